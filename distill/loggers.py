"""Further Lightning loggers beside the run's TensorBoard.

`trainer.logger` takes one logger or a list (`class_path`/`init_args`, as Lightning's CLI does);
`distill fit` puts them after its own `TensorBoardLogger` (`trainer.loggers[0]`, in
`<run_dir>/tensorboard`), so every metric Lightning or a callback logs, the hyperparameters at
the start, and the run's knobs and `final/<name>` figures at the end reach each of them.

A resumed run continues each logger's run rather than starting another, and never writes a step
twice:

- **The same run.** `<run_dir>/loggers.json` records each further logger's class and `version`
  (MLflow's run id, W&B's run id, a CSV or TensorBoard version); a resume hands it back through
  the constructor argument that continues it (`run_id`, else `version`) unless the config sets it.
  A CSV log keeps its earlier rows (Lightning's `CSVLogger` would delete them).
- **No step twice.** A tracker cannot take a point back (MLflow and W&B histories only grow), so
  `HeldLogger` passes on what was logged only once a checkpoint holds it: at each checkpoint, and
  until the next batch starts (what Lightning logs after saving belongs to that checkpoint: a
  resume does not repeat it). A killed run's later figures were never sent; the resume logs them.
  What a run logs after training (export, test, the final figures) reaches them when it ends.
  TensorBoard stays live: its files can be rewritten, so `CheckpointBoundary` records when each
  checkpoint's figures end (`tensorboard/.covered.json`) and a resume drops the events written
  after that (TensorBoard's own `purge_step` works by step, and Lightning logs a batch's figures
  at the step before the callbacks' figures of the same batch).
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger

from distill.errors import ConfigError
from distill.names import knobs_of
from distill.runinfo import write_atomic, write_json_atomic

RECORD = "loggers.json"
COVERED = ".covered.json"  # in tensorboard/: where the last checkpoint's boundary was (CheckpointBoundary)


def logger_configs(trainer_config: Any) -> list:
    """The further loggers' config entries (`trainer.logger`: one, a list, or None)."""
    value = trainer_config.get("logger") if trainer_config is not None else None
    if value is None or isinstance(value, bool):
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]


def continue_arg(cls: type) -> str | None:
    """The constructor argument through which a logger class continues an earlier run."""
    params = inspect.signature(cls).parameters
    return next((name for name in ("run_id", "version") if name in params), None)


def _class(path: Any) -> type | None:
    module, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def continue_runs(trainer_config: Any, run_dir: Path) -> None:
    """On a resume: give each further logger the run it logged to before (`loggers.json`), unless
    its config names one; matched by position and class path."""
    try:
        recorded = json.loads((run_dir / RECORD).read_text())
    except (OSError, ValueError):
        return
    for entry, old in zip(logger_configs(trainer_config), recorded):
        if not hasattr(entry, "get") or _class(entry.get("class_path")) is not _class(old.get("class_path")):
            continue
        arg = old.get("arg")
        init_args = entry.get("init_args")
        if arg and init_args is not None and init_args.get(arg) is None:
            init_args[arg] = old["version"]


class HeldLogger(Logger):
    """Passes `inner` what was logged once a checkpoint holds it (see the module's docstring):
    `after_save_checkpoint` delivers what is held and lets entries through until `hold()` (at the
    next batch, or once training ends); `deliver()` at the run's end. With `resume_step`, entries
    below it are dropped: a resumed run's first new step is `resume_step`, and what it re-logs
    from before (a data module's one-off counts at step 0) is already there."""

    def __init__(self, inner: Logger, *, hold: bool = True, resume_step: int | None = None):
        super().__init__()
        self.inner = inner
        self.holding = hold
        self.may_hold = hold
        self.resume_step = resume_step
        self.held: list[tuple[dict[str, float], int | None]] = []

    # Lightning reads these from every logger.
    @property
    def name(self):
        return self.inner.name

    @property
    def version(self):
        return self.inner.version

    @property
    def save_dir(self):
        return self.inner.save_dir

    @property
    def root_dir(self):
        return self.inner.root_dir

    @property
    def log_dir(self):
        return self.inner.log_dir

    @property
    def experiment(self):
        return self.inner.experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.resume_step is not None and step is not None and step < self.resume_step:
            return
        if self.holding:
            self.held.append((dict(metrics), step))
        else:
            self.inner.log_metrics(metrics, step)

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self.inner.log_hyperparams(params, *args, **kwargs)

    def log_graph(self, model, input_array=None) -> None:
        self.inner.log_graph(model, input_array)

    def save(self) -> None:
        self.inner.save()

    def finalize(self, status: str) -> None:
        # Held entries wait: after a failure a resume logs them again; after `fit` the run goes on
        # to export and test, and `deliver` sends them when it ends.
        self.inner.finalize(status)

    def after_save_checkpoint(self, checkpoint_callback) -> None:
        self.deliver()
        self.holding = False
        self.inner.after_save_checkpoint(checkpoint_callback)

    def hold(self) -> None:
        self.holding = self.may_hold

    @rank_zero_only
    def deliver(self) -> None:
        for metrics, step in self.held:
            self.inner.log_metrics(metrics, step)
        self.held.clear()
        self.inner.save()

    @rank_zero_only
    def log_final(self, params: dict[str, Any], finals: dict[str, float], step: int = 0) -> None:
        """What the run ends with: held entries, the knobs, the `final/` figures (at `step`, where
        TensorBoard's HParams dashboard has them), then `finalize('success')`."""
        self.deliver()
        self.inner.log_hyperparams(params)
        if finals:
            self.inner.log_metrics(finals, step)
        self.inner.save()
        self.inner.finalize("success")


class CheckpointBoundary(Callback):
    """Where what a checkpoint holds ends: at the first batch after a save (what Lightning logs
    after saving belongs to that checkpoint; a resume does not repeat it), or right after the save
    at the end of training (`covered`). There the further loggers start holding again and
    TensorBoard is flushed and its time recorded (`tensorboard/.covered.json`), so that a resume
    drops exactly what the killed attempt wrote after it (`tensorboard_resume`)."""

    def __init__(self, run_dir: Path, loggers: list[HeldLogger]):
        self.run_dir, self.loggers = Path(run_dir), loggers
        self.saved = False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saved = True

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.saved:
            self.covered(trainer)
        for logger in self.loggers:
            logger.hold()

    def covered(self, trainer) -> None:
        """Everything logged so far belongs to the last checkpoint (of `trainer.global_step`)."""
        self.saved = False
        for logger in self.loggers:
            logger.deliver()
            logger.hold()
        if rank_zero_only.rank == 0 and trainer.loggers:
            trainer.loggers[0].save()  # TensorBoard: what it was given is on disk
            record = {"step": trainer.global_step, "wall_time": time.time()}
            write_json_atomic(self.run_dir / "tensorboard" / COVERED, record)


def _covered(directory: Path) -> dict | None:
    try:
        return json.loads((directory / COVERED).read_text())
    except (OSError, ValueError):
        return None


def tensorboard_resume(directory: Path, resume_step: int | None) -> dict:
    """The TensorBoardLogger's extra arguments for a resume from the checkpoint of `resume_step`:
    none when `CheckpointBoundary` recorded where that checkpoint's figures end (`open_and_record`
    then drops what the killed attempt wrote after it); else, for a run directory written before
    the boundary was recorded or a resume from an older checkpoint, TensorBoard's own
    `purge_step`, which hides later steps but keeps Lightning's figures of the next batch (logged
    at the checkpoint's step) twice when the attempt got that far."""
    if resume_step is None:
        return {}
    covered = _covered(directory)
    if covered is None or covered.get("step", resume_step + 1) > resume_step:
        return {"purge_step": resume_step + 1}
    return {}  # an older boundary: the attempt was killed before writing past the checkpoint


def drop_events_after(directory: Path, wall_time: float) -> None:
    """Rewrite each TensorBoard event file of `directory` without its events after `wall_time`."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    for path in sorted(directory.glob("events.out.tfevents.*")):
        records = list(RawEventFileLoader(str(path)).Load())
        kept = [r for r in records if Event.FromString(r).wall_time <= wall_time]
        if len(kept) < len(records):
            write_atomic(path, lambda f, kept=kept: [RecordWriter(f).write(r) for r in kept])


def keep_csv_rows(logger: CSVLogger) -> None:
    """Lightning's CSV writer deletes an existing `metrics.csv` when it opens its directory; on a
    resume, open it with the earlier rows kept (every one a checkpoint held, see `HeldLogger`)."""
    path = os.path.join(logger.log_dir, "metrics.csv")
    rows: list[dict[str, str]] = []
    if os.path.isfile(path):
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    writer = logger.experiment
    if rows:
        writer.metrics[:0] = rows
        writer.save()


@rank_zero_only
def open_and_record(loggers: list[HeldLogger], run_dir: Path, resume_step: int | None) -> None:
    """Before the fit, with the run directory locked: on a resume, drop the TensorBoard events the
    killed attempt wrote after its checkpoint's boundary; open each further logger's run now,
    before any compute, so that a tracker that refuses (a store it cannot reach or write) ends the
    fit in one line naming the entry; record what continues each run in `<run_dir>/loggers.json`."""
    resumed = resume_step is not None
    covered = _covered(run_dir / "tensorboard") if resumed else None
    if covered is not None and covered.get("step") == resume_step:
        drop_events_after(run_dir / "tensorboard", float(covered["wall_time"]))
    record = []
    for i, held in enumerate(loggers):
        inner = held.inner
        where = f"trainer.logger[{i}] ({type(inner).__name__})"
        try:
            if resumed and isinstance(inner, CSVLogger):
                keep_csv_rows(inner)
            version = inner.version
            _ = inner.experiment
        except Exception as err:  # the tracker's own error, whatever its kind
            first = " ".join(str(err).split()) or type(err).__name__
            raise ConfigError(f"{where} cannot open its run: {type(err).__name__}: {first}") from None
        cls = type(inner)
        record.append(
            {
                "class_path": f"{cls.__module__}.{cls.__qualname__}",
                "arg": continue_arg(cls),
                "version": version,
            }
        )
    write_json_atomic(run_dir / RECORD, record)


def run_summary(config: dict, trainer, metrics: dict) -> tuple[dict, dict]:
    """(the run's knobs, under the names the sweeps and the report use, with its model class and
    max_steps; its final figures, under `final/<name>`, so the curves under their own names are
    not touched)."""
    knobs = knobs_of(config)
    knobs["model"] = str(config.get("model", {}).get("class_path", "")).rsplit(".", 1)[-1]
    knobs["max_steps"] = trainer.max_steps
    params = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in knobs.items()}
    finals = {f"final/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    return params, finals


def tensorboard_summary(logger: Logger, params: dict, finals: dict) -> None:
    """The knobs and final figures to TensorBoard's HParams dashboard (the figures at step 0), so
    TensorBoard over a sweep compares runs by knob."""
    if isinstance(logger, TensorBoardLogger):
        logger.log_hyperparams(params, metrics=finals)
        logger.experiment.flush()


def finish_further(loggers: list[HeldLogger], params: dict, finals: dict) -> None:
    """The further loggers get what they held, the knobs and the final figures (at step 0, as
    TensorBoard has them). Called after metrics.json is written: a tracker that refuses them
    (MLflow will not change a parameter's value) costs one line on stderr, not the run's record."""
    for i, held in enumerate(loggers):
        try:
            held.log_final(params, finals)
        except Exception as err:  # the tracker's own error, whatever its kind
            name = type(held.inner).__name__
            print(f"distill fit: trainer.logger[{i}] ({name}) refused the run's end: {err}", file=sys.stderr)

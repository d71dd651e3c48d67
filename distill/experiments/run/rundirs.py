"""Run directories: what makes a run finished, how an unfinished one is prepared, its fit command.

A run directory written by the sweep runner holds, before the fit starts, `overrides.yaml` (the
run's config overrides, passed to fit as the last `--config`) and `settings.json` (the knob values
by axis name, which the report reads; in a staged spec also `stage` and, for a chained run,
`after`: its parent's stage, name and directory). The fit then writes `config.yaml`, `env.json`,
`checkpoints/`, `tensorboard/`, `student/`, and last, atomically, `metrics.json`.

A run is finished iff its `metrics.json` parses and has `"status": "finished"`; it is done when
finished or diverged (`"status": "diverged"`: the non-finite guard stopped it, and re-running it
would diverge again). Done runs are never touched, even when the spec's fixed overrides have
changed since (use a new `out` then). An unfinished run resumes from `checkpoints/last.ckpt` when
there is one; otherwise its partial contents are cleared and it starts afresh. A run directory
another process holds (its `.lock`, `distill.rundir.RunLock`) is never prepared. `run_state` answers
which of these a run (or a directory) is in.

A reference run (`Run.reference`; `distill.experiments.run.references`) is prepared the same way but
runs `distill test` (the test prefix) and is finished iff its `test_metrics.json` holds metrics.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from distill.experiments.run import references
from distill.experiments.run.axes import nest
from distill.experiments.run.spec import Run
from distill.rundir import METRICS, RunLock, read_status
from distill.runinfo import write_text_atomic

SETTINGS = "settings.json"
OVERRIDES = "overrides.yaml"
LAST_CKPT = Path("checkpoints") / "last.ckpt"
FIT_LOG = "fit.log"
TEST_LOG = "test.log"  # a reference's `distill test` output
DONE = ("finished", "diverged")
DEFAULT_FIT_PREFIX = (sys.executable, "-m", "distill.cli", "fit")


def derive_test_prefix(fit_prefix: tuple[str, ...] | list[str]) -> list[str] | None:
    """The command that tests a reference, from the fit prefix: its final `fit` becomes `test`
    (`torchrun ... -m distill.cli fit` -> `... test`); None when it does not end in `fit`."""
    prefix = list(fit_prefix)
    return prefix[:-1] + ["test"] if prefix and prefix[-1] == "fit" else None


def is_run_dir(path: Path) -> bool:
    """Whether `path` is a run directory: one the sweep runner prepared or a fit finished in."""
    return any((Path(path) / name).exists() for name in (SETTINGS, METRICS, OVERRIDES))


@dataclass(frozen=True)
class RunState:
    """What a run directory holds, as far as running it goes (`run_state`)."""

    reference: bool  # a reference run: evaluation only, nothing to resume
    status: str | None  # a fit's `metrics.json` status; a reference's "finished" once it has test metrics
    checkpoint: Path | None  # a fit's resume checkpoint, `checkpoints/last.ckpt`, when there is one

    @property
    def finished(self) -> bool:
        return self.status == "finished"

    @property
    def done(self) -> bool:
        """Finished or diverged: never run again, never rewritten."""
        return self.status in DONE

    @property
    def next(self) -> str:
        """'done', 'resume' (a fit with a checkpoint) or 'todo' (a fresh start)."""
        return "done" if self.done else "resume" if self.checkpoint is not None else "todo"


def run_state(run: Run | Path) -> RunState:
    """The state of a run of the sweep or of its directory: finished, done, resumable. Given a
    path alone, a directory under `references/` is a reference run."""
    if isinstance(run, Run):
        run_dir, reference = Path(run.run_dir), bool(run.reference)
    else:
        run_dir = Path(run)
        reference = run_dir.parent.name == references.DIRNAME
    if reference:
        return RunState(True, "finished" if references.read(run_dir) is not None else None, None)
    ckpt = run_dir / LAST_CKPT
    return RunState(False, read_status(run_dir), ckpt if ckpt.is_file() else None)


def command(
    run: Run,
    base: list[Path],
    fit_prefix: tuple[str, ...] | list[str] = DEFAULT_FIT_PREFIX,
    test_prefix: tuple[str, ...] | list[str] | None = None,
) -> list[str]:
    """`fit_command` of a fit; of a reference, the same configs and run directory after the test
    prefix (default: derived from the fit prefix by `derive_test_prefix`), with no checkpoint."""
    if not run.reference:
        return fit_command(run, base, fit_prefix)
    prefix = test_prefix if test_prefix is not None else derive_test_prefix(fit_prefix)
    if prefix is None:
        raise ValueError(
            f"reference {run.name!r} needs a test command, and the fit prefix {' '.join(fit_prefix)!r} "
            "does not end in 'fit'; pass --test-prefix or set 'references: false' in the spec"
        )
    cmd = list(prefix)
    for path in run.base if run.base is not None else base:
        cmd += ["--config", str(path)]
    return cmd + ["--config", str(run.run_dir / OVERRIDES), "--run_dir", str(run.run_dir)]


def fit_command(
    run: Run, base: list[Path], prefix: tuple[str, ...] | list[str] = DEFAULT_FIT_PREFIX
) -> list[str]:
    """`<prefix> --config <base>... --config <run_dir>/overrides.yaml --run_dir <run_dir>
    [--ckpt_path <run_dir>/checkpoints/last.ckpt]` (the checkpoint only when it exists). A run of a
    staged spec starts from its stage's `base` instead."""
    cmd = list(prefix)
    for path in run.base if run.base is not None else base:
        cmd += ["--config", str(path)]
    cmd += ["--config", str(run.run_dir / OVERRIDES), "--run_dir", str(run.run_dir)]
    ckpt = run_state(run).checkpoint
    if ckpt is not None:
        cmd += ["--ckpt_path", str(ckpt)]
    return cmd


def prepare_run_dir(run: Run, sweep_name: str) -> str:
    """Make an unfinished run's directory ready to launch and return its state ('resume'/'todo').

    Refuses (ValueError) to touch a finished run. Without a resume checkpoint every partial
    file is removed first, so a fresh start never sees leftovers of a killed attempt."""
    run_dir = run.run_dir
    if run_state(run).done:
        raise ValueError(f"run {run.name!r} is done; its directory {run_dir} is never rewritten")
    if run_dir.exists():  # another process (an orphaned fit, a second sweep) owns it: touch nothing
        RunLock(run_dir, what=f"run {run.name!r}: its directory").acquire().release()
    state = run_state(run).next
    if state == "todo" and run_dir.exists():
        for child in run_dir.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    elif state == "resume":
        # A truncated metrics.json from the killed attempt must not outlive the resumed fit.
        (run_dir / METRICS).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / OVERRIDES, yaml.safe_dump(nest(run.overrides), sort_keys=False))
    record = {"sweep": sweep_name, "name": run.name, "settings": run.settings, "overrides": run.overrides}
    if run.stage is not None:
        record["stage"] = run.stage
    if run.reference is not None:  # evaluation only: the report reads it as a reference, not a run
        record["reference"] = run.reference
    if run.after is not None:  # the parent run (its directory), for the before/after report
        record["after"] = {"stage": run.after.parent.name, "run": run.after.name, "run_dir": str(run.after)}
    write_text_atomic(run_dir / SETTINGS, json.dumps(record, indent=2) + "\n")
    return state

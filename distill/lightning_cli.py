"""`distill fit|validate|test`: LightningCLI over any LightningModule (DistillationModule, GRPOModule)
and `RolloutDataModule`, with a run directory.

    distill fit --config configs/tiny/fkl_mix0.yaml --run_dir runs/fkl_mix0
    distill fit --config configs/tiny/fkl_mix0.yaml --run_dir runs/fkl_mix0 --ckpt_path last  # resume
    distill fit --config configs/tiny/fkl_mix0.yaml --print_config

A run directory holds `config.yaml` (the resolved config), `env.json` (package versions, git
revision), `tensorboard/` (`trainer.logger` adds loggers beside it, `loggers.json` their runs:
`distill.loggers`), `checkpoints/last.ckpt` (every `--checkpoint_every_n_steps` optimiser
steps and at the end of training; written atomically; no teacher tensors; deleted, with θ0, after
a finished fit given `--drop_checkpoints true`), `student/` (the exported student) and, written
last and atomically, `metrics.json`: `status` is `finished` only when training, export and
testing all finished, `diverged` (with a `reason`) when the non-finite guard stopped the run;
metrics are strict JSON (NaN/inf as null, listed under `nonfinite`).

What a fit guarantees (`distill.rundir`): the run directory is locked while the fit runs; a
finished run is never overwritten without `--overwrite`; a directory with a checkpoint is resumed
(`--ckpt_path last`), never silently restarted; a resume reproduces the uninterrupted run (data
order, rollouts, callbacks' state) and refuses a config that differs from the checkpoint's unless
`--allow_config_change` (then recorded in `config_changes.json`). Bad settings fail before any
model is loaded with one line naming the field, the value and what to do (`distill.config_errors`).
"""

from __future__ import annotations

import errno
import importlib
import json
import logging
import signal
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import yaml
from jsonargparse import ArgumentError
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger

from distill import run_status
from distill.config_bases import expand_bases, moved_args, moved_config
from distill.config_errors import (
    class_path_field,
    instantiate_error_line,
    parse_error_line,
    trainer_error_line,
)
from distill.data import RolloutDataModule
from distill.errors import ConfigError, Diverged, Interrupted
from distill.loggers import (
    CheckpointBoundary,
    HeldLogger,
    continue_runs,
    finish_further,
    open_and_record,
    run_summary,
    tensorboard_resume,
    tensorboard_summary,
)
from distill.models import real
from distill.models.tiny_world import world_of
from distill.parallel import end_launched_ranks_on_failure, end_process_group
from distill.rl import GRPOModule
from distill.rl.objective import check_sampling
from distill.run_record import AtomicCheckpointIO, PeriodicCheckpoint, RunRecord, read_checkpoint_record
from distill.rundir import (
    LAST_CKPT,
    METRICS,
    OPTIMIZER_ARGS,
    RunDirError,
    RunLock,
    check_fit_target,
    check_resume_config,
    check_trainer_flags,
    check_writable_dir,
    clear_fit_outputs,
    default_run_dir,
    drop_checkpoints,
    finite_metrics,
    read_metrics,
)
from distill.runinfo import environment, write_json_atomic, write_text_atomic
from distill.stopping import StopOnSignal, begin_launch, checkpoint_point, launcher_gone

# Checkpoints are written after the optimiser step on purpose (a resume continues from the state
# the next step starts from, exactly); Lightning warns about that under manual optimisation.
warnings.filterwarnings(
    "ignore", message=r".*ModelCheckpoint with manual optimization and every_n_train_steps.*"
)
# Under DDP/FSDP every epoch-level figure distill logs is already global (sums over every rank in
# `EvalFigures`; the measurement callbacks compute the same figures on every rank), so Lightning's
# advice to add sync_dist=True (one warning per figure and epoch) does not apply.
warnings.filterwarnings("ignore", message=r".*when logging on epoch level in distributed setting.*")

EXIT_DIVERGED = 3
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


class DistillCLI(LightningCLI):
    def __init__(self, *args, command: str = "fit", **kwargs):
        self.command = command
        self.resume_changes: dict = {}
        self.resume_step: int | None = None  # the global step of the checkpoint a fit resumes
        self.fresh_start = False
        self.continuing = False
        self.held: list[HeldLogger] = []  # trainer.logger's further loggers (distill.loggers)
        self.stop: StopOnSignal | None = None  # a fit's signal handling (distill.stopping)
        super().__init__(*args, **kwargs)

    # --- bad input ends in one line (distill.config_errors) -------------------------------------
    def parse_arguments(self, parser, args) -> None:
        parser.exit_on_error = False  # raise, not print the whole usage text before the message
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as err:
            raise ConfigError(parse_error_line(str(err), parser)) from None

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except ConfigError:
            raise
        except ValueError as err:  # a constructor's own check, as jsonargparse wraps it
            locate = lambda path: class_path_field(self.config, path)  # noqa: E731
            raise ConfigError(instantiate_error_line(str(err), locate)) from None
        self._check_chat_template()

    def _check_chat_template(self) -> None:
        """`data.prompts.chat_template: true` needs a tokenizer that has one: said now, before any
        model loads (tokenizers are loaded already, and cheap)."""
        fmt = getattr(self.datamodule, "prompts", None)
        if fmt is None or not fmt.chat_template:
            return
        from distill.models.loading import load_tokenizer

        tokenizer = load_tokenizer(fmt.tokenizer) if fmt.tokenizer else getattr(self.model, "tokenizer", None)
        if tokenizer is not None and getattr(tokenizer, "chat_template", None) is None:
            where = fmt.tokenizer or getattr(self.model, "student_path", None)
            raise ConfigError(
                f"data.prompts.chat_template is true, but the tokenizer of {where!r} has no chat template; "
                "set data.prompts.chat_template: false for plain-text prompts, or give an instruct model's "
                "tokenizer (data.prompts.tokenizer)"
            )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument(
            "--run_dir", type=str | None, default=None, help="run directory (default: runs/<time>-<random>)"
        )
        parser.add_argument(
            "--ckpt_path",
            type=str | None,
            default=None,
            help="checkpoint to resume from or test; 'last' = <run_dir>/checkpoints/last.ckpt",
        )
        parser.add_argument(
            "--test_after_fit", type=bool, default=True, help="run the test sets after fitting"
        )
        parser.add_argument(
            "--checkpoint_every_n_steps",
            type=int,
            default=50,
            help="write <run_dir>/checkpoints/last.ckpt every N optimiser steps (atomically); a "
            "killed run resumes from it (0 = only at the end of training)",
        )
        parser.add_argument(
            "--overwrite",
            type=bool,
            default=False,
            help="fit into a run directory that holds a finished run or a checkpoint: afresh "
            "(deleting what its earlier fit wrote) or, with --ckpt_path, continuing from it",
        )
        parser.add_argument(
            "--allow_config_change",
            type=bool,
            default=False,
            help="resume even when the config differs from the checkpoint's; the change is recorded "
            "in <run_dir>/config_changes.json",
        )
        parser.add_argument(
            "--drop_checkpoints",
            type=bool,
            default=False,
            help="once the run has finished (metrics.json written with status finished), delete "
            "<run_dir>/checkpoints/ (student weights and optimiser state) and theta0.safetensors; "
            "metrics.json, student/ and tensorboard/ stay. Failed, diverged or interrupted runs keep "
            "them and stay resumable",
        )
        # Runs are seeded: a config that names no seed gets 0, not Lightning's `true` (a random
        # seed, which `data.seed` cannot take and a rerun could not repeat).
        parser.set_defaults({"seed_everything": 0})
        parser.link_arguments("seed_everything", "data.seed")

    # --- checks before anything is instantiated or written ----------------------------------------
    def before_instantiate_classes(self) -> None:
        config = self.config
        trainer = config.get("trainer") or {}
        check_trainer_flags(trainer)
        every = config.checkpoint_every_n_steps
        if not isinstance(every, int) or every < 0:
            raise RunDirError(f"checkpoint_every_n_steps must be an integer >= 0, got {every!r}")
        if not config.get("run_dir"):
            config.run_dir = default_run_dir()
        run_dir = Path(config.run_dir)
        check_writable_dir(run_dir, "run_dir")
        if config.ckpt_path == "last":
            config.ckpt_path = str(run_dir / LAST_CKPT)
            if not Path(config.ckpt_path).is_file():
                raise RunDirError(f"ckpt_path 'last': {run_dir} has no checkpoint ({LAST_CKPT} is missing)")
        if config.ckpt_path is not None and not Path(config.ckpt_path).is_file():
            raise RunDirError(f"ckpt_path {config.ckpt_path!r} does not exist")
        if run_dir.is_dir() and rank_zero_only.rank == 0:  # in use? (taken for real in `execute`)
            RunLock(run_dir).acquire().release()
        if self.command == "fit":
            self._check_fit(config, run_dir)
            if config.ckpt_path is not None:  # continue each further logger's run
                continue_runs(trainer, run_dir)

    def _check_fit(self, config, run_dir: Path) -> None:
        if _model_class(config) is not None and issubclass(_model_class(config), GRPOModule):
            data = config.get("data") or {}
            check_sampling(data.get("group_size"), data.get("sampling.temperature"))
        ckpt = Path(config.ckpt_path) if config.ckpt_path else None
        status = check_fit_target(run_dir, ckpt, config.overwrite)
        # Without a checkpoint, what an earlier fit wrote goes (an --overwrite, or the leftovers of
        # an attempt killed before its first checkpoint); a continued finished run loses its old
        # metrics.json at once, so a kill cannot leave it looking finished.
        self.fresh_start = ckpt is None
        self.continuing = ckpt is not None and status is not None
        if ckpt is not None:
            record, self.resume_step = read_checkpoint_record(ckpt)
            if record is not None:
                new = yaml.safe_load(self.parser.dump(config, skip_none=False, skip_check=True))
                old = moved_config(record["config"])[0]  # a run written before a move
                self.resume_changes = check_resume_config(
                    old, new, ckpt, config.allow_config_change, {"data": RolloutDataModule}
                )

    # --- the trainer ------------------------------------------------------------------------------
    def instantiate_trainer(self, **kwargs) -> L.Trainer:
        run_dir = Path(self.config_init.run_dir)
        trainer_config = self._get(self.config_init, "trainer", default={})
        callbacks = list(trainer_config.get("callbacks") or [])
        plugins = trainer_config.get("plugins") or []
        plugins = list(plugins) if isinstance(plugins, list) else [plugins]
        checkpointing = trainer_config.get("enable_checkpointing", True) is not False
        if checkpointing:
            every = self.config_init.checkpoint_every_n_steps
            callbacks.append(
                PeriodicCheckpoint(
                    dirpath=run_dir / "checkpoints",
                    save_last=True,
                    save_top_k=0,
                    every_n_train_steps=every,  # 0: only the explicit save at the end of training
                    every_n_epochs=0,
                    enable_version_counter=False,  # last.ckpt is replaced, never joined by last-v1.ckpt
                )
            )
            plugins.append(AtomicCheckpointIO())
        if self.command == "fit":
            self.stop = StopOnSignal(run_dir, run_dir / LAST_CKPT if checkpointing else None)
            callbacks.append(self.stop)
        self.record = RunRecord(
            yaml.safe_load(self.parser.dump(self.config, skip_none=False, skip_check=True)),
            optimizer_changes={
                key[len(OPTIMIZER_ARGS) :]: new
                for key, (_, new) in self.resume_changes.items()
                if key.startswith(OPTIMIZER_ARGS)
            },
        )
        callbacks.append(self.record)
        fit = self.command == "fit"
        # A resumed run drops what the killed attempt logged after its checkpoint, so curves are not
        # spliced twice over the same steps.
        purge = tensorboard_resume(run_dir / "tensorboard", self.resume_step if fit else None)
        logger = TensorBoardLogger(
            save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False, **purge
        )
        further = trainer_config.get("logger")
        further = [] if further is None else further if isinstance(further, list) else [further]
        self.held = [
            HeldLogger(other, hold=fit and checkpointing, resume_step=self.resume_step if fit else None)
            for other in further
        ]
        self.boundary = CheckpointBoundary(run_dir, self.held)
        callbacks.append(self.boundary)
        try:
            return super().instantiate_trainer(
                default_root_dir=str(run_dir),
                logger=[logger, *self.held],
                callbacks=callbacks,
                plugins=plugins,
                **kwargs,
            )
        except (ValueError, MisconfigurationException, ImportError) as err:
            raise ConfigError(trainer_error_line(err)) from None

    # --- running ----------------------------------------------------------------------------------
    def execute(self, command: str) -> dict:
        run_dir = Path(self.config.run_dir)
        lock = RunLock(run_dir).acquire() if rank_zero_only.rank == 0 else None
        try:
            with end_launched_ranks_on_failure(self.trainer, run_dir):  # one rank's failure ends every rank
                if command != "fit":
                    return self._execute(command, run_dir)
                return self._fit_with_status(run_dir)
        finally:
            if lock is not None:
                lock.release()

    def _fit_with_status(self, run_dir: Path) -> dict:
        """`_execute("fit")`, with the run's status record (`distill.run_status`) kept: running,
        then how it ended; an interrupted fit exits 128 + the signal's number."""
        rank = rank_zero_only.rank  # as every other run file is written (DDP: the global rank)

        def record(state: str, reason: str | None, step: int | None = None, resume: bool = True) -> None:
            step = self.trainer.global_step if step is None else step
            resume_from = self._resume_from() if resume else None
            run_status.write(run_dir, state, reason=reason, rank=rank, step=step, resume_from=resume_from)

        if rank == 0:
            run_status.write(run_dir, "running", resume_from=self._resume_from())
        try:
            metrics = self._execute("fit", run_dir)
        except Interrupted as err:
            record(
                "interrupted",
                f"{err.signal_name}: stopped at the end of step {err.step} on every rank",
                err.step,
            )
            if rank == 0:
                line = run_status.describe(run_status.read(run_dir))
                print(f"distill fit: run interrupted: {line}", file=sys.stderr)
            raise SystemExit(128 + int(getattr(signal, err.signal_name))) from None
        except SystemExit as err:
            if err.code == EXIT_DIVERGED:
                record("diverged", (read_metrics(run_dir) or {}).get("reason"), resume=False)
            elif err.code and self.trainer.interrupted:  # Lightning's own end of a Ctrl-C
                record("interrupted", "SIGINT (KeyboardInterrupt)")
            elif err.code:
                record("failed", f"exit status {err.code}")
            raise
        except BaseException as err:
            gone = launcher_gone()  # then this rank's error (a closed connection) is its consequence
            if gone is not None:
                record("interrupted", gone)
            else:
                state = "interrupted" if isinstance(err, KeyboardInterrupt) else "failed"
                record(state, run_status.error_reason(err))
            raise
        finally:
            if self.stop is not None:
                self.stop.restore()
        if rank == 0:
            run_status.write(run_dir, "finished", step=self.trainer.global_step)
        return metrics

    def _resume_from(self) -> dict | None:
        """The checkpoint a resume of this run would start from, with its step."""
        run_dir = Path(self.config.run_dir)
        return checkpoint_point(run_dir, run_dir / LAST_CKPT)

    def _execute(self, command: str, run_dir: Path) -> dict:
        # Under DDP every rank runs this (and every collective in it: fit, test, save_checkpoint);
        # only rank 0 writes or removes run files.
        writer = rank_zero_only.rank == 0
        if writer:
            if command == "fit" and self.fresh_start:
                clear_fit_outputs(run_dir)
            if command == "fit" and self.continuing:
                (run_dir / METRICS).unlink(missing_ok=True)
            write_text_atomic(run_dir / "config.yaml", self.parser.dump(self.config, skip_none=False))
            write_json_atomic(run_dir / "env.json", {**environment(), "models": model_record(self.model)})
            if self.resume_changes:
                self._record_changes(run_dir)
            if command == "fit":
                open_and_record(self.held, run_dir, self.resume_step)
        ckpt = self.config.ckpt_path
        if command != "fit":
            results = getattr(self.trainer, command)(self.model, datamodule=self.datamodule, ckpt_path=ckpt)
            metrics = _flatten(results)
            strict, nonfinite = finite_metrics(metrics)
            if writer:
                write_json_atomic(
                    run_dir / f"{command}_metrics.json",
                    {"metrics": strict, **({"nonfinite": nonfinite} if nonfinite else {})},
                )
            return metrics
        try:
            self.trainer.fit(self.model, datamodule=self.datamodule, ckpt_path=ckpt)
        except Diverged as err:
            metrics = self.record.metrics(self.trainer)
            loop = getattr(self.model, "loop", None)
            if loop is not None:  # the stopping step raised before it could be logged
                metrics["train/nonfinite_steps"] = float(loop.guard.skipped)
            self._log_hparams(metrics)
            self._write_metrics(run_dir, metrics, status="diverged", reason=str(err))
            self._finish_loggers(metrics)
            print(f"distill fit: run diverged: {err}", file=sys.stderr)
            raise SystemExit(EXIT_DIVERGED) from None
        if self.trainer.interrupted:
            return {}
        metrics = self.record.metrics(self.trainer)
        # The end-of-training state (with the final validation's figures): a run killed during
        # export or testing resumes from here and still reports its training and validation.
        if self.trainer.checkpoint_callback is not None:
            self.trainer.save_checkpoint(run_dir / LAST_CKPT)  # every rank: it holds a barrier
            self.boundary.covered(self.trainer)  # what follows (export, test, final figures) is not
        if self.stop is not None:  # a signal during the last step stops here; one from now on, at once
            self.stop.after_fit(self.trainer)
        self.model.export_student(run_dir / "student")  # every rank (FSDP gathers); rank 0 writes
        if self.config.test_after_fit:
            metrics |= _flatten(self.trainer.test(self.model, datamodule=self.datamodule, verbose=False))
        for callback in self.trainer.callbacks:
            if hasattr(callback, "summary"):
                metrics |= callback.summary()
        self._log_hparams(metrics)
        self._write_metrics(run_dir, metrics, status="finished")
        self._finish_loggers(metrics)
        if self.config.drop_checkpoints and rank_zero_only.rank == 0:
            drop_checkpoints(run_dir)
        return metrics

    def _log_hparams(self, metrics: dict) -> None:
        tensorboard_summary(self.trainer.loggers[0], *run_summary(self.record.config, self.trainer, metrics))

    def _finish_loggers(self, metrics: dict) -> None:
        finish_further(self.held, *run_summary(self.record.config, self.trainer, metrics))

    def _write_metrics(self, run_dir: Path, metrics: dict, status: str, reason: str | None = None) -> None:
        if rank_zero_only.rank != 0:
            return
        strict, nonfinite = finite_metrics(metrics)
        record: dict = {"status": status, "metrics": strict}
        if nonfinite:
            record["nonfinite"] = nonfinite
        if reason is not None:
            record["reason"] = reason
        write_json_atomic(run_dir / METRICS, record)

    def _record_changes(self, run_dir: Path) -> None:
        path = run_dir / "config_changes.json"
        try:
            history = json.loads(path.read_text())
        except (OSError, ValueError):
            history = []
        history.append(
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "ckpt_path": self.config.ckpt_path,
                "changes": {k: {"checkpoint": a, "now": b} for k, (a, b) in self.resume_changes.items()},
            }
        )
        write_json_atomic(run_dir / "config_changes.json", history)


def _flatten(results: list[dict] | None) -> dict:
    out: dict = {}
    for r in results or []:
        out |= {k: float(v) for k, v in r.items()}
    return out


def _model_class(config) -> type | None:
    """The LightningModule class the parsed config names (jsonargparse has resolved it already)."""
    path = str((config.get("model") or {}).get("class_path") or "")
    module, _, name = path.rpartition(".")
    if not module:
        return None
    found = getattr(importlib.import_module(module), name, None)
    return found if isinstance(found, type) else None


def run_lightning_cli(argv: list[str]) -> dict:
    command, args = argv[0], argv[1:]
    # `distill fit ARGS` hands ARGS to LightningCLI explicitly; its warning about sys.argv is moot.
    warnings.filterwarnings("ignore", message=".*LightningCLI's args parameter is intended.*")
    # The frozen teacher (or GRPO's reference) is in eval mode on purpose.
    warnings.filterwarnings("ignore", message=r".*module\(s\) in eval mode at the start of training.*")
    # "Seed set to N" on stderr says what config.yaml records, and would precede a one-line error.
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)
    begin_launch()
    try:
        args = expand_bases(moved_args(args))
        cli = DistillCLI(
            L.LightningModule,
            RolloutDataModule,
            subclass_mode_model=True,
            auto_configure_optimizers=False,
            save_config_callback=None,
            run=False,
            args=args,
            parser_kwargs={"prog": f"distill {command}"},
            command=command,
        )
        result = cli.execute(command)
        end_process_group()
        return result
    except (ValueError, FileNotFoundError, TypeError) as err:
        if isinstance(err, ConfigError) or "cli" not in locals():
            print(f"distill {command}: error: {instantiate_error_line(str(err))}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            raise
        # A full disk, a quota, a read-only mount: the run's own files say where it stands (the
        # checkpoint before is intact: checkpoints are written beside it and renamed).
        where = f" writing {err.filename}" if err.filename else ""
        record = run_status.read(cli.config.run_dir) if "cli" in locals() else None
        said = f"; {run_status.describe(record)}" if record is not None else ""
        print(f"distill {command}: error: {err.strerror}{where}{said}", file=sys.stderr)
        raise SystemExit(1) from None


def model_record(module) -> dict:
    """Each model a run loads (`student`, `teacher`, `reference`): its resolved path and, for a
    tiny-world model, the world's version and the weights' fingerprint (`tiny_world.world_of`), so
    that an archive says which world its runs used; for a `real:NAME` model, what it was converted
    from (`real.record_of`)."""
    out = {}
    for role in ("student", "teacher", "reference"):
        path = getattr(module, f"{role}_path", None)
        if path and (role != "reference" or getattr(module, "use_reference", False)):
            world, converted = world_of(path), real.record_of(path)
            out[role] = {
                "path": str(path),
                **({"tiny_world": world} if world else {}),
                **({"real": converted} if converted else {}),
            }
    return out

"""What `distill fit` guarantees about its run directory (used by `distill.lightning_cli`).

- **Ownership.** `RunLock` holds an exclusive `flock` on `<run_dir>/.lock` while a fit (or a
  sweep, on its `out`) runs. The kernel drops it when the process dies, `kill -9` included, so a
  lock never goes stale; a second process refuses with one line naming the holder.
- **Atomic checkpoints.** `AtomicCheckpointIO` (`distill.run_record`) writes a checkpoint beside its target, fsyncs it and
  renames it into place: a kill mid-write leaves the previous checkpoint whole.
- **The run record.** `RunRecord` (a callback, `distill.run_record`) keeps in every checkpoint the resolved config and the
  last training/validation figures. A resumed fit compares its config with the checkpoint's
  (`config_changes`) and, when it resumes after training ended, still reports those figures.
- **Strict metrics.** `finite_metrics` turns NaN/inf into null and lists them, so `metrics.json` is
  always strict JSON.
- **Checks before any model loads**: Trainer flags the run owns (`check_trainer_flags`), a fit
  that would overwrite a done run or silently restart a checkpointed one (`check_fit_target`), a
  resume whose config differs from its checkpoint's (`check_resume_config`).

This module imports neither torch nor Lightning, so that `distill sweep` and `distill report`, which
read run directories, start in a second; the pieces a fit needs from them are `distill.run_record`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import importlib
import inspect
import json
import math
import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from distill.errors import ConfigError

LOCK = ".lock"
RECORD_KEY = "distill_run"
# Config keys that may differ between a run and its resume: where it runs, how it is resumed,
# how often it checkpoints and whether it tests afterwards change no trained number.
RESUME_FREE_KEYS = (
    "config",
    "trainer.logger",  # further loggers: where figures are also sent (distill.loggers)
    "run_dir",
    "ckpt_path",
    "overwrite",
    "allow_config_change",
    "checkpoint_every_n_steps",
    "test_after_fit",
    "drop_checkpoints",
)


class RunDirError(ConfigError):
    """A run directory refuses what was asked of it (in use, finished, has a checkpoint, ...)."""


LAST_CKPT = Path("checkpoints") / "last.ckpt"
METRICS = "metrics.json"  # written last, atomically: the run's status and figures
# What a fit writes into its run directory (an --overwrite or a fresh start removes these only).
FIT_OUTPUTS = (
    "config.yaml",
    "env.json",
    "tensorboard",
    "checkpoints",
    "student",
    "theta0.safetensors",
    METRICS,
    "config_changes.json",
    "loggers.json",  # what continues each further logger's run (distill.loggers)
)
# Settings whose state the checkpoint restores, so a resume cannot change them (the optimiser's
# own hyperparameters, `...optimizer.init_args.*`, can: RunRecord applies them to its state).
RESUME_FIXED = ("model.init_args.optimizer.class_path", "model.init_args.lr_scheduler")
OPTIMIZER_ARGS = "model.init_args.optimizer.init_args."
DEFAULT_RUN_DIR_ENV = "DISTILL_DEFAULT_RUN_DIR"  # shared with ranks Lightning launches itself

# Trainer flags the run owns: each refused up front with what to use instead.
OWNED_TRAINER_FLAGS = {
    "default_root_dir": (None, "the run directory is --run_dir; use --run_dir"),
    "logger": (
        None,
        "a run logs to TensorBoard in <run_dir>/tensorboard, always; trainer.logger takes further "
        "loggers (class_path/init_args, or a list of them)",
    ),
    "gradient_clip_val": (
        None,
        "the training step clips the gradient itself; set model.gradient_clip_val instead",
    ),
    "accumulate_grad_batches": (
        1,
        "one rollout batch (data.batch_size prompts) is one optimiser step; to fit it in memory "
        "split it with model.micro_batch_size instead",
    ),
}


def default_run_dir() -> str:
    """`runs/<date>-<time>-<random>`: two fits started in the same second never share it. Rank 0
    names it; ranks that Lightning launches from it inherit the name through the environment."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if rank_zero_only.rank != 0 and DEFAULT_RUN_DIR_ENV in os.environ:
        return os.environ[DEFAULT_RUN_DIR_ENV]
    name = str(Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}")
    os.environ[DEFAULT_RUN_DIR_ENV] = name
    return name


def read_metrics(run_dir: Path) -> dict[str, Any] | None:
    """The parsed `metrics.json` of a run, or None when it is missing, truncated or not a mapping."""
    try:
        data = json.loads((Path(run_dir) / METRICS).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_status(run_dir: Path) -> str | None:
    """The `status` of a run's `metrics.json` (`finished`, `diverged`), or None."""
    data = read_metrics(run_dir)
    return data.get("status") if data is not None else None


def clear_fit_outputs(run_dir: Path) -> None:
    """Remove what an earlier fit wrote (`FIT_OUTPUTS`); other files (a sweep's settings) stay."""
    for name in FIT_OUTPUTS:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


RESUME_STATE = ("checkpoints", "theta0.safetensors")  # what only a resume reads


def drop_checkpoints(run_dir: Path) -> list[str]:
    """Delete a finished run's resume state (`RESUME_STATE`: the student's weights and optimiser
    state in `checkpoints/`, θ0 in `theta0.safetensors`); `metrics.json`, `student/`,
    `tensorboard/` and the config stay. Refused unless `metrics.json` says `finished`: a failed,
    diverged or interrupted run keeps what it needs to resume. Returns the names removed."""
    status = read_status(run_dir)
    if status != "finished":
        raise RunDirError(
            f"drop_checkpoints: run directory {str(run_dir)!r} holds no finished run (status "
            f"{status!r}); its checkpoints stay so that it can resume"
        )
    removed = []
    for name in RESUME_STATE:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def check_trainer_flags(trainer: dict) -> None:
    """Refuse, in one line, a Trainer flag the run owns (`OWNED_TRAINER_FLAGS`)."""
    for flag, (default, what) in OWNED_TRAINER_FLAGS.items():
        value = trainer.get(flag, default)
        if flag == "logger" and not isinstance(value, bool):
            continue  # further loggers are welcome; only switching TensorBoard off or on is not
        if value != default:
            raise RunDirError(f"trainer.{flag}={value!r} is not used: {what}")


def check_writable_dir(path: Path, field: str) -> None:
    """A run directory this process can write: a folder (or none yet, under a folder it can
    create it in), checked by writing a nameless temporary file there. Said in one line before any
    model loads, not as a traceback later."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{field} {str(path)!r} is a file, not a directory; give a directory for the run")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirError(f"{field} {str(path)!r} cannot be created: {str(existing)!r} is a file")
    try:  # a real write: permissions, a read-only mount and a full disk all show here
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as err:
        where = "" if existing == path else f" (in {str(existing)!r})"
        raise RunDirError(f"{field} {str(path)!r} cannot be written{where}: {err.strerror or err}") from None


def check_fit_target(run_dir: Path, ckpt: Path | None, overwrite: bool) -> str | None:
    """Refuse a fit that would overwrite a done run or restart a checkpointed one silently;
    returns the run directory's status (`finished`, `diverged` or None)."""
    status = read_status(run_dir)
    if status is not None and not overwrite:
        raise RunDirError(
            f"run directory {str(run_dir)!r} holds a {status} run (metrics.json); pass --overwrite "
            "to replace it (with --ckpt_path last: to continue it) or choose another --run_dir"
        )
    if ckpt is None and (run_dir / LAST_CKPT).is_file() and not overwrite:
        raise RunDirError(
            f"run directory {str(run_dir)!r} has a checkpoint of an unfinished run: resume it with "
            "--ckpt_path last, or start afresh with --overwrite"
        )
    return status


def check_resume_config(
    old: dict, new: dict, ckpt: Path, allow: bool, classes: dict[str, type] | None = None
) -> dict[str, tuple[Any, Any]]:
    """The changes from a checkpoint's config to a resume's (`config_changes`, `classes` as there):
    refused when they touch `RESUME_FIXED`, or any setting unless `allow` (--allow_config_change)."""
    changes = config_changes(old, new, classes)
    fixed = [k for k in changes if k.startswith(RESUME_FIXED)]
    if fixed:
        raise RunDirError(
            f"{fixed[0]} differs from checkpoint {str(ckpt)!r}, and a resumed run keeps the "
            "checkpoint's optimiser and schedule state; start a new run to change it"
        )
    if changes and not allow:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(changes.items())[:4])
        more = f" (and {len(changes) - 4} more)" if len(changes) > 4 else ""
        raise RunDirError(
            f"the config differs from checkpoint {str(ckpt)!r}: {listed}{more}; resume with "
            "the checkpoint's config, or pass --allow_config_change to record the change"
        )
    return changes


class RunLock:
    """An exclusive, non-blocking `flock` on `<directory>/.lock`, released when the process ends."""

    def __init__(self, directory: str | Path, what: str = "run directory"):
        self.directory, self.what = Path(directory), what
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunDirError(
                f"{self.what} {str(self.directory)!r} is in use by {holder}; wait for it to end "
                "or choose another directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}".encode()
        )
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys: `{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


_UNKNOWN = object()


def option_default(config: dict, key: str, classes: dict[str, type] | None = None) -> Any:
    """The constructor default behind dotted config `key`: `<...>.init_args.<name>` of a block
    with a `class_path`, or `<section>.<name>` of a section whose class `classes` gives (e.g.
    `{"data": RolloutDataModule}`), and a field of a group of settings under either
    (`<...>.<name>.<field>`, the group's default's field); `_UNKNOWN` when there is none to find."""
    parts = key.split(".")
    cls, rest = (classes or {}).get(parts[0]), parts[1:]
    if "init_args" in parts[:-1]:
        at = len(parts) - 1 - parts[::-1].index("init_args")
        block: Any = config
        for part in parts[:at]:
            block = block.get(part) if isinstance(block, dict) else None
        path = block.get("class_path") if isinstance(block, dict) else None
        module, _, name = path.rpartition(".") if isinstance(path, str) else ("", "", "")
        try:
            cls = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError):
            cls = None
        rest = parts[at + 1 :]
    try:
        param = inspect.signature(cls).parameters.get(rest[0]) if cls is not None and rest else None
    except (TypeError, ValueError):
        param = None
    if param is None or param.default is inspect.Parameter.empty:
        return _UNKNOWN
    default = param.default
    for field in rest[1:]:  # a field of a group of settings (a dataclass)
        if not dataclasses.is_dataclass(default) or not hasattr(default, field):
            return _UNKNOWN
        default = getattr(default, field)
    return default


def config_changes(
    old: dict, new: dict, classes: dict[str, type] | None = None
) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (checkpoint's value, new value) for every setting that differs, leaving out
    `RESUME_FREE_KEYS` and options the checkpoint's config lacks that are at their default (added
    to the code since it was written: `option_default`, `classes` naming sections without a
    `class_path`)."""
    a, b = flatten(old), flatten(new)

    def changed(key: str) -> bool:
        if key.startswith(tuple(f"{k}." for k in RESUME_FREE_KEYS)) or key in RESUME_FREE_KEYS:
            return False
        if a.get(key) == b.get(key):
            return False
        return key in a or option_default(new, key, classes) != b[key]

    return {key: (a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if changed(key)}


def finite_metrics(metrics: dict[str, float]) -> tuple[dict[str, float | None], list[str]]:
    """(metrics with every NaN/inf replaced by None, the names replaced)."""
    bad = sorted(k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v))
    return {k: (None if k in bad else v) for k, v in metrics.items()}, bad

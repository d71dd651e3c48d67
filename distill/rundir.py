"""What `distill fit` guarantees about its run directory (used by `distill.lightning_cli`).

- **Ownership.** `RunLock` holds an exclusive `flock` on `<run_dir>/.lock` while a fit (or a
  sweep, on its `out`) runs. The kernel drops it when the process dies, `kill -9` included, so a
  lock never goes stale; a second process refuses with one line naming the holder.
- **Atomic checkpoints.** `AtomicCheckpointIO` writes a checkpoint beside its target, fsyncs it and
  renames it into place: a kill mid-write leaves the previous checkpoint whole.
- **The run record.** `RunRecord` (a callback) keeps in every checkpoint the resolved config and the
  last training/validation figures. A resumed fit compares its config with the checkpoint's
  (`config_changes`) and, when it resumes after training ended, still reports those figures.
- **Strict metrics.** `finite_metrics` turns NaN/inf into null and lists them, so `metrics.json` is
  always strict JSON.
"""

from __future__ import annotations

import fcntl
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback

from distill.runinfo import write_atomic

LOCK = ".lock"
RECORD_KEY = "distill_run"
# Config keys that may differ between a run and its resume: where it runs, how it is resumed,
# how often it checkpoints and whether it tests afterwards change no trained number.
RESUME_FREE_KEYS = (
    "config",
    "run_dir",
    "ckpt_path",
    "overwrite",
    "allow_config_change",
    "checkpoint_every_n_steps",
    "test_after_fit",
)


class RunDirError(ValueError):
    """A run directory refuses what was asked of it (in use, finished, has a checkpoint, ...)."""


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


class AtomicCheckpointIO(TorchCheckpointIO):
    """`torch.save` into a temporary file in the target's folder, fsync, then rename over the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        write_atomic(path, lambda f: torch.save(checkpoint, f))


def scalar_metrics(trainer) -> dict[str, float]:
    """The trainer's logged scalars (`callback_metrics`) as floats."""
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


class RunRecord(Callback):
    """Stores `config` and the trainer's logged scalars in every checkpoint; on resume, restores
    the scalars (`self.restored`), so figures logged before the checkpoint are not lost, and
    writes `optimizer_changes` (hyperparameter -> new value, a resume's recorded config change)
    into the checkpoint's optimiser state before Lightning restores it, so they take effect."""

    def __init__(self, config: dict, optimizer_changes: dict[str, Any] | None = None):
        self.config = config
        self.optimizer_changes = dict(optimizer_changes or {})
        self.restored: dict[str, float] = {}

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[RECORD_KEY] = {
            "config": self.config,
            "metrics": {**self.restored, **scalar_metrics(trainer)},
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.restored = dict(checkpoint.get(RECORD_KEY, {}).get("metrics", {}))
        for state in checkpoint.get("optimizer_states", []):
            for group in state.get("param_groups", []):
                for name, value in self.optimizer_changes.items():
                    if name in group:
                        group[name] = tuple(value) if isinstance(group[name], tuple) else value

    def metrics(self, trainer) -> dict[str, float]:
        """Figures of this session over those restored from the checkpoint."""
        return {**self.restored, **scalar_metrics(trainer)}


def read_checkpoint_record(path: str | Path) -> tuple[dict | None, int]:
    """(the `RunRecord` of a checkpoint, or None for one written without it; its global step),
    read with tensors memory-mapped, not loaded. Raises `RunDirError` for a file that is not one."""
    try:
        checkpoint = torch.load(str(path), map_location="cpu", mmap=True, weights_only=False)
    except Exception as err:  # a truncated or foreign file: torch raises many kinds
        raise RunDirError(
            f"ckpt_path {str(path)!r} is not a readable checkpoint ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise RunDirError(f"ckpt_path {str(path)!r} is not a Lightning checkpoint (no state_dict)")
    return checkpoint.get(RECORD_KEY), int(checkpoint.get("global_step", 0))


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out |= _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def config_changes(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """Dotted key -> (checkpoint's value, new value) for every setting that differs, leaving out
    `RESUME_FREE_KEYS`."""
    a, b = _flatten(old), _flatten(new)
    free = tuple(RESUME_FREE_KEYS)
    return {
        key: (a.get(key), b.get(key))
        for key in sorted(set(a) | set(b))
        if key.split(".")[0] not in free and a.get(key) != b.get(key)
    }


def finite_metrics(metrics: dict[str, float]) -> tuple[dict[str, float | None], list[str]]:
    """(metrics with every NaN/inf replaced by None, the names replaced)."""
    bad = sorted(k for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v))
    return {k: (None if k in bad else v) for k, v in metrics.items()}, bad

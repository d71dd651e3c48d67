"""The pieces of `distill.rundir`'s guarantees that live inside a Lightning fit: atomic checkpoint
writes (`AtomicCheckpointIO`), the run record kept in every checkpoint (`RunRecord`) and reading it
back (`read_checkpoint_record`). Apart from `distill.rundir` so that the sweep and report commands,
which only read run directories, do not import torch and Lightning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from distill.rundir import RECORD_KEY, RunDirError
from distill.runinfo import write_atomic


class PeriodicCheckpoint(ModelCheckpoint):
    """`ModelCheckpoint` for `last.ckpt` every N optimiser steps, without its save when training
    ends: `distill fit` writes the end-of-training state itself once the fit has returned (the
    final validation's figures in it), and the two wrote the same state twice (for a paper-sized
    student with AdamW's moments, 100 GB written for nothing at the end of every run)."""

    def on_train_end(self, trainer, pl_module) -> None:
        return


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
    into the checkpoint's optimiser state before Lightning restores it, and into the restored
    optimisers when training starts, so they take effect under every strategy."""

    def __init__(self, config: dict, optimizer_changes: dict[str, Any] | None = None):
        self.config = config
        self.optimizer_changes = dict(optimizer_changes or {})
        self.restored: dict[str, float] = {}
        self.resumed = False

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint[RECORD_KEY] = {
            "config": self.config,
            "metrics": {**self.restored, **scalar_metrics(trainer)},
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        self.restored = dict(checkpoint.get(RECORD_KEY, {}).get("metrics", {}))
        self.resumed = True
        for state in checkpoint.get("optimizer_states", []):
            self._apply(state.get("param_groups", []))

    def on_train_start(self, trainer, pl_module) -> None:
        # Also on the live optimisers: a strategy that restores optimiser state itself (FSDP2's
        # ModelParallelStrategy, inside `load_checkpoint`) has read it before the edit above.
        if self.resumed:
            for optimizer in trainer.optimizers:
                self._apply(optimizer.param_groups)

    def _apply(self, groups: list[dict]) -> None:
        for group in groups:
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

"""`UpdateSparsity`: which entries of the student's weights distillation has moved from θ0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from safetensors.torch import load_file, save

from distill.callbacks.contract import StudentHolder, require
from distill.callbacks.generation import log_scalars
from distill.callbacks.interval import StepInterval
from distill.checks import check_int, check_number
from distill.metrics import update_sparsity
from distill.parallel import full_tensor
from distill.runinfo import write_atomic

SNAPSHOT_NAME = "theta0.safetensors"


def trainable_parameters(model: torch.nn.Module) -> Mapping[str, torch.Tensor]:
    """name -> parameter, trainable ones only; a tied weight appears once (`named_parameters`). An
    FSDP-sharded parameter is gathered whole when read (`full_tensor`: a collective, which every
    rank takes in the same order), one at a time: never the whole model at once."""
    return _Trainable({name: p for name, p in model.named_parameters() if p.requires_grad})


class _Trainable(Mapping):
    def __init__(self, params: dict[str, torch.Tensor]):
        self._params = params

    def __getitem__(self, name: str) -> torch.Tensor:
        return full_tensor(self._params[name].detach())

    def __iter__(self):
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)


class UpdateSparsity(L.Callback):
    """Compare the student's trainable parameters with their values θ0 when fitting started.

    Logs `sparsity/overall` (fraction of entries with |θ - θ0| <= atol, compared in float32),
    `sparsity/exact_zero` (fraction with θ == θ0 exactly), `sparsity/bf16_unchanged` (fraction equal
    once θ and θ0 are both rounded to bfloat16: the reading of a model kept in bf16, the paper's
    setting; in float32 AdamW moves nearly every entry), `sparsity/<type>` per module type
    (attention, mlp, embedding, norm, other; see `distill.metrics.module_type`),
    `sparsity/relative_update_norm` (‖θ - θ0‖ / ‖θ0‖ over all trainable entries) and, with a
    TensorBoard logger, the per-tensor fractions as the histogram `sparsity/per_tensor`. Measured
    every `every_n_steps` optimiser steps and at the end of fit, tensor by tensor in float32 slices
    (never a float32 copy of the whole model; an FSDP-sharded tensor is gathered whole in turn).
    θ0 is whole on every rank (`offload_to_cpu` keeps it off the GPU).

    θ0 is written once to a safetensors file and only its path goes into checkpoints; resuming
    reads θ0 back from that file, so the comparison stays against the original student.

    Args:
        every_n_steps: measure every N optimiser steps (plus the end of fit).
        atol: an entry counts as unchanged when |θ - θ0| <= atol.
        offload_to_cpu: keep the in-memory θ0 on the CPU instead of the parameters' device.
        snapshot_path: where θ0 is written; None: `<trainer.default_root_dir>/theta0.safetensors`.
    """

    def __init__(
        self,
        every_n_steps: int = 50,
        atol: float = 1e-5,
        offload_to_cpu: bool = False,
        snapshot_path: str | None = None,
    ):
        self.every_n_steps = check_int("UpdateSparsity.every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        self.atol = check_number("UpdateSparsity.atol", atol, 0)
        self.offload_to_cpu = bool(offload_to_cpu)
        self.snapshot_path = None if snapshot_path is None else str(snapshot_path)
        self.theta0: dict[str, torch.Tensor] | None = None
        self.latest: dict[str, float] = {}
        self.last_step = -1
        self.restore_from: str | None = None  # θ0 file named by a checkpoint being resumed
        self.root: Path | None = None  # the run directory (trainer.default_root_dir) of this fit

    # --- θ0 ---------------------------------------------------------------------------------------
    def _path(self, trainer) -> Path:
        return Path(self.snapshot_path or Path(trainer.default_root_dir) / SNAPSHOT_NAME)

    def take_snapshot(self, model: torch.nn.Module, path: Path, write: bool = True) -> None:
        """Copy the current trainable parameters into memory as θ0 and write them to `path`
        (`write=False`: keep the path only; another process writes the file)."""
        params = trainable_parameters(model)
        self.theta0 = {
            n: p.detach().to("cpu" if self.offload_to_cpu else p.device, copy=True) for n, p in params.items()
        }
        self.snapshot_path = str(path)
        if not write:
            return
        tensors = {n: t.detach().cpu().contiguous() for n, t in self.theta0.items()}
        write_atomic(path, lambda f: f.write(save(tensors)))  # a crash never leaves a truncated θ0

    def load_snapshot(self, model: torch.nn.Module, path: Path) -> None:
        """Read θ0 from `path`; its names and shapes must match the trainable parameters."""
        if not path.is_file():
            raise FileNotFoundError(
                f"UpdateSparsity: θ0 snapshot {str(path)!r} (from the checkpoint) does not exist; "
                "without it sparsity cannot be measured against the original student"
            )
        params = trainable_parameters(model)
        loaded = load_file(str(path))
        if set(loaded) != set(params) or any(loaded[n].shape != p.shape for n, p in params.items()):
            raise ValueError(
                f"UpdateSparsity: θ0 snapshot {str(path)!r} does not match the student's parameters"
            )
        self.theta0 = {n: loaded[n].to("cpu" if self.offload_to_cpu else p.device) for n, p in params.items()}

    # --- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require(pl_module, StudentHolder, "UpdateSparsity")

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.root = Path(trainer.default_root_dir)
        if self.theta0 is not None:
            return
        if self.restore_from is not None:
            path = self.root / self.restore_from  # relative to the run directory, unless absolute
            self.load_snapshot(pl_module.student, path)
            self.snapshot_path, self.restore_from = str(path), None
        else:
            # Under DDP every rank holds the same θ0; one writes the file.
            write = getattr(trainer, "is_global_zero", True)
            self.take_snapshot(pl_module.student, self._path(trainer), write=write)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.interval.batch_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.interval.due_after(trainer):
            self.measure(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.measure(trainer, pl_module)

    def summary(self) -> dict[str, float]:
        return dict(self.latest)

    def state_dict(self) -> dict:
        # θ0 inside the run directory is stored relative to it, so a moved run directory resumes.
        path = self.snapshot_path
        if path is not None and self.root is not None and Path(path).is_relative_to(self.root):
            path = str(Path(path).relative_to(self.root))
        return {"snapshot_path": path, "latest": self.latest, "last_step": self.last_step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.restore_from = state_dict["snapshot_path"]
        self.latest = dict(state_dict["latest"])
        self.last_step = int(state_dict["last_step"])
        self.theta0 = None  # read from snapshot_path when training starts

    # --- measurement ------------------------------------------------------------------------------
    def compute(self, model: torch.nn.Module) -> tuple[dict[str, float], dict[str, float]]:
        """(scalar metrics, per-tensor fractions) of the model against θ0."""
        if self.theta0 is None:
            raise RuntimeError("UpdateSparsity: no θ0 snapshot yet (taken when training starts)")
        report = update_sparsity(self.theta0, trainable_parameters(model), self.atol)
        metrics = {
            "sparsity/overall": report.overall,
            "sparsity/exact_zero": report.exact_zero,
            "sparsity/bf16_unchanged": report.bf16_unchanged,
            "sparsity/relative_update_norm": report.relative_update_norm,
        }
        metrics |= {f"sparsity/{group}": share for group, share in report.per_module_type.items()}
        return metrics, report.per_tensor

    def measure(self, trainer, pl_module) -> None:
        if trainer.global_step == self.last_step or self.theta0 is None:
            return
        self.last_step = trainer.global_step
        metrics, per_tensor = self.compute(pl_module.student)
        self.latest = metrics
        log_scalars(trainer, metrics)
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                values = np.asarray(list(per_tensor.values()), dtype=np.float64)
                logger.experiment.add_histogram("sparsity/per_tensor", values, trainer.global_step)

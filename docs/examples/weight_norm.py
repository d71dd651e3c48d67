# docs/examples/weight_norm.py
"""A measurement of your own (docs/extending.md): the student's weight norm, logged every N
optimiser steps and at the end of fit, and written into metrics.json."""

import lightning as L
import torch

from distill.callbacks.contract import StudentHolder, require
from distill.callbacks.generation import log_scalars
from distill.callbacks.interval import StepInterval
from distill.checks import check_int
from distill.parallel import gathered


class WeightNorm(L.Callback):
    """Logs `weights/student_norm`, the L2 norm of the student's trainable parameters.

    Args:
        every_n_steps: measure every N optimiser steps (plus the end of fit).
    """

    def __init__(self, every_n_steps: int = 50):
        self.every_n_steps = check_int("WeightNorm.every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        self.latest: float | None = None

    def setup(self, trainer, pl_module, stage):
        require(pl_module, StudentHolder, "WeightNorm")  # fails before the first step, naming what is missing

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.interval.batch_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.interval.due_after(trainer):
            self.measure(trainer, pl_module)

    def on_train_end(self, trainer, pl_module):
        self.measure(trainer, pl_module)

    def measure(self, trainer, pl_module):
        with torch.no_grad(), gathered(pl_module.student):  # FSDP2: the whole student, on every rank
            squares = sum(
                float(p.float().pow(2).sum()) for p in pl_module.student.parameters() if p.requires_grad
            )
        self.latest = squares**0.5
        log_scalars(trainer, {"weights/student_norm": self.latest})

    def summary(self) -> dict[str, float]:  # what the run adds to metrics.json
        return {} if self.latest is None else {"weights/student_norm": self.latest}

    def state_dict(self) -> dict:  # saved in checkpoints, so a resumed run continues exactly
        return {"latest": self.latest}

    def load_state_dict(self, state_dict: dict) -> None:
        self.latest = state_dict["latest"]

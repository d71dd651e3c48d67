"""Faults a test can arm in a real `distill fit` subprocess, through the environment only, so that
every attempt of a run has the same config (a resume compares it with the checkpoint's):

- `KillAt`: SIGKILL its own process after optimiser step `DISTILL_TEST_KILL_AT_STEP`, or when
  testing starts if `DISTILL_TEST_KILL_IN=test` (after training and export);
- `PoisonAt`: after optimiser step `DISTILL_TEST_POISON_AT_STEP`, fill the student's weights
  with NaN (what a diverged update leaves behind)."""

from __future__ import annotations

import math
import os
import signal

import torch
from lightning.pytorch.callbacks import Callback


def _armed(name: str, trainer) -> bool:
    step = os.environ.get(name)
    return step is not None and trainer.global_step == int(step)


class KillAt(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _armed("DISTILL_TEST_KILL_AT_STEP", trainer):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_test_start(self, trainer, pl_module) -> None:
        if os.environ.get("DISTILL_TEST_KILL_IN") == "test":
            os.kill(os.getpid(), signal.SIGKILL)


class PoisonAt(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if _armed("DISTILL_TEST_POISON_AT_STEP", trainer):
            with torch.no_grad():
                for p in pl_module.student.parameters():
                    p.fill_(math.nan)

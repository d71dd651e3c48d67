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
import time

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


def _rank(trainer) -> int:
    return int(trainer.global_rank)


class SignalAt(Callback):
    """`DISTILL_TEST_SIGNAL_AT_STEP=k` on rank `DISTILL_TEST_SIGNAL_RANK` (default 0): SIGTERM its
    own process after optimiser step k (`DISTILL_TEST_SIGNAL_IN=step`, the default) or in the first
    validation batch after it (`validation`), then stay busy `DISTILL_TEST_STALL_S` seconds (a
    compile: the other rank runs on into its next collective meanwhile). `DISTILL_TEST_SIGKILL=1`
    sends SIGKILL instead (the launcher's death, when the rank is 0); `DISTILL_TEST_SIGNAL_RUN`
    arms it only in the run directory whose path ends so (a sweep's run)."""

    def _fire(self, trainer, where: str) -> None:
        if not _armed("DISTILL_TEST_SIGNAL_AT_STEP", trainer):
            return
        if os.environ.get("DISTILL_TEST_SIGNAL_IN", "step") != where:
            return
        only = os.environ.get("DISTILL_TEST_SIGNAL_RUN")  # in a sweep: the run whose directory ends so
        if only and not str(trainer.default_root_dir).endswith(only):
            return
        if _rank(trainer) != int(os.environ.get("DISTILL_TEST_SIGNAL_RANK", "0")) or getattr(
            self, "fired", False
        ):
            return
        self.fired = True
        kill = os.environ.get("DISTILL_TEST_SIGKILL") == "1"
        os.kill(os.getpid(), signal.SIGKILL if kill else signal.SIGTERM)
        # Sleeping lets the signal's reader run now, so the stop comes at this step's end.
        time.sleep(float(os.environ.get("DISTILL_TEST_STALL_S", "0.5")))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._fire(trainer, "step")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._fire(trainer, "validation")

"""`PhaseMark`: the callback benchmarks/gpu_smoke.py puts before the first measurement callback and
after each one, so that each phase's peak memory goes to the phase, or the callback, that ran."""

from __future__ import annotations

import resource
import time

import lightning as L
import torch


class Recorder:
    """Peak memory and seconds per label: `close(label)` puts everything since the previous close
    down to `label`. The peak is `torch.cuda.max_memory_allocated` (reset at every close) on a GPU,
    the process's peak RSS so far on the CPU (it cannot be reset)."""

    def __init__(self):
        self.peak: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.shapes: dict[str, list[int]] = {}  # phase -> [rows, prompt width, completion width]
        self.start = time.perf_counter()

    def close(self, label: str) -> None:
        now = time.perf_counter()
        self.seconds[label] = self.seconds.get(label, 0.0) + now - self.start
        self.start = now
        if torch.cuda.is_available():
            peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        self.peak[label] = max(self.peak.get(label, 0), peak)

    def shape(self, phase: str, rollout) -> None:
        from distill.models.forward import completion_width

        rows, width = rollout.input_ids.shape
        new = completion_width(rollout.completion_mask[:, 1:])
        old = self.shapes.get(phase, [0, 0, 0])
        self.shapes[phase] = [max(old[0], rows), max(old[1], width - new), max(old[2], new)]


RECORDER = Recorder()
# What ran just before a hook when no callback did: the module's own phases.
BEFORE = {
    "on_train_start": "setup",
    "on_train_batch_start": "rollout",  # sampled in the datamodule's on_after_batch_transfer
    "on_train_batch_end": "step",
    "on_validation_start": "other",
    "on_validation_batch_start": "evaluation",
    "on_validation_batch_end": "evaluation",
    "on_validation_epoch_end": "evaluation",
    "on_validation_end": "evaluation",
    "on_train_end": "other",
}


class PhaseMark(L.Callback):
    """Put before the first measurement callback and after each one (Lightning calls callbacks in
    list order): at every hook the peak since the previous mark goes to the callback this mark
    follows (`after`), or, for the first mark, to the module's phase that ran before the hook."""

    def __init__(self, after: str = ""):
        self.after = after

    def _close(self, hook: str, batch=None, phase: str = "") -> None:
        if batch is not None and not self.after:
            RECORDER.shape(phase, batch["rollout"])
        RECORDER.close(self.after or BEFORE[hook])

    def on_train_start(self, trainer, pl_module):
        self._close("on_train_start")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._close("on_train_batch_start", batch, "rollout")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._close("on_train_batch_end")

    def on_validation_start(self, trainer, pl_module):
        self._close("on_validation_start")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._close("on_validation_batch_start", batch, "evaluation")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._close("on_validation_batch_end")

    def on_validation_epoch_end(self, trainer, pl_module):
        self._close("on_validation_epoch_end")

    def on_validation_end(self, trainer, pl_module):
        self._close("on_validation_end")

    def on_train_end(self, trainer, pl_module):
        self._close("on_train_end")

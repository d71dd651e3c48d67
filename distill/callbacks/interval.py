"""`StepInterval`: when a measurement callback is due, in optimiser steps.

One training batch may take several optimiser steps (GRPO's `num_iterations` passes over a rollout
batch), so `trainer.global_step % n == 0` can skip every multiple of `n` (steps 2, 4, 6, ... never
hit 5). A batch is due when a multiple of `n` lies among the steps it takes."""

from __future__ import annotations


def steps_per_batch(pl_module) -> int:
    """Optimiser steps the coming batch takes, as the module says (`optimizer_steps_per_batch`,
    e.g. GRPO's `num_iterations` cut at `max_steps`); 1 for modules that step once per batch."""
    steps = getattr(pl_module, "optimizer_steps_per_batch", None)
    return steps() if steps is not None else 1


class StepInterval:
    """Every `n` optimiser steps. Call `batch_start` in `on_train_batch_start`; then `due_after`
    in `on_train_batch_end` says whether the batch crossed a multiple of `n`, and `due_before`
    (in `on_train_batch_start`, for hooks that must arm before the backward pass) whether it will."""

    def __init__(self, n: int):
        self.n = n
        self.before = 0

    def _crosses(self, before: int, after: int) -> bool:
        return after // self.n > before // self.n

    def batch_start(self, trainer) -> None:
        self.before = trainer.global_step

    def due_before(self, trainer, pl_module) -> bool:
        step = trainer.global_step
        return self._crosses(step, step + steps_per_batch(pl_module))

    def due_after(self, trainer) -> bool:
        return self._crosses(self.before, trainer.global_step)

"""Measurement intervals count optimiser steps, also when a batch takes several (GRPO)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distill.callbacks import GradientStats
from distill.callbacks.interval import StepInterval, steps_per_batch
from distill.rl.module import GRPOModule
from distill.rl.objective import GRPOObjective


def _grpo_like(trainer, passes: int):
    """A stand-in module whose `optimizer_steps_per_batch` is GRPOModule's own method."""
    module = SimpleNamespace(objective=GRPOObjective(num_iterations=passes), trainer=trainer)
    module.optimizer_steps_per_batch = lambda: GRPOModule.optimizer_steps_per_batch(
        SimpleNamespace(objective=module.objective, trainer=trainer, global_step=trainer.global_step)
    )
    return module


def _run(n: int, passes: int, batches: int, max_steps: int = -1):
    """Walk `batches` training batches of `passes` optimiser steps each; return the global steps
    after the batches that `due_before` (decided at batch start) and `due_after` flag."""
    trainer = SimpleNamespace(global_step=0, max_steps=max_steps)
    module = _grpo_like(trainer, passes)
    interval, before, after = StepInterval(n), [], []
    for _ in range(batches):
        interval.batch_start(trainer)
        armed = interval.due_before(trainer, module)
        trainer.global_step += steps_per_batch(module)
        if armed:
            before.append(trainer.global_step)
        if interval.due_after(trainer):
            after.append(trainer.global_step)
    return before, after


@pytest.mark.parametrize(
    ("n", "passes", "expected"),
    [
        (5, 1, [5, 10, 15, 20]),
        (5, 2, [6, 10, 16, 20]),  # the batches taking steps 5-6, 9-10, 15-16, 19-20
        (10, 2, [10, 20]),
        (1, 2, [2, 4, 6, 8, 10, 12, 14, 16, 18, 20]),
        (3, 4, [4, 8, 12, 16, 20]),  # every batch of 4 steps holds a multiple of 3
    ],
)
def test_a_batch_is_due_when_one_of_its_steps_is_a_multiple(n, passes, expected):
    before, after = _run(n, passes, batches=20 // passes)
    assert before == after == expected


def test_the_last_batch_is_cut_at_max_steps():
    trainer = SimpleNamespace(global_step=9, max_steps=10)
    assert steps_per_batch(_grpo_like(trainer, 4)) == 1
    assert steps_per_batch(SimpleNamespace()) == 1  # a module that steps once per batch
    assert _run(5, 2, batches=3, max_steps=5) == ([5], [5])  # steps 1-2, 3-4, then 5 alone


def test_gradient_stats_arms_on_grpo_batches_that_cross_its_interval():
    """The bug it fixes: with num_iterations 2, `(global_step + 1) % 10` is never 0."""
    stats = GradientStats(every_n_steps=10)
    trainer = SimpleNamespace(global_step=0, max_steps=100)
    module = _grpo_like(trainer, 2)
    armed = []
    for _ in range(10):
        stats.on_train_batch_start(trainer, module, None, 0)
        if stats.active:
            armed.append(trainer.global_step)
        trainer.global_step += 2
    assert armed == [8, 18]

"""`StepLoop`: both trainers (distillation, GRPO) run their micro-batches and optimiser steps
through the one implementation, and its pieces do what they say."""

from __future__ import annotations

import math
from unittest import mock

import lightning as L
import pytest
import torch

from distill.data import RolloutDataModule
from distill.losses import ForwardKL
from distill.module import DistillationModule
from distill.rl import GRPOModule
from distill.training import StepLoop


def _fit(module, data, max_steps: int) -> None:
    L.Trainer(
        max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
        num_sanity_val_steps=0,
    ).fit(module, data)  # fmt: skip


def _trainers(world):
    student, teacher = str(world / "student"), str(world / "teacher")
    data = dict(
        task="countdown3",
        batch_size=2,
        train_size=8,
        evaluation={"val_size": 0},
        sampling={"max_new_tokens": 6},
        prompts={"tokenizer": student},
    )
    distill = DistillationModule(student=student, teacher=teacher, divergence=ForwardKL(), micro_batch_size=1)
    grpo = GRPOModule(student=student, micro_batch_size=1, objective={"num_iterations": 2}, text_log={"every": 0})
    return [
        ("distillation", distill, RolloutDataModule(mix=0.5, **data)),
        ("grpo", grpo, RolloutDataModule(group_size=2, **data)),  # two passes over one batch
    ]


def test_both_trainers_step_through_the_one_loop(quick_world):
    for name, module, data in _trainers(quick_world):
        with (
            mock.patch.object(StepLoop, "backward", autospec=True, side_effect=StepLoop.backward) as backward,
            mock.patch.object(
                StepLoop, "optimizer_step", autospec=True, side_effect=StepLoop.optimizer_step
            ) as step,
        ):
            _fit(module, data, max_steps=2)
        assert step.call_count == 2, name  # every optimiser step of the run
        assert backward.call_count == 2, name  # one backward pass per optimiser step
        assert all(call.args[0] is module.loop for call in step.call_args_list), name
        rows = {call.args[2] for call in backward.call_args_list}
        assert rows == {2 * (1 if name == "distillation" else 2)}, name  # batch x group size
        assert module.global_step == 2, name


def test_micro_batches_cover_the_rows_once():
    loop = StepLoop(micro_batch_size=3, gradient_clip_val=None, max_nonfinite_steps=1)
    parts = loop.micro_batches(8)
    assert [(p.start, p.stop) for p in parts] == [(0, 3), (3, 6), (6, 9)]
    assert sorted(i for p in parts for i in range(8)[p]) == list(range(8))
    assert StepLoop(None, None, 1).micro_batches(5) == [slice(0, 5)]


class _Owner(torch.nn.Module):
    """What `StepLoop` needs of a module, without a Trainer: a student, its optimiser, no schedule."""

    _trainer = None

    def __init__(self):
        super().__init__()
        self.student = torch.nn.Linear(3, 1)
        self.optimizer = torch.optim.SGD(self.student.parameters(), lr=0.1)

    def optimizers(self):
        return self.optimizer

    def lr_schedulers(self):
        return None


def test_optimizer_step_clips_and_skips_a_non_finite_step():
    owner = _Owner()
    loop = StepLoop(micro_batch_size=2, gradient_clip_val=0.5, max_nonfinite_steps=3)
    x = torch.randn(4, 3)
    loop.backward(owner, 4, lambda rows: 100 * owner.student(x[rows]).sum())
    before = [p.detach().clone() for p in owner.student.parameters()]
    expected_norm = torch.nn.utils.get_total_norm([p.grad for p in owner.student.parameters()])
    grads = [p.grad.clone() for p in owner.student.parameters()]
    grad_norm, _ = loop.optimizer_step(owner, torch.tensor(1.0))
    torch.testing.assert_close(grad_norm, expected_norm)
    for b, g, p in zip(before, grads, owner.student.parameters()):  # SGD by the clipped gradient
        torch.testing.assert_close(
            p.detach(), b - 0.1 * g * (0.5 / float(expected_norm)), rtol=1e-4, atol=1e-6
        )
        assert p.grad is None
    moved = [p.detach().clone() for p in owner.student.parameters()]
    loop.backward(owner, 4, lambda rows: owner.student(x[rows]).sum())
    loop.optimizer_step(owner, math.nan)
    assert loop.guard.skipped == 1
    for m, p in zip(moved, owner.student.parameters()):
        assert torch.equal(m, p.detach()) and p.grad is None


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"micro_batch_size": 0}, "model.micro_batch_size must be None or an integer >= 1, got 0"),
        ({"gradient_clip_val": 0.0}, "model.gradient_clip_val must be None or a finite number > 0"),
        ({"max_nonfinite_steps": 0}, "model.max_nonfinite_steps must be an integer >= 1"),
    ],
)
def test_bad_loop_settings_are_named(options, match):
    settings = {"micro_batch_size": None, "gradient_clip_val": 1.0, "max_nonfinite_steps": 5} | options
    with pytest.raises(ValueError, match=match):
        StepLoop(**settings)

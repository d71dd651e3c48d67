"""GradientStats: the forward-KL logit-gradient identity, and the recorded per-token squared norms."""

from __future__ import annotations

import pytest
import torch

from distill.callbacks import GradientStats
from distill.losses import ForwardKL
from distill.rollout import RolloutBatch
from distill.training import StepResult


def random_case(seed: int = 0, b: int = 3, t: int = 6, v: int = 13):
    g = torch.Generator().manual_seed(seed)
    student = torch.randn(b, t, v, generator=g, dtype=torch.float64)
    teacher = torch.randn(b, t, v, generator=g, dtype=torch.float64)
    mask = torch.rand(b, t, generator=g) < 0.7
    teacher_mask = mask & (torch.rand(b, t, generator=g) < 0.5)
    return student, teacher, mask, teacher_mask


def test_forward_kl_logit_gradient_is_ps_minus_pt_over_num_items():
    student, teacher, mask, _ = random_case()
    num_items = int(mask.sum()) + 5  # the step's tokens may include other micro-batches
    s = student.clone().requires_grad_(True)
    ForwardKL()(s, teacher, mask, num_items=num_items).backward()
    expected = (student.softmax(-1) - teacher.softmax(-1)) * mask[..., None] / num_items
    assert torch.allclose(s.grad, expected, atol=1e-10)


def run_step(cb, student, teacher, mask, teacher_mask, micro: int):
    """Backward a forward-KL step in micro-batches, with the hook the module registers."""
    num_items = torch.tensor(int(mask.sum()))
    for start in range(0, student.shape[0], micro):
        rows = slice(start, start + micro)
        s = student[rows].clone().requires_grad_(True)
        m, tm = mask[rows], teacher_mask[rows]
        s.register_hook(lambda g, m=m, tm=tm: cb.record(g, m, tm, num_items))
        ForwardKL()(s, teacher[rows], m, num_items=num_items).backward()


def outputs(grad_norm: float) -> dict:
    """A training step's outputs (`StepResult.output()`) carrying only what GradientStats reads."""
    ids = torch.zeros(1, 2, dtype=torch.long)
    none = torch.zeros(1, 2, dtype=torch.bool)
    rollout = RolloutBatch(ids, torch.ones_like(ids), none, none, 1)
    return StepResult(torch.tensor(0.0), rollout, 1, grad_norm).output()


@pytest.mark.parametrize("micro", [3, 1])
def test_recorded_norms_equal_direct_computation(micro, fake_trainer, fake_module):
    student, teacher, mask, teacher_mask = random_case(seed=1)
    direct = (student.softmax(-1) - teacher.softmax(-1)).square().sum(-1)  # ‖p_S - p_T‖² per token
    expected = {
        "grad/logit_sq_norm": direct[mask].mean().item(),
        "grad/logit_sq_norm_teacher_tokens": direct[teacher_mask].mean().item(),
        "grad/logit_sq_norm_student_tokens": direct[mask & ~teacher_mask].mean().item(),
        "grad/param_norm": 0.75,
    }
    cb, trainer, module = GradientStats(), fake_trainer(), fake_module(None)
    cb.on_train_start(trainer, module)
    assert module.logit_grad_sink is cb
    cb.on_train_batch_start(trainer, module, None, 0)
    run_step(cb, student, teacher, mask, teacher_mask, micro)
    cb.on_train_batch_end(trainer, module, outputs(0.75), None, 0)
    step, logged = trainer.loggers[0].calls[-1]
    assert logged == pytest.approx(expected, rel=1e-6)
    assert cb.summary() == pytest.approx(expected, rel=1e-6)
    cb.on_train_end(trainer, module)
    assert module.logit_grad_sink is None


def test_split_without_tokens_is_skipped_and_interval_is_respected(fake_trainer, fake_module):
    student, teacher, mask, _ = random_case(seed=2)
    no_teacher = torch.zeros_like(mask)
    cb, trainer, module = GradientStats(every_n_steps=2), fake_trainer(), fake_module(None)
    cb.on_train_start(trainer, module)
    for step in range(2):  # steps 1 and 2: only step 2 is measured
        trainer.global_step = step
        cb.on_train_batch_start(trainer, module, None, 0)
        run_step(cb, student, teacher, mask, no_teacher, micro=3)
        cb.on_train_batch_end(trainer, module, outputs(1.0), None, 0)
    calls = trainer.loggers[0].calls
    assert len(calls) == 1
    assert "grad/logit_sq_norm_teacher_tokens" not in calls[0][1]
    assert calls[0][1]["grad/logit_sq_norm"] == pytest.approx(
        calls[0][1]["grad/logit_sq_norm_student_tokens"]
    )


@pytest.mark.parametrize(("clip", "expected"), [(1.0, 0.5), (None, None)])
def test_clip_share_counts_the_steps_whose_norm_exceeded_the_clip(clip, expected, fake_trainer, fake_module):
    """How often clipping changed the update: 2 of 4 measured steps exceed a clip of 1.0 (1.0 itself
    does not); a module that does not clip reports no share."""
    from types import SimpleNamespace

    cb, trainer, module = GradientStats(), fake_trainer(), fake_module(None)
    module.hparams = SimpleNamespace(gradient_clip_val=clip)
    cb.setup(trainer, module, "fit")
    cb.on_train_start(trainer, module)
    for step, norm in enumerate([0.5, 2.0, 1.0, 1.5]):
        trainer.global_step = step
        cb.on_train_batch_start(trainer, module, None, 0)
        cb.on_train_batch_end(trainer, module, outputs(norm), None, 0)
    assert cb.summary().get("grad/clip_share") == expected
    resumed = GradientStats()
    resumed.load_state_dict(cb.state_dict())
    resumed.setup(trainer, module, "test")  # a run resumed straight into testing
    assert resumed.summary() == cb.summary()


def test_totals_survive_resume():
    cb = GradientStats()
    cb.totals = {"sq": [2.0, 1.0, 1.0], "count": [4, 2, 2], "param_norm": 3.0, "steps": 2}
    resumed = GradientStats()
    resumed.load_state_dict(cb.state_dict())
    assert (
        resumed.summary()
        == cb.summary()
        == {
            "grad/logit_sq_norm": 0.5,
            "grad/logit_sq_norm_teacher_tokens": 0.5,
            "grad/logit_sq_norm_student_tokens": 0.5,
            "grad/param_norm": 1.5,
        }
    )


def test_options_are_validated():
    with pytest.raises(ValueError, match="GradientStats.every_n_steps must be an integer >= 1, got 0"):
        GradientStats(every_n_steps=0)

"""CostMeter: token, FLOP and time accounting on synthetic steps with known sizes."""

from __future__ import annotations

import pytest
import torch

from distill.callbacks import CostMeter
from distill.callbacks.cost_meter import matmul_parameters
from distill.rollout import RolloutBatch
from distill.training import StepCost, StepResult


def rollout(teacher_gen: int, student_gen: int, teacher_fwd: int, student_fwd: int, seconds: float):
    ids = torch.zeros(1, 2, dtype=torch.long)
    false = torch.zeros(1, 2, dtype=torch.bool)
    return RolloutBatch(
        ids,
        torch.ones_like(ids),
        false,
        false,
        1,
        teacher_gen,
        student_gen,
        teacher_fwd,
        student_fwd,
        seconds,
    )


def step(r, teacher_forward: int, student_train: int, reused: bool = False, reference: int = 0) -> dict:
    cost = StepCost(
        student_train_tokens=student_train,
        teacher_forward_tokens=teacher_forward,
        reference_forward_tokens=reference,
        student_forward_backward_s=0.5,
        teacher_forward_s=0.25,
        reference_forward_s=0.125 if reference else 0.0,
    )
    return StepResult(torch.tensor(0.0), r, 1, 1.0, cost, reused_rollout=reused).output()


def test_matmul_parameters_counts_tied_embedding_once_and_drops_a_separate_input_table(tiny_student):
    from transformers import LlamaForCausalLM

    from distill.models.tiny import llama_config

    emb = tiny_student.get_input_embeddings().weight.numel()
    body = sum(p.numel() for n, p in tiny_student.named_parameters() if "embed_tokens" not in n)
    assert matmul_parameters(tiny_student) == body + emb  # tied: the table is the output projection
    cfg = llama_config(vocab_size=112, hidden_size=32, num_layers=1, num_heads=2)
    cfg.tie_word_embeddings = False
    untied = LlamaForCausalLM(cfg)
    assert matmul_parameters(untied) == sum(p.numel() for p in untied.parameters()) - 112 * 32


def test_counts_flops_and_reuse(fake_trainer, fake_module, tiny_student, tiny_teacher):
    meter, trainer = CostMeter(), fake_trainer()
    module = fake_module(tiny_student, tiny_teacher)
    meter.on_fit_start(trainer, module)
    meter.on_train_start(trainer, module)
    n_s, n_t = matmul_parameters(tiny_student), matmul_parameters(tiny_teacher)
    first = rollout(teacher_gen=30, student_gen=10, teacher_fwd=100, student_fwd=40, seconds=2.0)
    second = rollout(teacher_gen=0, student_gen=20, teacher_fwd=0, student_fwd=50, seconds=1.0)
    # Step 2 reuses step 1's rollout (refresh_every=2); step 3 has a fresh one.
    for i, (r, reused) in enumerate([(first, False), (first, True), (second, False)], start=1):
        trainer.global_step = i
        out = step(r, teacher_forward=60, student_train=60, reused=reused)
        meter.on_train_batch_end(trainer, module, out, None, 0)
    meter.on_fit_end(trainer, module)
    out = meter.summary()
    assert out["cost/teacher_generated_tokens"] == 30
    assert out["cost/student_generated_tokens"] == 30
    assert out["cost/teacher_forward_tokens"] == 100 + 3 * 60
    assert out["cost/student_forward_tokens"] == 40 + 50 + 3 * 60
    assert out["cost/flops"] == 2 * n_t * (100 + 180) + 2 * n_s * 90 + 6 * n_s * 180
    assert out["cost/reference_forward_tokens"] == 0 and out["cost/time/reference_forward"] == 0
    assert out["cost/time/rollout"] == pytest.approx(3.0)
    assert out["cost/time/teacher_forward"] == pytest.approx(0.75)
    assert out["cost/time/student_forward_backward"] == pytest.approx(1.5)
    assert 0 <= out["cost/wall_s"] < 60
    assert [s for s, _ in trainer.loggers[0].calls] == [1, 2, 3]
    assert trainer.loggers[0].calls[-1][1]["cost/flops"] == out["cost/flops"]


def test_a_reference_model_is_costed(fake_trainer, fake_module, tiny_student, tiny_teacher):
    """GRPO: no teacher, a frozen reference (here tiny_teacher's shape) read once per batch."""
    meter, trainer = CostMeter(), fake_trainer()
    module = fake_module(tiny_student)
    module.reference = tiny_teacher
    meter.on_fit_start(trainer, module)
    meter.on_train_start(trainer, module)
    n_s, n_r = matmul_parameters(tiny_student), matmul_parameters(tiny_teacher)
    r = rollout(teacher_gen=0, student_gen=12, teacher_fwd=0, student_fwd=30, seconds=1.0)
    for i in (1, 2):
        trainer.global_step = i
        meter.on_train_batch_end(trainer, module, step(r, 0, student_train=80, reference=40), None, 0)
    out = meter.summary()
    assert out["cost/reference_forward_tokens"] == 80 and out["cost/teacher_forward_tokens"] == 0
    assert out["cost/flops"] == 2 * n_r * 80 + 2 * n_s * 60 + 6 * n_s * 160
    assert out["cost/time/reference_forward"] == pytest.approx(0.25)


def test_totals_survive_resume(fake_trainer, fake_module, tiny_student):
    meter, trainer = CostMeter(), fake_trainer()
    module = fake_module(tiny_student)
    meter.on_fit_start(trainer, module)
    meter.on_train_start(trainer, module)
    meter.on_train_batch_end(trainer, module, step(rollout(0, 7, 0, 9, 0.5), 20, 20), None, 0)
    meter.on_validation_start(trainer, module)
    meter.on_validation_end(trainer, module)
    state = meter.state_dict()
    resumed = CostMeter()
    resumed.load_state_dict(state)
    resumed.on_fit_start(trainer, module)
    resumed.on_train_start(trainer, module)
    resumed.on_train_batch_end(trainer, module, step(rollout(0, 3, 0, 4, 0.5), 20, 20), None, 0)
    out = resumed.summary()
    assert out["cost/student_generated_tokens"] == 10
    assert out["cost/student_forward_tokens"] == 9 + 4 + 40
    assert out["cost/teacher_forward_tokens"] == 40  # no teacher: training forward only
    assert out["cost/time/rollout"] == pytest.approx(1.0)
    assert out["cost/time/evaluation"] >= state["times"]["evaluation"] > 0
    assert out["cost/wall_s"] >= state["wall_s"]


def test_options_are_validated():
    with pytest.raises(ValueError, match="CostMeter.every_n_steps must be an integer >= 1, got 0"):
        CostMeter(every_n_steps=0)

"""UpdateSparsity: known perturbations give known fractions; θ0 is written once and read back on resume."""

from __future__ import annotations

import math

import pytest
import torch

from distill.callbacks import UpdateSparsity
from distill.callbacks.update_sparsity import trainable_parameters


def perturb(model) -> dict:
    """Move 10 attention entries by 1.0 and one norm entry by 1e-6 (within atol); return the
    expected measurements, counted by hand from the parameter shapes."""
    params = dict(model.named_parameters())
    q = params["model.layers.0.self_attn.q_proj.weight"]
    norm = params["model.layers.0.input_layernorm.weight"]
    with torch.no_grad():
        sq_before = sum(float(p.double().square().sum()) for p in params.values())
        q.view(-1)[:10] += 1.0
        norm.view(-1)[0] += 1e-6
        moved_norm = float(norm.view(-1)[0].double() - 1.0)  # what float32 stored
    total = sum(p.numel() for p in params.values())
    attention = sum(p.numel() for n, p in params.items() if "self_attn" in n)
    return {
        "sparsity/overall": 1 - 10 / total,
        "sparsity/exact_zero": 1 - 11 / total,
        "sparsity/bf16_unchanged": 1 - 10 / total,  # the 1e-6 norm step rounds away in bfloat16
        "sparsity/attention": 1 - 10 / attention,
        "sparsity/norm": 1.0,
        "sparsity/mlp": 1.0,
        "sparsity/embedding": 1.0,
        "sparsity/relative_update_norm": math.sqrt(10 * 1.0 + moved_norm**2) / math.sqrt(sq_before),
    }


def test_known_perturbation_gives_expected_fractions(tiny_student, fake_trainer, fake_module, tmp_path):
    cb = UpdateSparsity(every_n_steps=2, atol=1e-5)
    module, trainer = fake_module(tiny_student), fake_trainer()
    cb.on_train_start(trainer, module)
    # Tied embeddings: the shared matrix is compared once, under its first name.
    assert "lm_head.weight" not in cb.theta0 and "model.embed_tokens.weight" in cb.theta0
    expected = perturb(tiny_student)
    trainer.global_step = 1
    cb.on_train_batch_end(trainer, module, None, None, 0)
    assert cb.latest == {}  # not an interval step
    trainer.global_step = 2
    cb.on_train_batch_end(trainer, module, None, None, 0)
    assert cb.latest == pytest.approx(expected, rel=1e-6)
    assert trainer.loggers[0].calls[-1] == (2, cb.latest)
    assert set(cb.summary()) == set(expected)


def test_snapshot_survives_resume_and_file_is_reused(tiny_student, fake_trainer, fake_module, tmp_path):
    cb = UpdateSparsity(offload_to_cpu=True)
    module, trainer = fake_module(tiny_student), fake_trainer()
    cb.on_train_start(trainer, module)
    path = tmp_path / "theta0.safetensors"
    assert cb.snapshot_path == str(path) and path.is_file()
    theta0 = {n: t.clone() for n, t in cb.theta0.items()}
    written = path.stat().st_mtime_ns
    expected = perturb(tiny_student)
    state = cb.state_dict()
    assert set(state) == {"snapshot_path", "latest", "last_step"}  # the path, not the tensors

    resumed = UpdateSparsity(offload_to_cpu=True)
    resumed.load_state_dict(state)
    resumed.on_train_start(trainer, module)  # loads θ0 from the file, does not re-snapshot
    assert path.stat().st_mtime_ns == written
    assert set(resumed.theta0) == set(theta0)
    assert all(torch.equal(resumed.theta0[n], theta0[n]) for n in theta0)
    metrics, per_tensor = resumed.compute(tiny_student)
    assert metrics == pytest.approx(expected, rel=1e-6)
    assert per_tensor["model.layers.0.self_attn.q_proj.weight"] < 1.0
    assert per_tensor["model.layers.0.mlp.up_proj.weight"] == 1.0


def test_resume_without_snapshot_file_fails_clearly(tiny_student, fake_trainer, fake_module, tmp_path):
    cb = UpdateSparsity(snapshot_path=str(tmp_path / "elsewhere" / "t0.safetensors"))
    module, trainer = fake_module(tiny_student), fake_trainer()
    cb.on_train_start(trainer, module)
    (tmp_path / "elsewhere" / "t0.safetensors").unlink()
    resumed = UpdateSparsity()
    resumed.load_state_dict(cb.state_dict())
    with pytest.raises(FileNotFoundError, match="t0.safetensors.*does not exist"):
        resumed.on_train_start(trainer, module)


def test_frozen_parameters_are_not_compared(tiny_student):
    tiny_student.model.norm.weight.requires_grad_(False)
    assert "model.norm.weight" not in trainable_parameters(tiny_student)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_steps": 0}, "UpdateSparsity.every_n_steps must be an integer >= 1, got 0"),
        ({"atol": -1.0}, "UpdateSparsity.atol must be a finite number >= 0, got -1.0"),
    ],
)
def test_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        UpdateSparsity(**kwargs)

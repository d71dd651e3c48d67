"""Update sparsity on constructed state dicts, checked against direct float64 computations."""

from __future__ import annotations

import math

import pytest
import torch

from distill.metrics.sparsity import (
    SparsityReport,
    UpdateCounts,
    module_type,
    tensor_update_counts,
    update_sparsity,
)


def changed_share(before, share, delta=1.0, seed=0):
    """Add `delta` to exactly `share` of the entries of each tensor (chosen at random)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in before.items():
        flat = t.clone().reshape(-1)
        idx = torch.randperm(flat.numel(), generator=gen)[: round(share * flat.numel())]
        flat[idx] += delta
        out[name] = flat.reshape(t.shape)
    return out


def test_known_share_changed():
    torch.manual_seed(0)
    before = {"a": torch.randn(10, 10), "b": torch.randn(50)}
    after = changed_share(before, 0.3)
    report = update_sparsity(before, after)
    assert isinstance(report, SparsityReport)
    assert report.overall == pytest.approx(0.7)
    assert report.exact_zero == pytest.approx(0.7)
    assert report.per_tensor == {"a": pytest.approx(0.7), "b": pytest.approx(0.7)}
    assert report.numel == 150
    assert report.per_module_type == {"other": pytest.approx(0.7)}


def test_changes_within_atol_count_as_unchanged():
    before = {"w": torch.zeros(1000)}
    after = {"w": torch.zeros(1000)}
    after["w"][:100] = 5e-6  # below atol: unchanged, but not exactly equal
    after["w"][100:300] = 1e-3  # above atol
    report = update_sparsity(before, after, atol=1e-5)
    assert report.overall == pytest.approx(0.8)
    assert report.exact_zero == pytest.approx(0.7)
    assert update_sparsity(before, after, atol=0.0).overall == pytest.approx(0.7)
    assert update_sparsity(before, after, atol=1e-2).overall == 1.0


def test_identical_state_dicts():
    torch.manual_seed(0)
    sd = {"x": torch.randn(4, 4), "y": torch.randn(3)}
    report = update_sparsity(sd, {k: v.clone() for k, v in sd.items()})
    assert (report.overall, report.exact_zero, report.relative_update_norm) == (1.0, 1.0, 0.0)


def test_relative_update_norm_matches_direct_computation():
    torch.manual_seed(0)
    before = {"a": torch.randn(30, 7), "b": torch.randn(11), "c": torch.randn(2, 3, 4)}
    after = {k: v + 0.01 * torch.randn_like(v) for k, v in before.items()}
    diff = torch.cat([(after[k].double() - before[k].double()).reshape(-1) for k in before])
    base = torch.cat([before[k].double().reshape(-1) for k in before])
    expected = (diff.norm() / base.norm()).item()
    assert update_sparsity(before, after).relative_update_norm == pytest.approx(expected, rel=1e-5)


def test_chunking_does_not_change_results():
    torch.manual_seed(0)
    before = {"a": torch.randn(37, 5), "b": torch.randn(101)}
    after = changed_share(before, 0.45, delta=0.5)
    whole = update_sparsity(before, after)
    for chunk in (1, 7, 64):
        sliced = update_sparsity(before, after, chunk_numel=chunk)
        assert sliced.overall == whole.overall
        assert sliced.per_tensor == whole.per_tensor
        assert sliced.relative_update_norm == pytest.approx(whole.relative_update_norm, rel=1e-6)


def test_bf16_one_ulp_updates_are_measured_as_stored():
    # What is checked: values are compared as stored, after casting to float32. bf16 keeps 8
    # significant bits, so the smallest update it can store is one ulp: 2**-7 for weights in
    # [1, 2) (a 0.4-0.8 % relative change). Such an update must be seen exactly, as a difference
    # of 2**-7, on exactly the entries that changed.
    gen = torch.Generator().manual_seed(0)
    before = (1 + 0.9 * torch.rand(1000, generator=gen)).to(torch.bfloat16)  # stays below 2
    bits = before.view(torch.int16).clone()
    bits[:300] += 1  # next representable bf16 value up (positive numbers)
    after = bits.view(torch.bfloat16)
    report = update_sparsity({"w": before}, {"w": after})
    assert report.overall == pytest.approx(0.7)
    assert report.exact_zero == pytest.approx(0.7)
    diff = after.float() - before.float()
    assert torch.equal(diff[:300], torch.full((300,), 2.0**-7))
    # A 1e-3 relative update computed in float32 is below bf16 spacing: it rounds back to the same
    # stored weights, so nothing changed and nothing is reported.
    nudged = (before.float() * (1 + 1e-3)).to(torch.bfloat16)
    assert update_sparsity({"w": before}, {"w": nudged}).exact_zero == 1.0


def test_bf16_updates_below_atol_are_seen_only_by_exact_zero():
    # On weights around 1e-3 a one-ulp bf16 change is about 4e-6..8e-6, below atol=1e-5:
    # `.overall` calls it unchanged, `.exact_zero` still sees it.
    before = torch.full((100,), 1.5e-3).to(torch.bfloat16)
    after = (before.view(torch.int16) + 1).view(torch.bfloat16)
    step = (after.float() - before.float())[0].item()
    assert 1e-6 < step < 1e-5
    report = update_sparsity({"w": before}, {"w": after}, atol=1e-5)
    assert (report.overall, report.exact_zero) == (1.0, 0.0)
    assert update_sparsity({"w": before}, {"w": after}, atol=step / 2).overall == 0.0


def test_fp16_squares_are_accumulated_in_float32():
    # 300**2 = 90000 overflows fp16 (max 65504); the norm must still be finite and right.
    before = torch.full((64,), 300.0, dtype=torch.float16)
    after = torch.full((64,), 301.0, dtype=torch.float16)
    report = update_sparsity({"w": before}, {"w": after})
    assert report.relative_update_norm == pytest.approx(1 / 300, rel=1e-6)
    assert report.overall == 0.0


def test_mixed_devices_and_dtypes():
    torch.manual_seed(0)
    before = torch.randn(20)
    after = before.clone().to(torch.bfloat16)
    # Compared in float32: the bf16 rounding of the float32 snapshot itself is a change.
    expected = (after.float() - before).abs().le(1e-5).float().mean().item()
    assert update_sparsity({"w": before}, {"w": after}).overall == pytest.approx(expected)
    if torch.cuda.is_available():
        cuda = update_sparsity({"w": before}, {"w": after.cuda()})
        assert cuda.overall == pytest.approx(expected)


def test_non_floating_tensors_are_skipped():
    before = {"w": torch.zeros(4), "step": torch.tensor(3)}
    after = {"w": torch.ones(4), "step": torch.tensor(4)}
    report = update_sparsity(before, after)
    assert report.per_tensor == {"w": 0.0}
    assert report.numel == 4


def test_per_module_type_on_llama_names():
    from transformers import LlamaForCausalLM

    from distill.models.tiny import llama_config

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".mlp." in name:
                param.add_(0.1)
    after = dict(model.named_parameters())
    report = update_sparsity(before, after)
    assert report.per_module_type == {"attention": 1.0, "mlp": 0.0, "embedding": 1.0, "norm": 1.0}
    mlp_numel = sum(p.numel() for n, p in after.items() if ".mlp." in n)
    assert report.overall == pytest.approx(1 - mlp_numel / report.numel)
    assert report.numel == sum(p.numel() for p in model.parameters())
    assert {n for n, f in report.per_tensor.items() if f == 0.0} == {
        f"model.layers.{i}.mlp.{p}.weight" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")
    }


@pytest.mark.parametrize(
    "name, kind",
    [
        ("model.layers.3.self_attn.q_proj.weight", "attention"),
        ("model.layers.3.self_attn.o_proj.bias", "attention"),
        ("model.layers.3.self_attn.q_norm.weight", "norm"),  # Qwen3
        ("model.layers.3.mlp.down_proj.weight", "mlp"),
        ("model.layers.3.input_layernorm.weight", "norm"),
        ("model.layers.3.post_attention_layernorm.weight", "norm"),
        ("model.norm.weight", "norm"),
        ("model.embed_tokens.weight", "embedding"),
        ("lm_head.weight", "embedding"),
        ("transformer.wte.weight", "embedding"),
        ("transformer.h.0.attn.c_proj.weight", "attention"),
        ("transformer.h.0.mlp.c_proj.weight", "mlp"),
        ("transformer.h.0.ln_1.weight", "norm"),
        ("score.weight", "other"),
    ],
)
def test_module_type(name, kind):
    assert module_type(name) == kind


def test_tensor_update_counts_fields():
    before = torch.tensor([0.0, 1.0, 2.0, 3.0])
    after = torch.tensor([0.0, 1.0 + 1e-6, 2.5, 1.0])
    counts = tensor_update_counts(before, after, atol=1e-5)
    assert counts == UpdateCounts(2, 1, 4, pytest.approx(0.25 + 4 + 1e-12), pytest.approx(14.0), 2)
    assert counts + counts == UpdateCounts(4, 2, 8, pytest.approx(8.5), pytest.approx(28.0), 4)


def test_errors_name_the_problem():
    a = {"x": torch.zeros(2, 3), "y": torch.zeros(1)}
    with pytest.raises(KeyError, match=r"missing from after: \['y'\], missing from before: \['z'\]"):
        update_sparsity(a, {"x": torch.zeros(2, 3), "z": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"'x' has shape \(2, 3\) before and \(3, 2\) after"):
        update_sparsity(a, {"x": torch.zeros(3, 2), "y": torch.zeros(1)})
    with pytest.raises(TypeError, match=r"'y' must be floating on both sides"):
        update_sparsity(a, {"x": torch.zeros(2, 3), "y": torch.zeros(1, dtype=torch.long)})
    with pytest.raises(ValueError, match=r"atol must be a finite number >= 0, got -1"):
        update_sparsity(a, a, atol=-1)
    with pytest.raises(ValueError, match=r"atol must be a finite number >= 0, got inf"):
        update_sparsity(a, a, atol=math.inf)
    with pytest.raises(ValueError, match=r"chunk_numel must be an integer >= 1, got 0"):
        update_sparsity(a, a, chunk_numel=0)
    with pytest.raises(ValueError, match="no floating-point tensors"):
        update_sparsity({}, {})


def test_bf16_reading_counts_updates_that_rounding_to_bfloat16_hides():
    # Entries near 1.0: bfloat16 keeps 8 bits of mantissa, so steps below 2**-9 round away.
    before = {"w": torch.ones(1000)}
    after = {"w": torch.ones(1000)}
    after["w"][:300] += 1e-4  # a small AdamW-sized step: changed in float32, not in bfloat16
    after["w"][300:400] += 0.25  # a large step: changed in both
    report = update_sparsity(before, after, atol=0.0)
    assert report.exact_zero == pytest.approx(0.6)
    assert report.bf16_unchanged == pytest.approx(0.9)
    # independent reading: round both sides, compare
    rounded = (before["w"].bfloat16() == after["w"].bfloat16()).float().mean()
    assert report.bf16_unchanged == pytest.approx(float(rounded))

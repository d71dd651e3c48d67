"""Step-level normalisation: accumulation invariance, num_items forms, step_token_count."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from distill.losses import build_divergence, step_token_count

LENGTHS = [3, 9, 1, 6, 12, 2, 7, 4]  # completion lengths of the 8 sequences
T, V = 12, 11


def _batch():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(8, T, V, generator=g)
    t = torch.randn(8, T, V, generator=g)
    tokens = torch.randint(0, V, (8, T), generator=g)
    mask = torch.zeros(8, T, dtype=torch.bool)
    for i, n in enumerate(LENGTHS):
        mask[i, T - n :] = True  # completion at the end, prompt before it
    return s, t, tokens, mask


@pytest.mark.parametrize("name,estimator", [("forward_kl", "exact"), ("jsd", "topk"), ("reverse_kl", "k3")])
def test_eight_micro_batches_equal_one_batch(name, estimator):
    s, t, tokens, mask = _batch()
    div = build_divergence(name, estimator=estimator, top_k=3)
    num_items = step_token_count([mask[i : i + 1] for i in range(8)])
    assert int(num_items) == sum(LENGTHS)

    leaf = s.clone().requires_grad_()
    full = div(leaf, t, mask, tokens, num_items=num_items)
    full.backward()
    grad_full = leaf.grad.clone()

    leaf.grad = None
    total = 0.0
    for i in range(8):  # gradient accumulation: grads add up across backward calls
        part = div(leaf[i : i + 1], t[i : i + 1], mask[i : i + 1], tokens[i : i + 1], num_items=num_items)
        part.backward()
        total += part.item()
    torch.testing.assert_close(leaf.grad, grad_full, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(torch.tensor(total), full.detach(), rtol=1e-5, atol=1e-7)
    # with the step count, a batch equals the token mean; per-micro-batch means would not
    torch.testing.assert_close(full, div(s, t, mask, tokens))
    mean_of_means = (
        sum(div(s[i : i + 1], t[i : i + 1], mask[i : i + 1], tokens[i : i + 1]) for i in range(8)) / 8
    )
    assert not torch.allclose(mean_of_means, full)


@pytest.mark.parametrize("num_items", [57, 57.0, torch.tensor(57), torch.tensor([57.0])])
def test_num_items_forms_give_masked_sum_over_count(num_items):
    s, t, _, mask = _batch()
    div = build_divergence("reverse_kl")
    want = (div.per_token(s, t) * mask).sum() / 57
    torch.testing.assert_close(div(s, t, mask, num_items=num_items), want)


def test_float_mask_acts_as_weights():
    s, t, _, mask = _batch()
    w = mask.float() * torch.linspace(0.5, 2.0, T)
    div = build_divergence("tvd")
    want = (div.per_token(s, t) * w).sum() / w.sum()
    torch.testing.assert_close(div(s, t, w), want)


@pytest.mark.parametrize("bad", [-1, float("nan"), torch.ones(2)])
def test_bad_num_items_rejected(bad):
    s, t, _, mask = _batch()
    with pytest.raises(ValueError, match="num_items"):
        build_divergence("forward_kl")(s, t, mask, num_items=bad)


def test_step_token_count_dtypes_and_errors():
    masks = [torch.ones(2, 3, dtype=torch.bool), torch.tensor([[1, 0, 1]])]
    count = step_token_count(masks)
    assert count.dtype == torch.int64 and count.item() == 8
    weights = step_token_count([torch.full((2, 2), 0.5)])
    assert weights.dtype == torch.float32 and weights.item() == 2.0
    with pytest.raises(ValueError, match="masks"):
        step_token_count([])


def test_step_token_count_all_reduces_when_distributed(tmp_path):
    if not dist.is_available():
        pytest.skip("torch.distributed not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        calls = []
        real = dist.all_reduce

        def spy(tensor, *args, **kwargs):
            calls.append(tensor.clone())
            return real(tensor, *args, **kwargs)

        dist.all_reduce = spy
        try:
            assert step_token_count([torch.ones(3, 4, dtype=torch.bool)]).item() == 12
        finally:
            dist.all_reduce = real
        assert len(calls) == 1 and calls[0].item() == 12
    finally:
        dist.destroy_process_group()

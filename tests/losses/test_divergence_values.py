"""Exact divergence values against independent float64 computations."""

from __future__ import annotations

import pytest
import torch

from distill.losses import DIVERGENCES, GeneralizedJSD, build_divergence, token_statistics

# One parameter setting per registry key.
CASES = [
    ("forward_kl", {}),
    ("reverse_kl", {}),
    ("jsd", {"beta": 0.3}),
    ("skew_kl", {"alpha": 0.2}),
    ("skew_reverse_kl", {"alpha": 0.2}),
    ("tvd", {}),
    ("interpolated_kl", {"weight": 0.7}),
]


def _logits(*shape, seed=0, scale=2.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("name,params", CASES)
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_per_token_matches_reference(name, params, temperature, divergence_ref):
    s, t = _logits(3, 5, 17, seed=1), _logits(3, 5, 17, seed=2)
    div = build_divergence(name, temperature=temperature, chunk_size=4, **params)
    got = div.per_token(s, t)
    want = divergence_ref(name, s, t, temperature, **params)
    assert got.shape == (3, 5) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,params", CASES)
def test_zero_for_identical_distributions(name, params):
    s = _logits(2, 4, 9, seed=3)
    got = build_divergence(name, **params).per_token(s, s.clone())
    assert torch.all(got.abs() < 1e-6)


@pytest.mark.parametrize("name,params", CASES)
def test_masked_mean_matches_reference(name, params, divergence_ref):
    s, t = _logits(2, 6, 11, seed=4), _logits(2, 6, 11, seed=5)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
    got = build_divergence(name, **params)(s, t, mask)
    ref = divergence_ref(name, s, t, **params)
    want = (ref * mask).sum() / mask.sum()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_jsd_end_points_are_exactly_the_kl_directions(kl_ref):
    s, t = _logits(2, 5, 13, seed=6), _logits(2, 5, 13, seed=7)
    fwd = DIVERGENCES["forward_kl"]().per_token(s, t)
    rev = DIVERGENCES["reverse_kl"]().per_token(s, t)
    assert torch.equal(GeneralizedJSD(beta=0.0).per_token(s, t), fwd)
    assert torch.equal(GeneralizedJSD(beta=1.0).per_token(s, t), rev)
    torch.testing.assert_close(fwd.double(), kl_ref(t.double(), s.double()), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rev.double(), kl_ref(s.double(), t.double()), rtol=1e-5, atol=1e-6)


def test_interpolated_end_points_and_skew_at_zero():
    s, t = _logits(2, 5, 13, seed=8), _logits(2, 5, 13, seed=9)
    fwd = build_divergence("forward_kl").per_token(s, t)
    rev = build_divergence("reverse_kl").per_token(s, t)
    assert torch.equal(build_divergence("interpolated_kl", weight=1.0).per_token(s, t), fwd)
    assert torch.equal(build_divergence("interpolated_kl", weight=0.0).per_token(s, t), rev)
    torch.testing.assert_close(build_divergence("skew_kl", alpha=0.0).per_token(s, t), fwd)
    torch.testing.assert_close(build_divergence("skew_reverse_kl", alpha=0.0).per_token(s, t), rev)


def test_vocab_padding_is_sliced_off(kl_ref):
    s, t = _logits(2, 3, 112, seed=10), _logits(2, 3, 128, seed=11)
    real = 100
    want = kl_ref(t[..., :real].double(), s[..., :real].double())
    got = build_divergence("forward_kl", vocab_size=real).per_token(s, t)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    # without vocab_size both are cut to the smaller width (112)
    got_min = build_divergence("forward_kl").per_token(s, t)
    torch.testing.assert_close(
        got_min.double(), kl_ref(t[..., :112].double(), s.double()), rtol=1e-5, atol=1e-6
    )


def _collapse(logits, idx):
    """Probabilities over (top-k teacher ids, tail), from the full softmax (float64)."""
    p = logits.double().softmax(-1)
    top = p.gather(-1, idx)
    return torch.cat([top, 1 - top.sum(-1, keepdim=True)], -1)


@pytest.mark.parametrize("name,params", CASES)
def test_topk_matches_collapsed_reference(name, params, divergence_ref):
    s, t = _logits(2, 4, 20, seed=12, scale=1.0), _logits(2, 4, 20, seed=13, scale=1.0)
    k = 5
    idx = t.topk(k, -1).indices
    qs, qt = _collapse(s, idx), _collapse(t, idx)
    want = divergence_ref(name, qs.log(), qt.log(), **params)
    got = build_divergence(name, estimator="topk", top_k=k, **params).per_token(s, t)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,params", CASES)
def test_topk_with_whole_vocabulary_equals_exact(name, params):
    s, t = _logits(2, 3, 9, seed=14), _logits(2, 3, 9, seed=15)
    exact = build_divergence(name, **params).per_token(s, t)
    topk = build_divergence(name, estimator="topk", top_k=50, **params).per_token(s, t)
    torch.testing.assert_close(topk, exact, rtol=1e-5, atol=1e-6)


def test_token_statistics_match_distributions(kl_ref):
    s, t = _logits(2, 5, 30, seed=16), _logits(2, 5, 32, seed=17)
    stats = token_statistics(s, t, vocab_size=28, chunk_size=3)
    assert set(stats) == {"forward_kl", "reverse_kl", "student_entropy", "teacher_entropy"}
    sd, td = s[..., :28].double(), t[..., :28].double()
    torch.testing.assert_close(stats["forward_kl"].double(), kl_ref(td, sd), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["reverse_kl"].double(), kl_ref(sd, td), rtol=1e-5, atol=1e-6)
    ent_s = torch.distributions.Categorical(logits=sd).entropy()
    ent_t = torch.distributions.Categorical(logits=td).entropy()
    torch.testing.assert_close(stats["student_entropy"].double(), ent_s, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats["teacher_entropy"].double(), ent_t, rtol=1e-5, atol=1e-6)
    assert all(v.dtype == torch.float32 and v.shape == (2, 5) and not v.requires_grad for v in stats.values())


def test_token_statistics_no_grad_even_for_grad_inputs():
    s = _logits(1, 2, 7, seed=18).requires_grad_()
    stats = token_statistics(s, _logits(1, 2, 7, seed=19))
    assert not stats["forward_kl"].requires_grad


def test_token_statistics_rejects_bad_options():
    s, t = _logits(1, 2, 8, seed=20), _logits(1, 2, 6, seed=21)
    with pytest.raises(ValueError, match="^chunk_size must be an integer >= 1, got 0$"):
        token_statistics(s, t, chunk_size=0)
    with pytest.raises(ValueError, match=r"^vocab_size must be an integer in \[1, 6\], got 7$"):
        token_statistics(s, t, vocab_size=7)
    with pytest.raises(ValueError, match="^temperature must be a finite number > 0, got 0$"):
        token_statistics(s, t, temperature=0)

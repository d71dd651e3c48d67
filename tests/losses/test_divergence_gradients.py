"""Gradients of the chunked closed-form divergences: gradcheck, reference autograd, chunking, masks,
-inf logits, low precision, empty masks."""

from __future__ import annotations

import pytest
import torch

from distill.losses import ForwardKL, ReverseKL, build_divergence

CASES = [
    ("forward_kl", {}),
    ("reverse_kl", {}),
    ("jsd", {"beta": 0.3}),
    ("skew_kl", {"alpha": 0.2}),
    ("skew_reverse_kl", {"alpha": 0.2}),
    ("tvd", {}),
    ("interpolated_kl", {"weight": 0.7}),
]
ALL_ESTIMATORS = [(n, p, "exact") for n, p in CASES] + [(n, p, "topk") for n, p in CASES]
SAMPLED = [(n, {}, e) for n in ("forward_kl", "reverse_kl") for e in ("k1", "k2", "k3")]
# sampled estimators whose unbiased gradient is the plain derivative of the reported value
PATHWISE = [("forward_kl", {}, "k1"), ("forward_kl", {}, "k3"), ("reverse_kl", {}, "k2")]


def _logits(*shape, seed=0, scale=1.5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def _tokens(b, t, v, seed=0):
    return torch.randint(0, v, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name,params,estimator", ALL_ESTIMATORS + PATHWISE)
def test_gradcheck_float64(name, params, estimator):
    s = _logits(2, 3, 6, seed=1).requires_grad_()
    t = _logits(2, 3, 7, seed=2)
    tokens = _tokens(2, 3, 6, seed=3)
    mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]])
    div = build_divergence(name, estimator=estimator, top_k=3, temperature=0.8, chunk_size=2, **params)
    assert torch.autograd.gradcheck(lambda x: div.per_token(x, t, tokens), (s,))
    assert torch.autograd.gradcheck(lambda x: div(x, t, mask, tokens, num_items=7), (s,))


def _sampled_surrogate(name, estimator, s, t, tokens, temperature):
    """Value k_i with the documented gradient c * d log p_S(x), written with autograd."""
    ls, lt = (s / temperature).log_softmax(-1), (t / temperature).log_softmax(-1)
    s_x = ls.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    t_x = lt.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    lr = s_x - t_x if name == "forward_kl" else t_x - s_x
    value = {"k1": -lr, "k2": lr**2 / 2, "k3": lr.exp() - 1 - lr}[estimator]
    if name == "reverse_kl":
        coef = (s_x - t_x).detach()
    else:
        coef = (lr.exp() - 1).detach() if estimator == "k3" else -torch.ones_like(s_x)
    return value.detach() + coef * s_x - (coef * s_x).detach()


@pytest.mark.parametrize("name,params,estimator", SAMPLED)
def test_sampled_value_and_gradient_match_surrogate(name, params, estimator):
    s = _logits(2, 4, 7, seed=30).requires_grad_()
    t = _logits(2, 4, 7, seed=31)
    tokens = _tokens(2, 4, 7, seed=32)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
    div = build_divergence(name, estimator=estimator, temperature=0.9, chunk_size=3)
    per = div.per_token(s, t, tokens)
    val = div(s, t, mask, tokens, num_items=10)
    (got,) = torch.autograd.grad(val, s)
    ref = _sampled_surrogate(name, estimator, s, t, tokens, 0.9)
    (want,) = torch.autograd.grad((ref * mask).sum() / 10, s)
    torch.testing.assert_close(per, ref.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,params", CASES)
def test_gradient_matches_autograd_of_reference(name, params, divergence_ref):
    s = _logits(3, 4, 10, seed=4).requires_grad_()
    t = _logits(3, 4, 10, seed=5)
    mask = torch.rand(3, 4, generator=torch.Generator().manual_seed(6)) > 0.3
    div = build_divergence(name, temperature=1.3, **params)
    (got,) = torch.autograd.grad(div(s, t, mask), s)
    ref = divergence_ref(name, s, t, 1.3, **params)
    (want,) = torch.autograd.grad((ref * mask).sum() / mask.sum(), s)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name,params,estimator", ALL_ESTIMATORS + SAMPLED)
def test_chunked_equals_unchunked(name, params, estimator):
    s = _logits(3, 5, 12, seed=7, dtype=torch.float32).requires_grad_()
    t = _logits(3, 5, 12, seed=8, dtype=torch.float32)
    tokens = _tokens(3, 5, 12, seed=9)
    mask = torch.ones(3, 5)
    mask[1, 2:] = 0
    out = {}
    for chunk in (1, 4, None):  # None: the default, one chunk at this size
        div = build_divergence(name, estimator=estimator, top_k=4, chunk_size=chunk, **params)
        val = div(s, t, mask, tokens)
        (grad,) = torch.autograd.grad(val, s)
        out[chunk] = (val, grad, div.per_token(s, t, tokens).detach())
    for chunk in (1, 4):
        for a, b in zip(out[chunk], out[None]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name,params", CASES)
def test_masked_positions_have_no_effect(name, params):
    s = _logits(2, 4, 9, seed=10, dtype=torch.float32)
    t = _logits(2, 4, 9, seed=11, dtype=torch.float32)
    mask = torch.tensor([[True, False, True, False], [False, True, True, False]])
    # garbage (even NaN) at masked positions must not leak into the value or the gradient
    s2, t2 = s.clone(), t.clone()
    s2[~mask] = float("nan")
    t2[~mask] = 1e3 * torch.randn_like(t2[~mask])
    div = build_divergence(name, **params)
    results = []
    for a, b in ((s, t), (s2, t2)):
        a = a.clone().requires_grad_()
        val = div(a, b, mask)
        (g,) = torch.autograd.grad(val, a)
        results.append((val, g))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    assert torch.all(results[1][1][~mask] == 0)


@pytest.mark.parametrize("name,params,estimator", ALL_ESTIMATORS + SAMPLED)
def test_neg_inf_logits_give_finite_values_and_grads(name, params, estimator):
    s = _logits(2, 3, 10, seed=12, dtype=torch.float32)
    t = _logits(2, 3, 10, seed=13, dtype=torch.float32)
    s[..., 7:] = float("-inf")  # padded vocabulary in both
    t[..., 7:] = float("-inf")
    s[0, 0, 2] = float("-inf")  # one token masked in the student only
    t[1, 1, 3] = float("-inf")  # and one in the teacher only
    s[1, 2, :] = float("-inf")  # a fully masked row
    s = s.requires_grad_()
    tokens = _tokens(2, 3, 7, seed=14)
    div = build_divergence(name, estimator=estimator, top_k=3, **params)
    per = div.per_token(s, t, tokens)
    val = div(s, t, torch.ones(2, 3), tokens)
    (g,) = torch.autograd.grad(val, s)
    assert torch.isfinite(per).all() and torch.isfinite(val) and torch.isfinite(g).all()
    if estimator != "k1":
        assert (per >= 0).all()


def test_neg_inf_in_both_matches_sliced_vocabulary():
    s = _logits(2, 3, 10, seed=15, dtype=torch.float32)
    t = _logits(2, 3, 10, seed=16, dtype=torch.float32)
    s_pad, t_pad = s.clone(), t.clone()
    s_pad[..., 6:] = float("-inf")
    t_pad[..., 6:] = float("-inf")
    for name, params in CASES:
        div = build_divergence(name, **params)
        torch.testing.assert_close(div.per_token(s_pad, t_pad), div.per_token(s[..., :6], t[..., :6]))


@pytest.mark.parametrize("name,params,estimator", ALL_ESTIMATORS)
def test_bf16_inputs_nonnegative_and_close(name, params, estimator):
    s = _logits(2, 8, 50, seed=17, scale=3.0, dtype=torch.float32)
    t = s + 0.01 * _logits(2, 8, 50, seed=18, dtype=torch.float32)  # nearly equal: tests the clamp
    sb = s.bfloat16().requires_grad_()
    div = build_divergence(name, estimator=estimator, top_k=5, **params)
    per = div.per_token(sb, t.bfloat16())
    assert per.dtype == torch.float32 and (per >= 0).all()
    ref = div.per_token(s.bfloat16().float(), t.bfloat16().float())
    torch.testing.assert_close(per, ref)
    (g,) = torch.autograd.grad(div(sb, t.bfloat16(), torch.ones(2, 8)), sb)
    assert g.dtype == torch.bfloat16 and torch.isfinite(g.float()).all()


@pytest.mark.parametrize("name,params,estimator", ALL_ESTIMATORS + SAMPLED)
@pytest.mark.parametrize("num_items", [None, 0])
def test_empty_mask_gives_zero_and_zero_grad(name, params, estimator, num_items):
    s = _logits(2, 3, 8, seed=19, dtype=torch.float32).requires_grad_()
    t = _logits(2, 3, 8, seed=20, dtype=torch.float32)
    div = build_divergence(name, estimator=estimator, **params)
    val = div(s, t, torch.zeros(2, 3, dtype=torch.bool), _tokens(2, 3, 8), num_items=num_items)
    val.backward()
    assert val.item() == 0.0 and torch.equal(s.grad, torch.zeros_like(s))


def test_retained_graph_second_backward_recomputes_same_gradient():
    s = _logits(2, 4, 9, seed=21).requires_grad_()
    t = _logits(2, 4, 9, seed=22)
    val = ReverseKL(chunk_size=3)(s, t, torch.ones(2, 4))
    (g1,) = torch.autograd.grad(2.0 * val, s, retain_graph=True)
    (g2,) = torch.autograd.grad(2.0 * val, s)
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-14)


def test_per_token_backward_with_weights_and_noncontiguous_input(divergence_ref):
    full = _logits(2, 6, 9, seed=23).requires_grad_()
    s = full[:, :-1]  # the caller's shift: a non-contiguous view
    t = _logits(2, 6, 9, seed=24)[:, 1:]
    w = torch.rand(2, 5, generator=torch.Generator().manual_seed(25), dtype=torch.float64)
    (g,) = torch.autograd.grad((ForwardKL(chunk_size=4).per_token(s, t) * w).sum(), full)
    (want,) = torch.autograd.grad((divergence_ref("forward_kl", s, t) * w).sum(), full)
    torch.testing.assert_close(g, want, rtol=1e-7, atol=1e-10)


def test_teacher_receives_no_gradient():
    s = _logits(1, 3, 5, seed=26).requires_grad_()
    t = _logits(1, 3, 5, seed=27).requires_grad_()
    ForwardKL()(s, t, torch.ones(1, 3)).backward()
    assert s.grad is not None and t.grad is None


def test_no_grad_inputs_need_no_backward():
    s, t = _logits(1, 3, 5, seed=28), _logits(1, 3, 5, seed=29)
    val = ReverseKL()(s, t, torch.ones(1, 3))
    assert not val.requires_grad and val.item() > 0


def test_no_gradient_work_under_no_grad(monkeypatch):
    import distill.losses.functional as functional

    seen = []
    real = functional.logit_grad
    monkeypatch.setattr(functional, "logit_grad", lambda g, p: seen.append(1) or real(g, p))
    s = _logits(1, 3, 5, seed=30).requires_grad_()
    t = _logits(1, 3, 5, seed=31)
    with torch.no_grad():
        val = ForwardKL()(s, t, torch.ones(1, 3))
    assert not val.requires_grad and not seen
    ForwardKL()(s, t, torch.ones(1, 3))
    assert seen

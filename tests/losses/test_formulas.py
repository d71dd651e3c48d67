"""Each divergence's per-token formula is its single definition: the closed-form terms equal the
autograd of the formula, the formula equals an independent torch.distributions computation, and a
divergence given only a formula works on every call path. The contract of a `terms` function,
checked for every registered divergence (a new one is covered by registering it): it may overwrite
`s`, `t` and `p_t` to save memory, but never `p_s`, which the caller reuses for the logit gradient."""

from __future__ import annotations

import pytest
import torch

from distill.losses import TokenDivergence
from distill.losses.divergences import DIVERGENCES, build_divergence
from distill.losses.formulas import autograd_terms
from distill.losses.functional import exact_rows, log_probs

CASES = [(name, {}) for name in DIVERGENCES] + [
    ("jsd", {"beta": 0.0}),
    ("jsd", {"beta": 1.0}),
    ("jsd", {"beta": 0.3}),
    ("skew_kl", {"alpha": 0.0}),
    ("skew_kl", {"alpha": 0.9}),
    ("skew_reverse_kl", {"alpha": 0.0}),
    ("skew_reverse_kl", {"alpha": 0.9}),
    ("interpolated_kl", {"weight": 0.0}),
    ("interpolated_kl", {"weight": 1.0}),
    ("interpolated_kl", {"weight": 0.3}),
]
IDS = [f"{n}{o}" for n, o in CASES]


def _rows(seed: int, n: int = 6, v: int = 13) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    u_s = 2.0 * torch.randn(n, v, generator=g, dtype=torch.float64)
    u_t = 3.0 * torch.randn(n, v, generator=g, dtype=torch.float64)
    u_t[0, :4] = float("-inf")  # tokens the teacher forbids (floored log-probabilities)
    u_s[1, 5] = float("-inf")
    return log_probs(u_s), log_probs(u_t)


@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_closed_form_terms_equal_the_autograd_of_the_formula(name, options):
    div = build_divergence(name, **options)
    s, t = _rows(seed=len(name))
    got_v, got_g = div.terms()(s.clone(), t.clone(), s.exp(), t.exp())
    want_v, want_g = autograd_terms(div.formula())(s.clone(), t.clone(), s.exp(), t.exp())
    torch.testing.assert_close(got_v, want_v, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_g, want_g, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_formula_equals_the_independent_reference(name, options, divergence_ref):
    g = torch.Generator().manual_seed(3)
    u_s = torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    u_t = torch.randn(2, 3, 9, generator=g, dtype=torch.float64)
    div = build_divergence(name, **options)
    params = {k: getattr(div, k) for k in ("beta", "alpha", "weight") if hasattr(div, k)}
    got = div.formula()(log_probs(u_s.view(6, 9)), log_probs(u_t.view(6, 9))).view(2, 3)
    torch.testing.assert_close(got, divergence_ref(name, u_s, u_t, **params), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_formula_leaves_its_inputs_untouched(name, options):
    s, t = _rows(seed=7)
    kept = (s.clone(), t.clone())
    build_divergence(name, **options).formula()(s, t)
    assert torch.equal(s, kept[0]) and torch.equal(t, kept[1])


class Hellinger(TokenDivergence):
    """Squared Hellinger distance, defined here by its formula only (no closed-form terms)."""

    name = "hellinger"

    def formula(self):
        return lambda s, t: 1.0 - (0.5 * (s + t)).exp().sum(-1)


def _hellinger(student, teacher, temperature):
    ps, pt = (student / temperature).softmax(-1), (teacher / temperature).softmax(-1)
    return 1.0 - (ps * pt).sqrt().sum(-1)


@pytest.mark.parametrize("estimator", ["exact", "topk"])
def test_a_divergence_given_only_its_formula_works_on_every_path(estimator):
    g = torch.Generator().manual_seed(11)
    s = torch.randn(2, 4, 8, generator=g, dtype=torch.float64).requires_grad_()
    t = torch.randn(2, 4, 9, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    div = Hellinger(estimator=estimator, top_k=3, temperature=0.7, chunk_size=3)
    assert torch.autograd.gradcheck(lambda x: div(x, t, mask, num_items=5), (s,))
    if estimator == "exact":
        want = _hellinger(s, t[..., :8], 0.7)
        torch.testing.assert_close(div.per_token(s, t), want.detach(), rtol=1e-10, atol=1e-12)
        (got_g,) = torch.autograd.grad(div(s, t, mask, num_items=5), s)
        (want_g,) = torch.autograd.grad((want * mask).sum() / 5, s)
        torch.testing.assert_close(got_g, want_g, rtol=1e-9, atol=1e-12)


def test_a_divergence_without_a_formula_says_so():
    class Nameless(TokenDivergence):
        pass

    with pytest.raises(NotImplementedError, match="Nameless must define formula"):
        Nameless().per_token(torch.randn(1, 2, 3), torch.randn(1, 2, 3))


@pytest.mark.parametrize("name, options", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_terms_never_write_into_p_s(name, options, dtype):
    torch.manual_seed(0)
    terms = build_divergence(name, **options).terms()
    s, t = log_probs(torch.randn(5, 11, dtype=dtype)), log_probs(3 * torch.randn(5, 11, dtype=dtype))
    p_s, p_t = s.exp(), t.exp()
    kept = p_s.clone()
    value, g = terms(s.clone(), t.clone(), p_s, p_t.clone())
    assert torch.equal(p_s, kept)
    assert value.shape == (5,) and g.shape == (5, 11) and value.dtype == g.dtype == dtype


@pytest.mark.parametrize("name, options", CASES, ids=IDS)
def test_exact_rows_leave_the_callers_logits_untouched(name, options):
    torch.manual_seed(1)
    u_s, u_t = torch.randn(4, 9), torch.randn(4, 9)
    kept = (u_s.clone(), u_t.clone())
    exact_rows(build_divergence(name, **options).terms(), u_s, u_t, want_grad=True)
    assert torch.equal(u_s, kept[0]) and torch.equal(u_t, kept[1])

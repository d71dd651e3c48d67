"""The contract of a divergence's `terms` function (`distill.losses.functional`), checked for every
registered divergence (a new one is covered by registering it): it may overwrite `s`, `t` and
`p_t` to save memory, but never `p_s`, which the caller reuses for the logit gradient."""

from __future__ import annotations

import pytest
import torch

from distill.losses.divergences import DIVERGENCES, build_divergence
from distill.losses.functional import exact_rows, log_probs

# Each registered divergence with its defaults, plus the end points and an interior point of the
# parameterised ones (their terms take other code paths there).
CASES = [(name, {}) for name in DIVERGENCES] + [
    ("jsd", {"beta": 0.0}),
    ("jsd", {"beta": 1.0}),
    ("jsd", {"beta": 0.3}),
    ("skew_kl", {"alpha": 0.9}),
    ("skew_reverse_kl", {"alpha": 0.9}),
    ("interpolated_kl", {"weight": 0.0}),
    ("interpolated_kl", {"weight": 1.0}),
]


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}{o}" for n, o in CASES])
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


@pytest.mark.parametrize("name, options", CASES, ids=[f"{n}{o}" for n, o in CASES])
def test_exact_rows_leave_the_callers_logits_untouched(name, options):
    torch.manual_seed(1)
    u_s, u_t = torch.randn(4, 9), torch.randn(4, 9)
    kept = (u_s.clone(), u_t.clone())
    exact_rows(build_divergence(name, **options).terms(), u_s, u_t, want_grad=True)
    assert torch.equal(u_s, kept[0]) and torch.equal(u_t, kept[1])

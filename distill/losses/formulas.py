"""Per-token definitions of the divergences, and the autograd path that turns one into terms.

A *formula* ``formula(s, t) -> value`` is a divergence written once, from its definition, on a chunk
of rows ``[n, V]`` of student and teacher log-probabilities (``p = s.exp()``); it returns ``[n]``
and must not modify its inputs. It is all a new divergence needs: :func:`autograd_terms` derives
``(value, g)`` from it, ``g = dL/ds`` with ``s`` taken as free variables, which is the
``p_s * dL/dp_s`` the closed-form terms of ``functional.py`` compute by hand. The registered
divergences keep their closed forms (they overwrite buffers instead of building a graph, so they
are faster and lighter); the tests check each one against the autograd of its formula.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from distill.losses.functional import Terms

Formula = Callable[[Tensor, Tensor], Tensor]


def autograd_terms(formula: Formula) -> Terms:
    """Terms for any formula: its value, and its gradient w.r.t. the student log-probabilities by
    autograd on the chunk (a ``[n, V]`` graph lives only while one chunk is processed)."""

    def terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
        with torch.enable_grad():
            x = s.detach().requires_grad_(True)
            value = formula(x, t.detach())
            (g,) = torch.autograd.grad(value.sum(), x)
        return value.detach(), g

    return terms


def _kl(a: Tensor, b: Tensor) -> Tensor:
    """KL(exp(a) || exp(b)) per row from log-probabilities."""
    return (a.exp() * (a - b)).sum(-1)


def _log_mix(a: Tensor, wa: float, b: Tensor, wb: float) -> Tensor:
    """log(wa exp(a) + wb exp(b)), out of place; exactly ``a`` or ``b`` when the other weight is 0."""
    if wb == 0.0:
        return a
    if wa == 0.0:
        return b
    return torch.logaddexp(a + math.log(wa), b + math.log(wb))


def forward_kl(s: Tensor, t: Tensor) -> Tensor:
    """KL(p_T || p_S)."""
    return _kl(t, s)


def reverse_kl(s: Tensor, t: Tensor) -> Tensor:
    """KL(p_S || p_T)."""
    return _kl(s, t)


def jsd(beta: float) -> Formula:
    """beta KL(p_T || M) + (1 - beta) KL(p_S || M), M = beta p_T + (1 - beta) p_S; forward KL at
    beta = 0 and reverse KL at beta = 1 (the convention, not the limit of the mixture)."""
    if beta == 0.0:
        return forward_kl
    if beta == 1.0:
        return reverse_kl
    return lambda s, t: beta * _kl(t, m := _log_mix(t, beta, s, 1.0 - beta)) + (1.0 - beta) * _kl(s, m)


def skew_kl(alpha: float) -> Formula:
    """KL(p_T || alpha p_T + (1 - alpha) p_S)."""
    return lambda s, t: _kl(t, _log_mix(t, alpha, s, 1.0 - alpha))


def skew_reverse_kl(alpha: float) -> Formula:
    """KL(p_S || (1 - alpha) p_T + alpha p_S)."""
    return lambda s, t: _kl(s, _log_mix(t, 1.0 - alpha, s, alpha))


def tvd(s: Tensor, t: Tensor) -> Tensor:
    """1/2 sum |p_S - p_T|."""
    return 0.5 * (s.exp() - t.exp()).abs().sum(-1)


def interpolated_kl(weight: float) -> Formula:
    """weight KL(p_T || p_S) + (1 - weight) KL(p_S || p_T)."""
    return lambda s, t: weight * _kl(t, s) + (1.0 - weight) * _kl(s, t)

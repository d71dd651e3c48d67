"""Fixtures: naive float64 reference divergences, written from the definitions (independent of
distill.losses). Served as fixtures because the suite runs with --import-mode=importlib."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical, kl_divergence


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(p) || softmax(q)) per position, via torch.distributions."""
    return kl_divergence(Categorical(logits=p_logits), Categorical(logits=q_logits))


def _kl_probs(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p * (p.log() - q.log())).sum(-1)


def reference(name: str, student, teacher, temperature: float = 1.0, **params) -> torch.Tensor:
    """Per-position divergence ``[B, T]`` in float64 from materialised probabilities (differentiable)."""
    s = student.double() / temperature
    t = teacher.double() / temperature
    ps, pt = s.softmax(-1), t.softmax(-1)
    if name == "forward_kl":
        return kl(t, s)
    if name == "reverse_kl":
        return kl(s, t)
    if name == "jsd":
        beta = params["beta"]
        if beta == 0:
            return kl(t, s)
        if beta == 1:
            return kl(s, t)
        m = beta * pt + (1 - beta) * ps
        return beta * _kl_probs(pt, m) + (1 - beta) * _kl_probs(ps, m)
    if name == "skew_kl":
        a = params["alpha"]
        return _kl_probs(pt, a * pt + (1 - a) * ps)
    if name == "skew_reverse_kl":
        a = params["alpha"]
        return _kl_probs(ps, (1 - a) * pt + a * ps)
    if name == "tvd":
        return 0.5 * (ps - pt).abs().sum(-1)
    if name == "interpolated_kl":
        w = params["weight"]
        return w * kl(t, s) + (1 - w) * kl(s, t)
    raise KeyError(name)


@pytest.fixture
def kl_ref():
    """``kl_ref(p_logits, q_logits)``: KL(softmax(p) || softmax(q)) per position via torch.distributions."""
    return kl


@pytest.fixture
def divergence_ref():
    """``divergence_ref(name, student, teacher, temperature=1.0, **params)``: per-position float64
    divergence from materialised probabilities (differentiable)."""
    return reference

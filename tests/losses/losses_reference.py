"""Naive float64 reference divergences, written from the definitions (independent of distill.losses)."""

from __future__ import annotations

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


# One parameter setting per registry key, used across the test files.
CASES = [
    ("forward_kl", {}),
    ("reverse_kl", {}),
    ("jsd", {"beta": 0.3}),
    ("skew_kl", {"alpha": 0.2}),
    ("skew_reverse_kl", {"alpha": 0.2}),
    ("tvd", {}),
    ("interpolated_kl", {"weight": 0.7}),
]

"""Row-wise divergence math on float32 chunks: values and closed-form gradients.

Every function here works on a chunk of rows ``[n, V]`` already in float32 (float64 when the inputs
are float64, for gradcheck) and already divided by the temperature. A divergence is described by a
*terms* function ``terms(s, t, p_s, p_t) -> (value, g)`` where ``s``/``t`` are the student/teacher
log-probabilities, ``p_s``/``p_t`` their probabilities, ``value`` is the divergence per row and
``g = p_s * dL/dp_s`` (the derivative with respect to the student's log-probabilities taken as free
variables). A terms function may overwrite ``s``, ``t`` and ``p_t`` (to save ``[n, V]``
allocations) but never ``p_s``. The gradient with respect to the student's (scaled) logits then
follows from the softmax Jacobian as ``g - p_s * sum(g)``, which is what :func:`logit_grad`
computes; no ``[n, V]`` autograd graph is ever built.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

# Log-probabilities are floored here so that a -inf logit (masked or padded vocabulary) gives a
# finite log-ratio: exp(-1e4) is exactly 0 in float32, so a token with zero probability contributes
# nothing where it is the weight, and a large finite (not infinite) penalty where the other
# distribution puts mass on it.
LOG_PROB_FLOOR = -1.0e4

# Cap on log(p_other(x) / p_sampler(x)) inside the sampled estimators (exp(50) ~ 5e21, finite).
MAX_LOG_RATIO = 50.0

# Below this many elements the fused log_softmax kernel's thread fan-out costs more than the work
# (milliseconds per call on a loaded machine); the two-pass form stays serial.
_SMALL = 32768

Terms = Callable[[Tensor, Tensor, Tensor, Tensor], "tuple[Tensor, Tensor]"]


def log_probs(u: Tensor) -> Tensor:
    """Float32 log-softmax over the last dim, floored at :data:`LOG_PROB_FLOOR`.

    A row whose logits are all -inf (nothing allowed) becomes the all-zero "distribution" (every
    log-probability at the floor) instead of NaN; NaN logits still give NaN so that bugs surface.
    """
    if u.numel() < _SMALL:
        s = u - torch.logsumexp(u, dim=-1, keepdim=True)
    else:
        s = torch.log_softmax(u, dim=-1)
    s.clamp_min_(LOG_PROB_FLOOR)
    bad = torch.isnan(s[:, 0])
    if bool(bad.any()):
        dead = bad & torch.isneginf(u).all(dim=-1)
        s[dead] = LOG_PROB_FLOOR
    return s


def rowdot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise dot product ``(a * b).sum(-1)`` without allocating the ``[n, V]`` product."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(-1)


def logit_grad(g: Tensor, p_s: Tensor) -> Tensor:
    """Gradient w.r.t. the scaled student logits from ``g = p_s * dL/dp_s`` (in place on ``g``)."""
    return g.addcmul_(p_s, g.sum(dim=-1, keepdim=True), value=-1.0)


def _log_mix(a: Tensor, wa: float, b: Tensor, wb: float) -> Tensor:
    """log(wa * exp(a) + wb * exp(b)) for weights in [0, 1], stable, exact when a weight is 0 or 1."""
    if wa == 0.0:
        return b.clone()
    if wb == 0.0:
        return a.clone()
    m = a + math.log(wa)
    return torch.logaddexp(m, b + math.log(wb), out=m)


def forward_kl_terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
    """KL(p_T || p_S) = sum p_T (log p_T - log p_S); g = -p_T."""
    return rowdot(p_t, t.sub_(s)), p_t.neg_()


def reverse_kl_terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
    """KL(p_S || p_T) = sum p_S (log p_S - log p_T); g = p_S (log p_S - log p_T + 1)."""
    d = s.sub_(t)
    value = rowdot(p_s, d)
    return value, d.add_(1.0).mul_(p_s)


def jsd_terms(beta: float) -> Terms:
    """Generalised JSD: beta KL(p_T || M) + (1 - beta) KL(p_S || M), M = beta p_T + (1 - beta) p_S.

    beta = 0 and beta = 1 are, by convention (as in TRL's GKD), forward and reverse KL exactly; the
    mixture formula itself tends to 0 at both ends.
    """
    if beta == 0.0:
        return forward_kl_terms
    if beta == 1.0:
        return reverse_kl_terms

    def terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
        m = _log_mix(t, beta, s, 1.0 - beta)
        value = beta * rowdot(p_t, t.sub_(m))
        d = s.sub_(m).mul_(p_s)  # p_S (log p_S - log M); dL/dp_S = (1 - beta)(log p_S - log M)
        value += (1.0 - beta) * d.sum(dim=-1)
        return value, d.mul_(1.0 - beta)

    return terms


def skew_kl_terms(alpha: float) -> Terms:
    """Skew KL (DistiLLM): KL(p_T || alpha p_T + (1 - alpha) p_S); g = -(1 - alpha) p_S p_T / M."""

    def terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
        m = _log_mix(t, alpha, s, 1.0 - alpha)
        tm = t.sub_(m)
        value = rowdot(p_t, tm)
        return value, tm.add_(s).exp_().mul_(-(1.0 - alpha))

    return terms


def skew_reverse_kl_terms(alpha: float) -> Terms:
    """Skew reverse KL (DistiLLM): KL(p_S || (1 - alpha) p_T + alpha p_S).

    dL/dp_S = log p_S - log M + 1 - alpha p_S / M, so g = p_S (log p_S - log M + 1) - alpha p_S^2 / M.
    """

    def terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
        m = _log_mix(t, 1.0 - alpha, s, alpha)
        d = s - m
        value = rowdot(p_s, d)
        if alpha == 0.0:
            return value, d.add_(1.0).mul_(p_s)
        sq = s.add_(d).exp_()  # exp(2 log p_S - log M) = p_S^2 / M
        return value, d.add_(1.0).mul_(p_s).sub_(sq, alpha=alpha)

    return terms


def tvd_terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
    """Total variation 1/2 sum |p_S - p_T|; g = 1/2 p_S sign(p_S - p_T) (a subgradient at ties)."""
    diff = p_s - p_t
    value = 0.5 * diff.abs().sum(dim=-1)
    return value, diff.sign_().mul_(p_s).mul_(0.5)


def interpolated_kl_terms(weight: float) -> Terms:
    """weight * KL(p_T || p_S) + (1 - weight) * KL(p_S || p_T)."""
    if weight == 1.0:
        return forward_kl_terms
    if weight == 0.0:
        return reverse_kl_terms

    def terms(s: Tensor, t: Tensor, p_s: Tensor, p_t: Tensor) -> tuple[Tensor, Tensor]:
        d = s.sub_(t)  # log p_S - log p_T
        value = weight * rowdot(p_t, d).neg_() + (1.0 - weight) * rowdot(p_s, d)
        g = d.add_(1.0).mul_(p_s).mul_(1.0 - weight).sub_(p_t, alpha=weight)
        return value, g

    return terms


# Columns of the statistics a chunk can hand back with its value (see `fill_statistics`).
STATISTICS = ("forward_kl", "reverse_kl", "student_entropy", "teacher_entropy")


def fill_statistics(
    out: Tensor, s: Tensor, t: Tensor, p_s: Tensor | None = None, p_t: Tensor | None = None
) -> None:
    """Write both exact KL directions and both entropies of each row into ``out`` ``[n, 4]`` (columns
    as in :data:`STATISTICS`, clamped at 0) from the log-probabilities ``s``, ``t`` (probabilities
    computed when not given). Reads its inputs only."""
    p_s = s.exp() if p_s is None else p_s
    p_t = t.exp() if p_t is None else p_t
    d = t - s
    out[:, 0] = rowdot(p_t, d)
    out[:, 1] = rowdot(p_s, d).neg_()
    out[:, 2] = rowdot(p_s, s).neg_()
    out[:, 3] = rowdot(p_t, t).neg_()
    out.clamp_min_(0.0)


def exact_rows(
    terms: Terms, u_s: Tensor, u_t: Tensor, want_grad: bool, stats: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """Exact divergence over the whole vocabulary for a chunk; gradient w.r.t. the scaled logits.
    With ``stats`` (``[n, 4]``) the chunk's statistics are written there from the same softmaxes."""
    s = log_probs(u_s)
    t = log_probs(u_t)
    p_s = s.exp()
    p_t = t.exp()
    if stats is not None:
        fill_statistics(stats, s, t, p_s, p_t)
    value, g = terms(s, t, p_s, p_t)
    del t, p_t
    return value.clamp_min(0.0), logit_grad(g, p_s) if want_grad else None


def _with_tail(logp: Tensor, idx: Tensor) -> Tensor:
    """``[n, k + 1]`` log-probabilities: the entries at ``idx`` and the log of the remaining mass."""
    tail = torch.logsumexp(logp.scatter(-1, idx, float("-inf")), dim=-1, keepdim=True)
    return torch.cat([logp.gather(-1, idx), tail], dim=-1).clamp_min_(LOG_PROB_FLOOR)


def topk_rows(
    terms: Terms, u_s: Tensor, u_t: Tensor, top_k: int, want_grad: bool, stats: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """Divergence between the two distributions collapsed onto the teacher's top-k tokens + one tail.

    The tail bucket holds the remaining mass of each distribution (computed by log-sum-exp, not as
    1 - sum, so a tiny tail keeps its precision). The gradient flows to every student logit: a tail
    token j receives ``p_S(j) / q_S(tail)`` of the tail bucket's share.
    """
    k = min(top_k, u_t.shape[-1])
    s = log_probs(u_s)
    t = log_probs(u_t)
    if stats is not None:
        fill_statistics(stats, s, t)
    idx = t.topk(k, dim=-1, sorted=False).indices
    rs = _with_tail(s, idx)
    rt = _with_tail(t, idx)
    del t
    q_s = rs.exp()
    value, g_red = terms(rs, rt, q_s, rt.exp())
    value = value.clamp_min(0.0)
    if not want_grad:
        return value, None
    p_s = s.exp()
    q_tail = q_s[:, k:]
    share = torch.where(q_tail > 0, g_red[:, k:] / q_tail.clamp_min(torch.finfo(q_tail.dtype).tiny), 0.0)
    g = p_s * share
    g.scatter_(-1, idx, g_red[:, :k])
    return value, g.addcmul_(p_s, g_red.sum(dim=-1, keepdim=True), value=-1.0)


def sampled_rows(
    direction: str,
    estimator: str,
    u_s: Tensor,
    u_t: Tensor,
    tokens: Tensor,
    behaviour_logprobs: Tensor | None,
    max_importance_weight: float | None,
    want_grad: bool,
    stats: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Single-sample estimators (Schulman, "Approximating KL divergence") on the given tokens.

    ``direction`` is ``"forward"`` (KL(p_T||p_S), tokens assumed drawn from the teacher) or
    ``"reverse"`` (KL(p_S||p_T), tokens assumed drawn from the student). With log-ratio
    ``lr = log p_other(x) - log p_sampler(x)`` the values are k1 = -lr, k2 = lr^2 / 2,
    k3 = exp(lr) - 1 - lr. Every gradient has the form ``c * d log p_S(x)``:

    - reverse: ``c = log p_S(x) - log p_T(x)`` for k1, k2 and k3 alike. This is the score-function
      (REINFORCE) gradient: for k1 and k3 it is the full derivative of E_{x~p_S}[k] with the
      zero-mean term ``d log p_S(x)`` dropped, and it equals k2's own pathwise gradient.
    - forward: ``c = -1`` (cross-entropy on the token) for k1 and k2; for k3 its own pathwise gradient
      ``c = p_S(x)/p_T(x) - 1``, which adds the zero-mean control variate ``r d log p_S(x)``.

    With ``behaviour_logprobs`` (log-prob of each token under the distribution that really drew it)
    value and gradient are multiplied by the stop-gradient importance weight
    ``p_sampler(x) / p_behaviour(x)``, optionally truncated at ``max_importance_weight``.
    """
    s = log_probs(u_s)
    t = log_probs(u_t)
    if stats is not None:
        fill_statistics(stats, s, t)
    x = tokens.unsqueeze(-1)
    s_x = s.gather(-1, x).squeeze(-1)
    t_x = t.gather(-1, x).squeeze(-1)
    del t
    own, other = (t_x, s_x) if direction == "forward" else (s_x, t_x)
    # A token the assumed sampler gives (almost) zero probability cannot have been drawn from it;
    # capping the log-ratio keeps k3's exp finite there instead of overflowing to inf.
    lr = (other - own).clamp_max_(MAX_LOG_RATIO)
    if estimator == "k1":
        value = -lr
    elif estimator == "k2":
        value = 0.5 * lr.square()
    else:
        value = torch.expm1(lr) - lr
    if direction == "reverse":
        coef = s_x - t_x
    elif estimator == "k3":
        coef = torch.expm1(lr)
    else:
        coef = torch.full_like(s_x, -1.0)
    if behaviour_logprobs is not None:
        w = (own - behaviour_logprobs.to(own.dtype)).exp()
        if max_importance_weight is not None:
            w = w.clamp_max(max_importance_weight)
        value = value * w
        coef = coef * w
    if not want_grad:
        return value, None
    # c * d log p_S(x) / du = c * (onehot(x) - p_S)
    g = s.exp_().mul_(-coef.unsqueeze(-1))
    g.scatter_add_(-1, x, coef.unsqueeze(-1))
    return value, g

"""The token-level divergences and their registry for configs.

p_S, p_T: student and teacher next-token distributions at one position (after temperature).
Options shared by all (temperature, estimator, top_k, vocab_size, chunk_size,
max_importance_weight) are documented on :class:`TokenDivergence`.
"""

from __future__ import annotations

from distill.checks import check_number
from distill.losses import formulas
from distill.losses.base import TokenDivergence
from distill.losses.formulas import Formula
from distill.losses.functional import (
    Terms,
    forward_kl_terms,
    interpolated_kl_terms,
    jsd_terms,
    reverse_kl_terms,
    skew_kl_terms,
    skew_reverse_kl_terms,
    tvd_terms,
)
from distill.names import EXACT_ESTIMATORS, SAMPLED_ESTIMATORS


class ForwardKL(TokenDivergence):
    """KL(p_T || p_S) = sum_v p_T(v) log(p_T(v) / p_S(v)): mass-covering (the student must put
    mass wherever the teacher does). Exact gradient w.r.t. the student logits: (p_S - p_T) / temperature.

    Sampled estimators (k1, k2, k3) assume the tokens were drawn from the TEACHER (teacher-written
    rollouts); the gradient is then unbiased: ``-d log p_S(x)`` (cross-entropy on the teacher's token)
    for k1 and k2, ``(p_S(x)/p_T(x) - 1) d log p_S(x)`` for k3. For student-written tokens it is biased
    (it fits the student to its own samples); for mixed rollouts pass ``behaviour_logprobs`` so each
    token is reweighted by p_T(x) / p_behaviour(x).
    """

    name = "forward_kl"
    estimators = EXACT_ESTIMATORS + SAMPLED_ESTIMATORS
    sampled_direction = "forward"

    def formula(self) -> Formula:
        return formulas.forward_kl

    def terms(self) -> Terms:
        return forward_kl_terms


class ReverseKL(TokenDivergence):
    """KL(p_S || p_T) = sum_v p_S(v) log(p_S(v) / p_T(v)): mode-seeking (the student may drop teacher
    modes but is punished for mass where the teacher has little). Exact gradient w.r.t. the student
    logits: p_S * (log p_S - log p_T - KL) / temperature.

    Sampled estimators (k1, k2, k3) assume the tokens were drawn from the STUDENT (on-policy
    rollouts, at this divergence's temperature). Because the sampling distribution depends on the
    student, the gradient includes the score-function term: all three use
    ``(log p_S(x) - log p_T(x)) * d log p_S(x)`` (as on-policy distillation does with the per-token
    reverse KL as a negative advantage), which is unbiased for the exact gradient; they differ only in
    the reported value (k1 unbiased but may be negative, k2 biased, k3 unbiased and non-negative). For
    teacher-written tokens this gradient is biased: its mean is
    ``E_{x~p_T}[(log p_S(x) - log p_T(x)) d log p_S(x)]``, not the reverse-KL gradient. For mixed
    rollouts pass ``behaviour_logprobs`` (log-prob of each token under whatever drew it: the
    teacher, the student, or their mixture) so each token is reweighted by p_S(x) / p_behaviour(x).
    """

    name = "reverse_kl"
    estimators = EXACT_ESTIMATORS + SAMPLED_ESTIMATORS
    sampled_direction = "reverse"

    def formula(self) -> Formula:
        return formulas.reverse_kl

    def terms(self) -> Terms:
        return reverse_kl_terms


class GeneralizedJSD(TokenDivergence):
    """Generalised Jensen-Shannon divergence (GKD): with M = beta p_T + (1 - beta) p_S,
    beta KL(p_T || M) + (1 - beta) KL(p_S || M) for 0 < beta < 1. By convention beta = 0 is exactly
    ForwardKL and beta = 1 exactly ReverseKL (the mixture formula itself vanishes at both ends).
    Bounded; between mass-covering (small beta) and mode-seeking (large beta).
    """

    name = "jsd"

    def __init__(self, beta: float = 0.5, **kwargs) -> None:
        """
        Args:
            beta: teacher weight of the mixture, in [0, 1]; 0 = forward KL, 1 = reverse KL.
        """
        check_number(f"{type(self).__name__}.beta", beta, 0, 1)
        super().__init__(**kwargs)
        self.beta = float(beta)

    def _params_repr(self) -> list[str]:
        return [f"beta={self.beta}"]

    def formula(self) -> Formula:
        return formulas.jsd(self.beta)

    def terms(self) -> Terms:
        return jsd_terms(self.beta)


class SkewKL(TokenDivergence):
    """Skew KL (DistiLLM): KL(p_T || alpha p_T + (1 - alpha) p_S). alpha = 0 is ForwardKL; larger
    alpha bounds the divergence (by log 1/alpha) and smooths its gradient. Mass-covering.
    """

    name = "skew_kl"

    def __init__(self, alpha: float = 0.1, **kwargs) -> None:
        """
        Args:
            alpha: teacher weight of the mixture in the second argument, in [0, 1).
        """
        check_number(f"{type(self).__name__}.alpha", alpha, 0, 1, open_max=True)
        super().__init__(**kwargs)
        self.alpha = float(alpha)

    def _params_repr(self) -> list[str]:
        return [f"alpha={self.alpha}"]

    def formula(self) -> Formula:
        return formulas.skew_kl(self.alpha)

    def terms(self) -> Terms:
        return skew_kl_terms(self.alpha)


class SkewReverseKL(TokenDivergence):
    """Skew reverse KL (DistiLLM): KL(p_S || (1 - alpha) p_T + alpha p_S). alpha = 0 is ReverseKL;
    larger alpha bounds the divergence (by log 1/alpha). Mode-seeking.
    """

    name = "skew_reverse_kl"

    def __init__(self, alpha: float = 0.1, **kwargs) -> None:
        """
        Args:
            alpha: student weight of the mixture in the second argument, in [0, 1).
        """
        check_number(f"{type(self).__name__}.alpha", alpha, 0, 1, open_max=True)
        super().__init__(**kwargs)
        self.alpha = float(alpha)

    def _params_repr(self) -> list[str]:
        return [f"alpha={self.alpha}"]

    def formula(self) -> Formula:
        return formulas.skew_reverse_kl(self.alpha)

    def terms(self) -> Terms:
        return skew_reverse_kl_terms(self.alpha)


class TotalVariation(TokenDivergence):
    """Total variation distance 1/2 sum_v |p_S(v) - p_T(v)|, in [0, 1]; symmetric. Its gradient
    w.r.t. p_S is 1/2 sign(p_S - p_T) (a subgradient where they tie).
    """

    name = "tvd"

    def formula(self) -> Formula:
        return formulas.tvd

    def terms(self) -> Terms:
        return tvd_terms


class InterpolatedKL(TokenDivergence):
    """weight * KL(p_T || p_S) + (1 - weight) * KL(p_S || p_T): an explicit mix of the two KL
    directions (weight 1 = ForwardKL, 0 = ReverseKL), unlike the mixture inside GeneralizedJSD.
    """

    name = "interpolated_kl"

    def __init__(self, weight: float = 0.5, **kwargs) -> None:
        """
        Args:
            weight: share of the forward KL, in [0, 1].
        """
        check_number(f"{type(self).__name__}.weight", weight, 0, 1)
        super().__init__(**kwargs)
        self.weight = float(weight)

    def _params_repr(self) -> list[str]:
        return [f"weight={self.weight}"]

    def formula(self) -> Formula:
        return formulas.interpolated_kl(self.weight)

    def terms(self) -> Terms:
        return interpolated_kl_terms(self.weight)


DIVERGENCES: dict[str, type[TokenDivergence]] = {
    cls.name: cls
    for cls in (ForwardKL, ReverseKL, GeneralizedJSD, SkewKL, SkewReverseKL, TotalVariation, InterpolatedKL)
}


def build_divergence(name: str, **kwargs) -> TokenDivergence:
    """Instantiate a divergence by registry key (``DIVERGENCES``) with its constructor options."""
    if name not in DIVERGENCES:
        raise ValueError(f"unknown divergence {name!r}; allowed names: {', '.join(DIVERGENCES)}")
    return DIVERGENCES[name](**kwargs)

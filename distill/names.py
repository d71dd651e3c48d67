"""The knob names every layer agrees on: the losses, the sampler, GRPO and sweep specs read them
from here (no torch is imported, so a spec is checked without it). `tests/test_names.py` checks
that the divergence classes the losses register are the ones named here."""

from __future__ import annotations

# Registry name -> class path of every divergence (`distill.losses.DIVERGENCES` by class).
DIVERGENCE_CLASSES: dict[str, str] = {
    "forward_kl": "distill.losses.ForwardKL",
    "reverse_kl": "distill.losses.ReverseKL",
    "jsd": "distill.losses.GeneralizedJSD",
    "skew_kl": "distill.losses.SkewKL",
    "skew_reverse_kl": "distill.losses.SkewReverseKL",
    "tvd": "distill.losses.TotalVariation",
    "interpolated_kl": "distill.losses.InterpolatedKL",
}
# Who writes a rollout's tokens, at which granularity the teacher's share applies.
GRANULARITIES = ("batch", "sequence", "token", "speculative")
# A divergence's estimators: exact over the vocabulary (or its top-k), or sampled (Schulman's k1-k3).
EXACT_ESTIMATORS = ("exact", "topk")
SAMPLED_ESTIMATORS = ("k1", "k2", "k3")
ESTIMATORS = ("exact", "k1", "k2", "k3", "topk")
# GRPO's per-token KL-penalty estimators.
KL_ESTIMATORS = ("k1", "k2", "k3")

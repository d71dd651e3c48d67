"""Token-level divergences between student and teacher next-token distributions.

``divergences.py`` holds the classes and the config registry, ``base.py`` their shared options and
call paths, ``formulas.py`` each divergence's per-token definition (all a new one needs),
``functional.py`` the closed-form row math, ``chunked.py`` the memory-light autograd,
``reduction.py`` the optimiser-step normalisation and ``statistics.py`` the logging statistics.
"""

from distill.losses.base import TokenDivergence
from distill.losses.divergences import (
    DIVERGENCES,
    ForwardKL,
    GeneralizedJSD,
    InterpolatedKL,
    ReverseKL,
    SkewKL,
    SkewReverseKL,
    TotalVariation,
    build_divergence,
)
from distill.losses.reduction import global_sum, gradient_denominator, step_token_count
from distill.losses.statistics import token_statistics

__all__ = [
    "DIVERGENCES",
    "ForwardKL",
    "GeneralizedJSD",
    "InterpolatedKL",
    "ReverseKL",
    "SkewKL",
    "SkewReverseKL",
    "TokenDivergence",
    "TotalVariation",
    "build_divergence",
    "global_sum",
    "gradient_denominator",
    "step_token_count",
    "token_statistics",
]

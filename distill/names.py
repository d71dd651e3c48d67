"""The knob names every layer agrees on: the losses, the sampler, GRPO and sweep specs read them
from here (no torch is imported, so a spec is checked without it). `tests/test_names.py` checks
that the divergence classes the losses register are the ones named here.

The sweep axes' shorthands (`SHORTHANDS`: `mix`, `lr`, `divergence`, ...) live here too, so that
`distill fit` logs its knobs (`knobs_of`) under the names the sweeps and the report use without
importing the sweep code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Shorthand:
    """An axis name for the config path `path`; `kind` says what its values are (`check_value`):
    'choice' (one of `choices`), 'text' (a non-empty string), 'count' (an integer >= 0),
    'fraction' (a number in [0, 1]) or 'positive' (a number > 0); `null`: None too.
    `to_config`: the value written into the config."""

    path: str
    kind: str
    choices: tuple[str, ...] = ()
    null: bool = False
    to_config: Callable[[Any], Any] = lambda value: value


SHORTHANDS: dict[str, Shorthand] = {
    "mix": Shorthand("data.mix", "fraction"),
    "granularity": Shorthand("data.granularity", "choice", GRANULARITIES),
    "task": Shorthand("data.task", "text"),
    "lr": Shorthand("model.optimizer.init_args.lr", "positive"),
    "seed": Shorthand("seed_everything", "count"),
    "estimator": Shorthand("model.divergence.init_args.estimator", "choice", ESTIMATORS),
    "gradient_clip": Shorthand("model.gradient_clip_val", "positive", null=True),
    "divergence": Shorthand(
        "model.divergence.class_path", "choice", tuple(DIVERGENCE_CLASSES), to_config=DIVERGENCE_CLASSES.get
    ),
}
PATH_TO_SHORTHAND = {s.path: name for name, s in SHORTHANDS.items()}


def knobs_of(config: dict[str, Any]) -> dict[str, Any]:
    """The shorthand knobs a resolved fit config (as `config.yaml` holds it) sets, by shorthand
    name, e.g. ``{"mix": 0.5, "divergence": "reverse_kl", "lr": 0.001, "seed": 0, ...}``; a knob the
    config lacks (a GRPO run has no divergence) is left out. `distill fit` logs them to
    TensorBoard's HParams dashboard, under the names the sweeps and the report use."""
    class_paths = {path: name for name, path in DIVERGENCE_CLASSES.items()}
    knobs = {}
    for name, short in SHORTHANDS.items():
        parts = short.path.split(".")
        if parts[0] == "model":  # the model is a class_path entry: its options are init_args
            parts = ["model", "init_args", *parts[1:]]
        node: Any = config
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:  # the path is set; None counts only for knobs that may be null
            if node is not None or short.null:
                knobs[name] = class_paths.get(node, node) if name == "divergence" else node
    return knobs

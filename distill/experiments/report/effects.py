"""Effect sizes for the contrasts the study's claims are about, with 95 % intervals (exploratory:
the declared contrasts and their verdicts are `distill.experiments.stats.verdicts`).

A contrast compares two values of one knob (`a` and `b`, e.g. mix 0 against mix 1), optionally
within one value of another knob (e.g. within forward KL), pooled over everything else. Runs of
`a` and `b` are paired when they share every other setting (learning rate, seed, ...): the effect
is then the mean of the paired differences, with the interval of `distill.experiments.stats.intervals`
(Student's t below `MIN_BOOTSTRAP_PAIRS` = 10 pairs, a percentile bootstrap over the pairs from
there on). Runs without a partner are left out; with no pairs at all (an unbalanced sweep) the effect
is the difference of the two means and each side is resampled on its own.

A bootstrap over few pairs under-covers (over two it can only return their range, and two equal
differences gave a zero-width interval that "excluded 0"). One pair has no interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from distill.experiments.report.tables import table
from distill.experiments.run.axes import format_value
from distill.experiments.run.records import RunRecord, is_share
from distill.experiments.stats.intervals import MIN_BOOTSTRAP_PAIRS, estimate, t_quantile  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class Effect:
    """mean(metric | knob=a) - mean(metric | knob=b), within `within` (knob, value) if set."""

    metric: str
    knob: str
    a: Any
    b: Any
    within: tuple[str, Any] | None
    difference: float
    low: float
    high: float
    n: int  # pairs, or runs of the smaller side when unpaired
    paired: bool

    @property
    def clear(self) -> bool:
        """Whether the interval excludes 0 (never without an interval: NaN bounds)."""
        return self.low > 0 or self.high < 0

    @property
    def says_something(self) -> bool:
        """False for a contrast whose sides are equal in every pair (e.g. 0 % everywhere)."""
        return self.difference != 0 or self.high > self.low

    @property
    def method(self) -> str:
        """How the interval was made: "bootstrap", or "t" for a paired contrast of few pairs."""
        return "t" if self.paired and self.n < MIN_BOOTSTRAP_PAIRS else "bootstrap"


def _key(record: RunRecord, skip: set[str]) -> tuple:
    return tuple(sorted((k, format_value(v)) for k, v in record.settings.items() if k not in skip))


def _matches(record: RunRecord, knob: str, value: Any) -> bool:
    return knob in record.settings and format_value(record.settings[knob]) == format_value(value)


def difference_interval(
    a: np.ndarray, b: np.ndarray, paired: bool, n_boot: int, level: float, seed: int, resolution=None
) -> tuple[float, float, float]:
    """(mean(a - b) or mean(a) - mean(b), low, high): for paired runs `intervals.estimate` (Student's
    t below `MIN_BOOTSTRAP_PAIRS` pairs, nan bounds for one pair or none without spread; from there
    on a percentile bootstrap with as many resamples as bounds stable to `resolution` need);
    unpaired, a percentile bootstrap of `n_boot` resamples of each side."""
    if paired:
        d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
        est = estimate([d], level, resolution, seed)
        if est.method == "none" or est.se == 0:  # no spread to scale: no interval, not a zero-width one
            return est.point, math.nan, math.nan
        return est.point, est.low, est.high
    rng = np.random.default_rng(seed)
    tail = (1 - level) / 2 * 100
    boot = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1) - b[
        rng.integers(0, b.size, size=(n_boot, b.size))
    ].mean(axis=1)
    low, high = np.percentile(boot, [tail, 100 - tail])
    return float(a.mean() - b.mean()), float(low), float(high)


def contrast(
    records: list[RunRecord],
    metric: str,
    knob: str,
    a: Any,
    b: Any,
    within: tuple[str, Any] | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Effect | None:
    """The effect of `knob` = `a` against `b` on `metric` (None when either side has no finite
    value)."""
    runs = [r for r in records if within is None or _matches(r, *within)]
    runs = [r for r in runs if metric in r.metrics and math.isfinite(r.metrics[metric])]
    side_a = {_key(r, {knob}): r.metrics[metric] for r in runs if _matches(r, knob, a)}
    side_b = {_key(r, {knob}): r.metrics[metric] for r in runs if _matches(r, knob, b)}
    if not side_a or not side_b:
        return None
    shared = sorted(set(side_a) & set(side_b))
    if shared:
        x = np.array([side_a[k] for k in shared])
        y = np.array([side_b[k] for k in shared])
    else:
        x, y = np.array(list(side_a.values())), np.array(list(side_b.values()))
    resolution = 0.001 if is_share(metric) else None  # printed in 0.1 pp
    diff, low, high = difference_interval(x, y, bool(shared), n_boot, level, seed, resolution)
    n = len(shared) if shared else min(len(side_a), len(side_b))
    return Effect(metric, knob, a, b, within, diff, low, high, n, bool(shared))


def study_contrasts(factors: dict[str, list]) -> list[tuple[str, Any, Any, tuple[str, Any] | None]]:
    """The contrasts of the paper's claims that a sweep's knobs allow, as (knob, a, b, within):
    on- against off-policy (the lowest mix against the highest) within each divergence and pooled
    over them; forward against reverse KL within the lowest and the highest mix and pooled over
    every mix; the highest learning rate against the lowest, pooled."""
    out: list[tuple[str, Any, Any, tuple[str, Any] | None]] = []
    mixes = sorted(factors.get("mix", []))
    divergences = list(factors.get("divergence", []))
    if len(mixes) > 1:
        for div in divergences or [None]:
            out.append(("mix", mixes[0], mixes[-1], None if div is None else ("divergence", div)))
        if len(divergences) > 1:  # pooled over the directions: twice the pairs
            out.append(("mix", mixes[0], mixes[-1], None))
    if {"forward_kl", "reverse_kl"} <= set(divergences):
        ends = [mixes[0], mixes[-1]] if len(mixes) > 1 else [None]
        for mix in ends:
            out.append(("divergence", "forward_kl", "reverse_kl", None if mix is None else ("mix", mix)))
        if len(mixes) > 1:  # pooled over every mix: the direction's main effect
            out.append(("divergence", "forward_kl", "reverse_kl", None))
    lrs = sorted(factors.get("lr", []))
    if len(lrs) > 1:
        out.append(("lr", lrs[-1], lrs[0], None))
    return out


def policy_side(a: Any, b: Any) -> str:
    """Which side of a mix contrast a − b is on-policy (mix is the teacher's share of the rollouts)."""
    return "on − off-policy" if (a, b) == (0, 1) else "more − less on-policy"


def _points(x: float) -> str:
    """Percentage points: one decimal, or two significant digits below 0.1 pp."""
    return f"{x:+.1f}" if abs(x) >= 0.1 or x == 0 else f"{x:+.2g}"


def _effect_cells(effect: Effect, metric: str) -> tuple[str, str]:
    """(effect, interval) cells: shares in percentage points; "—" where there is no interval."""
    share = is_share(metric)

    def fmt(v: float) -> str:
        return _points(100 * v) if share else f"{v:+.3g}"

    difference = fmt(effect.difference) + (" pp" if share else "")
    if not (math.isfinite(effect.low) and math.isfinite(effect.high)):
        return difference, "—"
    return difference, f"[{fmt(effect.low)}, {fmt(effect.high)}]"


def effect_metrics(groups: dict[str, list[str]]) -> list[str]:
    """The outcomes the effects table covers: test accuracies, pass@k at the largest k of each
    test set, the side effects and the logit-gradient norms."""
    coverage = {}
    for metric in groups["coverage"]:
        head, _, tail = metric.rpartition("/pass@")
        if tail.isdigit() and int(tail) > int(coverage.get(head, "0")):
            coverage[head] = tail
    best_k = [f"{h}/pass@{k}" for h, k in coverage.items()]
    return groups["accuracy"] + best_k + groups["side"] + groups.get("gradient", [])


def effects_section(
    records: list[RunRecord], metrics: list[str], factors: dict[str, list], n_boot: int
) -> list[str]:
    """The report's effect-size table: every study contrast on every metric given."""
    rows = []
    for knob, a, b, within in study_contrasts(factors):
        for metric in metrics:
            effect = contrast(records, metric, knob, a, b, within, n_boot=n_boot)
            if effect is None or not effect.says_something:
                continue
            where = "all runs" if within is None else f"{within[0]}={format_value(within[1])}"
            pairs = f"{effect.n} pairs" if effect.paired else f"{effect.n} runs (unpaired)"
            pairs += ", t" if effect.method == "t" and math.isfinite(effect.low) else ""
            rows.append(
                [
                    metric,
                    f"{knob}={format_value(a)} − {knob}={format_value(b)}"
                    + (f" ({policy_side(a, b)})" if knob == "mix" else ""),
                    where,
                    *_effect_cells(effect, metric),
                    pairs + (" ✱" if effect.clear else ""),
                ]
            )
    if not rows:
        return []
    intro = (
        "Exploratory: none of these contrasts is declared in a claims file, so they carry no verdict and "
        "no correction for their number (the declared ones are in the verdict table above, where a claims "
        "file applies). Difference of means run for run: runs of the two sides that share every other "
        "setting (learning rate, seed, ...) are paired, pooling any knob not named, learning rates "
        "included (pp: percentage points). Unadjusted 95 % intervals: Student's t on the paired "
        f"differences below {MIN_BOOTSTRAP_PAIRS} pairs (marked t; none, —, for one pair or pairs without "
        "spread), from there on a percentile bootstrap over the pairs. ✱: the interval excludes 0. "
        "Contrasts whose two sides are equal in every pair (e.g. 0 % everywhere) are left out."
    )
    header = ["outcome", "contrast", "within", "effect", "95 % interval", "n"]
    return ["## Effects (exploratory)", "", intro, "", *table(header, rows)]

"""Effect sizes for the contrasts the study's claims are about, with bootstrap intervals.

A contrast compares two values of one knob (`a` and `b`, e.g. mix 0 against mix 1), optionally
within one value of another knob (e.g. within forward KL), pooled over everything else. Runs of
`a` and `b` are paired when they share every other setting (learning rate, seed, ...): the effect
is then the mean of the paired differences, and its percentile bootstrap interval resamples the
pairs. Runs without a partner are left out; with no pairs at all (an unbalanced sweep) the effect
is the difference of the two means and each side is resampled on its own.

Below `MIN_BOOTSTRAP_PAIRS` pairs the interval is Student's t on the paired differences instead:
a bootstrap over two pairs can only return their range (two equal differences give a zero-width
interval that "excludes 0"), far narrower than the uncertainty of a mean of two. One pair has no
interval.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from distill.experiments.axes import format_value
from distill.experiments.records import RunRecord
from distill.experiments.tables import is_share, table


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


MIN_BOOTSTRAP_PAIRS = 5


@functools.lru_cache(maxsize=64)  # a report asks for the same (p, df) once per contrast
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with `df` degrees of freedom (p in (0.5, 1)): bisection on its
    CDF, integrated from the density by Simpson's rule (no scipy here)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile: p must be in (0.5, 1) and df >= 1, got p={p}, df={df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float) -> float:  # t >= 0; substitute x = tan(u) so the heavy tail is on a finite range
        u = np.linspace(0.0, math.atan(t), 4001)
        x = np.tan(u)
        f = np.exp(log_norm - (df + 1) / 2 * np.log1p(x * x / df)) * (1 + x * x)
        h = u[1] - u[0]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum())

    low, high = 0.0, 1.0
    while cdf(high) < p:
        high *= 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def difference_interval(
    a: np.ndarray, b: np.ndarray, paired: bool, n_boot: int, level: float, seed: int
) -> tuple[float, float, float]:
    """(mean(a - b) or mean(a) - mean(b), low, high): the percentile bootstrap interval, or
    Student's t for fewer than `MIN_BOOTSTRAP_PAIRS` pairs (nan bounds for one pair)."""
    rng = np.random.default_rng(seed)
    tail = (1 - level) / 2 * 100
    if paired and a.size < MIN_BOOTSTRAP_PAIRS:
        d = a - b
        point = float(d.mean())
        # no spread to scale (up to float rounding): no interval, not a zero-width one
        if d.size < 2 or float(np.ptp(d)) <= 1e-12 * max(1.0, float(np.abs(d).max())):
            return point, math.nan, math.nan
        half = t_quantile(1 - (1 - level) / 2, d.size - 1) * float(d.std(ddof=1)) / math.sqrt(d.size)
        return point, point - half, point + half
    if paired:
        d = a - b
        boot = d[rng.integers(0, d.size, size=(n_boot, d.size))].mean(axis=1)
        point = float(d.mean())
    else:
        boot = a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(axis=1) - b[
            rng.integers(0, b.size, size=(n_boot, b.size))
        ].mean(axis=1)
        point = float(a.mean() - b.mean())
    low, high = np.percentile(boot, [tail, 100 - tail])
    return point, float(low), float(high)


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
    diff, low, high = difference_interval(x, y, bool(shared), n_boot, level, seed)
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
        "Difference of means for the contrasts the study's claims are about, run for run: runs of the "
        "two sides that share every other setting (learning rate, seed, ...) are paired, and the interval "
        "is a percentile bootstrap 95 % interval over the pairs (pp: percentage points). ✱: the interval "
        f"excludes 0. With fewer than {MIN_BOOTSTRAP_PAIRS} pairs (marked t) the interval is Student's t on "
        "the paired differences (none, —, for one pair or pairs without spread): a bootstrap over two pairs would only span their range. Contrasts whose "
        "two sides are equal in every pair (e.g. 0 % everywhere) are left out."
    )
    header = ["outcome", "contrast", "within", "effect", "95 % interval", "n"]
    return ["## Effects", "", intro, "", *table(header, rows)]

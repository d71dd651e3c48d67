"""Intervals for paired differences: Student's t below 10 pairs, the bootstrap from 10 on; the
equal-weight estimate over strata; Holm's step-down; the minimum detectable effect; a check that
pairs sharing a seed are independent.

A *stratum* is a value of a fixed factor (e.g. a learning rate): its effect is not noise to be
pooled. The stratified estimate is the equal-weight mean of the per-stratum mean differences,
so it estimates "the effect averaged over the declared strata", a target fixed by the design. Its
variance is the sum of the strata's sd²/n over S², with Welch–Satterthwaite degrees of freedom (the
strata's spreads differ: one learning rate may move a metric by tenths of a point, another by
several). Inverse-variance weights were rejected: with 2–5 pairs a stratum, a variance estimate is
itself so noisy that the weights would follow the noise, and a stratum that happened to agree
with itself would decide the estimate.

Below `MIN_BOOTSTRAP_PAIRS` pairs in any stratum the interval is t; from there on an expanded
percentile bootstrap (within strata; see `estimate`), with as many resamples as it takes for the
printed bound to be stable:
the Monte Carlo sd of a percentile bound is about se · sqrt(q (1 − q) / B) / φ(z_q), and B is set
so that it is at most a quarter of the printed resolution (0.1 pp for shares).

Every p-value here is the interval inverted: the largest level whose interval still holds 0 is
1 − p, so the interval at a level excludes 0 exactly when p < 1 − level, and Holm's step-down
(which tests each contrast at the level of its step) rejects exactly the contrasts whose interval
at that level excludes 0. For the bootstrap this holds only if the p-value and the interval come
from the same resamples: `estimate` sizes them for the strictest level it may be asked at
(`strictest`, Holm's first step) and draws them from its `seed`, so every level sees the same
resamples, and p has no floor set by their number (0 when none falls on the other side of 0).

The pairs are taken as independent. Where pairs share a value of a knob (the seed of a claim
paired by seed and mix, or by seed across learning-rate strata), `independence` tests whether they
differ alike: an F test of the knob's effect on the differences after each stratum's mean.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

MIN_BOOTSTRAP_PAIRS = 10
MAX_RESAMPLES = 2_000_000
_CHUNK = 200_000


def _log_density_norm(df: float) -> float:
    return math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)


def t_tail(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` > 0 degrees of freedom and t >= 0: the density
    integrated by Simpson's rule over u = atan(x) in [atan(t), π/2] (no scipy here; the tail is
    integrated directly, so small p-values keep their digits)."""
    if t < 0 or not df > 0:
        raise ValueError(f"t_tail: need t >= 0 and df > 0, got t={t}, df={df}")
    if math.isinf(t):
        return 0.0
    u = np.linspace(math.atan(t), math.pi / 2, 1201)
    x2 = np.tan(u) ** 2
    with np.errstate(over="ignore"):
        f = np.exp(_log_density_norm(df) - (df + 1) / 2 * np.log1p(x2 / df) + np.log1p(x2))
    h = u[1] - u[0]
    return float(h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))


def _t_density(t: float, df: float) -> float:
    return math.exp(_log_density_norm(df) - (df + 1) / 2 * math.log1p(t * t / df))


@functools.lru_cache(maxsize=256)  # a report asks for the same (p, df) once per contrast
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` > 0 degrees of freedom (p in (0.5, 1)): Newton's
    method on its tail from the normal quantile, which lies below it where the tail is convex, so
    the steps climb to the root; a step that would leave the bracket known so far bisects it."""
    if not 0.5 < p < 1 or not df > 0:
        raise ValueError(f"t_quantile: p must be in (0.5, 1) and df > 0, got p={p}, df={df}")
    tail = 1 - p
    low, high = 0.0, math.inf
    t = NORMAL.inv_cdf(p)
    for _ in range(200):
        excess = t_tail(t, df) - tail
        if excess == 0:
            return t
        low, high = (t, high) if excess > 0 else (low, t)
        step = t + excess / _t_density(t, df)
        if not low < step < high:
            step = (low + high) / 2 if math.isfinite(high) else 2 * t
        if abs(step - t) <= 1e-15 * t:
            return step
        t = step
    return t


NORMAL = NormalDist()


def f_tail(f: float, df1: float, df2: float) -> float:
    """P(F > f) for Snedecor's F with `df1`, `df2` > 0 degrees of freedom and f >= 0: the regularized
    incomplete beta I_x(df2 / 2, df1 / 2) at x = df2 / (df2 + df1 f)."""
    if f < 0 or not (df1 > 0 and df2 > 0):
        raise ValueError(f"f_tail: need f >= 0 and df > 0, got f={f}, df1={df1}, df2={df2}")
    if math.isinf(f):
        return 0.0
    return _beta_regularized(df2 / 2, df1 / 2, df2 / (df2 + df1 * f))


def _beta_regularized(a: float, b: float, x: float) -> float:
    """I_x(a, b) by its continued fraction (Numerical Recipes, 3rd ed., § 6.4; modified Lentz),
    evaluated on the side of the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) where it converges fast."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _beta_regularized(b, a, 1.0 - x)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 1000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * fraction / a


def resamples(se: float, tail: float, resolution: float | None) -> int:
    """Bootstrap resamples that make the `tail` percentile bound's Monte Carlo sd at most a
    quarter of `resolution` (None: at most se / 50)."""
    if not se > 0:
        return 2000
    target = resolution / 4 if resolution else se / 50
    z = NORMAL.inv_cdf(1 - tail)
    density = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    needed = tail * (1 - tail) * (se / (target * density)) ** 2
    return int(min(MAX_RESAMPLES, max(2000, math.ceil(needed))))


@dataclass(frozen=True)
class Estimate:
    """A (stratified) mean paired difference with its interval at `level` and two-sided p-value
    (nan without spread: no interval to invert)."""

    point: float
    low: float
    high: float
    se: float
    df: float
    p: float
    n: int  # the pairs the estimate uses, over all strata
    method: str  # "t", "bootstrap", or "none" (fewer than 2 pairs in every stratum)
    level: float
    resamples: int = 0

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def _moments(strata: list[np.ndarray]) -> tuple[float, float, float]:
    """(equal-weight mean, its standard error, Welch–Satterthwaite df) over strata of >= 2 pairs."""
    s = len(strata)
    point = float(np.mean([d.mean() for d in strata]))
    parts = [float(d.var(ddof=1)) / d.size / s**2 for d in strata]
    var = sum(parts)
    if var <= 0:
        return point, 0.0, float(sum(d.size - 1 for d in strata))
    df = var**2 / sum(v * v / (d.size - 1) for v, d in zip(parts, strata) if v > 0)
    return point, math.sqrt(var), df


def _boot_means(strata: list[np.ndarray], n: int, rng) -> np.ndarray:
    """`n` bootstrap replicates of the equal-weight mean, resampling pairs within each stratum."""
    out = np.empty(n)
    for start in range(0, n, _CHUNK):
        size = min(_CHUNK, n - start)
        total = np.zeros(size)
        for d in strata:
            total += d[rng.integers(0, d.size, size=(size, d.size))].mean(axis=1)
        out[start : start + size] = total / len(strata)
    return out


def _crossing(boot: np.ndarray) -> float:
    """The share q at which the percentile function of the sorted resamples `boot` (numpy's default:
    linear between order statistics) turns positive: its q-quantile is > 0 exactly when q exceeds
    it (0 when every resample is positive, 1 when none is)."""
    b = boot.size
    if boot[0] > 0:
        return 0.0
    if boot[-1] <= 0:
        return 1.0
    k = int(np.searchsorted(boot, 0.0, side="right")) - 1  # the last resample <= 0
    return (k - boot[k] / (boot[k + 1] - boot[k])) / (b - 1)


def estimate(
    strata: list[np.ndarray],
    level: float = 0.95,
    resolution: float | None = None,
    seed: int = 0,
    strictest: float | None = None,
) -> Estimate:
    """The equal-weight mean of the strata's mean paired differences, with a t interval (some
    stratum below `MIN_BOOTSTRAP_PAIRS`) or a stratified percentile bootstrap. Strata of fewer than
    2 pairs are left out (no spread to scale), from the mean and from the pair count; with none
    left there is no interval, and the point is the mean of the lone pairs.

    `strictest`: the highest level the same differences will be asked at (Holm's first step). The
    bootstrap's resamples are sized for it and drawn from `seed`, so calls at any level up to it
    see the same resamples, and p < 1 − level exactly when the interval at `level` excludes 0."""
    if not 0 < level < 1:
        raise ValueError(f"estimate: level must be in (0, 1), got {level}")
    kept = [np.asarray(d, dtype=float) for d in strata if len(d) >= 2]
    if not kept:
        lone = [float(np.mean(d)) for d in strata if len(d)]
        point = float(np.mean(lone)) if lone else math.nan
        return Estimate(point, math.nan, math.nan, math.nan, math.nan, math.nan, len(lone), "none", level)
    n = int(sum(d.size for d in kept))
    point, se, df = _moments(kept)
    if all(float(np.ptp(d)) <= 1e-12 * max(1.0, float(np.abs(d).max())) for d in kept):
        se = 0.0  # no spread beyond float rounding: not a zero-width interval that "excludes 0"
    tail = (1 - level) / 2
    if se == 0:  # every pair of every stratum differs by the same amount: no interval, so no p
        return Estimate(point, point, point, 0.0, df, math.nan, n, "t", level)
    if min(d.size for d in kept) < MIN_BOOTSTRAP_PAIRS:
        half = t_quantile(1 - tail, df) * se
        p = min(1.0, 2 * t_tail(abs(point) / se, df))
        return Estimate(point, point - half, point + half, se, df, p, n, "t", level)
    # Expanded percentiles (Hesterberg 2015): a plain percentile interval is as narrow as z * sd / sqrt(n)
    # with sd over n, and under-covered at 12 pairs (90 % for 95 % in a simulation); its tails are
    # moved out to where a normal sample would have t's width with sd over n - 1.
    n_min = min(d.size for d in kept)
    stretch = math.sqrt(n_min / (n_min - 1))

    def expanded(tail: float) -> float:
        return NORMAL.cdf(-stretch * t_quantile(1 - tail, df))

    tail_used = expanded(tail)
    sized_for = tail_used if strictest is None else min(tail_used, expanded((1 - strictest) / 2))
    b = resamples(se, sized_for, resolution)
    boot = np.sort(_boot_means(kept, b, np.random.default_rng(seed)))
    low, high = np.quantile(boot, [tail_used, 1 - tail_used])
    # The interval inverted: it excludes 0 once its expanded tail passes the share of resamples on
    # the far side of 0 (read off the same percentile function), i.e. once (1 - level) / 2 passes
    # the t tail at that share's normal quantile, unstretched.
    share = min(_crossing(boot), _crossing(-boot[::-1]))
    z = -NORMAL.inv_cdf(share) if share > 0 else math.inf
    p = 1.0 if share >= 0.5 else 2 * t_tail(z / stretch, df)
    return Estimate(point, float(low), float(high), se, df, p, n, "bootstrap", level, b)


def holm(p_values: list[float], alpha: float = 0.05) -> tuple[list[float], list[float]]:
    """Holm's step-down over a family: (adjusted p-values, the level each is tested at).

    Adjusted p_(i) = max over j <= i of min(1, (m − j + 1) p_(j)) (ranks by ascending p). The
    level of a contrast is 1 − α / (m − i + 1) at its rank i while the step-down rejects, and
    that of the first contrast it stops at for every later one: the interval at that level
    excludes 0 exactly when Holm rejects (for the bootstrap, with `estimate`'s `strictest` and seed
    the same at every level). A nan p-value counts in m but gets neither an adjusted p nor a level;
    a contrast without an interval to invert belongs in the family as p = 1, never a rejection."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: (math.isnan(p_values[i]), p_values[i]))
    adjusted, levels = [math.nan] * m, [math.nan] * m
    running, stopped = 0.0, None
    for rank, i in enumerate(order):
        if math.isnan(p_values[i]):
            continue
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
        if stopped is None and running > alpha:
            stopped = rank
        levels[i] = 1 - alpha / (m - (rank if stopped is None else stopped))
    return adjusted, levels


@dataclass(frozen=True)
class Independence:
    """The F test of a knob's effect on paired differences beyond their strata's means: whether
    pairs that share the knob's value (a seed) differ alike, as independent pairs would not."""

    knob: str
    f: float
    df1: int
    df2: int
    p: float


def independence(strata: list[np.ndarray], clusters: list[list], knob: str) -> Independence | None:
    """The nested-model F test of `knob` on the differences of `strata`, `clusters[i][j]` being the
    knob's value of difference j of stratum i: residual sums of squares of least squares on the
    strata alone and on strata plus knob (additive; exact for unbalanced designs too). None when no
    value of the knob recurs across pairs, when the fit leaves no degrees of freedom, or without
    spread."""
    groups = [np.asarray(d, dtype=float) for d in strata]
    labels = [c for cs in clusters for c in cs]
    y = np.concatenate(groups) if groups else np.empty(0)
    if len(labels) != y.size:
        raise ValueError(f"independence: {len(labels)} knob values for {y.size} differences")
    if len(set(labels)) == len(labels):
        return None
    if all(d.size < 2 or float(np.ptp(d)) <= 1e-12 * max(1.0, float(np.abs(d).max())) for d in groups):
        return None
    stratum = np.repeat(np.arange(len(groups)), [d.size for d in groups])
    blocks = (stratum[:, None] == np.arange(len(groups))).astype(float)
    values = list(dict.fromkeys(labels))
    knob_columns = np.array([[label == v for v in values] for label in labels], dtype=float)

    def fit(x: np.ndarray) -> tuple[float, int]:
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        residual = y - x @ coef
        return float(residual @ residual), int(np.linalg.matrix_rank(x))

    rss_strata, rank_strata = fit(blocks)
    rss_full, rank_full = fit(np.hstack([blocks, knob_columns]))
    df1, df2 = rank_full - rank_strata, y.size - rank_full
    if df1 < 1 or df2 < 1:
        return None
    f = (rss_strata - rss_full) / df1 / (rss_full / df2) if rss_full > 0 else math.inf
    f = max(0.0, f)  # rounding can leave -1e-16 when the knob explains nothing
    return Independence(knob, f, df1, df2, f_tail(f, df1, df2))


def minimum_detectable(se: float, df: float, level: float, power: float = 0.8) -> float:
    """The smallest true effect a two-sided t test at `level` detects with `power`, given the
    standard error and df observed: (t_{1 − α/2} + t_{power}) · se."""
    if not (se > 0 and df > 0):
        return math.nan
    return (t_quantile(1 - (1 - level) / 2, df) + t_quantile(power, df)) * se

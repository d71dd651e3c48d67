"""Which knob matters: variance shares of main effects, with basic bootstrap intervals.

For an outcome y over runs and knobs k (seeds excluded: they are the replicates),

    eta²_k       = SS_between(k) / SS_total,  SS_between(k) = sum_g n_g (mean_g - mean)²
    residual     = SS_within(cells) / SS_total   (cells: runs sharing every knob value; this is
                   the seed-to-seed share)
    interactions = 1 - sum_k eta²_k - residual

In a balanced full grid the main effects are orthogonal, so the three parts add to one with
interactions >= 0; in an unbalanced one (missing runs) the remainder may be slightly negative.

Intervals are *basic* bootstrap intervals, [2 est − q_high, 2 est − q_low] clipped to [0, 1].
A variance share is biased upwards (seed noise lands in every cell mean), and a resample adds that
noise a second time: percentile intervals sat above the estimate for small shares (a null mix
share of 0.12 got [0.02, 0.47] in a simulation), and could not contain 0. The basic interval
reflects the resamples about the estimate, so the bias is subtracted once; under a known null it
contains 0 in about 95 % of simulated grids (tests/experiments/test_analysis.py). It may lie
below the estimate itself, which is then mostly bias.

When some cell has two or more runs, the design
stays fixed and only seed noise is resampled, by a residual bootstrap: each run is its cell's
mean plus a within-cell residual drawn from all cells' residuals, each scaled by
sqrt(n_c / (n_c - 1)) so that the draws have the seed variance itself (a residual of a cell of
n_c runs has only (n_c - 1) / n_c of it). Resampling runs within their cells instead is
degenerate with two seeds a cell: half the resamples repeat one seed, the within-cell spread
shrinks, and the seed share's interval fell below its own estimate (measured on the v2 grid:
0.115 [0.023, 0.093]). With no replicates, whole runs are resampled and the residual share is 0
by construction (seed noise cannot be told apart from interactions).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

N_BOOT = 1000


@dataclass(frozen=True)
class Share:
    """A variance share with its bootstrap interval (`low`, `high`)."""

    estimate: float
    low: float
    high: float


@dataclass(frozen=True)
class Importance:
    """Variance decomposition of one outcome over `n_runs` runs."""

    outcome: str
    n_runs: int
    factors: dict[str, Share]
    interactions: Share
    residual: Share
    resampling: str  # "within-cell residuals" or "runs"

    def largest(self) -> str:
        return max(self.factors, key=lambda k: self.factors[k].estimate)


def summarize(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation (nan for one value), count) of the finite values."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size == 0:
        return math.nan, math.nan, 0
    return float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else math.nan, int(x.size)


def _codes(labels: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    index: dict[Hashable, int] = {}
    codes = np.array([index.setdefault(label, len(index)) for label in labels], dtype=np.int64)
    return codes, len(index)


def _ss_between(y: np.ndarray, codes: np.ndarray, n_groups: int) -> np.ndarray:
    """SS_between for each row of y [B, n] with group codes [B, n] (or [n], shared by all rows)."""
    rows = y.shape[0]
    codes = np.broadcast_to(codes, y.shape)
    flat = (np.arange(rows)[:, None] * n_groups + codes).ravel()
    sums = np.bincount(flat, weights=y.ravel(), minlength=rows * n_groups).reshape(rows, n_groups)
    counts = np.bincount(flat, minlength=rows * n_groups).reshape(rows, n_groups)
    means = np.divide(sums, counts, out=np.zeros_like(sums), where=counts > 0)
    grand = y.mean(axis=1, keepdims=True)
    return (counts * (means - grand) ** 2).sum(axis=1)


def eta_squared(y: Sequence[float], labels: Sequence[Hashable]) -> float:
    """SS_between / SS_total of y grouped by labels (nan when y has no variance)."""
    y = np.asarray(y, dtype=float)[None, :]
    codes, groups = _codes(labels)
    total = float(((y - y.mean()) ** 2).sum())
    return float(_ss_between(y, codes, groups)[0]) / total if total > 0 else math.nan


def _shares(y: np.ndarray, codes: dict[str, np.ndarray], sizes: dict[str, int], cells, n_cells):
    """Main-effect, interaction and residual shares for each row of y [B, n]."""
    total = ((y - y.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = total > 1e-300
        denom = np.where(ok, total, 1.0)
        mains = {k: np.where(ok, _ss_between(y, codes[k], sizes[k]) / denom, np.nan) for k in codes}
        residual = np.where(ok, (total - _ss_between(y, cells, n_cells)) / denom, np.nan)
        residual = np.clip(residual, 0.0, 1.0)  # rounding can leave -1e-17
        interactions = 1.0 - sum(mains.values()) - residual
    return mains, interactions, residual


def _residual_resamples(y: np.ndarray, members: list[np.ndarray], n_boot: int, rng) -> np.ndarray:
    """[n_boot, n] resamples of y: every run keeps its cell's mean and gets a residual drawn from
    the pool of variance-corrected within-cell residuals (cells of two or more runs)."""
    fitted = np.empty_like(y)
    pool = []
    for m in members:
        fitted[m] = y[m].mean()
        if len(m) >= 2:
            pool.append((y[m] - fitted[m]) * math.sqrt(len(m) / (len(m) - 1)))
    pool = np.concatenate(pool)
    return fitted[None, :] + rng.choice(pool, size=(n_boot, y.size), replace=True)


def factor_importance(
    y: Sequence[float],
    factors: dict[str, Sequence[Hashable]],
    outcome: str = "",
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = 0.95,
) -> Importance:
    """Variance shares of `y` explained by each factor's main effect, by interactions and by
    replicates (runs that share all factor values), with `level` basic bootstrap intervals."""
    y = np.asarray(y, dtype=float)
    if y.ndim != 1 or y.size < 2:
        raise ValueError(f"factor_importance({outcome!r}): need at least 2 runs, got {y.size}")
    if not factors:
        raise ValueError(f"factor_importance({outcome!r}): no factors given")
    for name, labels in factors.items():
        if len(labels) != y.size:
            raise ValueError(f"factor {name!r}: {len(labels)} labels for {y.size} runs")
    coded = {name: _codes(labels) for name, labels in factors.items()}
    codes = {name: c for name, (c, _) in coded.items()}
    sizes = {name: g for name, (_, g) in coded.items()}
    cells, n_cells = _codes(list(zip(*factors.values())))
    mains, inter, resid = _shares(y[None, :], codes, sizes, cells, n_cells)

    rng = np.random.default_rng(seed)
    members = [np.flatnonzero(cells == c) for c in range(n_cells)]
    if max(len(m) for m in members) >= 2:
        resampling = "within-cell residuals"
        boot = _shares(_residual_resamples(y, members, n_boot, rng), codes, sizes, cells, n_cells)
    else:
        resampling = "runs"
        index = rng.integers(0, y.size, size=(n_boot, y.size))
        boot = _shares(y[index], {k: c[index] for k, c in codes.items()}, sizes, cells[index], n_cells)
    tail = (1 - level) / 2 * 100

    def share(point: np.ndarray, samples: np.ndarray) -> Share:
        if np.all(np.isnan(samples)):
            return Share(float(point[0]), math.nan, math.nan)
        low, high = np.nanpercentile(samples, [tail, 100 - tail])
        est = float(point[0])
        # basic interval: the resamples' spread reflected about the estimate, so the bias of a
        # variance share (seed noise in every cell mean) is taken off instead of added twice
        return Share(est, max(min(0.0, est), 2 * est - float(high)), min(1.0, 2 * est - float(low)))

    return Importance(
        outcome=outcome,
        n_runs=int(y.size),
        factors={k: share(mains[k], boot[0][k]) for k in factors},
        interactions=share(inter, boot[1]),
        residual=share(resid, boot[2]),
        resampling=resampling,
    )

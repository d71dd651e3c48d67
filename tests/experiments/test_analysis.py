"""Factor importance: eta² against a direct computation, planted effects, bootstrap intervals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from distill.experiments.stats.analysis import eta_squared, factor_importance, summarize


def _eta_by_hand(y, labels):
    grand = sum(y) / len(y)
    total = sum((v - grand) ** 2 for v in y)
    between = 0.0
    for g in set(labels):
        members = [v for v, lab in zip(y, labels) if lab == g]
        between += len(members) * (sum(members) / len(members) - grand) ** 2
    return between / total


def test_eta_squared_matches_direct_computation_on_unbalanced_groups():
    rng = np.random.default_rng(3)
    y = rng.normal(size=11).tolist()
    labels = ["a", "b", "a", "c", "c", "a", "b", "a", "c", "a", "b"]
    assert eta_squared(y, labels) == pytest.approx(_eta_by_hand(y, labels), rel=1e-12)
    assert eta_squared(y, list(range(11))) == pytest.approx(1.0)  # every run its own group
    assert eta_squared(y, ["x"] * 11) == pytest.approx(0.0)
    assert math.isnan(eta_squared([2.0, 2.0, 2.0], ["a", "b", "a"]))


def _grid(effect_div, effect_lr, noise, seeds=3, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    rows = list(itertools.product(["fkl", "rkl", "jsd"], [1e-4, 1e-3], range(seeds)))
    div_effect = {"fkl": 0.0, "rkl": 1.0, "jsd": 0.5}
    y = [effect_div * div_effect[d] + effect_lr * (lr == 1e-3) + noise * rng.normal() for d, lr, _ in rows]
    return y, [r[0] for r in rows], [r[1] for r in rows]


def test_balanced_grid_shares_add_to_one_and_name_the_planted_knob():
    y, div, lr = _grid(effect_div=1.0, effect_lr=0.1, noise=0.05)
    imp = factor_importance(y, {"divergence": div, "lr": lr}, outcome="acc", n_boot=300)
    parts = [imp.factors["divergence"], imp.factors["lr"], imp.interactions, imp.residual]
    assert sum(p.estimate for p in parts) == pytest.approx(1.0)
    assert imp.factors["divergence"].estimate == pytest.approx(eta_squared(y, div))
    assert imp.largest() == "divergence" and imp.factors["divergence"].estimate > 0.8
    assert imp.resampling == "within-cell residuals" and imp.n_runs == 18
    for p in parts:
        assert p.low <= p.estimate + 1e-9 and p.estimate - 1e-9 <= p.high
    # residual = within-cell (seed) sum of squares over the total, computed directly
    cells = {}
    for v, d, r in zip(y, div, lr):
        cells.setdefault((d, r), []).append(v)
    within = sum(sum((v - np.mean(c)) ** 2 for v in c) for c in cells.values())
    total = sum((v - np.mean(y)) ** 2 for v in y)
    assert imp.residual.estimate == pytest.approx(within / total)


def test_pure_noise_is_assigned_to_the_residual():
    y, div, lr = _grid(effect_div=0.0, effect_lr=0.0, noise=1.0, seeds=6)
    imp = factor_importance(y, {"divergence": div, "lr": lr}, n_boot=300)
    assert imp.residual.estimate > 0.5
    assert imp.residual.estimate > max(s.estimate for s in imp.factors.values())


def test_interval_narrows_with_less_noise_and_is_reproducible():
    y, div, lr = _grid(effect_div=1.0, effect_lr=0.0, noise=0.3)
    wide = factor_importance(y, {"divergence": div, "lr": lr}, n_boot=400, seed=1).factors["divergence"]
    again = factor_importance(y, {"divergence": div, "lr": lr}, n_boot=400, seed=1).factors["divergence"]
    assert wide == again
    y, div, lr = _grid(effect_div=1.0, effect_lr=0.0, noise=0.01)
    narrow = factor_importance(y, {"divergence": div, "lr": lr}, n_boot=400, seed=1).factors["divergence"]
    assert narrow.high - narrow.low < wide.high - wide.low


@pytest.mark.parametrize("rng_seed", [0, 1, 2])
def test_two_seeds_a_cell_intervals_hold_their_estimates(rng_seed):
    # With two seeds a cell, resampling runs within their cells repeats one seed in half the
    # cells of every resample, and the seed share's interval fell below its own estimate.
    y, div, lr = _grid(effect_div=0.5, effect_lr=0.3, noise=0.3, seeds=2, rng_seed=rng_seed)
    imp = factor_importance(y, {"divergence": div, "lr": lr}, n_boot=2000, seed=rng_seed)
    for part in [*imp.factors.values(), imp.interactions, imp.residual]:
        assert part.low <= part.estimate <= part.high


def test_residual_draws_have_the_seed_variance():
    # Pure noise of known variance, two runs a cell: the variance-corrected residual pool gives
    # resamples whose within-cell variance matches the data's on average (uncorrected, it is half).
    from distill.experiments.stats.analysis import _residual_resamples

    rng = np.random.default_rng(0)
    y = rng.normal(size=400)
    members = [np.array([2 * i, 2 * i + 1]) for i in range(200)]
    boot = _residual_resamples(y, members, 500, np.random.default_rng(1))

    def within(v):
        return ((v[..., 0::2] - v[..., 1::2]) ** 2 / 2).mean(axis=-1)

    assert np.mean(within(boot)) == pytest.approx(float(within(y)), rel=0.05)
    assert np.allclose(boot.reshape(500, 200, 2).mean(axis=(0, 2)), y.reshape(200, 2).mean(axis=1), atol=0.15)


def test_without_replicates_runs_are_resampled_and_residual_is_zero():
    y, div, lr = _grid(effect_div=1.0, effect_lr=0.5, noise=0.1, seeds=1)
    imp = factor_importance(y, {"divergence": div, "lr": lr}, n_boot=200)
    assert imp.resampling == "runs" and imp.residual.estimate == pytest.approx(0.0)
    assert imp.factors["divergence"].low <= imp.factors["divergence"].high


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="need at least 2 runs"):
        factor_importance([1.0], {"a": ["x"]})
    with pytest.raises(ValueError, match="factor 'a': 1 labels for 2 runs"):
        factor_importance([1.0, 2.0], {"a": ["x"]})


def test_summarize_skips_missing_values():
    mean, std, n = summarize([1.0, 3.0, float("nan"), None])
    assert (mean, n) == (2.0, 2) and std == pytest.approx(math.sqrt(2))
    assert summarize([5.0])[2] == 1 and math.isnan(summarize([5.0])[1])
    assert summarize([])[2] == 0

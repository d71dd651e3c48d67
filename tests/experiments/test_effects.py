"""Effect sizes: paired differences over the runs that share every other setting, percentile
bootstrap intervals, the unpaired fallback, and the contrasts chosen from a sweep's knobs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from distill.experiments.report.effects import contrast, difference_interval, study_contrasts
from distill.experiments.run.records import RunRecord


def _run(value, **settings):
    name = ",".join(f"{k}={v}" for k, v in sorted(settings.items()))
    return RunRecord(name, Path(name), True, settings, {"acc": value})


def _grid(effect_of_mix0):
    """mix {0, 1} x lr {1, 2} x seed {0, 1, 2} x divergence {f, r}; mix 0 adds `effect_of_mix0`
    under forward KL only, plus seed noise shared by the two mixes of a pair."""
    rng = np.random.default_rng(0)
    runs = []
    for div in ("forward_kl", "reverse_kl"):
        for lr in (1, 2):
            for seed in (0, 1, 2):
                noise = float(rng.normal(0, 0.1))
                for mix in (0, 1):
                    shift = effect_of_mix0 if (mix == 0 and div == "forward_kl") else 0.0
                    runs.append(
                        _run(0.5 + 0.05 * lr + noise + shift, mix=mix, lr=lr, seed=seed, divergence=div)
                    )
    return runs


def test_paired_effect_is_the_mean_paired_difference_with_a_tight_interval():
    runs = _grid(0.2)
    effect = contrast(runs, "acc", "mix", 0, 1, within=("divergence", "forward_kl"))
    assert effect.paired and effect.n == 6
    assert effect.difference == pytest.approx(0.2)  # the noise is shared within a pair
    # every pair differs by exactly 0.2: no spread to scale, so no interval (not [0.2, 0.2])
    assert math.isnan(effect.low) and math.isnan(effect.high) and not effect.clear
    null = contrast(runs, "acc", "mix", 0, 1, within=("divergence", "reverse_kl"))
    assert null.difference == pytest.approx(0.0, abs=1e-12) and not null.clear


def test_bootstrap_interval_against_a_direct_resampling():
    # From 10 pairs on: a bootstrap over the pairs, whose 90 % bounds lie within the expanded
    # percentiles of a direct resampling (intervals.estimate moves the tails out a little).
    rng = np.random.default_rng(3)
    a, b = rng.normal(1.0, 1.0, size=12), rng.normal(0.0, 1.0, size=12)
    point, low, high = difference_interval(a, b, paired=True, n_boot=4000, level=0.9, seed=3)
    d = a - b
    boot = d[rng.integers(0, 12, size=(100_000, 12))].mean(axis=1)
    # t_0.95(11) * sqrt(12 / 11) = 1.875: the 3.0 % and 97.0 % points
    assert point == pytest.approx(d.mean())
    assert np.percentile(boot, 2) < low < np.percentile(boot, 4)
    assert np.percentile(boot, 96) < high < np.percentile(boot, 98)


def test_runs_without_a_partner_fall_back_to_unpaired():
    runs = [_run(v, mix=0, seed=s) for v, s in ((1.0, 0), (3.0, 1))]
    runs += [_run(v, mix=1, seed=s) for v, s in ((0.0, 5), (1.0, 6), (2.0, 7))]
    effect = contrast(runs, "acc", "mix", 0, 1, n_boot=500)
    assert not effect.paired and effect.n == 2
    assert effect.difference == pytest.approx(2.0 - 1.0)
    assert effect.low <= effect.difference <= effect.high


def test_a_side_without_values_gives_no_effect():
    runs = [_run(1.0, mix=0, seed=0), _run(float("nan"), mix=1, seed=0)]
    assert contrast(runs, "acc", "mix", 0, 1) is None
    assert contrast(runs, "missing", "mix", 0, 1) is None


def test_study_contrasts_follow_the_knobs_present():
    factors = {"mix": [0.5, 0, 1], "divergence": ["forward_kl", "reverse_kl"], "lr": [3e-4, 1e-4, 1e-3]}
    assert study_contrasts(factors) == [
        ("mix", 0, 1, ("divergence", "forward_kl")),
        ("mix", 0, 1, ("divergence", "reverse_kl")),
        ("mix", 0, 1, None),
        ("divergence", "forward_kl", "reverse_kl", ("mix", 0)),
        ("divergence", "forward_kl", "reverse_kl", ("mix", 1)),
        ("divergence", "forward_kl", "reverse_kl", None),
        ("lr", 1e-3, 1e-4, None),
    ]
    assert study_contrasts({"mix": [0, 1]}) == [("mix", 0, 1, None)]
    assert study_contrasts({"divergence": ["forward_kl", "reverse_kl"]}) == [
        ("divergence", "forward_kl", "reverse_kl", None)
    ]
    assert study_contrasts({"seed": [0, 1]}) == []


def test_t_quantile_matches_closed_forms_and_a_large_sample():
    from distill.experiments.report.effects import t_quantile

    # df 1 is the Cauchy distribution; df 2 has F^-1(p) = (2p - 1) / sqrt(2 p (1 - p))
    for p in (0.8, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-6)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-6)
    draws = torch.distributions.StudentT(torch.tensor(4.0, dtype=torch.float64)).sample((400_000,))
    assert float((draws < t_quantile(0.975, 4)).double().mean()) == pytest.approx(0.975, abs=1e-3)
    with pytest.raises(ValueError, match="p must be in"):
        t_quantile(0.3, 2)


def test_few_pairs_get_a_t_interval_not_their_range():
    from distill.experiments.report.effects import MIN_BOOTSTRAP_PAIRS, t_quantile

    a, b = np.array([3.0, 5.0]), np.array([1.0, 2.0])  # differences 2 and 3
    point, low, high = difference_interval(a, b, True, 2000, 0.95, 0)
    half = t_quantile(0.975, 1) * np.std([2.0, 3.0], ddof=1) / math.sqrt(2)
    assert (point, low, high) == pytest.approx((2.5, 2.5 - half, 2.5 + half))
    assert low < 0 < high  # the bootstrap's [2, 3] would have "excluded 0"
    same = difference_interval(np.array([1.0, 1.0]), np.array([0.0, 0.0]), True, 2000, 0.95, 0)
    assert (
        same[0] == 1.0 and math.isnan(same[1]) and math.isnan(same[2])
    )  # no spread: no interval, not [1, 1]
    one = difference_interval(np.array([1.0]), np.array([0.0]), True, 2000, 0.95, 0)
    assert one[0] == 1.0 and math.isnan(one[1]) and math.isnan(one[2])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=MIN_BOOTSTRAP_PAIRS), rng.normal(size=MIN_BOOTSTRAP_PAIRS)
    boot = difference_interval(x, y, True, 4000, 0.95, 0)
    d = x - y
    assert min(d) <= boot[1] < boot[2] <= max(d)  # from the bootstrap from 5 pairs on

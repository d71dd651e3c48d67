"""Planning seeds (`distill.experiments.stats.power`): the pooled spread against a direct computation,
the planned MDE against a simulation of the study's own estimator, the planned pairs from a spec."""

from __future__ import annotations

import math

import numpy as np
import pytest

from distill.experiments.run.claims import Claim, ClaimsError
from distill.experiments.run.spec import parse_spec
from distill.experiments.stats.intervals import estimate, minimum_detectable
from distill.experiments.stats.power import planned_mde, planned_pairs, pooled_sd


def test_the_pooled_spread_removes_each_stratums_mean():
    a, b = np.array([1.0, 2.0, 4.0]), np.array([10.0, 12.0])
    sd, df = pooled_sd([a, b, np.array([7.0])])  # a lone difference has no spread: left out
    assert df == 3
    assert sd == pytest.approx(math.sqrt((np.var(a) * 3 + np.var(b) * 2) / 3))
    assert pooled_sd([a + 100, b - 50]) == pytest.approx(pooled_sd([a, b]))  # a stratum's effect is not noise
    assert math.isnan(pooled_sd([np.array([1.0])])[0])


def test_the_planned_mde_is_what_the_estimator_reports_at_that_spread():
    """With every stratum's sd as planned, the MDE of `verdicts` (from the observed se and df)
    equals the planned one; unequal strata use Welch-Satterthwaite df as `estimate` does."""
    rng = np.random.default_rng(0)
    groups = [rng.normal(size=5) for _ in range(3)]
    groups = [(g - g.mean()) / g.std(ddof=1) * 0.02 for g in groups]  # sd exactly 0.02 each
    est = estimate(groups, 0.99)
    assert planned_mde(0.02, [5, 5, 5], 0.99) == pytest.approx(minimum_detectable(est.se, est.df, 0.99))
    assert planned_mde(0.02, [5, 5, 1], 0.99) == pytest.approx(planned_mde(0.02, [5, 5], 0.99))
    assert planned_mde(0.02, [10, 10, 10], 0.99) < planned_mde(0.02, [5, 5, 5], 0.99)
    assert math.isnan(planned_mde(0.02, [1, 1], 0.95)) and math.isnan(planned_mde(0.0, [5], 0.95))


@pytest.mark.parametrize(("pairs", "level"), [([5, 5, 5], 0.95), ([6], 0.99)])
def test_a_true_effect_of_the_planned_mde_is_found_with_about_the_planned_power(pairs, level):
    """Simulated studies with the planned design and a true effect equal to the planned MDE: the
    study's t interval excludes 0 in about 80 % of them (the MDE formula is the usual normal-style
    approximation, so a few points either way)."""
    rng = np.random.default_rng(1)
    mde = planned_mde(1.0, pairs, level)
    found = 0
    trials = 2000
    for _ in range(trials):
        est = estimate([rng.normal(mde, 1.0, size=n) for n in pairs], level)
        found += est.low > 0
    assert 0.74 <= found / trials <= 0.88, found / trials


def _spec(axes):
    return parse_spec({"name": "plan", "base": "configs/tiny/base.yaml", "axes": axes})


def _claim(**fields):
    values = dict(
        id="c", claim="c", archive="plan", metric="m", a={"mix": 0}, b={"mix": 1}, paired=("seed",),
        predicts="increase", sesoi=0.03,
    )  # fmt: skip
    return Claim(**{**values, **fields})


def test_the_planned_pairs_follow_the_claims_own_pairing():
    spec = _spec({"seed": [0, 1, 2, 3, 4], "mix": [0, 0.5, 1], "divergence": ["forward_kl", "reverse_kl"],
                  "lr": [1.0e-4, 3.0e-4]})  # fmt: skip
    within = {"divergence": "reverse_kl"}
    assert planned_pairs(_claim(within=within, strata=("lr",)), spec) == [5, 5]
    direction = _claim(
        a={"divergence": "forward_kl"}, b={"divergence": "reverse_kl"}, strata=("lr",), paired=("seed", "mix")
    )
    assert planned_pairs(direction, spec) == [15, 15]  # paired over seed and mix
    with pytest.raises(ClaimsError, match="knob 'lr' of plan varies but is not declared"):
        planned_pairs(_claim(within=within), spec)
    with pytest.raises(ClaimsError, match="plans no run of plan/grpo"):
        planned_pairs(_claim(archive="plan/grpo", within=within, strata=("lr",)), spec)


def test_a_plan_reads_the_pilots_spread_and_the_specs_runs(tmp_path, capsys):
    """End to end: a pilot archive (3 seeds) and a planned spec (8 seeds); a claim the pilot has
    borrows its spread, and the printed MDE is the planned one at Holm's last level."""
    from distill.experiments.run.claims import load_claims
    from distill.experiments.stats.power import main, plan

    from .test_verdicts import _archive, _claims

    noise = np.random.default_rng(3).normal(0, 0.02, size=(2, 2, 3))
    _archive(tmp_path / "results", "pilot", lambda mix, lr, seed: 0.4 + noise[mix, int(lr > 5e-4), seed])
    pilot = _claims(tmp_path, [("shared", "pilot", "increase")])
    (tmp_path / "planned").mkdir()
    planned = _claims(tmp_path / "planned", [("shared", "plan", "increase"), ("new", "plan", "none")])
    specs = tmp_path / "specs"
    specs.mkdir()
    axes = {"seed": list(range(8)), "mix": [0, 1], "lr": [1.0e-4, 1.0e-3]}
    (specs / "plan.yaml").write_text(f"name: plan\nbase: configs/tiny/base.yaml\naxes: {axes}\n")

    assert main([str(planned), "--pilot", str(pilot), "--specs", str(specs)]) == 0
    out = capsys.readouterr().out
    diffs = [noise[0, k] - noise[1, k] for k in (0, 1)]
    sd = pooled_sd(diffs)[0]
    mde = planned_mde(sd, [8, 8], 1 - 0.05 / 2)  # two claims: Holm's first step tests at 1 - 0.05 / 2
    shared, new = plan(load_claims(planned), load_claims(pilot), {"plan": parse_spec(
        {"name": "plan", "base": "configs/tiny/base.yaml", "axes": axes})})  # fmt: skip
    assert shared.mde == pytest.approx(mde) and shared.pairs == [8, 8] and shared.sd_source == "pilot"
    assert new.sd == pytest.approx(sd) and new.sd_source == "borrowed (median of 1 alike)"
    assert f"| shared | plan | 8, 8 | {100 * sd:.1f} pp pilot | {100 * mde:.1f} pp | 3.0 pp |" in out
    assert main([str(planned), "--pilot", str(pilot), "--specs", str(tmp_path / "results")]) == 2
    assert "no spec plans the archive 'plan'" in capsys.readouterr().err


def test_docs_quote_the_generated_v3_plan(capsys):
    """docs/study.md quotes `make plan-v3` (v2's archives, the v3 claims and specs); it does not
    retype it."""
    from pathlib import Path

    from distill.experiments.stats.power import main

    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "study.md").read_text()
    quoted = text.split("<!-- plan: make plan-v3 -->\n")[1].split("\n<!-- end plan -->")[0]
    claims = root / "experiments" / "claims"
    argv = [str(claims / "v3.yaml"), "--pilot", str(claims / "v2.yaml"), "--specs", str(root / "experiments")]
    assert main(argv) == 0
    assert quoted == capsys.readouterr().out.rstrip("\n")

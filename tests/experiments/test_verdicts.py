"""The statistics behind the verdicts, on simulated data with known effects: coverage of the t,
stratified and bootstrap intervals, bounds stable to 0.1 pp, the p-value as the interval inverted,
Holm against a direct reading of its definition, the pair count, the F tail and the independence
check against closed forms and a direct ANOVA, variance-share intervals under a known null, and
each verdict rule end to end on a small archive written here (plus the claims file's one-line
errors and the verdict cache). `test_verdict_simulation.py` runs the rule on many studies."""

from __future__ import annotations

import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from distill.experiments.run.claims import ClaimsError, load_claims
from distill.experiments.stats.analysis import factor_importance
from distill.experiments.stats.intervals import estimate, f_tail, holm, independence, t_tail
from distill.experiments.stats.verdicts import evaluate


def _coverage(draw, truth, studies, **options):
    rng = np.random.default_rng(0)
    hits = 0
    for k in range(studies):
        est = estimate(draw(rng), seed=k, **options)
        hits += est.low <= truth <= est.high
    return hits / studies


def test_t_interval_covers_below_ten_pairs():
    cover = _coverage(lambda rng: [rng.normal(0.3, 1.0, size=4)], 0.3, 400)
    assert cover == pytest.approx(0.95, abs=0.03)


def test_stratified_t_interval_covers_the_equal_weight_mean():
    # three learning rates with different effects and spreads (0.1 to 3): never pooled as noise
    means, sds, sizes = (0.5, -1.0, 2.0), (0.1, 1.0, 3.0), (3, 2, 4)

    def draw(rng):
        return [rng.normal(m, s, size=n) for m, s, n in zip(means, sds, sizes)]

    assert _coverage(draw, float(np.mean(means)), 300) == pytest.approx(0.95, abs=0.035)


def test_bootstrap_interval_covers_from_ten_pairs():
    cover = _coverage(lambda rng: [rng.normal(0.3, 1.0, size=12)], 0.3, 300, resolution=0.05)
    assert cover == pytest.approx(0.95, abs=0.04)


def test_bootstrap_bounds_are_stable_to_a_tenth_of_a_point():
    rng = np.random.default_rng(1)
    shares = [rng.normal(0.05, 0.04, size=10), rng.normal(0.02, 0.03, size=10)]  # accuracies' differences
    runs = [estimate(shares, resolution=0.001, seed=s) for s in range(4)]
    assert all(r.method == "bootstrap" and r.resamples > 2000 for r in runs)
    for bound in ("low", "high"):
        values = [100 * getattr(r, bound) for r in runs]
        assert max(values) - min(values) < 0.1


def _holm_direct(p, alpha):
    """Reject H_i iff every hypothesis with a p-value at most p_i passes its step's threshold."""
    m, order = len(p), sorted(range(len(p)), key=lambda i: p[i])
    rank = {i: r for r, i in enumerate(order)}
    return [all(p[j] <= alpha / (m - rank[j]) for j in range(m) if rank[j] <= rank[i]) for i in range(m)]


def test_holm_matches_its_definition_and_its_levels_match_its_decisions():
    rng = np.random.default_rng(2)
    for _ in range(200):
        p = list(rng.uniform(0, 0.1, size=int(rng.integers(1, 8))) ** rng.uniform(1, 3))
        for alpha in (0.01, 0.05, 0.1):
            adjusted, levels = holm(p, alpha)
            assert [a <= alpha for a in adjusted] == _holm_direct(p, alpha)
    # a t interval at the level Holm tests a contrast excludes 0 exactly when Holm rejects it
    studies = [[rng.normal(mu, 1.0, size=6)] for mu in (0.0, 0.4, 1.2, 2.0, 0.8)]
    ests = [estimate(s) for s in studies]
    adjusted, levels = holm([e.p for e in ests], 0.05)
    for s, adj, level in zip(studies, adjusted, levels):
        at = estimate(s, level)
        assert (at.low > 0 or at.high < 0) == (adj <= 0.05)


def test_the_bootstrap_p_value_is_its_interval_inverted_without_a_floor():
    """p is the smallest 1 − level whose interval excludes 0, read off the same resamples at every
    level (sized for the strictest): a t of about 40 gets p below anything a count of resamples
    could floor it at (2,000 resamples once gave 0.009), and at moderate t the bootstrap's p is
    close to Student's."""
    rng = np.random.default_rng(4)
    steady = [rng.normal(0.09, 0.01, size=12) for _ in range(2)]
    est = estimate(steady, 0.95, 0.001, seed=0)
    assert est.method == "bootstrap" and est.point / est.se > 30 and est.p < 1e-6
    for k in range(25):
        groups = [rng.normal(rng.uniform(0, 0.03), 0.03, size=12) for _ in range(2)]
        first = estimate(groups, 0.95, 0.005, seed=k, strictest=0.999)
        for level in (0.9, 0.95, 0.99, 0.995, 0.999):
            at = estimate(groups, level, 0.005, seed=k, strictest=0.999)
            assert at.resamples == first.resamples
            assert (at.low > 0 or at.high < 0) == (first.p < 1 - level)
    for k in range(8):
        groups = [rng.normal(0.45, 1.0, size=15) for _ in range(2)]
        est = estimate(groups, 0.95, 0.05, seed=k, strictest=0.99)
        if 1 < abs(est.point) / est.se < 3:
            assert est.p == pytest.approx(2 * t_tail(abs(est.point) / est.se, est.df), rel=0.4)


def test_the_pair_count_is_the_pairs_the_estimate_uses():
    """A stratum of one pair has no spread and is left out of the mean: of the count too."""
    est = estimate([np.array([0.30]), np.array([0.0, 0.01, 0.02])])
    assert est.n == 3 and est.point == pytest.approx(0.01)
    lone = estimate([np.array([0.30]), np.array([0.10])])  # no interval: the lone pairs are the point
    assert lone.method == "none" and lone.n == 2 and lone.point == pytest.approx(0.20)


def test_no_spread_means_no_p_value():
    est = estimate([np.full(4, 0.1), np.full(3, 0.1)])
    assert est.se == 0 and math.isnan(est.p) and est.n == 7


def test_the_f_tail_matches_its_closed_forms():
    """P(F > f): (1 + 2f/d2)^(−d2/2) for 2 numerator df, 1 − (d1 f / (2 + d1 f))^(d1/2) for 2
    denominator df, and twice Student's tail at √f for 1 numerator df."""
    for f in (0.0, 0.3, 1.0, 2.5, 7.0, 40.0):
        for d in (1, 3, 6.5, 30):
            assert f_tail(f, 2, d) == pytest.approx((1 + 2 * f / d) ** (-d / 2), rel=1e-10, abs=1e-14)
            assert f_tail(f, d, 2) == pytest.approx(1 - (d * f / (2 + d * f)) ** (d / 2), rel=1e-9, abs=1e-14)
            assert f_tail(f, 1, d) == pytest.approx(2 * t_tail(math.sqrt(f), d), rel=1e-8, abs=1e-14)
    assert f_tail(math.inf, 3, 4) == 0.0
    with pytest.raises(ValueError):
        f_tail(-1.0, 3, 4)


def test_the_independence_check_is_the_anova_of_the_seed_after_the_strata():
    """Balanced strata x seeds: the F of a two-way additive ANOVA (seed after stratum), computed
    here from its sums of squares; one stratum with each seed twice (paired by seed and mix): the
    one-way ANOVA. No seed that recurs: nothing to check."""
    rng = np.random.default_rng(6)
    s, g = 3, 4
    y = (
        rng.normal(size=(s, g)) + np.array([0.5, -1.0, 2.0])[:, None]
    )  # the strata differ: not the seed's doing
    check = independence(list(y), [[f"{k}" for k in range(g)]] * s, "seed")
    centred = y - y.mean(axis=1, keepdims=True)
    seed_means = centred.mean(axis=0)
    ss_seed, ss_residual = s * (seed_means**2).sum(), ((centred - seed_means) ** 2).sum()
    f = ss_seed / (g - 1) / (ss_residual / ((s - 1) * (g - 1)))
    assert (check.knob, check.df1, check.df2) == ("seed", g - 1, (s - 1) * (g - 1))
    assert check.f == pytest.approx(f) and check.p == pytest.approx(f_tail(f, g - 1, (s - 1) * (g - 1)))

    pairs = rng.normal(size=(g, 2))  # seed x mix
    check = independence([pairs.ravel()], [[f"{k}" for k in range(g) for _ in range(2)]], "seed")
    between = 2 * ((pairs.mean(axis=1) - pairs.mean()) ** 2).sum() / (g - 1)
    within = ((pairs - pairs.mean(axis=1, keepdims=True)) ** 2).sum() / (2 * g - g)
    assert check.f == pytest.approx(between / within) and (check.df1, check.df2) == (g - 1, g)
    assert independence([np.array([1.0, 2.0, 4.0])], [["0", "1", "2"]], "seed") is None
    assert independence([np.full(3, 0.1), np.full(3, 0.1)], [["0", "1", "2"]] * 2, "seed") is None


def test_variance_share_interval_covers_a_known_null():
    # knob b has no effect: its true share is 0, which a percentile interval could never contain
    hits, sims = 0, 150
    for k in range(sims):
        rng = np.random.default_rng(k)
        rows = list(itertools.product(range(3), range(3), range(2)))
        y = [0.5 * a + rng.normal() for a, _, _ in rows]
        imp = factor_importance(y, {"a": [r[0] for r in rows], "b": [r[1] for r in rows]}, n_boot=200, seed=k)
        hits += imp.factors["b"].low <= 0.0
    assert hits / sims == pytest.approx(0.95, abs=0.04)


# --- verdicts end to end ------------------------------------------------------------------------


def _archive(root: Path, name: str, value, references=(0.2, 0.7), seeds=3):
    """A sweep archive of mix {0, 1} x lr {1e-4, 1e-3} x seeds with metric `acc` = value(mix, lr, seed)."""
    sweep = root / name
    for mix, lr, seed in itertools.product((0, 1), (1e-4, 1e-3), range(seeds)):
        run = sweep / f"lr={lr},mix={mix},seed={seed}"
        run.mkdir(parents=True)
        settings = {"mix": mix, "lr": lr, "seed": seed}
        (run / "settings.json").write_text(json.dumps({"settings": settings}))
        metrics = {"test/x/accuracy": value(mix, lr, seed)}
        (run / "metrics.json").write_text(json.dumps({"status": "finished", "metrics": metrics}))
    for kind, acc in zip(("start", "teacher"), references):
        ref = sweep / "references" / kind
        ref.mkdir(parents=True)
        (ref / "test_metrics.json").write_text(json.dumps({"metrics": {"test/x/accuracy": acc}}))


CLAIM = """
  - id: {id}
    claim: {id}
    archive: {archive}
    metric: test/x/accuracy
    a: {{mix: 0}}
    b: {{mix: 1}}
    strata: [lr]
    paired: [seed]
    predicts: {predicts}
    sesoi: 0.03
    testable: {{margin: 0.1, floor: 0.02, ceiling: 0.98}}
"""


def _claims(tmp_path: Path, claims: list[tuple[str, str, str]]) -> Path:
    path = tmp_path / "claims.yaml"
    body = "".join(CLAIM.format(id=i, archive=a, predicts=p) for i, a, p in claims)
    path.write_text(f"results: results\nclaims:{body}")
    return path


def test_each_verdict_rule(tmp_path):
    results = tmp_path / "results"
    noise = np.random.default_rng(0).normal(0, 0.004, size=(2, 2, 3))

    def planted(effect):
        return lambda mix, lr, seed: 0.4 + (effect if mix == 0 else 0.0) + noise[mix, int(lr > 5e-4), seed]

    _archive(results, "up", planted(0.10))
    _archive(results, "flat", planted(0.0))
    _archive(
        results, "noisy", lambda mix, lr, seed: 0.4 + 0.3 * np.random.default_rng(seed * 7 + mix).normal()
    )
    _archive(results, "floor", planted(0.0), references=(0.01, 0.7))
    _archive(results, "no_lead", planted(0.10), references=(0.5, 0.55))
    _archive(results, "exact", lambda mix, lr, seed: 0.5 if mix == 0 else 0.4)
    claims = [
        ("replicated", "up", "increase"),
        ("contradicted", "up", "decrease"),
        ("no_effect", "flat", "increase"),
        ("equal", "flat", "none"),
        ("not_equal", "up", "none"),
        ("unresolved", "noisy", "increase"),
        ("at_floor", "floor", "increase"),
        ("teacher_not_ahead", "no_lead", "increase"),
        ("pending", "missing", "increase"),
        ("no_spread", "exact", "increase"),
    ]
    verdicts = {v.claim.id: v for v in evaluate(load_claims(_claims(tmp_path, claims)))}
    expected = {
        "replicated": "replicated",
        "contradicted": "contradicted",
        "no_effect": "no effect",
        "equal": "replicated",
        "not_equal": "contradicted",
        "unresolved": "unresolved",
        "at_floor": "not testable",
        "teacher_not_ahead": "not testable",
        "pending": "no runs yet",
        "no_spread": "unresolved",  # every pair +0.1 exactly: no interval, not a zero-width one
    }
    assert {k: v.verdict for k, v in verdicts.items()} == expected
    up = verdicts["replicated"]
    assert up.estimate.point == pytest.approx(0.10, abs=0.01) and up.estimate.n == 6
    assert [label for label, _ in up.strata] == ["1e-4", "1e-3"]  # numeric order, one per lr
    assert up.adjusted.level > 0.95  # Holm: the family is every testable claim (and the pending one)
    assert "the start is at the floor (1.0 % <= 2.0 %)" in verdicts["at_floor"].reason
    assert "not ahead of the start (50.0 %) by 10.0 pp" in verdicts["teacher_not_ahead"].reason
    assert (
        math.isfinite(verdicts["unresolved"].mde)
        and "detectable at 80 % power" in verdicts["unresolved"].reason
    )


def test_a_clear_bootstrap_claim_is_rejected_exactly_where_its_interval_excludes_0(tmp_path):
    """A bootstrap claim with t of about 80 among three claims of p about 0.002 and twelve nulls: with
    a p-value floored by its 2,000 resamples (0.005) Holm ranked it fourth and stopped there
    (adjusted p 0.06), while its interval at that step's level excluded 0 and it read replicated.
    Now every adjusted interval excludes 0 exactly when Holm rejects, and its p is below every
    other."""
    results = tmp_path / "results"
    noise = np.random.default_rng(5).normal(0, 0.004, size=(2, 2, 12))
    _archive(
        results,
        "steady",
        lambda mix, lr, seed: 0.4 + 0.09 * (mix == 0) + noise[mix, int(lr > 5e-4), seed],
        seeds=12,
    )
    for k, effect in enumerate((0.030, 0.032, 0.034)):  # p about 0.0018, 0.0014, 0.0011 (t, 4 df)
        _archive(
            results, f"clear{k}", lambda mix, lr, seed, e=effect: 0.4 + (mix == 0) * (e + 0.01 * (seed - 1))
        )
    _archive(results, "flat", lambda mix, lr, seed: 0.4 + (mix == 0) * 0.01 * (seed - 1))
    claims = [("steady", "steady", "increase")]
    claims += [(f"clear{k}", f"clear{k}", "increase") for k in range(3)]
    claims += [(f"flat{k}", "flat", "increase") for k in range(12)]
    verdicts = {v.claim.id: v for v in evaluate(load_claims(_claims(tmp_path, claims)))}
    for v in verdicts.values():
        assert (v.adjusted.low > 0 or v.adjusted.high < 0) == (v.p_adjusted <= 0.05), v.claim.id
    steady = verdicts["steady"]
    assert steady.estimate.method == "bootstrap" and steady.estimate.p < 1e-6
    assert steady.verdict == "replicated" and steady.p_adjusted <= 0.05
    assert [verdicts[f"clear{k}"].verdict for k in range(3)] == ["replicated"] * 3


def test_a_claim_without_spread_is_not_a_rejection_in_holms_family(tmp_path):
    """Every pair +0.1 exactly: no interval, no p-value, and in Holm's family p = 1. Counted as a
    rejection (p = 0 once), it let Holm test the other claim at 95 % instead of 97.5 %, and that
    claim, whose interval at 97.5 % lies within ±3 pp, read replicated instead of no effect."""
    results = tmp_path / "results"
    _archive(results, "exact", lambda mix, lr, seed: 0.5 if mix == 0 else 0.4)
    _archive(results, "small", lambda mix, lr, seed: 0.4 + (mix == 0) * (0.0122 + 0.01 * (seed - 1)))
    claims = [("exact", "exact", "increase"), ("small", "small", "increase")]
    verdicts = {v.claim.id: v for v in evaluate(load_claims(_claims(tmp_path, claims)))}
    exact, small = verdicts["exact"], verdicts["small"]
    assert small.verdict == "no effect" and small.adjusted.level == pytest.approx(0.975)
    assert 0.025 < small.estimate.p < 0.05 and small.p_adjusted == pytest.approx(2 * small.estimate.p)
    assert (exact.verdict, exact.reason) == ("unresolved", "no spread between pairs: no interval")
    assert math.isnan(exact.estimate.p) and exact.p_adjusted == 1.0


def test_an_effect_inside_the_sesoi_says_so_whichever_its_sign(tmp_path):
    """A contradiction whose whole interval lies within ±s reads "contradicted, but smaller than ±s",
    as a replication does, in the verdict table and in the outcome table; a large one reads plain."""
    from distill.experiments.report import verdict_table

    results = tmp_path / "results"
    noise = np.random.default_rng(8).normal(0, 0.002, size=(2, 2, 3))
    for name, effect in (("down_a_little", -0.01), ("up_a_little", 0.01), ("down", -0.10)):
        _archive(
            results,
            name,
            lambda mix, lr, seed, e=effect: 0.4 + e * (mix == 0) + noise[mix, int(lr > 5e-4), seed],
        )
    claims = [(name, name, "increase") for name in ("down_a_little", "up_a_little", "down")]
    verdicts = evaluate(load_claims(_claims(tmp_path, claims)))
    assert [(v.verdict, v.reason) for v in verdicts] == [
        ("contradicted", "but smaller than ±3.0 pp"),
        ("replicated", "but smaller than ±3.0 pp"),
        ("contradicted", ""),
    ]
    table = "\n".join(verdict_table.table(verdicts))
    assert "| **contradicted**, but smaller than ±3.0 pp |" in table
    assert "| **replicated**, but smaller than ±3.0 pp |" in table and "| **contradicted** |" in table
    outcome = "\n".join(verdict_table.beside(verdicts, verdicts, ("now", "then")))
    assert outcome.count("**contradicted**, but smaller than ±3.0 pp") == 2  # now and then


def test_pairs_that_share_a_seed_and_differ_alike_get_a_caveat(tmp_path):
    """Paired by seed across two learning rates: where each seed adds its own amount to side a at
    both rates, the pairs are not independent, and the verdict files say so beside the claim (F
    test of the seed after the strata); where the seeds add nothing, they do not."""
    from distill.experiments.report import verdict_table

    results = tmp_path / "results"
    rng = np.random.default_rng(9)
    carried, noise = (0.03, -0.02, 0.01, -0.03), rng.normal(0, 0.002, size=(2, 2, 4))
    _archive(
        results,
        "carried",
        lambda mix, lr, seed: 0.4 + (mix == 0) * (0.05 + carried[seed]) + noise[mix, int(lr > 5e-4), seed],
        seeds=4,
    )
    _archive(
        results,
        "apart",
        lambda mix, lr, seed: 0.4 + (mix == 0) * 0.05 + noise[mix, int(lr > 5e-4), seed],
        seeds=4,
    )
    path = _claims(tmp_path, [("carried", "carried", "increase"), ("apart", "apart", "increase")])
    claims = load_claims(path)
    verdicts = {v.claim.id: v for v in evaluate(claims)}
    checked = verdicts["carried"].independence
    assert checked.knob == "seed" and (checked.df1, checked.df2) == (3, 3) and checked.p < 0.01
    assert verdicts["apart"].independence.p > 0.05
    texts = verdict_table.files(claims, "claims.yaml", list(verdicts.values()), 2)
    lines = [line for line in texts["verdicts.md"].splitlines() if "differ alike" in line]
    assert len(lines) == 1 and lines[0].startswith("- `carried`: pairs that share a seed differ alike (F = ")
    found = {v["id"]: v["independence"] for v in json.loads(texts["verdicts.json"])["verdicts"]}
    assert found["carried"]["knob"] == "seed" and found["carried"]["df"] == [3, 3]
    assert found["apart"]["p"] == pytest.approx(verdicts["apart"].independence.p)


def test_the_verdict_cache_sees_a_metrics_file_rewritten_in_place(tmp_path):
    """`verdict_table.family` evaluates a claims file once a process for archives as they stand: a
    metrics.json rewritten in place, same size and modification time, directories untouched,
    still gives a fresh verdict."""
    from distill.experiments.report import verdict_table

    results = tmp_path / "results"
    _archive(results, "up", lambda mix, lr, seed: 0.4 + 0.1 * (mix == 0) + 0.004 * seed * mix)
    claims = load_claims(_claims(tmp_path, [("grows", "up", "increase")]))
    assert verdict_table.family(claims, {})[0].verdict == "replicated"
    assert verdict_table.family(claims, {}) is verdict_table.family(claims, {})  # evaluated once
    for metrics in (results / "up").glob("*mix=0*/metrics.json"):
        before = metrics.stat()
        text = metrics.read_text()
        assert '"test/x/accuracy": 0.5' in text
        metrics.write_text(text.replace('"test/x/accuracy": 0.5', '"test/x/accuracy": 0.3'))
        os.utime(metrics, ns=(before.st_atime_ns, before.st_mtime_ns))
        assert metrics.stat().st_size == before.st_size
    assert verdict_table.family(claims, {})[0].verdict == "contradicted"


def test_a_knob_left_undeclared_is_refused(tmp_path):
    _archive(tmp_path / "results", "up", lambda mix, lr, seed: 0.4)
    path = _claims(tmp_path, [("c", "up", "increase")])
    path.write_text(path.read_text().replace("    strata: [lr]\n", ""))
    with pytest.raises(ClaimsError, match="knob 'lr' of up varies but is not declared"):
        evaluate(load_claims(path))


def test_a_misspelt_metric_or_archive_is_an_error_naming_the_closest_not_no_runs_yet(tmp_path):
    _archive(tmp_path / "results", "v3_grid", lambda mix, lr, seed: 0.4)
    path = _claims(tmp_path, [("c", "v3_grid", "increase")])
    text = path.read_text()
    path.write_text(text.replace("metric: test/x/accuracy", "metric: test/x/acuracy"))
    with pytest.raises(
        ClaimsError,
        match=r"claim c: metric 'test/x/acuracy' is in none of the 12 finished runs of v3_grid; closest: \['test/x/accuracy'\]",
    ):
        evaluate(load_claims(path))
    path.write_text(text.replace("archive: v3_grid", "archive: v3_gird"))
    with pytest.raises(
        ClaimsError, match=r"claim c: archive 'v3_gird' has no directory .*; did you mean 'v3_grid'"
    ):
        evaluate(load_claims(path))
    path.write_text(text.replace("archive: v3_grid", "archive: v4_sparsity"))  # not run yet
    (verdict,) = evaluate(load_claims(path))
    assert verdict.verdict == "no runs yet"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ("predicts: increase", "predicts: up"),
            r"claims\[0\] \(c\)\.predicts: 'up' is not allowed; allowed: increase, decrease, none",
        ),
        (("sesoi: 0.03", "sesoi: 0"), r"\.sesoi: 0 is not allowed; allowed: a finite number > 0"),
        (("b: {mix: 1}", "b: {lr: 1}"), "sides a {'mix': 0} and b {'lr': 1} are not allowed"),
        (("paired: [seed]", "paired: [lr]"), "knob 'lr' is in both strata and paired"),
        (("metric:", "metrc:"), "unknown key 'metrc'; allowed: id, claim"),
        (
            ("  - id: c\n", "  - id: c\n    was: Old-Id\n"),
            r"\(c\)\.was: 'Old-Id' is not allowed; allowed: \[a-z0-9_\]\+",
        ),
    ],
)
def test_claims_file_errors_are_one_line(tmp_path, edit, message):
    path = _claims(tmp_path, [("c", "up", "increase")])
    path.write_text(path.read_text().replace(*edit))
    with pytest.raises(ClaimsError, match=message) as err:
        load_claims(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "doc, tables",
    [
        (
            "docs/study.md",
            ["experiments/claims/v2.yaml", "experiments/claims/v3.yaml beside experiments/claims/v2.yaml"],
        ),
        ("experiments/LOG.md", ["experiments/claims/v3.yaml beside experiments/claims/v2.yaml"]),
    ],
)
def test_docs_quote_the_generated_verdict_tables(doc, tables):
    """docs/study.md's outcome tables (v2's; v3's beside v2's) and the LOG's entry of the finished v3
    study are what `distill report --claims ...` prints from the committed archives; they are not
    retyped. The README quotes none: it links docs/study.md."""
    from distill.experiments.report import quoted

    text = (quoted.ROOT / doc).read_text()
    assert [m["head"] for m in quoted.BLOCK.finditer(text)] == [f"<!-- verdicts: {t} -->" for t in tables]
    assert quoted.refresh(text) == (text, [])


def test_committed_reports_carry_the_current_verdicts(capsys):
    """Every committed report's verdicts are those of the whole family as it stands: an archive that
    lands without `make outcome` leaves the others' adjusted intervals behind."""
    from distill.experiments.report import quoted

    assert quoted.main(["--archives", str(quoted.ROOT / "experiments" / "results"), "--check"]) == 0, (
        capsys.readouterr().out
    )


def test_a_stale_quoted_table_is_found_and_regenerated(tmp_path, capsys, monkeypatch):
    """`python -m distill.experiments.report.quoted FILE` (`make outcome`): a block that no longer says what
    the archives give (still empty; its claim moved to another archive) is named by `--check`, which
    exits 1 and rewrites nothing, and regenerated without it; a file without a block, or with a
    head whose end is missing, is an error and is left as it was."""
    from distill.experiments.report import quoted

    monkeypatch.setattr(quoted, "ROOT", tmp_path)
    _archive(tmp_path / "results", "up", lambda mix, lr, seed: 0.4 + 0.1 * (mix == 0) + 0.004 * seed * mix)
    _archive(tmp_path / "results", "flat", lambda mix, lr, seed: 0.4 + 0.004 * seed * mix)
    claims = _claims(tmp_path, [("grows", "up", "increase")])
    doc = tmp_path / "doc.md"
    empty = "# Outcome\n\n<!-- verdicts: claims.yaml -->\n<!-- end verdicts -->\n\nafter\n"
    doc.write_text(empty)
    assert quoted.main([str(doc), "--check"]) == 1
    assert "<!-- verdicts: claims.yaml --> is stale" in capsys.readouterr().out
    assert doc.read_text() == empty
    assert quoted.main([str(doc)]) == 0
    text = doc.read_text()
    assert "| grows |" in text and "**replicated**" in text and str(tmp_path) not in text
    assert text.startswith("# Outcome\n\n<!-- verdicts: claims.yaml -->\nDeclared in `claims.yaml`")
    assert text.endswith("\n<!-- end verdicts -->\n\nafter\n")
    assert quoted.main([str(doc), "--check"]) == 0
    claims.write_text(claims.read_text().replace("archive: up", "archive: flat"))
    assert quoted.main([str(doc), "--check"]) == 1 and doc.read_text() == text
    assert quoted.main([str(doc)]) == 0 and "**replicated**" not in doc.read_text()
    (tmp_path / "plain.md").write_text("no block\n")
    assert quoted.main([str(tmp_path / "plain.md")]) == 2
    unended = "<!-- verdicts: claims.yaml -->\nold\n\n" + text  # its end missing: not swallowed
    doc.write_text(unended)
    assert quoted.main([str(doc)]) == 2 and doc.read_text() == unended
    assert "2 verdict heads, 1 well-formed blocks" in capsys.readouterr().err


def test_an_archive_that_lands_refreshes_the_verdicts_of_the_reports_already_there(tmp_path, capsys):
    """Holm's family is the whole claims file: when a second claim's archive lands, the first
    archive's committed report is stale (its adjusted interval moves). `make outcome`
    (`quoted --archives DIR`) names it under `--check` without writing, and regenerates exactly what
    a fresh `distill report` writes."""
    from distill.experiments.report import quoted
    from distill.experiments.report.report import main as report

    results = tmp_path / "results"
    _archive(results, "up", lambda mix, lr, seed: 0.4 + 0.05 * (mix == 0) + 0.01 * seed * mix)
    (results / "up" / "sweep.json").write_text(json.dumps({"name": "up", "claims": "claims.yaml"}))
    # the later claim pending: in the family with p = 1
    _claims(tmp_path, [("grows", "up", "increase"), ("later", "later", "increase")])
    assert report([str(results / "up"), "--no-plots"]) == 0
    out = results / "up" / "report"
    before = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    assert quoted.main(["--archives", str(results), "--check"]) == 0
    # a clearer effect than up's: Holm now tests up's claim second, at 95 % instead of 97.5 %
    _archive(results, "later", lambda mix, lr, seed: 0.4 + 0.2 * (mix == 0) + 0.001 * seed * mix)
    capsys.readouterr()
    assert quoted.main(["--archives", str(results), "--check"]) == 1
    named = capsys.readouterr().out
    assert f"{out / 'verdicts.json'}: stale" in named and f"{out / 'report.md'}: stale" in named
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == before
    assert quoted.main(["--archives", str(results)]) == 0
    refreshed = {p.name: p.read_text() for p in out.iterdir() if p.is_file()}
    assert refreshed != before and json.loads(refreshed["verdicts.json"])["family"] == 2
    assert report([str(results / "up"), "--no-plots"]) == 0
    assert {p.name: p.read_text() for p in out.iterdir() if p.is_file()} == refreshed
    assert quoted.main(["--archives", str(results), "--check"]) == 0
    # the claim moves to another archive: up's report says no claim reads it, its verdict files go
    claims = tmp_path / "claims.yaml"
    claims.write_text(claims.read_text().replace("archive: up", "archive: later"))
    assert quoted.main(["--archives", str(results)]) == 0
    assert not (out / "verdicts.json").exists() and not (out / "verdicts.md").exists()
    assert "No claim of `claims.yaml` reads `up`" in (out / "report.md").read_text()
    assert quoted.main(["--archives", str(results), "--check"]) == 0
    (out / "report.md").write_text((out / "report.md").read_text().replace("No claim of", "Nothing of"))
    assert quoted.main(["--archives", str(results)]) == 2  # no section to replace: an error, not a guess
    assert "0 verdict sections, expected one" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # nothing to do is a usage error
        quoted.main([])
    with pytest.raises(SystemExit):
        quoted.main(["--archives", str(tmp_path / "nowhere")])
    assert "--archives: " in capsys.readouterr().err


def test_outcome_table_puts_each_claim_beside_its_earlier_verdict(tmp_path, capsys):
    """`distill report --claims NEW --beside OLD`: one row per claim of NEW with OLD's verdict of the
    same id (or of the id `was` names); claims only OLD declares come last; each file its own family."""
    from distill.experiments.report.report import main

    _archive(
        tmp_path / "old" / "results", "up", lambda mix, lr, seed: 0.4 + 0.1 * (mix == 0) + 0.004 * seed * mix
    )
    _archive(
        tmp_path / "new" / "results", "up", lambda mix, lr, seed: 0.4 - 0.1 * (mix == 0) + 0.004 * seed * mix
    )
    (tmp_path / "old").mkdir(exist_ok=True)
    old = _claims(
        tmp_path / "old",
        [("same", "up", "increase"), ("renamed", "up", "increase"), ("gone", "up", "increase")],
    )
    new = _claims(
        tmp_path / "new",
        [("same", "up", "increase"), ("split", "up", "increase"), ("fresh", "missing", "increase")],
    )
    new.write_text(new.read_text().replace("  - id: split\n", "  - id: split\n    was: renamed\n"))
    assert main(["--claims", str(new), "--beside", str(old), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "report" / "outcome.md").read_text() == out
    rows = {
        line.split(" | ")[1]: line.split(" | ")
        for line in out.splitlines()
        if line.startswith("| ") and "`" in line
    }
    assert list(rows) == ["`same`", "`split` (was `renamed`)", "`fresh`", "`gone`"]
    assert rows["`same`"][5] == "**contradicted**" and rows["`same`"][9].startswith("**replicated**")
    assert rows["`same`"][2].startswith("-10.4 pp [") and rows["`same`"][6].startswith("+9.6 pp [")
    assert rows["`split` (was `renamed`)"][9].startswith("**replicated**")
    assert rows["`fresh`"][5] == "**no runs yet**" and rows["`fresh`"][9].startswith("not declared")
    assert rows["`gone`"][5] == "not declared" and rows["`gone`"][9].startswith("**replicated**")
    assert "(3 and 3 testable claims)" in out


@pytest.mark.parametrize(
    "argv",
    [["--beside", "old.yaml"], ["sweep", "--claims", "new.yaml", "--beside", "old.yaml"]],
)
def test_beside_needs_claims_and_no_sweep(argv, capsys):
    from distill.experiments.report.report import main

    assert main(argv) == 2
    assert "--beside EARLIER needs --claims FILE and no SWEEP_DIR" in capsys.readouterr().err

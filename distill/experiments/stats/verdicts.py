"""Verdicts by rule: each declared claim (`distill.experiments.run.claims`) computed from its archive
(`evaluate`), or from its paired differences directly (`judge`, which `evaluate` calls).

For a claim, runs of side a and side b that agree on every `strata` and `paired` knob form a pair;
each pair gives a difference (of the metric, of its log, or of its change from the parent run).
The claim's estimate is the equal-weight mean of the per-stratum mean differences with a t or
bootstrap interval (`distill.experiments.stats.intervals`), and its p-value is that interval
inverted. Holm's step-down runs over the family: every claim of the file that is not *not testable*
(a claim whose archive has no runs yet, or whose pairs have no spread and so no interval, counts
with p = 1, so that the family is the declared one and such a claim is never a rejection). The
verdict (`decide`), from the interval [lo, hi] at the level Holm tests the claim at and the
smallest effect of interest s:

- *not testable*: the claim's `testable` rule holds (teacher not ahead of the start by the margin;
  start at a floor or ceiling; teacher at the floor; every run at the floor, or every run at the
  ceiling). A teacher at the ceiling alone does not count: it bounds nothing the students do unless
  they reach it too, which the every-run rule sees.
- predicts increase (decrease): *replicated* when lo > 0 (hi < 0); *contradicted* when hi < 0
  (lo > 0); *no effect* when −s <= lo and hi <= s; else *unresolved*.
- predicts none (an equality, e.g. "robust to the policy"): *replicated* when −s <= lo and hi <= s;
  *contradicted* when lo > s or hi < −s (an effect of at least s is shown); else *unresolved*.
- a *replicated* or *contradicted* directional claim whose whole interval lies within ±s says so:
  "but smaller than ±s" (an effect of the sign shown, too small to matter).
- every *unresolved* claim gets its minimum detectable effect at 80 % power, at the level Holm
  tested it and the standard error observed.

What this controls: Holm's step-down over the zero-null p-values bounds the family-wise error of
the claims that assert an effect (a directional *replicated* or *contradicted*, and an equality's
*contradicted*, whose interval then excludes 0 as well) at 1 − level. An equivalence verdict (*no
effect*, an equality's *replicated*) is a two one-sided test read off the same interval: each errs
with chance at most (1 − its level) / 2 <= 2.5 %, a bound per claim, not one over the family.

The pairs are taken as independent. Where a value of the first `paired` knob (the seed) recurs
across pairs, `intervals.independence` tests whether those pairs differ alike, and the report
says so beside the claim when they do.
"""

from __future__ import annotations

import difflib
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from distill.experiments.run.axes import format_value
from distill.experiments.run.claims import Claim, ClaimsError, ClaimsFile
from distill.experiments.run.records import RunRecord, chained_pairs, is_share, load_records, read_stages
from distill.experiments.run.references import load_references
from distill.experiments.stats.intervals import (
    Estimate,
    Independence,
    estimate,
    holm,
    independence,
    minimum_detectable,
)

VERDICTS = ("replicated", "contradicted", "no effect", "unresolved", "not testable", "no runs yet")


@dataclass
class Verdict:
    """A claim's verdict and the numbers behind it. Before `judge` a verdict of "" is pending: it
    holds the claim's paired differences (`groups`), references (`start`, `teacher`) and `raw`."""

    claim: Claim
    verdict: str
    reason: str
    estimate: Estimate | None = None  # at 95 % (unadjusted): the p-value Holm ranks
    adjusted: Estimate | None = None  # at the level Holm tested it
    p_adjusted: float = math.nan
    mde: float = math.nan
    strata: list[tuple[str, Estimate]] = field(default_factory=list)  # per stratum, 95 %
    groups: list[np.ndarray] = field(default_factory=list)  # the paired differences of each stratum
    start: float | None = None
    teacher: float | None = None
    raw: list[float] = field(default_factory=list)  # the metric of every run of the contrast
    independence: Independence | None = None  # pairs sharing a seed: do they differ alike?


def _same(x: Any, y: Any) -> bool:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
    return math.isclose(x, y, rel_tol=1e-9) if numbers else format_value(x) == format_value(y)


def _matches(record: RunRecord, values: dict[str, Any]) -> bool:
    return all(k in record.settings and _same(record.settings[k], v) for k, v in values.items())


def stage_dir(claim_archive: str, sweep_dirs: dict[str, Path], results: Path) -> Path:
    sweep, _, stage = claim_archive.partition("/")
    top = sweep_dirs.get(sweep, results / sweep)
    return top / stage if stage else top


def _values(claim: Claim, directory: Path, baseline: Path | None) -> list[tuple[RunRecord, float]]:
    """(run, the claim's value) for every finished run that has the metric. An archive not written
    yet gives none (its verdict: no runs yet), but a name that is likely a typo is an error: an
    archive missing beside one of a close name, a metric that no finished run has."""
    if not directory.is_dir():
        siblings = (
            [p.name for p in directory.parent.iterdir() if p.is_dir()] if directory.parent.is_dir() else []
        )
        near = difflib.get_close_matches(directory.name, siblings, n=3, cutoff=0.75)
        if near:
            raise ClaimsError(
                f"claim {claim.id}: archive {claim.archive!r} has no directory {directory}; "
                f"did you mean {' or '.join(repr(n) for n in near)} (beside it)?"
            )
    runs = [r for r in load_records(directory) if r.finished] if directory.is_dir() else []
    if runs and not any(claim.metric in r.metrics for r in runs):
        names = sorted({k for r in runs for k in r.metrics})
        near = difflib.get_close_matches(claim.metric, names, n=3, cutoff=0.5)
        raise ClaimsError(
            f"claim {claim.id}: metric {claim.metric!r} is in none of the {len(runs)} finished runs of "
            f"{claim.archive}; closest: {near or names[:5]}"
        )
    if baseline is None:
        return [(r, r.metrics[claim.metric]) for r in runs if claim.metric in r.metrics]
    parents = [r for r in load_records(baseline) if r.finished] if baseline.is_dir() else []
    return [
        (child, child.metrics[claim.metric] - parent.metrics[claim.metric])
        for parent, child in chained_pairs(parents, runs)
        if claim.metric in child.metrics and claim.metric in parent.metrics
    ]


def _check_knobs(claim: Claim, runs: list[RunRecord]) -> None:
    values: dict[str, set[str]] = defaultdict(set)
    for r in runs:
        for k, v in r.settings.items():
            values[k].add(format_value(v))
    declared = claim.knobs()
    for knob in sorted(declared):
        if knob not in values:
            raise ClaimsError(
                f"claim {claim.id}: knob {knob!r} is not a knob of {claim.archive}; allowed: {', '.join(sorted(values))}"
            )
    loose = sorted(k for k, v in values.items() if len(v) > 1 and k not in declared)
    if loose:
        raise ClaimsError(
            f"claim {claim.id}: knob {loose[0]!r} of {claim.archive} varies but is not declared; "
            "allowed: name it in a/b, within, strata or paired"
        )


def _pairs(claim: Claim, values: list[tuple[RunRecord, float]]) -> dict[tuple, list[tuple[tuple, float]]]:
    """Per stratum (a tuple of formatted values), each pair's `paired` knob values and its
    difference a − b."""
    _check_knobs(claim, [r for r, _ in values])
    sides: dict[str, dict[tuple, float]] = {"a": {}, "b": {}}
    for record, value in values:
        if not _matches(record, claim.within) or not math.isfinite(value):
            continue
        for side, wanted in (("a", claim.a), ("b", claim.b)):
            if _matches(record, wanted):
                key = tuple(format_value(record.settings[k]) for k in (*claim.strata, *claim.paired))
                if key in sides[side]:
                    raise ClaimsError(
                        f"claim {claim.id}: two runs of side {side} share {key}; allowed: one a pair"
                    )
                if claim.transform == "log":
                    if value <= 0:
                        raise ClaimsError(
                            f"claim {claim.id}: {claim.metric} = {value!r} in {record.name}; allowed with log: > 0"
                        )
                    value = math.log(value)
                sides[side][key] = value
    out: dict[tuple, list[tuple[tuple, float]]] = defaultdict(list)
    cut = len(claim.strata)
    for key in sorted(set(sides["a"]) & set(sides["b"]), key=_order):
        out[key[:cut]].append((key[cut:], sides["a"][key] - sides["b"][key]))
    return dict(out)


def _order(key: tuple[str, ...]) -> tuple:
    """Knob values in their natural order: numbers by value (1e-4 before 3e-4 before 1e-3)."""

    def one(text: str) -> tuple:
        try:
            return (0, float(text), "")
        except ValueError:
            return (1, 0.0, text)

    return tuple(one(t) for t in key)


def _references(claim: Claim, directory: Path, runs: list[RunRecord]) -> tuple[float | None, float | None]:
    """The start's and the teacher's value of the metric: the stage's references, else the first
    stage's; the start's from the runs' `<metric>_start` where the references lack the metric."""
    refs = load_references(directory)
    if not refs:
        stages = read_stages(directory.parent) or []
        refs = load_references(directory.parent / stages[0]["name"]) if stages else {}
    start = refs.get("start", {}).get(claim.metric)
    if start is None:
        own = [r.metrics[f"{claim.metric}_start"] for r in runs if f"{claim.metric}_start" in r.metrics]
        start = float(np.mean(own)) if own else None
    return start, refs.get("teacher", {}).get(claim.metric)


def _formatter(metric: str, transform: str | None, signed: bool = False):
    if transform == "log":
        return lambda v: f"×{math.exp(v):.3g}"
    if is_share(metric):
        return lambda v: f"{100 * v:+.1f} pp" if signed else f"{100 * v:.1f} %"
    return lambda v: f"{v:+.3g}" if signed else f"{v:.3g}"


def _resolution(claim: Claim) -> float:
    """How finely the claim's bounds are printed: 0.1 pp for shares and ratios, else s / 10."""
    return 0.001 if claim.transform == "log" or is_share(claim.metric) else claim.sesoi / 10


def decide(
    claim: Claim,
    start: float | None,
    teacher: float | None,
    raw: list[float],
    est: Estimate,
    adjusted: Estimate | None = None,
) -> tuple[str, str]:
    """The verdict rule (the module's docstring in words), in one place: a claim's verdict and the
    rule's reason, from its numbers. `start` and `teacher` are the references' metric and `raw`
    the metric of every run of the contrast (the `testable` rule); `est` is the unadjusted
    estimate and `adjusted` the Holm-adjusted one, None until Holm's step-down has run.

    Without `adjusted` only *not testable* (which leaves Holm's family) and *unresolved* for want
    of an interval are decided; ("", "") then means the verdict waits for the adjusted interval.
    An interval verdict's reason is `_reason`'s (it names the minimum detectable effect)."""
    rule, fmt = claim.testable, _formatter(claim.metric, None)
    if (
        rule.margin is not None
        and start is not None
        and teacher is not None
        and teacher - start < rule.margin
    ):
        lead = _formatter(claim.metric, None, signed=True)(rule.margin).lstrip("+")
        return (
            "not testable",
            f"the teacher ({fmt(teacher)}) is not ahead of the start ({fmt(start)}) by {lead}",
        )
    if rule.floor is not None:
        for who, v in (("start", start), ("teacher", teacher)):
            if v is not None and v <= rule.floor:
                return "not testable", f"the {who} is at the floor ({fmt(v)} <= {fmt(rule.floor)})"
        if raw and max(raw) <= rule.floor:
            return "not testable", f"every run is at the floor (<= {fmt(rule.floor)})"
    if rule.ceiling is not None:
        if start is not None and start >= rule.ceiling:
            return "not testable", f"the start is at the ceiling ({fmt(start)} >= {fmt(rule.ceiling)})"
        if raw and min(raw) >= rule.ceiling:
            return "not testable", f"every run is at the ceiling (>= {fmt(rule.ceiling)})"
    if est.method == "none" or est.se == 0:  # never a zero-width interval
        why = "fewer than 2 pairs in every stratum" if est.method == "none" else "no spread between pairs"
        return "unresolved", f"{why}: no interval"
    if adjusted is None:
        return "", ""
    s, lo, hi = claim.sesoi, adjusted.low, adjusted.high
    inside = -s <= lo and hi <= s
    if claim.predicts == "none":
        return ("replicated" if inside else "contradicted" if lo > s or hi < -s else "unresolved"), ""
    up = claim.predicts == "increase"
    if (lo > 0) if up else (hi < 0):
        return "replicated", ""
    if (hi < 0) if up else (lo > 0):
        return "contradicted", ""
    return ("no effect" if inside else "unresolved"), ""


def _observe(claim: Claim, index: int, claims: ClaimsFile, sweep_dirs: dict[str, Path]) -> Verdict:
    """A pending verdict: the claim's paired differences and references read from its archive
    (or "no runs yet"), with its per-stratum estimates and the check of its pairs' independence."""
    directory = stage_dir(claim.archive, sweep_dirs, claims.results)
    baseline = stage_dir(claim.baseline, sweep_dirs, claims.results) if claim.baseline else None
    values = _values(claim, directory, baseline)
    if not values:
        return Verdict(claim, "no runs yet", f"no finished run of {claim.archive} has {claim.metric}")
    strata = _pairs(claim, values)
    if not strata:
        return Verdict(claim, "no runs yet", "no pair of runs (side a and side b) yet")
    runs = [r for r, _ in values]
    start, teacher = _references(claim, directory, runs)
    raw = [
        r.metrics[claim.metric]
        for r in runs
        if _matches(r, claim.within) and (_matches(r, claim.a) or _matches(r, claim.b))
    ]
    groups = [np.array([d for _, d in pairs]) for pairs in strata.values()]
    per = [
        (", ".join(k) or "all", estimate([g], claims.level, _resolution(claim), seed=index))
        for k, g in zip(strata, groups)
    ]
    clusters = [[keys[0] for keys, _ in pairs] for pairs in strata.values()]
    checked = independence(groups, clusters, claim.paired[0]) if claim.paired else None
    return Verdict(
        claim,
        "",
        "",
        strata=per,
        groups=groups,
        start=start,
        teacher=teacher,
        raw=raw,
        independence=checked,
    )


def judge(verdicts: list[Verdict], level: float = 0.95) -> list[Verdict]:
    """The rule over a family: every pending verdict (`verdict` "") of `verdicts`, the whole claims
    file in its order, decided in place from its `groups`, references and `raw` (the module's
    docstring in words); verdicts already given (no runs yet) stay, in the family with p = 1.
    `level` is the family-wise level. Returns `verdicts`.

    Each estimate draws its bootstrap resamples from the claim's place in the file and sizes them
    for Holm's strictest level, 1 − (1 − level) / m over the m claims, so the interval at the level
    Holm tests a claim at excludes 0 exactly when Holm rejects it."""
    alpha = 1 - level
    strictest = 1 - alpha / max(1, len(verdicts))
    for index, v in enumerate(verdicts):
        if v.verdict == "":
            v.estimate = estimate(v.groups, level, _resolution(v.claim), seed=index, strictest=strictest)
            v.verdict, v.reason = decide(v.claim, v.start, v.teacher, v.raw, v.estimate)
    family = [(i, v) for i, v in enumerate(verdicts) if v.verdict != "not testable"]
    p = [1.0 if v.estimate is None or math.isnan(v.estimate.p) else v.estimate.p for _, v in family]
    adjusted, levels = holm(p, alpha)
    for (index, v), p_adj, at in zip(family, adjusted, levels):
        v.p_adjusted = p_adj
        if v.verdict:  # no runs yet, or decided without an interval
            continue
        v.adjusted = estimate(v.groups, at, _resolution(v.claim), seed=index, strictest=strictest)
        v.verdict, _ = decide(v.claim, v.start, v.teacher, v.raw, v.estimate, v.adjusted)
        v.mde = minimum_detectable(v.adjusted.se, v.adjusted.df, at)
        v.reason = _reason(v)
    for v in verdicts:
        if v.verdict == "not testable" and v.estimate is not None and v.estimate.se > 0:
            v.mde = minimum_detectable(v.estimate.se, v.estimate.df, level)
    return verdicts


def evaluate(claims: ClaimsFile, sweep_dirs: dict[str, Path] | None = None) -> list[Verdict]:
    """Every claim's verdict; `sweep_dirs` maps a sweep name to its directory where it is not
    `<results>/<name>` (a sweep reported before it is archived)."""
    sweep_dirs = sweep_dirs or {}
    pending = [_observe(c, i, claims, sweep_dirs) for i, c in enumerate(claims.claims)]
    return judge(pending, claims.level)


def _reason(v: Verdict) -> str:
    fmt = _formatter(v.claim.metric, v.claim.transform, signed=True)
    if v.verdict == "unresolved":
        where = (
            "is neither within nor beyond" if v.claim.predicts == "none" else "includes 0 and is not within"
        )
        return f"the interval {where} ±{_sesoi(v.claim)}; detectable at 80 % power: {fmt(v.mde)}"
    if v.verdict in ("replicated", "contradicted") and v.claim.predicts != "none":
        small = -v.claim.sesoi <= v.adjusted.low and v.adjusted.high <= v.claim.sesoi
        return f"but smaller than ±{_sesoi(v.claim)}" if small else ""
    return ""


def _sesoi(claim: Claim) -> str:
    if claim.transform == "log":
        return f"×{math.exp(claim.sesoi):.3g}"
    return f"{100 * claim.sesoi:.1f} pp" if is_share(claim.metric) else f"{claim.sesoi:.3g}"

"""Seeds before a study: each declared claim's minimum detectable effect (MDE) at a planned design,
from a pilot study's spread.

    python -m distill.experiments.stats.power experiments/claims/v3.yaml --pilot experiments/claims/v2.yaml

The **pilot** is an earlier study with a claims file of the same claim ids (v2's archives plan
v3's study). For each claim, its paired differences' spread within strata: every stratum's own
mean removed, the squares pooled (a fixed factor's effect is not noise). A claim the pilot could
not measure (no runs, no spread: a floor) borrows the median pooled sd of the pilot's claims on
the same kind of metric (the same last name part, e.g. `accuracy`; else the same scale: shares, or
logs), and the table says so.

The **plan** is the sweep spec of each archive a claim reads (`--specs`: the `*.yaml` files of a
directory, matched by their `name:`). Its runs, paired by the claim's own rule
(`distill.experiments.stats.verdicts`), give the pairs of every stratum; the staged archive
`sweep/stage` reads that stage's runs.

The MDE is what `verdicts` reports for an unresolved claim, computed ahead: (t_{1−α/2} + t_power)
· se, with se² = Σ sd² / n_s / S² over the S strata of n_s pairs and Welch–Satterthwaite df, at
Holm's strictest level, that of its first step (1 − α/m for m claims): a bound for every rank, since
each later step tests at a level between that and 1 − α. A claim is sized when its MDE is at most its smallest effect of interest: an effect that
large is then replicated with the power asked, and for an equality claim (`predicts: none`) the
interval of a null effect is then narrower than ±sesoi.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from distill.experiments.run.claims import Claim, ClaimsError, ClaimsFile, load_claims
from distill.experiments.run.records import RunRecord
from distill.experiments.run.schema import SpecError
from distill.experiments.run.spec import SweepSpec, expand, load_spec
from distill.experiments.stats.intervals import minimum_detectable

__all__ = ["Plan", "main", "plan", "planned_mde", "planned_pairs", "pooled_sd"]


def pooled_sd(groups: list[np.ndarray]) -> tuple[float, int]:
    """(sd, df) of paired differences pooled within groups (strata): each group's own mean removed,
    groups of one difference left out. (nan, 0) without any spread to measure."""
    kept = [np.asarray(g, dtype=float) for g in groups if len(g) >= 2]
    df = sum(len(g) - 1 for g in kept)
    if df == 0:
        return math.nan, 0
    return math.sqrt(sum(float(((g - g.mean()) ** 2).sum()) for g in kept) / df), df


def planned_mde(sd: float, pairs: list[int], level: float, power: float = 0.8) -> float:
    """The MDE of the equal-weight mean over strata of `pairs[i]` pairs each (strata of fewer than
    2 pairs have no interval and are left out, as `intervals.estimate` does), every difference
    with standard deviation `sd`."""
    kept = [n for n in pairs if n >= 2]
    if not kept or not sd > 0:
        return math.nan
    parts = [sd * sd / n / len(kept) ** 2 for n in kept]
    se = math.sqrt(sum(parts))
    df = sum(parts) ** 2 / sum(v * v / (n - 1) for v, n in zip(parts, kept))
    return minimum_detectable(se, df, level, power)


def planned_pairs(claim: Claim, spec: SweepSpec) -> list[int]:
    """Pairs per stratum of `claim` among the runs `spec` plans (the claim's pairing rule applied
    to the planned settings)."""
    from distill.experiments.stats.verdicts import _pairs  # the rule itself, not a copy of it

    stage = claim.archive.partition("/")[2] or None
    runs = [r for r in expand(spec) if r.reference is None and r.stage == stage]
    if not runs:
        raise ClaimsError(f"claim {claim.id}: the spec {spec.name!r} plans no run of {claim.archive}")
    records = [RunRecord(r.name, r.run_dir, True, dict(r.settings), {}) for r in runs]
    strata = _pairs(claim, [(record, 1.0) for record in records])  # any value: only pairs count (1: log-safe)
    return [len(d) for d in strata.values()]


@dataclass(frozen=True)
class Plan:
    claim: Claim
    pairs: list[int]
    sd: float
    sd_source: str  # "pilot" (its claim of the same id) or "borrowed (...)"
    mde: float

    @property
    def sized(self) -> bool:
        return self.mde <= self.claim.sesoi


def _pilot_spreads(pilot: ClaimsFile) -> dict[str, float]:
    from distill.experiments.stats.verdicts import evaluate

    out = {}
    for v in evaluate(pilot):
        sd, _ = pooled_sd(v.groups)
        if sd > 0:
            out[v.claim.id] = sd
    return out


def plan(
    claims: ClaimsFile, pilot: ClaimsFile, specs: dict[str, SweepSpec], power: float = 0.8
) -> list[Plan]:
    """Each claim's planned pairs and MDE at Holm's strictest level (its first step's)."""
    spreads = _pilot_spreads(pilot)
    scale = {c.id: c.transform for c in pilot.claims}
    kind = {c.id: c.metric.rsplit("/", 1)[-1] for c in pilot.claims}
    level = 1 - (1 - claims.level) / len(claims.claims)
    out = []
    for claim in claims.claims:
        if claim.sweep not in specs:
            raise ClaimsError(
                f"claim {claim.id}: no spec plans the archive {claim.sweep!r}; allowed: {', '.join(sorted(specs))}"
            )
        pairs = planned_pairs(claim, specs[claim.sweep])
        if claim.id in spreads:
            sd, source = spreads[claim.id], "pilot"
        else:
            same = [v for k, v in spreads.items() if scale.get(k) == claim.transform]
            alike = [v for k, v in spreads.items() if kind[k] == claim.metric.rsplit("/", 1)[-1]]
            pool, what = (alike, "alike") if alike and claim.transform is None else (same, "on its scale")
            if not pool:
                raise ClaimsError(
                    f"claim {claim.id}: the pilot has no claim on its scale to borrow a spread from"
                )
            sd, source = float(np.median(pool)), f"borrowed (median of {len(pool)} {what})"
        out.append(Plan(claim, pairs, sd, source, planned_mde(sd, pairs, level, power)))
    return out


def _specs(directory: Path) -> dict[str, SweepSpec]:
    out = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            name = (yaml.safe_load(path.read_text()) or {}).get("name")
        except (yaml.YAMLError, AttributeError):
            continue
        if isinstance(name, str) and name not in out:
            try:
                out[name] = load_spec(path)
            except SpecError:
                continue
    return out


def _units(claim: Claim, value: float) -> str:
    if claim.transform == "log":
        return f"x{math.exp(value):.3g}"
    return f"{100 * value:.1f} pp"


def table(rows: list[Plan], level: float, power: float = 0.8) -> str:
    lines = [
        f"MDE at {100 * power:.3g} % power, at Holm's strictest level, its first step's ({100 * level:.3g} %):",
        "",
        "| claim | archive | pairs per stratum | pilot sd | MDE | sesoi | sized |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.claim.id} | {r.claim.archive} | {', '.join(map(str, r.pairs))} | "
            f"{_units(r.claim, r.sd)} {r.sd_source} | {_units(r.claim, r.mde)} | "
            f"{_units(r.claim, r.claim.sesoi)} | {'yes' if r.sized else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distill.experiments.stats.power", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("claims", type=Path, help="the planned study's claims file")
    parser.add_argument("--pilot", type=Path, required=True, help="a finished study's claims file (same ids)")
    parser.add_argument("--specs", type=Path, default=Path("experiments"), help="where the sweep specs are")
    parser.add_argument("--power", type=float, default=0.8)
    args = parser.parse_args(argv)
    try:
        claims, pilot = load_claims(args.claims), load_claims(args.pilot)
        rows = plan(claims, pilot, _specs(args.specs), args.power)
    except (ClaimsError, SpecError) as err:
        print(f"power: {err}", file=sys.stderr)
        return 2
    print(table(rows, 1 - (1 - claims.level) / len(claims.claims), args.power))
    return 0


if __name__ == "__main__":
    sys.exit(main())

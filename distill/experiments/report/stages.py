"""Reports of staged sweeps (`stages:` in the spec): one report per stage, and before/after.

`<out>/report/report.md` links each stage's own report (`<out>/report/<stage>/report.md`, written
by `build_report` on `<out>/<stage>` as for any sweep) and, for each chained stage, compares every
chained run with its parent run: accuracy on each test set before (the parent, e.g. the distilled
student) and after (e.g. RLVR from it), and the paired change, grouped by the parent's knobs (by
default divergence x mix, i.e. by rollout policy and divergence). Cells are mean ± sample std
(n pairs) over seeds and over any knob not shown; the change is averaged per pair. The first
stage's reference runs (the start and the teacher) are the references of every stage's report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distill.experiments.run.axes import format_value
from distill.experiments.run.records import (
    REPLICATE,
    RunRecord,
    chained_pairs,
    headline_order,
    knob_values,
    load_records,
)
from distill.experiments.stats.analysis import summarize

PREFERRED = ("divergence", "mix")


def _spread(std: float) -> float:
    return std if std > 1e-12 else 0.0  # equal pairs: no floating-point residue in the table


def _cell(values: list[float]) -> str:
    """Accuracies (fractions) as percentages with one decimal: mean ± std (n)."""
    mean, std, n = summarize(values)
    if n == 0:
        return "—"
    return f"{100 * mean:.1f} ({n})" if n == 1 else f"{100 * mean:.1f} ± {100 * _spread(std):.1f} ({n})"


def _signed(values: list[float]) -> str:
    """Changes in percentage points with one decimal: mean ± std (n)."""
    mean, std, n = summarize(values)
    if n == 0:
        return "—"
    return f"{100 * mean:+.1f} ({n})" if n == 1 else f"{100 * mean:+.1f} ± {100 * _spread(std):.1f} ({n})"


def before_after(
    before: str, after: str, matched: list[tuple[RunRecord, RunRecord]], sweep_dir: Path
) -> list[str]:
    """The before/after section of one chained stage (`after`) against its parent stage."""
    lines = [f"## Before/after: {before} → {after}", ""]
    if not matched:
        return lines + [f"No finished `{after}` run with a finished parent in `{before}` yet.", ""]
    knobs = knob_values([p for p, _ in matched], sweep_dir / before)
    varying = [k for k, v in knobs.items() if len(v) > 1 and k != REPLICATE]
    shown = [k for k in PREFERRED if k in varying] or varying[:2]
    pooled = [k for k in varying if k not in shown]
    sets = sorted(
        {m.split("/")[1] for p, c in matched for m in p.metrics if re.fullmatch(r"test/[^/]+/accuracy", m)}
        & {m.split("/")[1] for p, c in matched for m in c.metrics if re.fullmatch(r"test/[^/]+/accuracy", m)},
        key=headline_order([p for p, _ in matched]),
    )
    lines += [
        f"Test accuracy of each `{before}` run (before) and of the `{after}` run started from it "
        f"(after), by {' × '.join(shown) or 'run'} of the `{before}` stage; Δ is after − before per "
        "pair. Mean ± std (n pairs) over seeds" + (f", pooled over {', '.join(pooled)}." if pooled else "."),
        "",
    ]
    groups: list[dict[str, Any]] = [{}]
    for knob in shown:
        groups = [g | {knob: v} for g in groups for v in knobs[knob]]
    header = [" · ".join(shown) or "all pairs"]
    for s in sets:
        header += [f"{s} before", f"{s} after", f"{s} Δ"]
    rows = []
    for where in groups:
        chosen = [
            (p, c)
            for p, c in matched
            if all(format_value(p.settings.get(k)) == format_value(v) for k, v in where.items())
        ]
        if not chosen:
            continue
        row = [", ".join(f"{k}={format_value(v)}" for k, v in where.items()) or "all pairs"]
        for s in sets:
            metric = f"test/{s}/accuracy"
            both = [
                (p.metrics[metric], c.metrics[metric])
                for p, c in chosen
                if metric in p.metrics and metric in c.metrics
            ]
            row += [
                _cell([b for b, _ in both]),
                _cell([a for _, a in both]),
                _signed([a - b for b, a in both]),
            ]
        rows.append(row)
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines + [""] + _persistence(matched, knobs, sets, before, after)


def _persistence(matched, knobs: dict[str, list], sets: list[str], before: str, after: str) -> list[str]:
    """On- minus off-policy (lowest mix − highest) within each divergence, before and after: does
    the rollout policy's advantage (or deficit) persist through the chained stage? Each side is an
    `effects.contrast` (paired by every other setting; a chained run inherits its parent's
    settings, so a stage with its own axes pairs per value of them)."""
    from distill.experiments.report.effects import MIN_BOOTSTRAP_PAIRS, contrast, policy_side

    mixes = sorted(knobs.get("mix", []))
    if len(mixes) < 2:
        return []
    parents = list({p.name: p for p, _ in matched}.values())
    children = [c for _, c in matched]
    rows = []
    for div in knobs.get("divergence", [None]):
        within = None if div is None else ("divergence", div)
        row, said = [f"divergence={format_value(div)}" if div is not None else "all runs"], False
        for s in sets:
            for records in (parents, children):
                e = contrast(records, f"test/{s}/accuracy", "mix", mixes[0], mixes[-1], within)
                if e is None:
                    row.append("—")
                    continue
                said = said or e.says_something
                bounds = f" [{100 * e.low:+.1f}, {100 * e.high:+.1f}]" if math.isfinite(e.low) else ""
                row.append(f"{100 * e.difference:+.1f}{bounds} ({e.n})")
        if said:
            rows.append(row)
    if not rows:
        return []
    header = ["within"] + [f"{s} {when}" for s in sets for when in (before, after)]
    # The committed reports print the effects' short dotted name as below (byte for byte); the
    # module is distill.experiments.report.effects.
    return [
        f"### mix={format_value(mixes[0])} − mix={format_value(mixes[-1])} ({policy_side(mixes[0], mixes[-1])}) "
        "before and after",
        "",
        "In percentage points (n pairs), paired by every other setting, with 95 % intervals (Student's t "
        f"below {MIN_BOOTSTRAP_PAIRS} pairs, else a bootstrap; none without spread; `distill.experiments.effects`): "
        f"does the rollout policy's effect survive `{after}`?",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def build_staged_report(
    sweep_dir: Path, out: Path, stages: list[dict[str, Any]], build_report: Callable[..., Path], **options
) -> Path:
    """Each stage's report under `out/<stage>/`, then `out/report.md` with the before/after sections."""
    sweep_dir, out = Path(sweep_dir), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kind = "chained stages" if any(stage.get("after") for stage in stages) else "stages"
    lines = [f"# Sweep report: {sweep_dir.name} ({kind})", ""]
    records: dict[str, list[RunRecord]] = {}
    first = sweep_dir / stages[0]["name"]  # where the sweep runner puts the references
    for stage in stages:
        name = stage["name"]
        stage_dir = sweep_dir / name
        records[name] = load_records(stage_dir) if stage_dir.is_dir() else []
        done = sum(r.finished for r in records[name])
        chained = f" (from `{stage['after']}`)" if stage.get("after") else ""
        if records[name]:
            build_report(stage_dir, out / name, references_from=first, **options)
            link = f"[{name}/report.md]({name}/report.md)"
        else:
            link = "no runs yet"
        lines.append(f"- stage `{name}`{chained}: {done} of {len(records[name])} runs finished; {link}")
    lines.append("")
    for stage in stages:
        if stage.get("after"):
            matched = chained_pairs(records[stage["after"]], records[stage["name"]])
            lines += before_after(stage["after"], stage["name"], matched, sweep_dir)
    (out / "report.md").write_text("\n".join(lines))
    return out / "report.md"

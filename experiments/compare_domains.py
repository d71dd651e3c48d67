"""Knowledge against skill: does the same knob matter when distilling facts as when distilling search?

Run:  .venv/bin/python experiments/compare_domains.py   # reads experiments/results/{tiny_grid,tiny_sci}

`tiny_sci` distils `teacher-sci` into `student-sci` on the tiny world's knowledge domain
(facts about made-up creatures, asked as multiple choice); `tiny_grid` distils `teacher` into
`student` on Countdown (a search skill). The knowledge grid ran a subset of the Countdown grid's
knob values (mix {0, 0.5, 1}, lr {3e-4, 1e-3}, both directions, seeds 0 and 1), so the Countdown
grid is cut to the same cells before anything is compared: both domains then have the same 24-run
design, and their variance shares (`analysis.factor_importance`, eta² of each knob's main effect,
the interactions and the seeds, with 95 % bootstrap intervals) are on the same footing. Then the
study's contrasts (`effects.contrast`: paired mean difference, 95 % interval) side by side.

Outcomes are paired by role, not by name: the trained task's accuracy and pass@8 (Countdown-3 /
`tinysci`), the harder variant (Countdown-4 / `tinysci_compose`), forgetting, update sparsity and
the training KLs. Forgetting is each grid's own retention sets: the prior abilities in both, plus
Countdown-3 in the knowledge grid (the pair's other skill). Markdown on stdout; experiments/LOG.md
quotes it.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from distill.experiments.report.effects import contrast
from distill.experiments.report.report import importance
from distill.experiments.run.axes import format_value
from distill.experiments.run.records import RunRecord, is_share, load_records

ROOT = Path(__file__).resolve().parent / "results"
KNOBS = ("mix", "divergence", "lr")
# role -> (the Countdown grid's metric, the knowledge grid's metric)
OUTCOMES = {
    "trained task, accuracy": ("test/countdown3/accuracy", "test/tinysci/accuracy"),
    "trained task, pass@8": ("test/countdown3/pass@8", "test/tinysci/pass@8"),
    "harder variant, accuracy": ("test/countdown4/accuracy", "test/tinysci_compose/accuracy"),
    "forgetting (mean drop)": ("forgetting/mean_delta", "forgetting/mean_delta"),
    "update sparsity": ("sparsity/overall", "sparsity/overall"),
    "train forward KL": ("train/forward_kl", "train/forward_kl"),
    "train reverse KL": ("train/reverse_kl", "train/reverse_kl"),
}
DOMAINS = ("Countdown", "knowledge")


def finished(records: list[RunRecord]) -> list[RunRecord]:
    return [r for r in records if r.problem is None and r.metrics]


def cell(record: RunRecord) -> tuple[str, ...]:
    return tuple(format_value(record.settings.get(k)) for k in (*KNOBS, "seed"))


def common_cells(grids: list[list[RunRecord]]) -> list[list[RunRecord]]:
    """Each grid cut to the cells (knob values and seed) that every grid ran, so that the designs
    are the same even while one grid is partial."""
    shared = set.intersection(*({cell(r) for r in runs} for runs in grids))
    return [[r for r in runs if cell(r) in shared] for runs in grids]


def share_cell(share) -> str:
    if not math.isfinite(share.estimate):
        return "—"
    return f"{share.estimate:.2f} [{share.low:.2f}, {share.high:.2f}]"


def effect_cell(effect, metric: str) -> str:
    if effect is None:
        return "—"
    scale, unit, digits = (100, " pp", 1) if is_share(metric) else (1, "", 3)
    point = f"{scale * effect.difference:+.{digits}f}{unit}"
    if math.isnan(effect.low):
        return f"{point} (n={effect.n})"
    mark = " ✱" if effect.clear else ""
    return f"{point} [{scale * effect.low:+.{digits}f}, {scale * effect.high:+.{digits}f}]{mark}"


def importance_rows(grids: list[list[RunRecord]], n_boot: int) -> list[str]:
    lines = [
        "| outcome | domain | runs | mix | divergence | lr | interactions | seeds | largest |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for role, metrics in OUTCOMES.items():
        for domain, runs, metric in zip(DOMAINS, grids, metrics):
            found = importance(runs, [metric], list(KNOBS), n_boot)
            if not found:
                lines.append(f"| {role} | {domain} | — | no variation or no runs |||||| ")
                continue
            imp = found[0]
            cells = [share_cell(imp.factors[k]) for k in KNOBS]
            lines.append(
                f"| {role} | {domain} | {imp.n_runs} | "
                + " | ".join(cells)
                + f" | {share_cell(imp.interactions)} | {share_cell(imp.residual)} | {imp.largest()} |"
            )
    return lines


CONTRASTED = (
    "trained task, accuracy",
    "trained task, pass@8",
    "harder variant, accuracy",
    "forgetting (mean drop)",
)
CONTRASTS = (
    ("on − off-policy (mix 0 − 1), forward KL", "mix", 0, 1, ("divergence", "forward_kl")),
    ("on − off-policy (mix 0 − 1), reverse KL", "mix", 0, 1, ("divergence", "reverse_kl")),
    ("forward − reverse KL, every mix", "divergence", "forward_kl", "reverse_kl", None),
    ("lr 1e-3 − 3e-4", "lr", 1e-3, 3e-4, None),
)


def contrast_rows(grids: list[list[RunRecord]]) -> list[str]:
    lines = ["| outcome | contrast | Countdown | knowledge |", "|---|---|---|---|"]
    for role, metrics in OUTCOMES.items():
        if role not in CONTRASTED:
            continue
        for label, knob, a, b, within in CONTRASTS:
            cells = [
                effect_cell(contrast(runs, metric, knob, a, b, within=within), metric)
                for runs, metric in zip(grids, metrics)
            ]
            lines.append(f"| {role} | {label} | " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--countdown", type=Path, default=ROOT / "tiny_grid")
    parser.add_argument("--knowledge", type=Path, default=ROOT / "tiny_sci")
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args(argv)
    grids = common_cells([finished(load_records(args.countdown)), finished(load_records(args.knowledge))])
    sizes = ", ".join(f"{d} {len(g)}" for d, g in zip(DOMAINS, grids))
    print(f"Runs in the shared cells: {sizes}.\n")
    if any(len(g) < 2 for g in grids):
        print("Too few finished runs in the shared cells to compare.")
        return 1
    print("### Which knob matters, in each domain (variance shares, 95 % intervals)\n")
    print("\n".join(importance_rows(grids, args.n_boot)) + "\n")
    print("### The study's contrasts in each domain (paired differences, 95 % intervals; ✱ excludes 0)\n")
    print("\n".join(contrast_rows(grids)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`distill report SWEEP_DIR [--out DIR] [--archive DEST]`: tables, plots and factor importance of a sweep.

Reads every run's `metrics.json` and settings (see `distill.experiments.run.records`) and writes,
into `--out` (default `SWEEP_DIR/report`):

- `runs.csv`: one row per run: run, finished, the knob columns, then the metric columns;
- `report.md`: the knobs; accuracy on each test set (Countdown-3 and the harder variants) and
  coverage (pass@k, distinct correct answers) by divergence x mix (where those do not vary, by
  the first knobs that do); forgetting, update sparsity
  and style by learning rate and by every other knob; factor importance (for each outcome the
  share of variance explained by each knob's main effect, eta², with bootstrap intervals, plus
  the interaction and seed shares; see `distill.experiments.stats.analysis`), and the same within each
  divergence; cost per run and per accuracy point; the plots;
- `plots/*.png`: heatmaps divergence x mix, curves against learning rate, accuracy against mix
  per divergence with seed error bars, and training curves of the KLs and of validation accuracy
  from the TensorBoard event files, or from an archived run's `curves.csv` (skipped when a run has
  neither).

The sweep's reference runs (`references/start` and `references/teacher`, see
`distill.experiments.run.references`) are rows `start (step 0)` and `teacher` in every accuracy and
coverage table, with a note of how many cells end above the start (and reach the teacher), and
horizontal lines in the accuracy-vs-knob plots and the validation-accuracy training curves. They are
not runs of the grid: not in `runs.csv`, the run counts or the factor analysis. A sweep without
them (e.g. an older archive) gets one line saying so.

`--archive DEST` first copies the committable part of the sweep into DEST (settings, resolved
configs, environments, metrics and curves; no checkpoints or event files; see
`distill.experiments.run.archive`) and then writes the report from DEST (into `DEST/report` unless
`--out` is given), so `distill report DEST` regenerates it from a git checkout.

A staged sweep (`stages:` in the spec) gets `report.md` with a link to each stage's report
(`<stage>/report.md`, as above) and a before/after section per chained stage (accuracy of each
parent run and of the run chained from it, by divergence x mix; see `distill.experiments.report.stages`).

Cells are mean ± sample std (n runs) over seeds and over every knob not shown, which is
pooled (averaged over); each table says which. Knobs with a single value are constants and are
left out of the factor analysis; `seed` is the replicate, never a factor. Missing metrics are
skipped.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

from distill.experiments.report import stages, tables, verdict_table
from distill.experiments.report.effects import effect_metrics, effects_section
from distill.experiments.report.tables import COL, GRADIENT, LR, ROW, SIDE_EFFECTS, table_axes
from distill.experiments.run.archive import ArchiveError, archive
from distill.experiments.run.axes import format_value
from distill.experiments.run.claims import ClaimsError
from distill.experiments.run.records import (
    CURVE_TAGS,
    REPLICATE,
    RunRecord,
    knob_values,
    load_records,
    metric_names,
    read_stages,
    write_csv,
)
from distill.experiments.run.references import DIRNAME as REFERENCES
from distill.experiments.run.references import load_references
from distill.experiments.run.sweep_record import sweep_name
from distill.experiments.stats.analysis import N_BOOT, Importance, factor_importance


def _share(share) -> str:
    if not math.isfinite(share.estimate):
        return "—"
    low, high = (f"{v:.3f}" if math.isfinite(v) else "—" for v in (share.low, share.high))
    return f"{share.estimate:.3f} [{low}, {high}]"


def importance(
    records: list[RunRecord], outcomes: list[str], factors: list[str], n_boot: int
) -> list[Importance]:
    """Factor importance of each outcome over the finished runs that report it (and vary)."""
    results = []
    for metric in outcomes:
        runs = [r for r in records if metric in r.metrics and math.isfinite(r.metrics[metric])]
        if len(runs) < 2 or len({r.metrics[metric] for r in runs}) < 2:
            continue
        labels = {k: [format_value(r.settings.get(k)) for r in runs] for k in factors}
        results.append(factor_importance([r.metrics[metric] for r in runs], labels, metric, n_boot=n_boot))
    return results


def _importance_cells(imp: Importance, factors: list[str]) -> list[str]:
    """Each factor's share (the largest in bold), then the interaction and seed shares."""
    top = imp.largest()
    cells = [f"**{_share(imp.factors[k])}**" if k == top else _share(imp.factors[k]) for k in factors]
    return [*cells, _share(imp.interactions), _share(imp.residual)]


def _within_section(
    records: list[RunRecord], outcomes: list[str], factors: list[str], n_boot: int, by: str = "divergence"
) -> list[str]:
    """Factor importance of the other knobs within each value of `by`: the paper's "is forward KL
    robust to the rollout policy?" is the mix share within forward KL, not across the whole grid."""
    if by not in factors or len(factors) < 2:
        return []
    others = [k for k in factors if k != by]
    rows = []
    for value in sorted({format_value(r.settings.get(by)) for r in records}):
        subset = [r for r in records if format_value(r.settings.get(by)) == value]
        for imp in importance(subset, outcomes, others, n_boot):
            rows.append([value, imp.outcome, str(imp.n_runs), *_importance_cells(imp, others)])
    if not rows:
        return []
    return [
        f"## Which knob matters within each {by}",
        "",
        f"The same analysis on the runs of one {by} at a time (outcomes that vary within it).",
        "",
        *tables.table([by, "outcome", "runs", *others, "interactions", "seeds (residual)"], rows),
    ]


def _importance_section(results: list[Importance], factors: list[str]) -> list[str]:
    lines = [
        "## Which knob matters: factor importance",
        "",
        "Share of each outcome's variance across runs explained by each knob's main effect "
        "(eta² = SS_between / SS_total), by interactions of knobs (the remainder), and by seeds "
        "(within-cell variance: runs that share every knob value). Brackets: 95 % basic "
        f"bootstrap intervals ({results[0].resampling if results else 'within-cell residuals'} resampled). "
        "**Bold**: the largest main effect.",
        "",
    ]
    rows = [[imp.outcome, str(imp.n_runs), *_importance_cells(imp, factors)] for imp in results]
    lines += tables.table(["outcome", "runs", *factors, "interactions", "seeds (residual)"], rows)
    for imp in results:
        top = imp.factors[imp.largest()]
        lines.append(
            f"- {imp.outcome}: largest main effect **{imp.largest()}** ({top.estimate:.0%} of the variance); "
            f"seeds {imp.residual.estimate:.0%}, interactions {imp.interactions.estimate:.0%}."
        )
    if any(imp.resampling == "runs" for imp in results):
        lines.append(
            "- With one run per cell (no seed replicates) seed noise cannot be told apart from "
            "interactions: the seed share shows as 0 and whole runs are resampled."
        )
    return lines + [""]


def _plots(records, factors, metrics, accuracy_metrics, out: Path, references=None) -> list[Path]:
    from distill.experiments.report import plots

    out.mkdir(parents=True, exist_ok=True)
    row, col = table_axes(factors)
    lines = (ROW, factors[ROW]) if ROW in factors else None
    paths = []
    if row and col:
        paths += [plots.heatmap(records, m, row, col, out) for m in accuracy_metrics]
    if LR in factors:
        lr_metrics = [m for m in (*SIDE_EFFECTS[:3], *accuracy_metrics[:1]) if m in metrics]
        paths.append(
            plots.against_knob(
                records, lr_metrics, (LR, factors[LR]), lines, out, "vs_lr", log_x=True, references=references
            )
        )
    if COL in factors:
        panels = (LR, factors[LR]) if LR in factors and len(factors[LR]) <= 6 else None
        mix = (COL, factors[COL])
        paths += [
            plots.accuracy_vs_mix(records, m, mix, lines, panels, out, references) for m in accuracy_metrics
        ]
        paths.append(
            plots.against_knob(
                records,
                [m for m in GRADIENT if m in metrics],
                mix,
                lines,
                out,
                "gradient_vs_mix",
                panels=panels,
            )
        )
    group = [axis[0] for axis in (row, col) if axis]
    paths.append(plots.training_curves(records, group, CURVE_TAGS, out, references))
    return [p for p in paths if p is not None]


def _header(
    sweep_dir: Path,
    records: list[RunRecord],
    knobs: dict[str, list],
    factors: dict[str, list],
    note: list[str],
) -> list[str]:
    """Title, run counts, the runs left out (and why), `note` (on the references), the knob table."""
    done = [r for r in records if r.finished]
    lines = [f"# Sweep report: {sweep_name(sweep_dir)}", ""]
    lines += [
        f"{len(done)} finished runs of {len(records)} in `{sweep_dir}`; every run is a row of `runs.csv`.",
        "",
    ]
    if len(done) < len(records):
        left_out = [r for r in records if not r.finished]
        lines += ["Left out of every table and figure:", ""]
        lines += [f"- `{r.name}`: {r.problem}" for r in left_out] + [""]
        for r in left_out:
            if r.problem != "unfinished":  # said on the terminal too: these are not mere stragglers
                print(f"[report] left out {r.name}: {r.problem}", file=sys.stderr)
    role = {k: "factor" if k in factors else "replicate" if k == REPLICATE else "constant" for k in knobs}
    rows = [[k, ", ".join(map(format_value, v)), role[k]] for k, v in knobs.items()]
    return lines + note + tables.table(["knob", "values", "role"], rows)


def _metric_groups(metrics: list[str]) -> dict[str, list[str]]:
    """The outcome metrics by kind: accuracy, coverage, side effects."""
    return {
        "accuracy": [m for m in metrics if re.fullmatch(r"test/[^/]+/accuracy", m)],
        "coverage": [m for m in metrics if re.fullmatch(r"test/[^/]+/(pass@\d+|distinct_correct)", m)],
        "side": [m for m in metrics if m in SIDE_EFFECTS or re.fullmatch(r"forgetting/[^/]+/delta", m)],
        "gradient": [m for m in GRADIENT if m in metrics],
    }


def _analysis(
    done: list[RunRecord],
    metrics: list[str],
    groups: dict[str, list[str]],
    factors: dict[str, list],
    n_boot: int,
) -> list[str]:
    """Factor importance (overall and within each divergence), then cost."""
    lines: list[str] = []
    described = groups["accuracy"] + groups["coverage"] + groups["side"]
    # Outcomes only: diagnostics such as train/loss (different objectives) or train/grad_norm are left out.
    outcomes = described + [m for m in metrics if m in ("train/forward_kl", "train/reverse_kl")]
    outcomes += [m for m in metrics if m.startswith("cost/")]
    results = importance(done, outcomes, list(factors), n_boot) if factors else []
    if results:
        lines += _importance_section(results, list(factors))
        lines += _within_section(done, described, list(factors), n_boot)
    accuracy = groups["accuracy"][0] if groups["accuracy"] else None  # the headline set's (metric_names)
    return lines + tables.cost_section(done, accuracy, *table_axes(factors))


def _plot_section(done, factors, metrics, accuracy_metrics, out: Path, references) -> list[str]:
    paths = _plots(done, factors, metrics, accuracy_metrics, out, references)
    lines: list[str] = []
    if paths:
        note = "Error bars: std over seeds (and over any pooled knob)."
        if references:
            note += " Horizontal lines: the references (in a validation-accuracy panel, their test accuracy)."
        lines += ["## Plots", "", note, ""]
        lines += [f"![{p.stem}](plots/{p.name})" for p in paths] + [""]
    if not any(p.name == "training_curves.png" for p in paths):
        lines += [
            f"No curves {', '.join(CURVE_TAGS)} (TensorBoard events or curves.csv) found: training curves skipped.",
            "",
        ]
    return lines


def build_report(
    sweep_dir: Path,
    out: Path | None = None,
    n_boot: int = N_BOOT,
    with_plots: bool = True,
    references_from: Path | None = None,
    claims: tuple[Path, str] | None = None,
) -> Path:
    """Write runs.csv, report.md and plots/ for a sweep directory; returns the report.md path.
    A staged sweep gets one report per stage and a before/after section (`distill.experiments.report.stages`).
    `references_from`: the directory whose `references/` to compare with (default `sweep_dir`; a
    chained stage uses the first stage's). `claims`: (path, name) of the claims file whose verdicts
    head the report (`distill.experiments.report.verdict_table`)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out) if out is not None else sweep_dir / "report"
    verdicts = (
        verdict_table.section(sweep_dir, sweep_name(sweep_dir), *claims, out) if claims is not None else []
    )
    staged = read_stages(sweep_dir)
    if staged:
        path = stages.build_staged_report(
            sweep_dir, out, staged, build_report, n_boot=n_boot, with_plots=with_plots
        )
        if verdicts:  # after the title
            lines = path.read_text().split("\n")
            path.write_text("\n".join(lines[:2] + verdicts + lines[2:]))
        return path
    records = load_records(sweep_dir)
    if not records:
        raise FileNotFoundError(f"no run directories (with settings.json or metrics.json) in {sweep_dir}")
    done = [r for r in records if r.finished]
    knobs = knob_values(done, sweep_dir)
    factors = {k: v for k, v in knobs.items() if len(v) > 1 and k != REPLICATE}
    metrics = metric_names(done)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(records, out / "runs.csv", list(knob_values(records, sweep_dir)), metrics)
    groups = _metric_groups(metrics)

    ref_dir = Path(references_from) if references_from is not None else sweep_dir
    references = load_references(ref_dir)
    where = "references/" if ref_dir == sweep_dir else f"{ref_dir.name}/references/"
    lines = _header(sweep_dir, records, knobs, factors, tables.references_lines(references, where))
    lines[4:4] = verdicts  # after the run count
    lines += tables.metric_tables(done, groups, factors, references)
    lines += effects_section(done, effect_metrics(groups), factors, n_boot)
    lines += _analysis(done, metrics, groups, factors, n_boot)
    if with_plots and done:
        lines += _plot_section(done, factors, metrics, groups["accuracy"], out / "plots", references)
    (out / "report.md").write_text("\n".join(lines))
    return out / "report.md"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `distill report`."""
    parser = argparse.ArgumentParser(
        prog="distill report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "sweep_dir", type=Path, nargs="?", help="a sweep's output directory (the spec's 'out')"
    )
    parser.add_argument("--out", type=Path, help="report directory (default: SWEEP_DIR/report)")
    parser.add_argument("--n-boot", type=int, default=N_BOOT, help=f"bootstrap resamples (default {N_BOOT})")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--archive",
        type=Path,
        metavar="DEST",
        help="copy the committable files to DEST and report from there",
    )
    parser.add_argument(
        "--claims",
        type=Path,
        metavar="FILE",
        help="the claims file whose verdicts head the report (default: the one sweep.json names); "
        "without SWEEP_DIR, print the verdict table of every claim in FILE (and write verdicts.md and "
        "verdicts.json into --out if given)",
    )
    parser.add_argument(
        "--beside",
        type=Path,
        metavar="EARLIER",
        help="with --claims FILE and no SWEEP_DIR: the outcome table instead, one row per claim (matched "
        "by id) with FILE's verdict, effect, interval and MDE beside those of the claims file EARLIER "
        "(and written as outcome.md into --out if given)",
    )
    args = parser.parse_args(argv)
    if args.beside is not None and (args.claims is None or args.sweep_dir is not None):
        print("distill report: --beside EARLIER needs --claims FILE and no SWEEP_DIR", file=sys.stderr)
        return 2
    if args.n_boot < 10:
        print(f"distill report: --n-boot must be >= 10, got {args.n_boot}", file=sys.stderr)
        return 2
    if args.sweep_dir is None and args.claims is None:
        print("distill report: give SWEEP_DIR, or --claims FILE for the verdict table alone", file=sys.stderr)
        return 2
    sweep_dir = args.sweep_dir
    try:
        if sweep_dir is None:
            return verdict_table.claims_only(args.claims, args.out, args.beside)
        if args.archive is not None:
            runs = archive(sweep_dir, args.archive)
            refs = [run for run in runs if run.parent.name == REFERENCES]
            kept = f"{len(runs) - len(refs)} runs" + (f" and {len(refs)} references" if refs else "")
            print(f"archived {kept} of {sweep_dir} in {args.archive}")
            sweep_dir = args.archive
        claims = (args.claims, str(args.claims)) if args.claims else verdict_table.attached_claims(sweep_dir)
        path = build_report(sweep_dir, args.out, args.n_boot, not args.no_plots, claims=claims)
    except (FileNotFoundError, ArchiveError, ClaimsError) as err:
        print(f"distill report: {err}", file=sys.stderr)
        return 2
    tables = sorted(str(p) for p in path.parent.glob("**/runs.csv"))
    print(f"wrote {path} and {', '.join(tables)}")
    return 0

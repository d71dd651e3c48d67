"""The markdown tables of `distill report` (`distill.experiments.report.report`): metric pivots by two
knobs with the reference rows, side effects by knob, the references note, and cost.

Cells are mean ± sample std (n runs) over seeds and over every knob not shown (pooled). Shares
(accuracies, pass@k, sparsity, style share, forgetting) are in percent with one decimal; any other
metric has one number of decimals per table, from its largest value. The best cell of an accuracy
or coverage table is bold.
"""

from __future__ import annotations

import math
from typing import Any

from distill.experiments.run.axes import format_value
from distill.experiments.run.records import RunRecord, is_share
from distill.experiments.run.references import LABELS
from distill.experiments.stats.analysis import summarize

SIDE_EFFECTS = (
    "forgetting/mean_delta",
    "sparsity/overall",
    "sparsity/bf16_unchanged",
    "sparsity/relative_update_norm",
    "style/teacher_style_share",
    "style/adoption_step",
)
# GradientStats: mean squared norm of the loss gradient w.r.t. one token's logits, over all
# completion tokens and by who wrote the token (the paper's Theorem C.1 bounds the forward-KL one
# whatever the rollout policy).
GRADIENT = ("grad/logit_sq_norm", "grad/logit_sq_norm_teacher_tokens", "grad/logit_sq_norm_student_tokens")
COST = ("cost/flops", "cost/wall_s", "cost/teacher_generated_tokens", "cost/student_generated_tokens")
ROW, COL, LR = "divergence", "mix", "lr"

Axis = tuple[str, list[Any]]


def num(value: float) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.4g}"


def decimals(metric: str, values: list[float]) -> int:
    """Decimals for a column: 1 for shares (in percent); else three significant digits of the
    largest finite magnitude."""
    if is_share(metric):
        return 1
    finite = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    return max(0, 2 - math.floor(math.log10(max(finite)))) if finite else 3


def fixed(value: float, metric: str, places: int) -> str:
    if value is None or not math.isfinite(value):
        return "—"
    return f"{value * 100 if is_share(metric) else value:.{places}f}"


def cell(values: list[float], metric: str = "", places: int | None = None, bold: bool = False) -> str:
    """mean ± std (n) of `values`; `metric` sets the unit (percent for shares), `places` the
    decimals (default: from the values themselves)."""
    mean, std, n = summarize(values)
    if n == 0:
        return "—"
    places = decimals(metric, [mean]) if places is None else places
    text = fixed(mean, metric, places) + ("" if n == 1 else f" ± {fixed(std, metric, places)}") + f" ({n})"
    return f"**{text}**" if bold else text


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows] + [""]


def select(records: list[RunRecord], metric: str, where: dict[str, Any]) -> list[float]:
    return [
        r.metrics[metric]
        for r in records
        if metric in r.metrics
        and all(format_value(r.settings.get(k)) == format_value(v) for k, v in where.items())
    ]


def pooled(factors: dict[str, list], shown: list[str]) -> str:
    others = [k for k in factors if k not in shown]
    text = "mean ± std (n runs) over seeds"
    return text + (f", pooled over {', '.join(others)}" if others else "") + "."


def pivot(
    records: list[RunRecord],
    metric: str,
    row: Axis | None,
    col: Axis | None,
    references: dict[str, dict[str, float]] | None = None,
    best_is_max: bool = False,
) -> list[str]:
    """The metric by row knob x column knob, then a row per reference that has the metric (its one
    value in every column) and a line counting the cells above the start and at the teacher.
    `best_is_max`: the cell with the highest mean is bold (none on a tie)."""
    row_knob, row_values = row or ("", [None])
    col_knob, col_values = col or ("", [None])
    header = [f"{row_knob} \\ {col_knob}" if row and col else (row_knob or "all")]
    header += [f"{col_knob}={format_value(v)}" for v in col_values] if col else [metric]
    grid = [
        [
            select(records, metric, {k: v for k, v in ((row_knob, rv), (col_knob, cv)) if k})
            for cv in col_values
        ]
        for rv in row_values
    ]
    summaries = [[summarize(values) for values in line] for line in grid]
    means = [mean for line in summaries for mean, _, n in line if n]
    refs = {k: m[metric] for k, m in (references or {}).items() if metric in m}
    places = decimals(metric, means + list(refs.values()))
    best = max(means) if means and best_is_max else None
    if best is not None and means.count(best) > 1:  # a tie (e.g. all 0) marks nothing
        best = None
    rows = []
    for rv, line, sums in zip(row_values, grid, summaries):
        cells = [
            cell(values, metric, places, bold=best is not None and n > 0 and mean == best)
            for values, (mean, _, n) in zip(line, sums)
        ]
        rows.append([format_value(rv) if row else "all runs", *cells])
    rows += [
        [LABELS[kind], *(fixed(value, metric, places) for _ in col_values)] for kind, value in refs.items()
    ]
    lines = table(header, rows)
    if refs.keys() >= {"start", "teacher"} and means and refs["teacher"] <= refs["start"]:
        lines += [
            f"The teacher ({fixed(refs['teacher'], metric, places)}) is not above the start "
            f"({fixed(refs['start'], metric, places)}): nothing to distil on this metric.",
            "",
        ]
    elif refs and means:
        counts = []
        if "start" in refs:
            above = sum(m > refs["start"] for m in means)
            counts.append(
                f"{above} of {len(means)} cells end above the start ({fixed(refs['start'], metric, places)})"
            )
        if "teacher" in refs:
            reach = sum(m >= refs["teacher"] for m in means)
            counts.append(
                f"{reach} of {len(means)} reach the teacher ({fixed(refs['teacher'], metric, places)})"
            )
        lines += ["; ".join(counts) + ".", ""]
    return lines


def references_lines(references: dict[str, dict[str, float]], where: str) -> list[str]:
    """What the reference rows and lines are, or one line saying the sweep has none."""
    if not references:
        return [
            "No reference runs (start, teacher) in this sweep: tables and plots show the runs only.",
            "",
        ]
    what = {
        "start": "`start (step 0)` (the untouched student)",
        "teacher": "`teacher` (the teacher in the student's place)",
    }
    return [
        "References: "
        + " and ".join(what[k] for k in references)
        + f", each tested once as every run's final student is: same test tasks and problems (`{where}`). "
        "They are rows of the accuracy and coverage tables and lines in the plots, not runs of the "
        "grid: not counted above, not in `runs.csv`, not in the factor analysis.",
        "",
    ]


def by_knob(records: list[RunRecord], metrics: list[str], factors: dict[str, list]) -> list[str]:
    order = sorted(factors, key=lambda k: k != LR)
    places = {m: decimals(m, select(records, m, {})) for m in metrics}
    rows = [
        [f"{k}={format_value(v)}", *(cell(select(records, m, {k: v}), m, places[m]) for m in metrics)]
        for k in order
        for v in factors[k]
    ]
    return table(["setting", *(f"{m} (%)" if is_share(m) else m for m in metrics)], rows)


def _cost(metric: str, value: float) -> str:
    """One format per cost column, so a column reads down: FLOPs in 3 significant digits with an
    exponent, seconds with one decimal, token counts whole with thousands separators."""
    if not math.isfinite(value):
        return "—"
    if metric == "cost/flops":
        return f"{value:.2e}"
    if metric == "cost/wall_s":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def cost_section(
    records: list[RunRecord], accuracy: str | None, row: Axis | None, col: Axis | None
) -> list[str]:
    costs = [m for m in COST if any(m in r.metrics for r in records)]
    if not costs:
        return []
    values = [r.metrics[accuracy] for r in records if accuracy and accuracy in r.metrics]
    point = 1.0 if values and max(values) > 1.0 else 0.01  # accuracy logged as a fraction unless > 1
    lines = ["## Cost", ""]
    if accuracy:
        lines += [
            f"Per run, mean over the runs of each cell. Cost per point: mean cost / mean {accuracy} "
            f"in percentage points ({'values already in percent' if point == 1 else 'accuracy is a fraction'}).",
            "",
        ]
    cells = [
        {k: v for k, v in ((row[0] if row else "", rv), (col[0] if col else "", cv)) if k}
        for rv in (row[1] if row else [None])
        for cv in (col[1] if col else [None])
    ]
    header = ["cell", "runs", *costs] + (
        [f"{accuracy} (%)", "FLOPs / point", "wall s / point"] if accuracy else []
    )
    rows = []
    for where in cells:
        name = ", ".join(f"{k}={format_value(v)}" for k, v in where.items()) or "all runs"
        means = {m: summarize(select(records, m, where))[0] for m in (*costs, accuracy) if m}
        n = len(
            [
                r
                for r in records
                if all(format_value(r.settings.get(k)) == format_value(v) for k, v in where.items())
            ]
        )
        row_cells = [name, str(n), *(_cost(m, means[m]) for m in costs)]
        if accuracy:
            points = means[accuracy] / point if math.isfinite(means[accuracy]) else math.nan
            per = {
                m: means.get(m, math.nan) / points if points > 0 else math.inf
                for m in ("cost/flops", "cost/wall_s")
            }
            row_cells += [
                f"{points:.1f}" if math.isfinite(points) else "—",
                _cost("cost/flops", per["cost/flops"]),
                _cost("cost/wall_s", per["cost/wall_s"]),
            ]
        rows.append(row_cells)
    lines += table(header, rows)
    totals = {
        m: sum(r.metrics.get(m, 0.0) for r in records) for m in ("cost/flops", "cost/wall_s") if m in costs
    }
    lines += [f"Sweep total {m}: {_cost(m, v)}" for m, v in totals.items()]
    return lines + [""]


def chance_line(records: list[RunRecord], metric: str) -> list[str]:
    """For a multiple-choice task's accuracy, the accuracy of a uniform guess among its options
    (`<split>/<task>/chance`, logged beside the accuracy); nothing for other tasks."""
    if not metric.endswith("/accuracy"):
        return []
    values = sorted(
        {v for r in records if (v := r.metrics.get(metric[: -len("accuracy")] + "chance")) is not None}
    )
    if not values:
        return []
    unit = " %" if is_share(metric) else ""
    shown = " to ".join(dict.fromkeys(fixed(v, metric, 1) + unit for v in (values[0], values[-1])))
    return [f"Chance (a uniform guess among the options): {shown}.", ""]


def table_axes(factors: dict[str, list]) -> tuple[Axis | None, Axis | None]:
    """Rows and columns of the main tables: divergence x mix where they vary, else the first
    varying knobs in their place."""
    chosen = [k for k in (ROW, COL) if k in factors] + [k for k in factors if k not in (ROW, COL)]
    axes = [(k, factors[k]) for k in chosen[:2]]
    return (axes + [None, None])[0], (axes + [None, None])[1]


def metric_tables(
    records: list[RunRecord],
    groups: dict[str, list[str]],
    factors: dict[str, list],
    references: dict[str, dict[str, float]],
) -> list[str]:
    """The accuracy and coverage sections (each metric by the two table knobs, with the reference
    rows) and the side effects by knob; `groups` holds the metrics of each ('accuracy', 'coverage',
    'side')."""
    row, col = table_axes(factors)
    shown = [axis[0] for axis in (row, col) if axis]
    lines: list[str] = []
    for title, group in (("Accuracy", groups["accuracy"]), ("Coverage", groups["coverage"])):
        if group:
            lines += [f"## {title} by {' × '.join(shown) or 'run'}", "", pooled(factors, shown), ""]
            for metric in group:
                lines += [
                    f"### {metric}",
                    "",
                    *pivot(records, metric, row, col, references, best_is_max=True),
                    *chance_line(records, metric),
                ]
    if groups.get("gradient") and row and col:
        lines += [f"## Logit-gradient squared norm per token by {' × '.join(shown)}", ""]
        lines += [
            "‖∂ℓ_t/∂z_t‖² averaged over completion tokens (GradientStats), over all tokens and by who "
            "wrote them. The paper's Theorem C.1 bounds its expectation for forward KL independently of "
            "the rollout policy; reverse KL has no such bound. " + pooled(factors, shown),
            "",
        ]
        for metric in groups["gradient"]:
            lines += [f"### {metric}", "", *pivot(records, metric, row, col)]
    if groups["side"] and factors:
        lines += ["## Forgetting, update sparsity and style by knob", ""]
        lines += ["Each row fixes one knob value: mean ± std (n runs) over seeds and all other knobs.", ""]
        lines += by_knob(records, groups["side"], factors)
    return lines

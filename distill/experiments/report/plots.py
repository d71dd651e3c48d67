"""Report figures (PNG, drawn with matplotlib's object API, so no GUI backend is involved).

Each function takes the run records and returns the path written, or None when the sweep has
nothing to plot for it (e.g. a knob that does not vary, or no TensorBoard events). The line plots
also take the sweep's references (the start and the teacher) and draw each as a horizontal line,
with a legend entry, in every panel of a metric they have.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from distill.experiments.run.axes import format_value
from distill.experiments.run.records import RunRecord, expand_tags, read_curves
from distill.experiments.run.references import LABELS
from distill.experiments.stats.analysis import summarize

DPI = 110
# Reference lines (`distill.experiments.run.references`): kind -> matplotlib line style.
REFERENCE_STYLE = {
    "start": {"color": "0.45", "linestyle": "--"},
    "teacher": {"color": "black", "linestyle": ":"},
}
References = dict[str, dict[str, float]]  # kind -> test metrics, as `references.load_references`


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in text)


def _values(records: list[RunRecord], metric: str, **where: Any) -> list[float]:
    return [
        r.metrics[metric]
        for r in records
        if metric in r.metrics
        and all(format_value(r.settings.get(k)) == format_value(v) for k, v in where.items())
    ]


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def heatmap(
    records: list[RunRecord], metric: str, rows: tuple[str, list], cols: tuple[str, list], out: Path
) -> Path | None:
    """Mean of `metric` in each (row knob value, column knob value) cell, annotated."""
    (row_knob, row_values), (col_knob, col_values) = rows, cols
    grid = np.full((len(row_values), len(col_values)), np.nan)
    for i, rv in enumerate(row_values):
        for j, cv in enumerate(col_values):
            grid[i, j] = summarize(_values(records, metric, **{row_knob: rv, col_knob: cv}))[0]
    if np.all(np.isnan(grid)):
        return None
    fig = Figure(figsize=(1.2 + 1.1 * len(col_values), 1.0 + 0.6 * len(row_values)))
    ax = fig.subplots()
    image = ax.imshow(grid, cmap="viridis", aspect="auto")
    fig.colorbar(image, ax=ax)
    ax.set_xticks(range(len(col_values)), [format_value(v) for v in col_values])
    ax.set_yticks(range(len(row_values)), [format_value(v) for v in row_values])
    ax.set_xlabel(col_knob)
    ax.set_ylabel(row_knob)
    ax.set_title(metric, fontsize=9)
    finite = grid[np.isfinite(grid)]
    middle = (finite.min() + finite.max()) / 2
    for (i, j), value in np.ndenumerate(grid):
        if math.isfinite(value):
            color = "black" if value > middle else "white"
            ax.text(j, i, f"{value:.3g}", ha="center", va="center", fontsize=8, color=color)
    return _save(fig, out / f"heatmap_{_slug(metric)}.png")


def reference_lines(ax, references: References | None, metric: str, suffix: str = "") -> bool:
    """A horizontal line per reference that has `metric`; whether any was drawn."""
    drawn = False
    for kind, metrics in (references or {}).items():
        if metric in metrics:
            ax.axhline(metrics[metric], linewidth=1.2, label=LABELS[kind] + suffix, **REFERENCE_STYLE[kind])
            drawn = True
    return drawn


def _lines(ax, records, metric, x_knob, x_values, line_knob, line_values, where=None) -> bool:
    drawn = False
    for lv in line_values if line_knob else [None]:
        means, stds, xs = [], [], []
        for xv in x_values:
            cond = dict(where or {}, **{x_knob: xv})
            if line_knob:
                cond[line_knob] = lv
            mean, std, n = summarize(_values(records, metric, **cond))
            if n:
                xs.append(float(xv))
                means.append(mean)
                stds.append(0.0 if math.isnan(std) else std)
        if xs:
            label = f"{line_knob}={format_value(lv)}" if line_knob else None
            ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=label)
            drawn = True
    return drawn


def against_knob(
    records: list[RunRecord],
    metrics: list[str],
    x: tuple[str, list],
    lines: tuple[str, list] | None,
    out: Path,
    name: str,
    log_x: bool = False,
    references: References | None = None,
    panels: tuple[str, list] | None = None,
) -> Path | None:
    """One row of panels per metric: mean ± std against a numeric knob, one line per value of
    another, and the references' lines; with `panels`, one column per value of that knob (so the
    bars are seed spread only, not that knob's effect)."""
    x_knob, x_values = x
    line_knob, line_values = lines if lines else (None, [])
    panel_knob, panel_values = panels if panels else (None, [None])
    metrics = [m for m in metrics if any(m in r.metrics for r in records)]
    if not metrics or not all(isinstance(v, (int, float)) for v in x_values):
        return None
    rows, cols = (len(metrics), len(panel_values)) if panel_knob else (1, len(metrics))
    fig = Figure(figsize=(4.2 * cols, 3.4 * rows))
    axes = np.atleast_2d(fig.subplots(rows, cols, squeeze=False))
    for i, metric in enumerate(metrics):
        for j, pv in enumerate(panel_values):
            ax = axes[i, j] if panel_knob else axes[0, i]
            where = {panel_knob: pv} if panel_knob else None
            _lines(ax, records, metric, x_knob, x_values, line_knob, line_values, where)
            drawn = reference_lines(ax, references, metric)
            if log_x:
                ax.set_xscale("log")
            ax.set_xlabel(x_knob)
            title = f"{metric}, {panel_knob}={format_value(pv)}" if panel_knob else metric
            ax.set_title(title, fontsize=9)
            if line_knob or drawn:
                ax.legend(fontsize=7)
    return _save(fig, out / f"{name}.png")


def accuracy_vs_mix(
    records: list[RunRecord],
    metric: str,
    mix: tuple[str, list],
    lines: tuple[str, list] | None,
    panels: tuple[str, list] | None,
    out: Path,
    references: References | None = None,
) -> Path | None:
    """`metric` against mix, one line per divergence, error bars = std over seeds; one panel per
    value of `panels` (the learning rate) so that the bars are seed spread only; the references'
    lines in every panel."""
    panel_knob, panel_values = panels if panels else (None, [None])
    line_knob, line_values = lines if lines else (None, [])
    if not any(metric in r.metrics for r in records):
        return None
    fig = Figure(figsize=(4.2 * len(panel_values), 3.4))
    axes = np.atleast_1d(fig.subplots(1, len(panel_values), sharey=True))
    for ax, pv in zip(axes, panel_values):
        where = {panel_knob: pv} if panel_knob else None
        _lines(ax, records, metric, mix[0], mix[1], line_knob, line_values, where)
        drawn = reference_lines(ax, references, metric)
        ax.set_xlabel(mix[0])
        ax.set_title(f"{panel_knob}={format_value(pv)}" if panel_knob else metric, fontsize=9)
        if line_knob or drawn:
            ax.legend(fontsize=7)
    axes[0].set_ylabel(metric)
    return _save(fig, out / f"vs_mix_{_slug(metric)}.png")


def _reference_metric(tag: str, references: References | None) -> tuple[str, str]:
    """The references' metric to draw in a curve's panel, and a label suffix: the tag itself, or
    for a validation accuracy the test accuracy of the same task (references are tested only)."""
    if any(tag in metrics for metrics in (references or {}).values()):
        return tag, ""
    parts = tag.split("/")
    if len(parts) == 3 and parts[0] == "val" and parts[2] == "accuracy":
        return f"test/{parts[1]}/accuracy", " (test problems)"
    return tag, ""


def training_curves(
    records: list[RunRecord],
    group_knobs: list[str],
    tags: tuple[str, ...],
    out: Path,
    references: References | None = None,
) -> Path | None:
    """Training curves from TensorBoard events (or archived curves.csv) of the tags matching
    `tags`, averaged over the runs of each group (on the first run's steps); in a validation
    accuracy panel, the references' test accuracy on that task as lines. None when no run has
    curves."""
    groups: dict[str, list[dict]] = {}
    for record in records:
        curves = read_curves(record.run_dir, tags)
        if curves:
            label = ",".join(f"{k}={format_value(record.settings.get(k))}" for k in group_knobs) or "all runs"
            groups.setdefault(label, []).append(curves)
    tags = expand_tags(tags, {t for runs in groups.values() for c in runs for t in c})
    if not tags:
        return None
    fig = Figure(figsize=(4.6 * len(tags), 3.6))
    axes = np.atleast_1d(fig.subplots(1, len(tags)))
    for ax, tag in zip(axes, tags):
        for label, runs in groups.items():
            runs = [c[tag] for c in runs if tag in c and c[tag][0]]
            if not runs:
                continue
            steps = np.asarray(runs[0][0], dtype=float)
            mean = np.mean([np.interp(steps, s, v) for s, v in runs], axis=0)
            ax.plot(steps, mean, label=f"{label} ({len(runs)})")
        reference_lines(ax, references, *_reference_metric(tag, references))
        ax.set_xlabel("step")
        ax.set_title(tag, fontsize=9)
        ax.legend(fontsize=6)
    return _save(fig, out / "training_curves.png")

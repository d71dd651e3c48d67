"""Reading a sweep directory back: one record per run (settings + metrics), `runs.csv`, TB curves
(the sweep's own `sweep.json`: `distill.experiments.run.sweep_record`).

A run directory is any direct subdirectory of the sweep directory holding `settings.json`,
`metrics.json` or `overrides.yaml`. Knob values come from `settings.json` (written by the sweep
runner); failing that from `overrides.yaml` (flattened to dotted paths; paths that have a
shorthand are named by it); failing that from the `settings` of `metrics.json`. Run names are never
parsed. Divergence class paths are shown by their registry names (`forward_kl`, ...).
"""

from __future__ import annotations

import csv
import fnmatch
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from distill import run_status
from distill.experiments.run.axes import canonical_axis, format_value
from distill.experiments.run.rundirs import OVERRIDES, SETTINGS, is_run_dir
from distill.experiments.run.schema import SpecError
from distill.experiments.run.sweep_record import read_sweep_record
from distill.names import DIVERGENCE_CLASSES as DIVERGENCES
from distill.names import PATH_TO_SHORTHAND
from distill.rundir import METRICS, flatten, read_metrics
from distill.tasks import qa_datasets

REPLICATE = "seed"
# The contract's headline metrics, in report order; `{set}` expands to each test set present.
HEADLINE = (
    "test/{set}/accuracy",
    "test/{set}/pass@1",
    "test/{set}/pass@4",
    "test/{set}/pass@8",
    "test/{set}/distinct_correct",
    "forgetting/mean_delta",
    "sparsity/overall",
    "sparsity/relative_update_norm",
    "style/teacher_style_share",
    "train/forward_kl",
    "train/reverse_kl",
    "cost/flops",
    "cost/wall_s",
    "cost/teacher_generated_tokens",
    "cost/student_generated_tokens",
)
# Curve tags; `*` matches any task (validation accuracy, logged at every validation of a fit).
CURVE_TAGS = ("train/forward_kl", "train/reverse_kl", "train/loss", "val/*/accuracy")
# What an archive keeps besides the plotted curves: the style share's and forgetting's course
# (StyleProbe and Forgetting log every `every_n_steps`), from which `STYLE_ADOPTION` is derived.
ARCHIVED_TAGS = (
    *CURVE_TAGS,
    "style/teacher_style_share",
    "style/teacher_style_share_sampled",
    "forgetting/mean_delta",
)
# Derived per run: the first logged step at which the student writes the teacher's style at least
# half as often as the teacher itself does (`adoption_step`); only for runs that end there.
STYLE_ADOPTION = "style/adoption_step"
# The teacher's own share when a run did not record it (runs before StyleProbe measured it): v2's
# teacher-es, the only style teacher of those runs, wrote its style always (share 1.0 in its
# quality.json), so half of it is the fixed 0.5 those reports used.
UNRECORDED_TEACHER_SHARE = 1.0
CURVES = "curves.csv"  # the curves of an archived run (distill.experiments.run.archive), without event files
_CLASS_TO_DIVERGENCE = {path: name for name, path in DIVERGENCES.items()}


# Fractions in [0, 1] (or their differences) shown in percent.
SHARES = re.compile(
    r"/accuracy$|/pass@\d+$|^style/teacher_(?:style|own)_share(?:_sampled|_start)?$|^forgetting/|^sparsity/(?!relative_update_norm)"
)


def is_share(metric: str) -> bool:
    return bool(SHARES.search(metric))


@dataclass
class RunRecord:
    name: str
    run_dir: Path
    finished: bool
    settings: dict[str, Any]
    metrics: dict[str, float]
    problem: str | None = None  # why the run is left out: unfinished, diverged, malformed, NaN


def run_problem(run_dir: Path, data: dict | None) -> str | None:
    """None for a finished run with whole, finite metrics; else why the report leaves it out."""
    if data is None:
        if (Path(run_dir) / METRICS).exists():
            return "malformed metrics.json"
        said = run_status.describe(run_status.read(run_dir))  # how its last attempt ended
        return "unfinished" if said is None or said.startswith("running") else f"unfinished: {said}"
    status = data.get("status")
    if status == "diverged":
        return f"diverged: {data.get('reason', 'no reason recorded')}"
    if status != "finished":
        return f"status {status!r}"
    metrics = data.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        return "malformed metrics.json (no metrics)"
    bad = sorted(
        k
        for k, v in metrics.items()
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or k in (data.get("nonfinite") or [])
    )
    if bad:
        more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
        return f"non-finite metrics: {', '.join(bad[:3])}{more}"
    return None


def _canonical(settings: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in settings.items():
        try:
            name, _ = canonical_axis(key)
        except SpecError:
            name = PATH_TO_SHORTHAND.get(key, key)
        if name == "divergence" and isinstance(value, str):
            value = _CLASS_TO_DIVERGENCE.get(value, value)
        out[name] = value
    return out


def _settings(run_dir: Path, metrics: dict[str, Any] | None) -> dict[str, Any]:
    try:
        data = json.loads((run_dir / SETTINGS).read_text())
        if isinstance(data, dict) and isinstance(data.get("settings"), dict):
            return _canonical(data["settings"])
    except (OSError, ValueError):
        pass
    try:
        overrides = yaml.safe_load((run_dir / OVERRIDES).read_text())
        if isinstance(overrides, dict) and overrides:
            return _canonical(flatten(overrides))
    except (OSError, yaml.YAMLError):
        pass
    if metrics and isinstance(metrics.get("settings"), dict):
        return _canonical(flatten(metrics["settings"]))
    return {}


def _numbers(metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def adoption_threshold(metrics: dict[str, float]) -> tuple[str, float]:
    """Which style share a run's adoption reads and the share that counts as adopted: half the
    teacher's own share of the same kind (StyleProbe's `style/teacher_own_share[_sampled]`). The
    sampled share (the student's probability of the style) when the run recorded it and the
    teacher's; else the greedy one, against `UNRECORDED_TEACHER_SHARE` if the teacher's is missing.
    A teacher that writes its style 44 % of the time is adopted at 0.22, not at a fixed 0.5 no
    student of it could reach."""
    own = metrics.get("style/teacher_own_share_sampled")
    if own is not None and "style/teacher_style_share_sampled" in metrics:
        return "style/teacher_style_share_sampled", own / 2
    return "style/teacher_style_share", metrics.get("style/teacher_own_share", UNRECORDED_TEACHER_SHARE) / 2


def adoption_step(run_dir: Path, metrics: dict[str, float] | None = None) -> int | None:
    """The first logged step at which the run's style share reaches `adoption_threshold` (None
    without a curve, or when it never does). `metrics`: the run's final metrics (read from
    `metrics.json` when not given)."""
    if metrics is None:
        metrics = _numbers((read_metrics(run_dir) or {}).get("metrics"))
    tag, threshold = adoption_threshold(metrics)
    steps, values = read_curves(run_dir, (tag,)).get(tag, ([], []))
    return next((step for step, value in zip(steps, values) if value >= threshold > 0), None)


def load_records(sweep_dir: Path) -> list[RunRecord]:
    """All runs of a sweep directory, sorted by name; runs left out (unfinished, diverged, with
    malformed or non-finite metrics: `problem`) have no metrics."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise FileNotFoundError(f"sweep directory {str(sweep_dir)!r} does not exist")
    records = []
    for run_dir in sorted(p for p in sweep_dir.iterdir() if p.is_dir()):
        if not is_run_dir(run_dir):
            continue
        data = read_metrics(run_dir)
        problem = run_problem(run_dir, data)
        finished = problem is None
        metrics = _numbers(data.get("metrics")) if finished else {}
        tag, threshold = adoption_threshold(metrics)
        if tag in metrics and metrics[tag] >= threshold > 0:  # runs that end adopted
            step = adoption_step(run_dir, metrics)
            if step is not None:
                metrics[STYLE_ADOPTION] = float(step)
        records.append(RunRecord(run_dir.name, run_dir, finished, _settings(run_dir, data), metrics, problem))
    return records


def read_stages(sweep_dir: Path) -> list[dict[str, Any]] | None:
    """The `stages` list of a sweep directory's `sweep.json`, or None for a single-stage sweep."""
    stages = read_sweep_record(sweep_dir).get("stages")
    return stages if isinstance(stages, list) and stages else None


def _parent(record: RunRecord) -> str | None:
    try:
        after = json.loads((record.run_dir / SETTINGS).read_text()).get("after")
    except (OSError, ValueError, AttributeError):
        return None
    return after.get("run") if isinstance(after, dict) else None


def chained_pairs(parents: list[RunRecord], children: list[RunRecord]) -> list[tuple[RunRecord, RunRecord]]:
    """(parent, chained run) for every finished chained run whose parent finished."""
    by_name = {r.name: r for r in parents if r.finished}
    return [(by_name[_parent(c)], c) for c in children if c.finished and _parent(c) in by_name]


def _sort_key(value: Any) -> tuple:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    if value in DIVERGENCES:
        return (1, float(list(DIVERGENCES).index(value)), "")
    return (2, 0.0, format_value(value))


def knob_values(records: list[RunRecord], sweep_dir: Path | None = None) -> dict[str, list[Any]]:
    """Each knob's distinct values: spec order (from sweep.json) where known, else sorted."""
    axes = read_sweep_record(sweep_dir).get("axes") if sweep_dir is not None else None
    spec_axes: dict[str, list[Any]] = _canonical(axes) if isinstance(axes, dict) else {}
    values: dict[str, list[Any]] = {}
    for record in records:
        for knob, value in record.settings.items():
            seen = values.setdefault(knob, [])
            if all(format_value(value) != format_value(v) for v in seen):
                seen.append(value)
    ordered = {}
    for knob in [k for k in spec_axes if k in values] + sorted(k for k in values if k not in spec_axes):
        spec_order = [format_value(v) for v in spec_axes.get(knob, [])]
        rank = {text: i for i, text in enumerate(spec_order)}
        ordered[knob] = sorted(
            values[knob], key=lambda v: (rank.get(format_value(v), len(rank)), _sort_key(v))
        )
    return ordered


def trained_task(records: list[RunRecord]) -> str | None:
    """The task most of the runs train on (`data.task` of their `config.yaml`), None if unknown."""
    tasks: dict[str, int] = {}
    for r in records:
        try:
            task = (yaml.safe_load((Path(r.run_dir) / "config.yaml").read_text()) or {})["data"]["task"]
        except (OSError, KeyError, TypeError, yaml.YAMLError):
            continue
        if isinstance(task, str):
            tasks[task] = tasks.get(task, 0) + 1
    return max(tasks, key=lambda t: (tasks[t], t)) if tasks else None


def headline_order(records: list[RunRecord]):
    """Sort key of test sets, headline first: Countdown-3 for runs that train on Countdown (any
    variant), else the task they train on (e.g. `tinysci`), then the rest by name."""
    task = trained_task(records)
    if task is not None and qa_datasets.is_spec(task):  # logged under its task's name
        task = qa_datasets.task_name(task)
    first = task if task is not None and not task.startswith(("countdown", "longchain")) else "countdown3"
    return lambda s: (s != first, s != "countdown3", s)


def metric_names(records: list[RunRecord]) -> list[str]:
    """Metric names present in any finished run: the headline metrics first, then the rest sorted."""
    present = {name for r in records for name in r.metrics}
    sets = sorted(
        {m.split("/")[1] for m in present if re.fullmatch(r"test/[^/]+/accuracy", m)},
        key=headline_order(records),
    )
    ordered = []
    for pattern in HEADLINE:
        for name in [pattern.format(set=s) for s in sets] if "{set}" in pattern else [pattern]:
            if name in present and name not in ordered:
                ordered.append(name)
    return ordered + sorted(present - set(ordered))


def write_csv(records: list[RunRecord], path: Path, knobs: list[str], metrics: list[str]) -> None:
    """One row per run: run, finished, the knob columns, then the metric columns."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "finished", *knobs, *metrics])
        for r in records:
            settings = [format_value(r.settings[k]) if k in r.settings else "" for k in knobs]
            values = [repr(r.metrics[m]) if m in r.metrics else "" for m in metrics]
            writer.writerow([r.name, str(r.finished).lower(), *settings, *values])


def wanted(tag: str, patterns: tuple[str, ...]) -> bool:
    """Whether a scalar tag is one of `patterns` (exact names or `fnmatch` patterns such as
    `val/*/accuracy`)."""
    return any(fnmatch.fnmatchcase(tag, pattern) for pattern in patterns)


def expand_tags(patterns: tuple[str, ...], present: set[str]) -> tuple[str, ...]:
    """The `present` tags that match, in pattern order (Countdown-3 first within a pattern)."""
    out: list[str] = []
    for pattern in patterns:
        matches = sorted(
            (t for t in present if fnmatch.fnmatchcase(t, pattern)), key=lambda t: ("countdown3" not in t, t)
        )
        out += [t for t in matches if t not in out]
    return tuple(out)


def _as_curves(points: dict[str, dict[int, float]]) -> dict[str, tuple[list[int], list[float]]]:
    return {tag: (sorted(p), [p[s] for s in sorted(p)]) for tag, p in points.items()}


def _read_curves_csv(path: Path, tags: tuple[str, ...]) -> dict[str, tuple[list[int], list[float]]]:
    points: dict[str, dict[int, float]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            value = float(row["value"])
            if wanted(row["tag"], tags) and math.isfinite(value):
                points.setdefault(row["tag"], {})[int(row["step"])] = value
    return _as_curves(points)


def read_curves(
    run_dir: Path, tags: tuple[str, ...] = CURVE_TAGS
) -> dict[str, tuple[list[int], list[float]]]:
    """Scalar curves (steps, values) of the tags matching `tags` (see `wanted`) from the TensorBoard
    event files under `<run_dir>/tensorboard`,
    or, when there are none, from an archived run's `curves.csv`; empty when neither exists.
    A resumed run may write several event files: later values win per step."""
    event_dirs = sorted({p.parent for p in (Path(run_dir) / "tensorboard").rglob("events.out.tfevents.*")})
    if not event_dirs:
        csv_path = Path(run_dir) / CURVES
        return _read_curves_csv(csv_path, tags) if csv_path.is_file() else {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    points: dict[str, dict[int, float]] = {}
    for event_dir in event_dirs:
        acc = EventAccumulator(str(event_dir), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in [t for t in acc.Tags().get("scalars", []) if wanted(t, tags)]:
            for event in acc.Scalars(tag):
                if math.isfinite(event.value):
                    points.setdefault(tag, {})[int(event.step)] = float(event.value)
    return _as_curves(points)

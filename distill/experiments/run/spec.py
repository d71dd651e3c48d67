"""Sweep specs: parsing, validation and expansion into runs.

A spec is a YAML file, run with `distill sweep SPEC`::

    # distill sweep experiments/tiny_grid.yaml
    name: tiny_grid                      # required; [A-Za-z0-9_.-]+
    base: configs/tiny/base.yaml         # one config file or a list (later ones override earlier)
    out: experiments/runs/tiny_grid      # optional; default experiments/runs/<name>
    overrides:                           # optional fixed dotted overrides for every run
      trainer.max_steps: 60
    axes:                                # the grid: the cartesian product of all value lists
      mix: [0, 0.25, 0.5, 0.75, 1]
      divergence: [forward_kl, reverse_kl]
      lr: [1.0e-4, 3.0e-4, 1.0e-3]
      seed: [0, 1]
    slurm:                               # optional defaults for --emit-slurm (flags override)
      partition: gpu
      gpus: 1
      time: "04:00:00"
    references: true                     # optional; default true (see below)
    claims: experiments/claims.yaml      # optional; the claims file whose verdicts head the report

Relative paths (`base`, `out`) resolve against the current working directory, which is the
repository root for every command in this project; they are made absolute before any command
is built, so the commands also work from elsewhere (e.g. a SLURM node).

An axis is one of these shorthands, or a dotted path into the fit config tree starting with
`trainer.`, `model.` or `data.` (e.g. `data.sampling.max_new_tokens`, `model.divergence.init_args.beta`),
whose values are passed through as they are. Shorthand values are checked before anything runs:

    mix            data.mix                              teacher share of rollouts, in [0, 1]
    granularity    data.granularity                      batch | sequence | token | speculative
    task           data.task                             a task name, e.g. countdown3
    lr             model.optimizer.init_args.lr          > 0
    seed           seed_everything                       integer >= 0 (replicates in the report)
    estimator      model.divergence.init_args.estimator  exact | k1 | k2 | k3 | topk
    gradient_clip  model.gradient_clip_val               > 0 or null (the module clips: it steps
                                                         its optimiser itself, so Lightning's
                                                         trainer.gradient_clip_val cannot apply)
    divergence     model.divergence.class_path           forward_kl | reverse_kl | jsd | skew_kl |
                   skew_reverse_kl | tvd | interpolated_kl (-> distill.losses.ForwardKL, ReverseKL,
                   GeneralizedJSD, SkewKL, SkewReverseKL, TotalVariation, InterpolatedKL)

`model.init_args.X` may be written `model.X` (the model is a `class_path` entry; jsonargparse
merges a bare `model.X` into its init_args) and is recorded that way. `overrides` takes the
same keys. Settings are recorded under the shorthand name even when the
spec uses the full path, so the report groups `data.mix` and `mix` alike.

Each run gets the directory `<out>/<name>`, where the name lists the settings sorted by axis,
e.g. `divergence=forward_kl,lr=3e-4,mix=0.25,seed=0` (floats in their shortest form that reads
back to the same number). A dotted axis appears under its full path unless it has a shorthand.

Chained stages (e.g. GRPO from each distilled student) replace `base`, `overrides` and `axes`
by a `stages:` list; each entry is a spec of its own (`name`, `base`, `overrides`, `axes`), and a
later one may say `after: <earlier stage>`::

    name: distill_then_rlvr
    stages:
      - name: distill
        base: configs/tiny/base.yaml
        axes: {mix: [0, 0.5, 1], divergence: [forward_kl, reverse_kl], seed: [0, 1]}
      - name: grpo
        after: distill
        base: configs/tiny/grpo_countdown.yaml
        overrides: {trainer.max_steps: 60}

A stage with `after` has one run per run of that stage (times its own axes, which are optional
there) with `model.student` set to the parent's `student/` export. A chained run inherits the
parent's settings (its knobs: the report groups the RLVR runs by the distillation's divergence and
mix) and, unless the stage sets `seed` itself, its seed. Its own axes may not repeat the parent's.
Run directories are nested as `<out>/<stage>/<name>` (a chained run has its parent's name when the
stage has no axes), run names are `<stage>/<name>`, and a chained run starts only once its parent
has finished (a failed parent marks it failed too). `distill report` writes one report per stage
and a before/after section comparing each chained run with its parent.

Reference runs (`references:`, default `true`): besides the grid, a sweep tests two models once,
without training, exactly as every run's final student is tested (`distill test` with the same
base configs and fixed overrides: same test tasks, test problems and TaskEvaluation settings):
`start`, the untouched student, and `teacher`, the teacher in the student's place (`model.student`
set to the config's `model.teacher`, loaded with its `teacher_dtype`). The report shows them as
rows and reference lines (`distill.experiments.run.references`). `references: false` turns them off;
a list such as `[start]` keeps some (and fails when the teacher is listed but the config names
none; with `true`, a config without a teacher, e.g. GRPO, simply gets no teacher reference). With
stages they belong to the first stage. They are not runs of the grid: not in `expand`, not in the
factor analysis. An axis that changes how runs are tested or which models they start from (e.g.
`model.teacher`, `data.evaluation.test_size`) leaves no single reference, and is refused unless
`references: false`.

The keys, stage entries and the `slurm:` section are declared in `distill.experiments.run.schema`
(dataclasses whose types jsonargparse checks), the shorthands and the checks of their values in
`distill.experiments.run.axes`. The whole spec, `slurm:` included, is checked before anything runs;
an error names the field, the value and what it must be.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.config_bases import moved_key
from distill.experiments.run.axes import (
    check_axes_vs_overrides,
    config_path,
    config_value,
    format_value,
    nest,
    parse_axes,
    parse_overrides,
    run_name,
)
from distill.experiments.run.claims import ClaimsError, load_claims
from distill.experiments.run.schema import (
    REFERENCE_KINDS,
    SpecError,
    SpecFields,
    StageFields,
    field_error,
    parse_fields,
    read_spec_file,
)
from distill.names import DIVERGENCE_CLASSES as DIVERGENCES
from distill.names import SHORTHANDS

__all__ = [  # with the names of `axes` and `schema` that users of this module need
    "DIVERGENCES",
    "SHORTHANDS",
    "Run",
    "SpecError",
    "Stage",
    "SweepSpec",
    "expand",
    "format_value",
    "load_spec",
    "nest",
    "parse_spec",
    "run_name",
]

STUDENT_PATH = "model.student"  # set on chained runs to the parent's export
STUDENT_EXPORT = "student"
# Config paths (and everything under them) that change how a run is tested or which models it
# starts from: as an axis they leave no single start/teacher to compare with.
REFERENCE_SENSITIVE = (
    "model.student",
    "model.teacher",
    "model.student_dtype",
    "model.teacher_dtype",
    "data.evaluation.test_tasks",
    "data.evaluation.test_size",
    "data.evaluation.max_new_tokens",
    "data.prompts.tokenizer",
    "data.prompts.chat_template",
    "trainer.precision",
    "trainer.callbacks",
)


@dataclass(frozen=True)
class Run:
    """One fit of a sweep: `settings` are the knob values by axis name (shorthand where one
    exists, values as in the spec); `overrides` are the dotted config values (fixed + axes).
    In a staged spec: `base` is the stage's configs (None: the spec's), `stage` its name, and
    `after` the parent run's directory (the run starts once the parent has finished).
    `reference` ('start' or 'teacher') marks an evaluation-only reference run (`distill test`, no
    settings; `distill.experiments.run.references`), which is never part of the grid."""

    name: str
    run_dir: Path
    settings: dict[str, Any]
    overrides: dict[str, Any]
    base: list[Path] | None = None
    stage: str | None = None
    after: Path | None = None
    reference: str | None = None


@dataclass
class Stage:
    name: str
    base: list[Path]
    axes: dict[str, list[Any]]
    overrides: dict[str, Any] = field(default_factory=dict)
    after: str | None = None


@dataclass
class SweepSpec:
    name: str
    base: list[Path]
    out: Path
    axes: dict[str, list[Any]]  # canonical axis name -> values, in spec order
    overrides: dict[str, Any] = field(default_factory=dict)
    slurm: dict[str, Any] = field(default_factory=dict)  # the `slurm:` section as written (checked)
    path: Path | None = None
    # Chained stages, in order; empty for a single-stage spec. With stages, base/axes/overrides
    # above are the first stage's.
    stages: list[Stage] = field(default_factory=list)
    # Reference runs to add (a subset of REFERENCE_KINDS, in that order); `references_listed`: the
    # spec named them in a list (so a missing teacher is an error, not a skip).
    references: tuple[str, ...] = REFERENCE_KINDS
    references_listed: bool = False
    # The claims file (`distill.experiments.run.claims`) whose verdicts head the report, as written.
    claims: str | None = None


def _paths(value: str | list[str], label: str, root: Path) -> list[Path]:
    """Config paths (already strings, by the schema) made absolute against `root`."""
    items = value if isinstance(value, list) else [value]
    if not items:
        raise field_error(StageFields if label else SpecFields, "base", value, label)
    return [(root / p).resolve() for p in items]


def _inherited_knobs(stages: list[Stage], name: str | None) -> set[str]:
    by_name = {s.name: s for s in stages}
    knobs: set[str] = set()
    while name is not None:
        knobs |= set(by_name[name].axes)
        name = by_name[name].after
    return knobs


def _parse_stage(entry: StageFields, index: int, earlier: list[Stage], root: Path) -> Stage:
    """A stage from its checked fields: its name unique, `after` an earlier stage, its axes and
    overrides valid, and (chained) no axis that its parent's runs already vary."""
    name, after, where = entry.name, entry.after, f"stage {entry.name!r}: "
    if name in {s.name for s in earlier}:
        raise SpecError(f"stages[{index}].name {name!r} is used by an earlier stage")
    if after is not None and after not in {s.name for s in earlier}:
        raise SpecError(
            f"stage {name!r}: after {after!r} must name an earlier stage "
            f"({', '.join(s.name for s in earlier) or 'none: the first stage cannot have after'})"
        )
    try:
        axes = parse_axes(entry.axes, optional=after is not None)
        overrides = parse_overrides(entry.overrides)
    except SpecError as err:
        raise SpecError(f"{where}{err}") from None
    check_axes_vs_overrides(axes, overrides, where)
    if after is not None:
        if STUDENT_PATH in overrides or STUDENT_PATH in axes:
            raise SpecError(
                f"{where}{STUDENT_PATH} is set to the parent's export; do not set it (after: {after})"
            )
        clash = sorted(set(axes) & _inherited_knobs(earlier, after))
        if clash:
            raise SpecError(
                f"{where}axis {', '.join(map(repr, clash))} is already a knob of its parent stage {after!r} "
                "(chained runs inherit the parent's settings)"
            )
    return Stage(name, _paths(entry.base, f"stages[{index}]", root), axes, overrides, after)


def _references(value: bool | list[str]) -> tuple[tuple[str, ...], bool]:
    """(kinds, listed) from the spec's `references` value: true, false or a list of kinds."""
    if isinstance(value, bool):
        return (REFERENCE_KINDS if value else ()), False
    if not value or len(set(value)) != len(value):
        raise field_error(SpecFields, "references", value)
    return tuple(k for k in REFERENCE_KINDS if k in value), True


def _check_references(spec: SweepSpec) -> None:
    """Refuse axes of the (first) stage that leave no single start or teacher to compare with."""
    if not spec.references:
        return
    for axis in spec.axes:
        path = moved_key(config_path(axis), quiet=True)  # an old spelling is its new place
        hit = next((p for p in REFERENCE_SENSITIVE if path == p or path.startswith(p + ".")), None)
        if hit is not None:
            raise SpecError(
                f"'references': axis {axis!r} sets {path}, which changes how runs are tested or which "
                "models they start from, so there is no single start or teacher to compare them with; "
                "set 'references: false' or fix the value in 'overrides'"
            )


def parse_spec(data: Any, root: Path | None = None, path: Path | None = None) -> SweepSpec:
    """Validate a spec mapping (as loaded from YAML); relative paths resolve against `root` (cwd)."""
    root = Path.cwd() if root is None else root
    if isinstance(data, dict) and "stages" in data:
        misplaced = sorted({"base", "axes", "overrides"} & set(data))
        if misplaced:
            raise SpecError(
                f"with 'stages', put {', '.join(misplaced)} inside each stage, not at the top level"
            )
    fields = parse_fields(SpecFields, data)
    out = (root / (fields.out or f"experiments/runs/{fields.name}")).resolve()
    references, listed = _references(fields.references)
    spec = SweepSpec(
        fields.name, [], out, {}, {}, dict(data.get("slurm") or {}), path, [], references, listed
    )
    if "stages" in data:
        if not fields.stages:
            raise field_error(SpecFields, "stages", data["stages"])
        for i, entry in enumerate(fields.stages):
            spec.stages.append(_parse_stage(entry, i, spec.stages, root))
        first = spec.stages[0]
        spec.base, spec.axes, spec.overrides = first.base, first.axes, first.overrides
    else:
        if fields.base is None:
            raise SpecError("'base' is required: the fit config file(s) every run starts from")
        spec.base = _paths(fields.base, "", root)
        spec.axes = parse_axes(fields.axes)
        spec.overrides = parse_overrides(fields.overrides)
        check_axes_vs_overrides(spec.axes, spec.overrides)
    _check_references(spec)
    if fields.claims is not None:  # declared before the sweep runs: a file that loads, checked now
        try:
            load_claims(root / fields.claims)
        except ClaimsError as err:
            raise SpecError(f"'claims': {err}") from err
        spec.claims = str(fields.claims)
    expand(spec)  # surface path collisions and name clashes now, before anything runs
    return spec


def load_spec(path: str | Path, out: str | Path | None = None) -> SweepSpec:
    """Read and validate a spec file; `out` replaces the spec's output directory."""
    path = Path(path)
    spec = parse_spec(read_spec_file(path), path=path.resolve())
    if out is not None:
        spec.out = Path(out).resolve()
    return spec


def _grid(axes: dict[str, list[Any]], fixed: dict[str, Any]) -> list[tuple[dict, dict]]:
    """(settings, overrides) of every combination of `axes`, the last axis varying fastest."""
    names = list(axes)
    out = []
    for combo in itertools.product(*(axes[a] for a in names)):
        settings = dict(zip(names, combo))
        overrides = dict(fixed)
        for axis, value in settings.items():
            overrides[config_path(axis)] = config_value(axis, value)
        nest(overrides)
        out.append((settings, overrides))
    return out


def _unique(runs: list[Run]) -> list[Run]:
    seen: dict[str, dict] = {}
    for run in runs:
        if run.name in seen:
            raise SpecError(
                f"settings {run.settings} and {seen[run.name]} give the same run name {run.name!r}"
            )
        seen[run.name] = run.settings
    return runs


def _chained(parent: Run | None, own: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The settings of a run of a stage from `own` (its stage's axes) and its parent run, if any;
    a chained run starts from the parent's export and, unless its stage sets one, its seed."""
    if parent is None:
        return dict(own)
    overrides[STUDENT_PATH] = str(parent.run_dir / STUDENT_EXPORT)
    if "seed" in parent.settings and "seed" not in own and "seed_everything" not in overrides:
        overrides["seed_everything"] = parent.settings["seed"]
    nest(overrides)
    return {**parent.settings, **own}


def expand(spec: SweepSpec) -> list[Run]:
    """All runs of the grid, in spec order (the last axis varies fastest); with stages, stage by
    stage, each chained run after its parent's stage."""
    if not spec.stages:
        return _unique(
            [Run(run_name(s), spec.out / run_name(s), s, o) for s, o in _grid(spec.axes, spec.overrides)]
        )
    runs: list[Run] = []
    by_stage: dict[str, list[Run]] = {}
    for stage in spec.stages:
        mine: list[Run] = []
        for parent in by_stage[stage.after] if stage.after else [None]:
            for own, overrides in _grid(stage.axes, stage.overrides):
                settings = _chained(parent, own, overrides)
                name = run_name(settings)
                after = parent.run_dir if parent is not None else None
                run_dir = spec.out / stage.name / name
                mine.append(
                    Run(f"{stage.name}/{name}", run_dir, settings, overrides, stage.base, stage.name, after)
                )
        by_stage[stage.name] = mine
        runs += mine
    return _unique(runs)

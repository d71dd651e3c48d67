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

Relative paths (`base`, `out`) resolve against the current working directory, which is the
repository root for every command in this project; they are made absolute before any command
is built, so the commands also work from elsewhere (e.g. a SLURM node).

An axis is one of these shorthands, or a dotted path into the fit config tree starting with
`trainer.`, `model.` or `data.` (e.g. `data.max_new_tokens`, `model.divergence.init_args.beta`),
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
rows and reference lines (`distill.experiments.references`). `references: false` turns them off;
a list such as `[start]` keeps some (and fails when the teacher is listed but the config names
none; with `true`, a config without a teacher, e.g. GRPO, simply gets no teacher reference). With
stages they belong to the first stage. They are not runs of the grid: not in `expand`, not in the
factor analysis. An axis that changes how runs are tested or which models they start from (e.g.
`model.teacher`, `data.test_size`) leaves no single reference, and is refused unless
`references: false`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from distill.names import DIVERGENCE_CLASSES as DIVERGENCES
from distill.names import ESTIMATORS, GRANULARITIES

ROOTS = ("trainer", "model", "data")
MODEL_INIT_ARGS = "model.init_args."
# Keys the runner itself sets on the command line; an axis or override may not set them.
RESERVED_PATHS = ("run_dir", "ckpt_path")
SPEC_KEYS = ("name", "base", "out", "overrides", "axes", "slurm", "stages", "references")
STAGE_KEYS = ("name", "base", "overrides", "axes", "after")
STUDENT_PATH = "model.student"  # set on chained runs to the parent's export
STUDENT_EXPORT = "student"
REFERENCE_KINDS = ("start", "teacher")
# Config paths (and everything under them) that change how a run is tested or which models it
# starts from: as an axis they leave no single start/teacher to compare with.
REFERENCE_SENSITIVE = (
    "model.student",
    "model.teacher",
    "model.student_dtype",
    "model.teacher_dtype",
    "data.test_tasks",
    "data.test_size",
    "data.eval_max_new_tokens",
    "data.tokenizer",
    "data.chat_template",
    "trainer.precision",
    "trainer.callbacks",
)

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=,@-]")
MAX_NAME = 200


class SpecError(ValueError):
    """A sweep spec that cannot be run; the message names the field, the value and what is allowed."""


def _number(axis: str, value: Any, low: float | None = None, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"axis {axis!r}: value {value!r} must be a finite number")
    if (low is not None and value < low) or (high is not None and value > high):
        raise SpecError(f"axis {axis!r}: value {value!r} must lie in [{low}, {high}]")


def _choice(choices: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(axis: str, value: Any) -> None:
        if value not in choices:
            raise SpecError(f"axis {axis!r}: unknown value {value!r}; allowed: {', '.join(choices)}")

    return check


def _seed(axis: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SpecError(f"axis {axis!r}: value {value!r} must be a non-negative integer")


def _text(axis: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise SpecError(f"axis {axis!r}: value {value!r} must be a non-empty string")


def _positive(axis: str, value: Any) -> None:
    _number(axis, value)
    if value <= 0:
        raise SpecError(f"axis {axis!r}: value {value!r} must be > 0")


def _clip(axis: str, value: Any) -> None:
    if value is not None:
        _positive(axis, value)


@dataclass(frozen=True)
class Shorthand:
    path: str
    check: Callable[[str, Any], None]
    to_config: Callable[[Any], Any] = lambda value: value


SHORTHANDS: dict[str, Shorthand] = {
    "mix": Shorthand("data.mix", lambda a, v: _number(a, v, 0, 1)),
    "granularity": Shorthand("data.granularity", _choice(GRANULARITIES)),
    "task": Shorthand("data.task", _text),
    "lr": Shorthand("model.optimizer.init_args.lr", _positive),
    "seed": Shorthand("seed_everything", _seed),
    "estimator": Shorthand("model.divergence.init_args.estimator", _choice(ESTIMATORS)),
    "gradient_clip": Shorthand("model.gradient_clip_val", _clip),
    "divergence": Shorthand("model.divergence.class_path", _choice(tuple(DIVERGENCES)), DIVERGENCES.get),
}
PATH_TO_SHORTHAND = {s.path: name for name, s in SHORTHANDS.items()}


@dataclass(frozen=True)
class Run:
    """One fit of a sweep: `settings` are the knob values by axis name (shorthand where one
    exists, values as in the spec); `overrides` are the dotted config values (fixed + axes).
    In a staged spec: `base` is the stage's configs (None: the spec's), `stage` its name, and
    `after` the parent run's directory (the run starts once the parent has finished).
    `reference` ('start' or 'teacher') marks an evaluation-only reference run (`distill test`, no
    settings; `distill.experiments.references`), which is never part of the grid."""

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
    slurm: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    # Chained stages, in order; empty for a single-stage spec. With stages, base/axes/overrides
    # above are the first stage's.
    stages: list[Stage] = field(default_factory=list)
    # Reference runs to add (a subset of REFERENCE_KINDS, in that order); `references_listed`: the
    # spec named them in a list (so a missing teacher is an error, not a skip).
    references: tuple[str, ...] = REFERENCE_KINDS
    references_listed: bool = False


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML silently keeps the last)."""


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    keys = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in keys:
            raise SpecError(f"duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        keys.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
# YAML 1.1 reads `1e-4` (no dot) as a string; learning rates are written that way, so read it as a float.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


def format_value(value: Any) -> str:
    """The text of a value in a run name: floats in the shortest form that parses back exactly."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, float):
        best = repr(value)
        for digits in range(17):
            mantissa, exponent = f"{value:.{digits}e}".split("e")
            text = f"{mantissa}e{int(exponent)}"
            if float(text) == value and len(text) < len(best):
                best = text
        return best
    return str(value)


def run_name(settings: dict[str, Any]) -> str:
    """Readable, filesystem-safe name of a run from its settings (sorted by axis name)."""
    parts = [f"{axis}={format_value(settings[axis])}" for axis in sorted(settings)]
    name = _UNSAFE.sub("_", ",".join(parts)) or "default"
    if len(name) > MAX_NAME:  # keep under filesystem limits; the hash keeps names distinct
        digest = hashlib.sha1(name.encode()).hexdigest()[:12]
        name = f"{name[: MAX_NAME - 13]}~{digest}"
    return name


def canonical_axis(axis: Any) -> tuple[str, str]:
    """(canonical name, dotted config path) of an axis or override key; raises SpecError."""
    if not isinstance(axis, str) or not axis:
        raise SpecError(f"axis {axis!r}: must be a non-empty string")
    if axis.startswith(MODEL_INIT_ARGS):  # jsonargparse reads model.x as model.init_args.x
        axis = "model." + axis[len(MODEL_INIT_ARGS) :]
    if axis in SHORTHANDS:
        return axis, SHORTHANDS[axis].path
    if axis in PATH_TO_SHORTHAND:
        return PATH_TO_SHORTHAND[axis], axis
    if axis in RESERVED_PATHS:
        raise SpecError(f"axis {axis!r}: set by the sweep runner itself, not by a spec")
    if "." not in axis:
        raise SpecError(
            f"unknown axis {axis!r}: use a shorthand ({', '.join(SHORTHANDS)}) "
            f"or a dotted config path such as data.max_new_tokens"
        )
    if not _DOTTED.match(axis) or axis.split(".")[0] not in ROOTS:
        raise SpecError(
            f"axis {axis!r}: malformed config path; expected dotted identifiers starting with "
            f"one of {', '.join(ROOTS)} (e.g. model.divergence.init_args.beta)"
        )
    return axis, axis


def config_value(axis: str, value: Any) -> Any:
    """The value written into the config for a canonical axis (divergence names -> class paths)."""
    return SHORTHANDS[axis].to_config(value) if axis in SHORTHANDS else value


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    """{'a.b': 1, 'a.c': 2} -> {'a': {'b': 1, 'c': 2}}; raises SpecError when paths collide."""
    tree: dict[str, Any] = {}
    for path, value in dotted.items():
        node, parts = tree, path.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(f"config path {path!r} runs through {part!r}, which is itself set")
            node = child
        if parts[-1] in node:
            raise SpecError(f"config path {path!r} is set twice or is a prefix of another path")
        node[parts[-1]] = value
    return tree


def _check_scalar(axis: str, value: Any) -> None:
    if not (value is None or isinstance(value, (str, int, float, bool))):
        raise SpecError(f"axis {axis!r}: value {value!r} must be a scalar (number, string, bool, null)")


def _same(a: Any, b: Any) -> bool:
    """Equal as settings: same run-name text, or equal numbers (0 and 0.0)."""
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return format_value(a) == format_value(b) or (numbers and a == b)


def _parse_axes(raw: Any, optional: bool = False) -> dict[str, list[Any]]:
    if optional and raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise SpecError(f"'axes' must be a non-empty mapping of axis -> list of values, got {raw!r}")
    axes: dict[str, list[Any]] = {}
    paths: dict[str, str] = {}
    for axis, values in raw.items():
        name, path = canonical_axis(axis)
        if path in paths:
            raise SpecError(f"duplicate axis {axis!r}: sets {path}, as axis {paths[path]!r} already does")
        paths[path] = axis
        if not isinstance(values, list) or not values:
            raise SpecError(f"axis {axis!r}: expected a non-empty list of values, got {values!r}")
        for value in values:
            _check_scalar(axis, value)
            if name in SHORTHANDS:
                SHORTHANDS[name].check(axis, value)
        repeated = sorted({format_value(v) for i, v in enumerate(values) for w in values[:i] if _same(v, w)})
        if repeated:
            raise SpecError(f"axis {axis!r}: repeated value(s) {', '.join(repeated)}")
        axes[name] = values
    return axes


def _parse_overrides(raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpecError(f"'overrides' must be a mapping of dotted config path -> value, got {raw!r}")
    out = {}
    for key, value in raw.items():
        name, path = canonical_axis(key)
        if path in out:
            raise SpecError(f"override {key!r}: sets {path} twice")
        if name in SHORTHANDS:
            SHORTHANDS[name].check(key, value)
        out[path] = config_value(name, value)
    return out


def _paths(raw: Any, field_name: str, root: Path) -> list[Path]:
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(p, str) and p for p in items):
        raise SpecError(f"{field_name!r} must be a config path or a non-empty list of paths, got {raw!r}")
    return [(root / p).resolve() for p in items]


def _check_axes_vs_overrides(axes: dict[str, list[Any]], overrides: dict[str, Any], where: str) -> None:
    for axis in axes:
        axis_path = SHORTHANDS[axis].path if axis in SHORTHANDS else axis
        if axis_path in overrides:
            raise SpecError(f"{where}axis {axis!r} sets {axis_path}, which 'overrides' fixes as well")


def _parse_stage(raw: Any, index: int, earlier: list[Stage], root: Path) -> Stage:
    if not isinstance(raw, dict):
        raise SpecError(f"stages[{index}] must be a mapping with keys {', '.join(STAGE_KEYS)}, got {raw!r}")
    unknown = sorted(set(raw) - set(STAGE_KEYS))
    if unknown:
        raise SpecError(
            f"stages[{index}]: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(STAGE_KEYS)}"
        )
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"stages[{index}].name must match [A-Za-z0-9_.-]+, got {name!r}")
    if name in {s.name for s in earlier}:
        raise SpecError(f"stages[{index}].name {name!r} is used by an earlier stage")
    after = raw.get("after")
    if after is not None and after not in {s.name for s in earlier}:
        raise SpecError(
            f"stage {name!r}: after {after!r} must name an earlier stage "
            f"({', '.join(s.name for s in earlier) or 'none: the first stage cannot have after'})"
        )
    if "base" not in raw:
        raise SpecError(f"stage {name!r}: 'base' is required: the fit config file(s) its runs start from")
    where = f"stage {name!r}: "
    try:
        axes = _parse_axes(raw.get("axes"), optional=after is not None)
        overrides = _parse_overrides(raw.get("overrides"))
    except SpecError as err:
        raise SpecError(f"{where}{err}") from None
    _check_axes_vs_overrides(axes, overrides, where)
    if after is not None:
        if STUDENT_PATH in overrides or STUDENT_PATH in axes:
            raise SpecError(
                f"{where}{STUDENT_PATH} is set to the parent's export; do not set it (after: {after})"
            )
        inherited = _inherited_knobs(earlier, after)
        clash = sorted(set(axes) & inherited)
        if clash:
            raise SpecError(
                f"{where}axis {', '.join(map(repr, clash))} is already a knob of its parent stage {after!r} "
                "(chained runs inherit the parent's settings)"
            )
    return Stage(name, _paths(raw["base"], f"stages[{index}].base", root), axes, overrides, after)


def _inherited_knobs(stages: list[Stage], name: str) -> set[str]:
    by_name = {s.name: s for s in stages}
    knobs: set[str] = set()
    while name is not None:
        knobs |= set(by_name[name].axes)
        name = by_name[name].after
    return knobs


def _parse_references(raw: Any) -> tuple[tuple[str, ...], bool]:
    """(kinds, listed) from the spec's `references` value: true, false or a list of kinds."""
    if raw is True or raw is False:
        return (REFERENCE_KINDS if raw else ()), False
    if (
        isinstance(raw, list)
        and raw
        and all(isinstance(k, str) and k in REFERENCE_KINDS for k in raw)
        and len(set(raw)) == len(raw)
    ):
        return tuple(k for k in REFERENCE_KINDS if k in raw), True
    raise SpecError(
        f"'references' must be true, false or a list of distinct names from {', '.join(REFERENCE_KINDS)} "
        f"(e.g. [start]), got {raw!r}"
    )


def _check_references(spec: SweepSpec) -> None:
    """Refuse axes of the (first) stage that leave no single start or teacher to compare with."""
    if not spec.references:
        return
    for axis in spec.axes:
        path = SHORTHANDS[axis].path if axis in SHORTHANDS else axis
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
    if not isinstance(data, dict):
        raise SpecError(f"a sweep spec must be a mapping with keys {', '.join(SPEC_KEYS)}")
    unknown = sorted(set(data) - set(SPEC_KEYS))
    if unknown:
        raise SpecError(
            f"unknown spec key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(SPEC_KEYS)}"
        )
    name = data.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise SpecError(f"'name' must match [A-Za-z0-9_.-]+, got {name!r}")
    out = _paths(data.get("out", f"experiments/runs/{name}"), "out", root)
    if len(out) != 1:
        raise SpecError(f"'out' must be a single directory, got {data.get('out')!r}")
    slurm = data.get("slurm") or {}
    if not isinstance(slurm, dict):
        raise SpecError(f"'slurm' must be a mapping of sbatch options, got {slurm!r}")
    references, listed = _parse_references(data.get("references", True))
    if "stages" in data:
        misplaced = sorted({"base", "axes", "overrides"} & set(data))
        if misplaced:
            raise SpecError(
                f"with 'stages', put {', '.join(misplaced)} inside each stage, not at the top level"
            )
        raw = data["stages"]
        if not isinstance(raw, list) or not raw:
            raise SpecError(f"'stages' must be a non-empty list of stage mappings, got {raw!r}")
        stages: list[Stage] = []
        for i, entry in enumerate(raw):
            stages.append(_parse_stage(entry, i, stages, root))
        first = stages[0]
        spec = SweepSpec(
            name,
            first.base,
            out[0],
            first.axes,
            first.overrides,
            dict(slurm),
            path,
            stages,
            references,
            listed,
        )
        _check_references(spec)
        expand(spec)
        return spec
    if "base" not in data:
        raise SpecError("'base' is required: the fit config file(s) every run starts from")
    base = _paths(data["base"], "base", root)
    axes = _parse_axes(data.get("axes"))
    overrides = _parse_overrides(data.get("overrides"))
    _check_axes_vs_overrides(axes, overrides, "")
    spec = SweepSpec(name, base, out[0], axes, overrides, dict(slurm), path, [], references, listed)
    _check_references(spec)
    expand(spec)  # surface path collisions and name clashes now, before anything runs
    return spec


def load_spec(path: str | Path, out: str | Path | None = None) -> SweepSpec:
    """Read and validate a spec file; `out` replaces the spec's output directory."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"sweep spec {str(path)!r} does not exist")
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as err:
        raise SpecError(f"sweep spec {str(path)!r} is not valid YAML: {err}") from err
    spec = parse_spec(data, path=path.resolve())
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
            overrides[SHORTHANDS[axis].path if axis in SHORTHANDS else axis] = config_value(axis, value)
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
        out = spec.out / stage.name
        mine: list[Run] = []
        parents = by_stage[stage.after] if stage.after else [None]
        for parent in parents:
            for own, overrides in _grid(stage.axes, stage.overrides):
                settings = dict(own)
                if parent is not None:
                    settings = {**parent.settings, **own}
                    overrides[STUDENT_PATH] = str(parent.run_dir / STUDENT_EXPORT)
                    if "seed" in parent.settings and "seed" not in own and "seed_everything" not in overrides:
                        overrides["seed_everything"] = parent.settings["seed"]
                    nest(overrides)
                name = run_name(settings)
                after = parent.run_dir if parent is not None else None
                mine.append(
                    Run(
                        f"{stage.name}/{name}", out / name, settings, overrides, stage.base, stage.name, after
                    )
                )
        by_stage[stage.name] = mine
        runs += mine
    return _unique(runs)

"""Reference runs: the start and the teacher, tested exactly as every run's final student.

Without them a report cannot say whether distillation moved the student above where it started,
or how far it stays from the teacher. A sweep (the first stage of a staged one) adds, unless its
spec says `references: false`, two evaluation-only runs of `distill test`:

- `start`: the base configs and the spec's fixed overrides, as every run of the grid, untrained;
- `teacher`: the same with `model.student` set to the config's `model.teacher` (and
  `model.student_dtype` to its `teacher_dtype`, `data.prompts.student_context` to its
  `data.prompts.teacher_context`, when the config sets them): the teacher in the student's place, reading
  what it reads in training.

`distill test` builds the same data module and callbacks as a fit, so the references see the same
test tasks, test problems and TaskEvaluation settings as each run's final test. Neither depends on
the run seed: test problems come from a fixed generator seed (`distill.data`, `_seed("test")`),
TaskEvaluation samples with its own `seed`, and greedy decoding has no randomness. One reference
therefore serves every seed of the grid; it runs at the grid's first seed all the same, so that it
differs from a run of that seed only by not being trained.

A reference lives in `<out>/references/<kind>` (`<out>/<first stage>/references/<kind>` with
stages), is named `references/<kind>` (`<stage>/references/<kind>`), and holds `overrides.yaml`,
`settings.json` (with `"reference": kind`) and what `distill test` writes: `config.yaml`,
`env.json`, `tensorboard/` and, last and atomically, `test_metrics.json`. It is finished iff that
file holds a `metrics` mapping; an unfinished one restarts clean (there is nothing to resume).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from distill.config_bases import moved_config, moved_key
from distill.experiments.run.axes import nest
from distill.experiments.run.schema import SpecError
from distill.experiments.run.spec import STUDENT_PATH, Run, SweepSpec

DIRNAME = "references"
TEST_METRICS = "test_metrics.json"
LABELS = {"start": "start (step 0)", "teacher": "teacher"}
TEACHER_PATH = "model.teacher"


def _merge(into: dict, new: dict) -> dict:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def _load(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    """A config file with its `base:` includes merged in (as `distill fit` reads it); {} if unreadable."""
    if path.resolve() in seen or not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {}
    if not isinstance(data, dict):
        return {}
    bases = data.pop("base", None)
    merged: dict = {}
    for base in [bases] if isinstance(bases, str) else bases if isinstance(bases, list) else []:
        _merge(merged, _load(path.parent / str(base), (*seen, path.resolve())))
    return _merge(merged, data)


def model_option(base: list[Path], overrides: dict[str, Any], name: str, section: str = "model") -> Any:
    """The value of `<section>.<name>` (`model` or `data`; `name` may reach into a group, e.g.
    `prompts.teacher_context`) after the base configs and the dotted overrides (`model.X` and
    `model.init_args.X` alike, later ones winning); a setting that moved into a group counts at
    its new place in either. None when nothing sets it."""
    value = None
    for path in base:
        block = moved_config(_load(Path(path)))[0].get(section)
        if isinstance(block, dict):
            init_args = block.get("init_args")
            for source in (block, init_args if isinstance(init_args, dict) else {}):
                found = _dotted(source, name)
                if found is not None:
                    value = found
    wanted = (f"{section}.{name}", f"{section}.init_args.{name}")
    for key, found in overrides.items():
        if moved_key(key, quiet=True) in wanted and found is not None:
            value = found
    return value


def _dotted(block: dict, name: str) -> Any:
    """`block[a][b]` for `name` "a.b"; None where a level is missing."""
    for part in name.split("."):
        block = block.get(part) if isinstance(block, dict) else None
    return block


def reference_runs(spec: SweepSpec) -> tuple[list[Run], list[str]]:
    """The spec's reference runs, and a note for each one left out (e.g. no teacher to test).
    Raises SpecError when the spec lists the teacher but its config names none."""
    if not spec.references:
        return [], []
    stage = spec.stages[0].name if spec.stages else None
    out = spec.out / stage if stage else spec.out
    base = spec.stages[0].base if spec.stages else None
    overrides = dict(spec.overrides)
    seeds = spec.axes.get("seed")
    if seeds and "seed_everything" not in overrides:
        overrides["seed_everything"] = seeds[0]
    runs, notes = [], []
    for kind in spec.references:
        own = dict(overrides)
        if kind == "teacher":
            teacher = model_option(spec.base, overrides, "teacher")
            if not isinstance(teacher, str) or not teacher:
                message = "the configs set no model.teacher (a GRPO stage has none)"
                if spec.references_listed:
                    raise SpecError(f"'references' lists teacher, but {message}")
                notes.append(f"teacher reference skipped: {message}")
                continue
            own[STUDENT_PATH] = teacher
            dtype = model_option(spec.base, overrides, "teacher_dtype")
            if dtype is not None:
                own["model.student_dtype"] = dtype
            # A teacher-only context is part of the teacher: test it reading that context.
            context = model_option(spec.base, overrides, "prompts.teacher_context", section="data")
            if context is not None:
                own["data.prompts.student_context"] = context
        nest(own)
        name = f"{DIRNAME}/{kind}"
        runs.append(
            Run(f"{stage}/{name}" if stage else name, out / DIRNAME / kind, {}, own, base, stage, None, kind)
        )
    return runs, notes


def read(run_dir: Path) -> dict[str, float] | None:
    """The finite numeric test metrics of a reference, or None when it has not finished (its
    `test_metrics.json` does not parse or holds no `metrics` mapping)."""
    try:
        data = json.loads((Path(run_dir) / TEST_METRICS).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), dict):
        return None
    return {
        str(k): float(v)
        for k, v in data["metrics"].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def load_references(sweep_dir: Path) -> dict[str, dict[str, float]]:
    """Finished references of a sweep (or stage) directory: kind -> test metrics, in LABELS order."""
    found = {}
    for kind in LABELS:
        metrics = read(Path(sweep_dir) / DIRNAME / kind)
        if metrics is not None:
            found[kind] = metrics
    return found

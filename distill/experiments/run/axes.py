"""Axes of a sweep spec (the format: `distill.experiments.run.spec`): the shorthand names, the one
check of their values, canonical names and config paths, and the names of runs.

The values a shorthand takes are named in `distill.names` (divergences, granularities,
estimators); a dotted axis (`data.sampling.max_new_tokens`) passes its values through unchecked.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from distill.checks import is_int, is_number
from distill.experiments.run.schema import SpecError, SpecFields, field_error
from distill.names import PATH_TO_SHORTHAND, SHORTHANDS

ROOTS = ("trainer", "model", "data")
MODEL_INIT_ARGS = "model.init_args."
# Keys the runner itself sets on the command line; an axis or override may not set them.
RESERVED_PATHS = ("run_dir", "ckpt_path")
_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+=,@-]")
MAX_NAME = 200


def check_value(axis: str, name: str, value: Any) -> None:
    """Raise SpecError unless `value` is allowed for the shorthand `name` (written `axis`)."""
    rule = SHORTHANDS[name]
    if value is None and rule.null:
        return
    problem = None
    if rule.kind == "choice":
        if value not in rule.choices:
            raise SpecError(f"axis {axis!r}: unknown value {value!r}; allowed: {', '.join(rule.choices)}")
    elif rule.kind == "text":
        problem = None if isinstance(value, str) and value else "must be a non-empty string"
    elif rule.kind == "count":
        problem = None if is_int(value) and value >= 0 else "must be a non-negative integer"
    elif not is_number(value):
        problem = "must be a finite number"
    elif rule.kind == "fraction" and not 0 <= value <= 1:
        problem = "must lie in [0, 1]"
    elif rule.kind == "positive" and value <= 0:
        problem = "must be > 0"
    if problem:
        raise SpecError(f"axis {axis!r}: value {value!r} {problem}")


def config_path(axis: str) -> str:
    """The dotted config path of a canonical axis name."""
    return SHORTHANDS[axis].path if axis in SHORTHANDS else axis


def config_value(axis: str, value: Any) -> Any:
    """The value written into the config for a canonical axis (divergence names -> class paths)."""
    return SHORTHANDS[axis].to_config(value) if axis in SHORTHANDS else value


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
            f"or a dotted config path such as data.sampling.max_new_tokens"
        )
    if not _DOTTED.match(axis) or axis.split(".")[0] not in ROOTS:
        raise SpecError(
            f"axis {axis!r}: malformed config path; expected dotted identifiers starting with "
            f"one of {', '.join(ROOTS)} (e.g. model.divergence.init_args.beta)"
        )
    return axis, axis


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


def _same(a: Any, b: Any) -> bool:
    """Equal as settings: same run-name text, or equal numbers (0 and 0.0)."""
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    return format_value(a) == format_value(b) or (numbers and a == b)


def parse_axes(raw: dict | None, optional: bool = False) -> dict[str, list[Any]]:
    """Canonical axis name -> its values (checked), in spec order; `optional`: None is no axes."""
    if optional and raw is None:
        return {}
    if not raw:
        raise field_error(SpecFields, "axes", raw)
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
            if not (value is None or isinstance(value, (str, int, float, bool))):
                raise SpecError(
                    f"axis {axis!r}: value {value!r} must be a scalar (number, string, bool, null)"
                )
            if name in SHORTHANDS:
                check_value(axis, name, value)
        repeated = sorted({format_value(v) for i, v in enumerate(values) for w in values[:i] if _same(v, w)})
        if repeated:
            raise SpecError(f"axis {axis!r}: repeated value(s) {', '.join(repeated)}")
        axes[name] = values
    return axes


def parse_overrides(raw: dict | None) -> dict[str, Any]:
    """Dotted config path -> value (shorthand keys resolved and checked as axis values are)."""
    out: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        name, path = canonical_axis(key)
        if path in out:
            raise SpecError(f"override {key!r}: sets {path} twice")
        if name in SHORTHANDS:
            check_value(key, name, value)
        out[path] = config_value(name, value)
    return out


def check_axes_vs_overrides(axes: dict[str, list[Any]], overrides: dict[str, Any], where: str = "") -> None:
    """Refuse an axis whose config path `overrides` fixes as well."""
    for axis in axes:
        if config_path(axis) in overrides:
            raise SpecError(f"{where}axis {axis!r} sets {config_path(axis)}, which 'overrides' fixes as well")

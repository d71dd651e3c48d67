"""One way to check an argument of the Python API: each helper raises a `ValueError` that names the
field, what is allowed and the value given, as ``"<field> must be <allowed>, got <value!r>"``.

(The CLI parses configs with jsonargparse, whose types reject most bad values earlier; these checks
are what a researcher calling the classes from Python meets, and they guard the CLI as well.)
Booleans are not accepted as numbers, and numbers must be finite.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any


def check(ok: bool, field: str, value: Any, allowed: str) -> None:
    """Raise ``ValueError("<field> must be <allowed>, got <value!r>")`` unless `ok`."""
    if not ok:
        raise ValueError(f"{field} must be {allowed}, got {value!r}")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bounds(minimum: float | None, maximum: float | None, open_min: bool, open_max: bool) -> str:
    if minimum is not None and maximum is not None:
        return f" in {'(' if open_min else '['}{minimum:g}, {maximum:g}{')' if open_max else ']'}"
    if minimum is not None:
        return f" {'>' if open_min else '>='} {minimum:g}"
    if maximum is not None:
        return f" {'<' if open_max else '<='} {maximum:g}"
    return ""


def _within(value: float, minimum, maximum, open_min: bool, open_max: bool) -> bool:
    low = minimum is None or (value > minimum if open_min else value >= minimum)
    high = maximum is None or (value < maximum if open_max else value <= maximum)
    return low and high


def check_int(
    field: str, value: Any, minimum: int | None = None, maximum: int | None = None, *, optional: bool = False
) -> int | None:
    """An integer within ``[minimum, maximum]`` (None: unbounded), or None when `optional`."""
    if optional and value is None:
        return None
    allowed = ("None or " if optional else "") + "an integer" + _bounds(minimum, maximum, False, False)
    check(is_int(value) and _within(value, minimum, maximum, False, False), field, value, allowed)
    return value


def check_number(
    field: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    open_min: bool = False,
    open_max: bool = False,
    optional: bool = False,
) -> float | None:
    """A finite number within the bounds (``open_min``/``open_max``: strict), as a float; or None
    when `optional`."""
    if optional and value is None:
        return None
    allowed = (
        ("None or " if optional else "") + "a finite number" + _bounds(minimum, maximum, open_min, open_max)
    )
    check(is_number(value) and _within(value, minimum, maximum, open_min, open_max), field, value, allowed)
    return float(value)


def check_choice(field: str, value: Any, choices: Collection) -> Any:
    """One of `choices` (listed in the message in their own order)."""
    check(value in choices, field, value, f"one of {list(choices)}")
    return value


def settings(cls: type, value: Any, field: str) -> Any:
    """A group of settings (a dataclass, e.g. `model.execution`) from an instance of `cls`, a
    mapping of its fields (a checkpoint's hyper-parameters, a Python caller) or None (its
    defaults). An unknown field or another type is refused naming `field`."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if isinstance(value, dict):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"{field} has no setting {unknown[0]!r}; it has {sorted(known)}")
        return cls(**value)
    raise ValueError(f"{field} must be a {cls.__name__} or a mapping of its fields, got {value!r}")

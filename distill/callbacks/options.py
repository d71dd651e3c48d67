"""Constructor checks shared by the measurement callbacks: one message format naming the field,
the value and what is allowed."""

from __future__ import annotations

import math


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(owner: str, field: str, value: object, minimum: int) -> int:
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{owner}.{field} must be an integer >= {minimum}, got {value!r}")
    return value


def check_optional_int(owner: str, field: str, value: object, minimum: int) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{owner}.{field} must be None or an integer >= {minimum}, got {value!r}")
    return value


def check_float(owner: str, field: str, value: object, minimum: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not minimum <= value < math.inf:
        raise ValueError(f"{owner}.{field} must be a finite number >= {minimum}, got {value!r}")
    return float(value)


def check_tasks(owner: str, field: str, names: object) -> list[str] | None:
    """None (the default set) or a non-empty list of registered task names."""
    from distill.tasks.registry import TASKS

    if names is None:
        return None
    if isinstance(names, str) or not all(isinstance(n, str) for n in names) or not list(names):
        raise ValueError(f"{owner}.{field} must be None or a non-empty list of task names, got {names!r}")
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ValueError(f"{owner}.{field} has unknown task(s) {unknown}; allowed: {sorted(TASKS)}")
    return list(names)

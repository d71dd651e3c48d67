"""The callbacks' check of a task list (the numeric options use `distill.checks`)."""

from __future__ import annotations

from distill.checks import check


def check_tasks(owner: str, field: str, names: object) -> list[str] | None:
    """None (the default set) or a non-empty list of registered task names or dataset specs (specs
    come back as their tasks' names)."""
    from distill.tasks.registry import TASKS, get_task, is_task

    if names is None:
        return None
    ok = not isinstance(names, str) and all(isinstance(n, str) for n in names) and bool(list(names))
    check(ok, f"{owner}.{field}", names, "None or a non-empty list of task names")
    unknown = [n for n in names if not is_task(n)]
    check(not unknown, f"{owner}.{field}", names, f"task names from {sorted(TASKS)} (unknown: {unknown})")
    # A dataset spec is loaded now and stands for its task's slash-free name (its metric keys).
    return [n if n in TASKS else get_task(n).name for n in names]

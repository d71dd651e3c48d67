"""The environment each fit of a sweep runs in: the shared teacher-rollout cache, its share of the
CPU cores, (with `distill sweep --devices`) its own GPUs, and the tiny-world models it loads."""

from __future__ import annotations

import os
from pathlib import Path

ROLLOUT_CACHE_ENV = "DISTILL_ROLLOUT_CACHE"


def device_groups(devices: str, jobs: int) -> list[str]:
    """`--devices` ("0,1,2,3") cut into `jobs` equal `CUDA_VISIBLE_DEVICES` values ("0,1", "2,3");
    a ValueError naming the option when the ids are not distinct integers >= 0 or do not split."""
    ids = [d.strip() for d in devices.split(",")]
    if not all(d.isdigit() for d in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--devices must be distinct GPU ids >= 0 separated by commas, got {devices!r}")
    if len(ids) % jobs:
        raise ValueError(
            f"--devices: {len(ids)} GPU(s) ({devices}) do not split evenly over --jobs {jobs}; "
            "give a multiple of --jobs ids"
        )
    size = len(ids) // jobs
    return [",".join(ids[i : i + size]) for i in range(0, len(ids), size)]


def child_env(out: Path, jobs: int, cpus: int | None = None) -> dict[str, str]:
    """Environment of each fit: the shared teacher-rollout cache and, unless the caller set it, an
    equal share of the CPU cores as OpenMP threads. Oversubscribed OpenMP threads spin against each
    other: two 2-thread fits on 2 cores ran 4-6 times slower than one after the other."""
    env = dict(os.environ, **{ROLLOUT_CACHE_ENV: str(out / "rollout_cache")})
    if "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (cpus or os.cpu_count() or 1) // max(1, jobs)))
    return env


__all__ = ["ROLLOUT_CACHE_ENV", "check_named_models", "child_env", "device_groups"]


def _strings(value, key: str = "") -> list[tuple[str, str]]:
    """(dotted key, string) of every string in a parsed config."""
    if isinstance(value, str):
        return [(key, value)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, f"{key}.{k}" if key else str(k))]
    if isinstance(value, (list, tuple)):
        return [s for i, v in enumerate(value) for s in _strings(v, f"{key}[{i}]")]
    return []


def check_named_models(runs: list, base: list[Path]) -> None:
    """Every `tiny-world[-vN]:NAME` that the runs' configs (a run's own `base`, else `base`) and
    overrides name is installed, and every `real:NAME` is converted (once, from its wheel): a sweep
    on a fresh machine fails here, before any compute, not once per run. Raises the first missing
    model's error (where it is named, its path and the command that installs it)."""
    import yaml

    from distill.models import real, tiny_world_names
    from distill.models.loading import check_model_path

    named: dict[str, str] = {}  # model -> where it is first named
    for path in sorted({p for run in runs for p in (run.base or base)}):
        for key, value in _strings(yaml.safe_load(Path(path).read_text())):
            named.setdefault(value, f"{path}: {key}")
    for run in runs:
        for key, value in _strings(run.overrides):
            named.setdefault(value, f"{run.name}: {key}")
    for value, where in named.items():
        if tiny_world_names.split_name(value) is not None or real.split_name(value) is not None:
            check_model_path(value, where)

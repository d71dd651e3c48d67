"""A sweep's own record, `sweep.json`: written by the sweep runner at the top of the sweep and in
each stage (name, spec, base configs, axes, overrides, run names, claims file), with a fingerprint
of everything that decides its runs, so that an archive is never filled by another sweep."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from distill.config_bases import expand_bases
from distill.experiments.run.spec import Run, SweepSpec
from distill.runinfo import write_json_atomic

SWEEP_RECORD = "sweep.json"


def read_sweep_record(sweep_dir: Path) -> dict[str, Any]:
    """A sweep directory's `sweep.json` (name, axes, stages, ...); empty when missing or unreadable."""
    try:
        record = json.loads((Path(sweep_dir) / SWEEP_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def sweep_name(sweep_dir: Path) -> str:
    """The spec's name from `sweep.json` (an archive keeps it), else the directory's name."""
    name = read_sweep_record(sweep_dir).get("name")
    return name if isinstance(name, str) and name else Path(sweep_dir).name


def _config_digests(paths: list[Path]) -> list[str]:
    """Each config's sha256, with the files it includes (`base:`) in merge order."""
    out = []
    for path in paths:
        for value in expand_bases(["--config", str(path)])[1::2]:  # files, or YAML left inline
            try:
                out.append(hashlib.sha256(Path(value).read_bytes()).hexdigest())
            except OSError:
                out.append(hashlib.sha256(value.encode()).hexdigest())
    return out


def spec_fingerprint(spec: SweepSpec) -> str:
    """What decides a sweep's runs, hashed: its name, axes, fixed overrides and references, each
    stage's, and the contents of every base config and the configs they include. Two sweeps with
    the same run names but another base config (e.g. a longer run) differ here."""
    data = {
        "name": spec.name,
        "axes": spec.axes,
        "overrides": spec.overrides,
        "base": _config_digests(spec.base),
        "references": list(spec.references),
        "stages": [
            {
                "name": stage.name,
                "after": stage.after,
                "axes": stage.axes,
                "overrides": stage.overrides,
                "base": _config_digests(stage.base),
            }
            for stage in spec.stages
        ],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def write_sweep_record(spec: SweepSpec, runs: list[Run]) -> None:
    """Write `sweep.json` (what `read_sweep_record` reads) at the top of the sweep and, with
    stages, in each stage directory: name, spec, base configs, axes, overrides and run names; the
    top one also holds the spec's `fingerprint` (`spec_fingerprint`)."""
    record = {
        "name": spec.name,
        "fingerprint": spec_fingerprint(spec),
        "spec": str(spec.path) if spec.path else None,
        "base": [str(p) for p in spec.base],
        "axes": spec.axes,
        "overrides": spec.overrides,
        "runs": [run.name for run in runs if not run.reference],
        "references": [run.name for run in runs if run.reference],
    }
    if spec.claims:
        record["claims"] = spec.claims
    if spec.stages:
        # Each stage directory reads as a sweep of its own (the report's knob order comes from
        # its axes: a chained stage's are its parents' plus its own).
        axes: dict[str, dict] = {}
        for stage in spec.stages:
            axes[stage.name] = {**(axes[stage.after] if stage.after else {}), **stage.axes}
            write_json_atomic(
                spec.out / stage.name / SWEEP_RECORD,
                {
                    "name": f"{spec.name}/{stage.name}",
                    "stage": stage.name,
                    "after": stage.after,
                    "base": [str(p) for p in stage.base],
                    "axes": axes[stage.name],
                    "overrides": stage.overrides,
                    "runs": [run.name for run in runs if run.stage == stage.name and not run.reference],
                    "references": [run.name for run in runs if run.stage == stage.name and run.reference],
                },
                sort_keys=False,
            )
        record["stages"] = [
            {"name": st.name, "after": st.after, "base": [str(p) for p in st.base], "axes": st.axes}
            for st in spec.stages
        ]
    write_json_atomic(spec.out / SWEEP_RECORD, record, sort_keys=False)

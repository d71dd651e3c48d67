"""Every sweep spec committed under experiments/ loads, names config files that exist and expands
to the runs its header comment promises."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from distill.experiments.run.spec import expand, load_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_committed_spec_loads_and_expands_as_its_header_says(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = load_spec(path)
    runs = expand(spec)
    assert runs and len({r.name for r in runs}) == len(runs)
    for run in runs:
        for base in run.base or spec.base or []:
            assert Path(base).is_file(), base
    promised = re.search(r"\b(\d+) runs\b", path.read_text())
    if promised:  # the header's run count is the grid's
        assert len(runs) == int(promised.group(1)), f"{path.name}: {len(runs)} runs"


def test_the_study_specs_set_what_their_checks_are_about(monkeypatch):
    monkeypatch.chdir(ROOT)
    stages = {r.name.split("/")[0]: r for r in expand(load_spec(ROOT / "experiments/tiny_robustness.yaml"))}
    assert set(stages) == {"no_clip", "topk", "longchain"}
    flat = {name: repr(run) for name, run in stages.items()}
    assert (
        "gradient_clip_val" in flat["no_clip"]
        and "top_k" in flat["topk"]
        and "longchain" in flat["longchain"]
    )

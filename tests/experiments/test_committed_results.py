"""The committed tiny-world v1 study (`experiments/results/tiny_grid_v1`) regenerates with `distill report`."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.experiments.report import main

RESULTS = Path(__file__).resolve().parents[2] / "experiments" / "results" / "tiny_grid_v1"


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no committed tiny_grid_v1 results")
def test_committed_report_regenerates_from_committed_files(tmp_path):
    runs = [p for p in RESULTS.iterdir() if (p / "metrics.json").is_file()]
    assert len(runs) == 60
    for run in runs:  # what the archive keeps, and nothing heavy
        assert {"config.yaml", "env.json", "metrics.json", "settings.json", "curves.csv"} <= {
            p.name for p in run.iterdir()
        }
        assert not (run / "checkpoints").exists() and not (run / "tensorboard").exists()
    out = tmp_path / "report"
    assert main([str(RESULTS), "--out", str(out)]) == 0
    committed = RESULTS / "report"
    assert (out / "runs.csv").read_text() == (committed / "runs.csv").read_text()
    regenerated = (out / "report.md").read_text().splitlines()
    expected = (committed / "report.md").read_text().splitlines()
    # Line 3 names the directory the report was read from; everything else must match exactly.
    assert regenerated[:2] + regenerated[3:] == expected[:2] + expected[3:]
    assert "No reference runs (start, teacher) in this sweep" in regenerated[4]  # it predates them
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted(
        p.name for p in (committed / "plots").iterdir()
    )

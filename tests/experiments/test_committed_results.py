"""Committed sweep archives regenerate with `distill report`: the tiny-world v1 study
(`experiments/results/tiny_grid_v1`), the v2 demo (`experiments/results/demo_v2`), the v2
run-length sizing (`experiments/results/v2_sizing`), the v2 study's main grid and style sweep
(`experiments/results/tiny_grid`, `tiny_style`) and the knowledge grid (`tiny_sci`), the v3
study's main grid, style sweep and knowledge grid (`v3_grid`, `v3_style`, `v3_sci`, each with
its verdict table); the staged archives (RLVR, robustness) below."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.experiments.report.report import main

ROOT = Path(__file__).resolve().parents[2] / "experiments" / "results"


@pytest.fixture(autouse=True)
def unrendered_plots(monkeypatch):
    """Every figure is still built and laid out, and its file named, but not rendered to PNG (two
    thirds of a report's time; these tests compare the plots' names, tests/experiments/test_report.py
    the rendered files)."""
    from distill.experiments.report import plots

    def save(fig, path):
        fig.tight_layout()
        path.write_bytes(b"")
        return path

    monkeypatch.setattr(plots, "_save", save)


@pytest.mark.parametrize(
    ("name", "n_runs", "references"),
    [
        ("tiny_grid_v1", 60, False),
        ("demo_v2", 4, True),
        ("v2_sizing", 2, True),
        ("tiny_grid", 60, True),
        ("tiny_style", 12, True),
        ("tiny_sci", 24, True),
        ("v3_grid", 72, True),
        ("v3_style", 16, True),
        ("v3_sci", 24, True),
    ],
)
def test_committed_report_regenerates_from_committed_files(tmp_path, name, n_runs, references):
    results = ROOT / name
    runs = [p for p in results.iterdir() if (p / "metrics.json").is_file()]
    assert len(runs) == n_runs
    for run in runs:  # what the archive keeps, and nothing heavy
        assert {"config.yaml", "env.json", "metrics.json", "settings.json", "curves.csv"} <= {
            p.name for p in run.iterdir()
        }
        assert not (run / "checkpoints").exists() and not (run / "tensorboard").exists()
    out = tmp_path / "report"
    assert main([str(results), "--out", str(out)]) == 0
    committed = results / "report"
    assert (out / "runs.csv").read_text() == (committed / "runs.csv").read_text()
    regenerated = (out / "report.md").read_text().splitlines()
    expected = (committed / "report.md").read_text().splitlines()
    # Line 3 names the directory the report was read from; everything else must match exactly.
    assert regenerated[:2] + regenerated[3:] == expected[:2] + expected[3:]
    # v1 predates reference runs; the v2 demo shows the start and the teacher as rows.
    assert ("No reference runs (start, teacher) in this sweep" in regenerated[4]) is not references
    assert ("| start (step 0) |" in "\n".join(regenerated)) is references
    assert sorted(p.name for p in (out / "plots").iterdir()) == sorted(
        p.name for p in (committed / "plots").iterdir()
    )
    _same_verdicts(out, committed)


def _same_verdicts(out: Path, committed: Path) -> None:
    """The verdict table (experiments/claims/v2.yaml, named by the archive's sweep.json) regenerates too."""
    for name in ("verdicts.md", "verdicts.json"):
        assert (out / name).is_file() == (committed / name).is_file()
        if (committed / name).is_file():
            assert (out / name).read_text() == (committed / name).read_text()


@pytest.mark.parametrize(
    ("name", "stages", "chained"),
    [
        ("tiny_rlvr", {"distill": 8, "grpo": 8}, True),
        ("tiny_robustness", {"no_clip": 12, "topk": 12, "longchain": 12}, False),
        ("v3_rlvr", {"distill": 16, "grpo": 16}, True),
        ("v3_robustness", {"no_clip": 8, "topk": 8, "longchain": 8}, False),
    ],
)
def test_committed_staged_report_regenerates(tmp_path, name, stages, chained):
    results = ROOT / name
    for stage, n_runs in stages.items():
        assert len([p for p in (results / stage).iterdir() if (p / "metrics.json").is_file()]) == n_runs
    out = tmp_path / "report"
    assert main([str(results), "--out", str(out)]) == 0
    committed = results / "report"
    assert (out / "report.md").read_text() == (committed / "report.md").read_text()
    for stage in stages:
        assert (out / stage / "runs.csv").read_text() == (committed / stage / "runs.csv").read_text()
        regenerated = (out / stage / "report.md").read_text().splitlines()
        expected = (committed / stage / "report.md").read_text().splitlines()
        assert regenerated[:2] + regenerated[3:] == expected[:2] + expected[3:]  # line 3: the directory read
    _same_verdicts(out, committed)
    top = (committed / "report.md").read_text()
    assert "## Verdicts: the declared claims" in top
    assert ("### mix=0 − mix=1 (on − off-policy) before and after" in top) is chained
    assert top.startswith(f"# Sweep report: {name} ({'chained stages' if chained else 'stages'})")


def test_robustness_comparison_pairs_each_stage_with_the_grid(capsys):
    """experiments/compare_robustness.py's paired shift (stage − grid at lr 1e-3, same mix,
    divergence and seed) equals the mean of the differences read straight from metrics.json."""
    import importlib.util
    import json
    import math

    path = ROOT.parent / "compare_robustness.py"
    spec = importlib.util.spec_from_file_location("compare_robustness", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([]) == 0
    out = capsys.readouterr().out

    def cells(directory, lr=None):
        found = {}
        for run in directory.iterdir():
            if not (run / "metrics.json").is_file():
                continue
            s = json.loads((run / "settings.json").read_text())["settings"]
            if lr is not None and not math.isclose(s["lr"], lr):
                continue
            key = (s["divergence"], float(s["mix"]), s["seed"])
            found[key] = json.loads((run / "metrics.json").read_text())["metrics"]["test/countdown3/accuracy"]
        return found

    grid = cells(ROOT / "tiny_grid", lr=1e-3)
    stage = cells(ROOT / "tiny_robustness" / "no_clip")
    assert len(stage) == 12 and set(stage) <= set(grid)
    shift = 100 * sum(stage[k] - grid[k] for k in stage) / len(stage)
    section = out.split("### `no_clip`")[1].split("###")[0]
    row = next(line for line in section.splitlines() if line.startswith("| C3 accuracy |"))
    assert row.split("|")[2].strip().startswith(f"{shift:+.1f} pp [")


def _script(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_domain_comparison_cuts_both_grids_to_the_shared_cells_and_pairs_runs(capsys):
    """experiments/compare_domains.py compares the knowledge grid with the Countdown grid on the
    cells both ran: the Countdown grid's mix 0.25/0.75 and lr 1e-4 runs are dropped, and the
    on − off-policy contrast it prints equals the mean paired difference read from metrics.json."""
    import json
    import math

    script = _script("compare_domains")

    def cells(directory, metric):
        found = {}
        for run in directory.iterdir():
            if (run / "metrics.json").is_file():
                s = json.loads((run / "settings.json").read_text())["settings"]
                key = (s["divergence"], float(s["mix"]), float(s["lr"]), s["seed"])
                found[key] = json.loads((run / "metrics.json").read_text())["metrics"][metric]
        return found

    countdown = cells(ROOT / "tiny_grid", "test/countdown3/accuracy")
    knowledge = cells(ROOT / "tiny_sci", "test/tinysci/accuracy")
    shared = set(countdown) & set(knowledge)
    assert script.main(["--n-boot", "50"]) == 0
    out = capsys.readouterr().out
    assert f"Countdown {len(shared)}, knowledge {len(shared)}." in out
    kept = script.common_cells(
        [script.finished(script.load_records(ROOT / d)) for d in ("tiny_grid", "tiny_sci")]
    )
    assert {float(r.settings["mix"]) for r in kept[0]} <= {0.0, 0.5, 1.0}
    assert not any(math.isclose(float(r.settings["lr"]), 1e-4) for r in kept[0])

    row = next(
        line
        for line in out.splitlines()
        if line.startswith("| trained task, accuracy | on − off-policy (mix 0 − 1), forward KL |")
    )
    for column, found in ((3, countdown), (4, knowledge)):
        pairs = [
            (found[("forward_kl", 0.0, lr, seed)], found[("forward_kl", 1.0, lr, seed)])
            for (div, mix, lr, seed) in shared
            if div == "forward_kl" and mix == 0.0 and ("forward_kl", 1.0, lr, seed) in shared
        ]
        if pairs:
            shift = 100 * sum(a - b for a, b in pairs) / len(pairs)
            assert row.split("|")[column].strip().startswith(f"{shift:+.1f} pp")
        else:
            assert row.split("|")[column].strip() == "—"

"""`distill sweep --archive DEST`: finished runs kept in DEST as they finish, and a sweep that
resumes from DEST alone (a fresh checkout, where the sweep directory is gone)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from distill.experiments import rundirs
from distill.experiments.sweep import main

NAMES = ["mix=0,seed=0", "mix=0,seed=1", "mix=0.5,seed=0", "mix=0.5,seed=1"]


def _calls(run_dir: Path) -> int:
    path = run_dir / "invocations.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _committable(dest: Path) -> set[str]:
    return {str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()}


def test_finished_runs_are_archived_and_a_fresh_checkout_runs_only_the_rest(
    grid_spec, fake_fit, tmp_path, monkeypatch, capsys
):
    dest = tmp_path / "results" / "grid"
    monkeypatch.setenv("FAKE_FIT_CRASH", "mix=0.5,seed=1")
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 1
    files = _committable(dest)
    assert "sweep.json" in files
    for name in NAMES[:3]:  # each finished run: its settings, overrides and finished metrics
        assert {f"{name}/settings.json", f"{name}/overrides.yaml", f"{name}/metrics.json"} <= files
        assert (dest / name / "metrics.json").read_bytes() == (
            tmp_path / "runs" / name / "metrics.json"
        ).read_bytes()
    assert not any(f.startswith(NAMES[3]) for f in files)  # the failed run is not archived
    assert not any("invocations" in f or "fit.log" in f for f in files)  # only the committable files

    shutil.rmtree(tmp_path / "runs")  # what a fresh checkout of the archive has
    monkeypatch.delenv("FAKE_FIT_CRASH")
    capsys.readouterr()
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 0
    out = capsys.readouterr().out
    assert f"3 run(s) already finished (3 of them in {dest}), skipped" in out
    assert [_calls(tmp_path / "runs" / name) for name in NAMES] == [0, 0, 0, 1]
    assert rundirs.is_finished(dest / NAMES[3])


def test_runs_finished_before_archiving_are_archived_at_the_start(grid_spec, fake_fit, tmp_path, capsys):
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 0
    dest = tmp_path / "archive"
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 0
    assert [_calls(tmp_path / "runs" / name) for name in NAMES] == [1, 1, 1, 1]  # nothing ran again
    assert all(rundirs.is_finished(dest / name) for name in NAMES)


def test_dry_run_counts_archived_runs_as_done(grid_spec, fake_fit, tmp_path, capsys):
    dest = tmp_path / "archive"
    assert main([str(grid_spec), "--only", NAMES[1], "--archive", str(dest)], fit_prefix=fake_fit) == 0
    shutil.rmtree(tmp_path / "runs")
    capsys.readouterr()
    assert main([str(grid_spec), "--dry-run", "--archive", str(dest)], fit_prefix=fake_fit) == 0
    captured = capsys.readouterr()
    assert [line.split()[:2] for line in captured.out.splitlines()] == [
        ["todo", NAMES[0]],
        ["done", NAMES[1]],
        ["todo", NAMES[2]],
        ["todo", NAMES[3]],
    ]
    assert "4 runs: 1 finished (skipped), 0 to resume, 3 to start" in captured.err


def test_an_archive_inside_the_sweep_or_of_another_sweep_is_refused_before_any_run(
    grid_spec, fake_fit, tmp_path, capsys
):
    assert main([str(grid_spec), "--archive", str(tmp_path / "runs" / "kept")], fit_prefix=fake_fit) == 2
    assert "must lie outside the sweep directory" in capsys.readouterr().err
    dest = tmp_path / "archive"
    (dest / "lr=1e-3").mkdir(parents=True)
    (dest / "lr=1e-3" / "settings.json").write_text("{}")
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 2
    err = capsys.readouterr().err
    assert "holds 1 runs that are not in" in err and "lr=1e-3" in err
    assert not (tmp_path / "runs").exists()  # nothing ran


def _chain(tmp_path: Path) -> Path:
    (tmp_path / "distill.yaml").write_text("trainer: {max_steps: 10}\ndata: {mix: 0.5, task: countdown3}\n")
    (tmp_path / "grpo.yaml").write_text("trainer: {max_steps: 5}\ndata: {mix: 0, task: countdown3}\n")
    spec = {
        "name": "chain",
        "out": str(tmp_path / "runs"),
        "references": False,
        "stages": [
            {"name": "distill", "base": str(tmp_path / "distill.yaml"), "axes": {"mix": [0, 0.5]}},
            {"name": "grpo", "after": "distill", "base": str(tmp_path / "grpo.yaml")},
        ],
    }
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_chained_run_still_to_run_gets_its_archived_parent_run_again(tmp_path, fake_fit, capsys):
    spec, dest, out = _chain(tmp_path), tmp_path / "archive", tmp_path / "runs"
    assert main([str(spec), "--archive", str(dest)], fit_prefix=fake_fit) == 0
    assert json.loads((dest / "grpo" / "sweep.json").read_text())["name"] == "chain/grpo"  # stage records too
    shutil.rmtree(out)
    shutil.rmtree(
        dest / "grpo" / "mix=0.5"
    )  # this chained run is to run again: it needs its parent's student
    assert main([str(spec), "--archive", str(dest)], fit_prefix=fake_fit) == 0
    assert _calls(out / "distill" / "mix=0.5") == 1 and _calls(out / "grpo" / "mix=0.5") == 1
    assert _calls(out / "distill" / "mix=0") == 0 and _calls(out / "grpo" / "mix=0") == 0
    assert rundirs.is_finished(dest / "grpo" / "mix=0.5")

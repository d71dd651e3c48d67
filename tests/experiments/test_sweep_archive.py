"""`distill sweep --archive DEST`: finished runs kept in DEST as they finish, and a sweep that
resumes from DEST alone (a fresh checkout, where the sweep directory is gone)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from distill.experiments.run import rundirs
from distill.experiments.run.sweep import main

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
    assert rundirs.run_state(dest / NAMES[3]).finished


def test_runs_finished_before_archiving_are_archived_at_the_start(grid_spec, fake_fit, tmp_path, capsys):
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 0
    dest = tmp_path / "archive"
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 0
    assert [_calls(tmp_path / "runs" / name) for name in NAMES] == [1, 1, 1, 1]  # nothing ran again
    assert all(rundirs.run_state(dest / name).finished for name in NAMES)


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
    assert rundirs.run_state(dest / "grpo" / "mix=0.5").finished


def test_an_archive_of_another_spec_or_base_config_is_refused(grid_spec, fake_fit, tmp_path, capsys):
    dest = tmp_path / "archive"
    assert main([str(grid_spec), "--only", NAMES[0], "--archive", str(dest)], fit_prefix=fake_fit) == 0
    base = tmp_path / "base.yaml"
    base.write_text(base.read_text().replace("task: countdown3", "task: countdown4"))  # same run names
    capsys.readouterr()
    assert (
        main([str(grid_spec), "--out", str(tmp_path / "other"), "--archive", str(dest)], fit_prefix=fake_fit)
        == 2
    )
    assert "holds sweep 'grid' of another spec or other base configs" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()
    record = json.loads((dest / "sweep.json").read_text())
    del record["fingerprint"]  # an archive written before sweeps were fingerprinted
    (dest / "sweep.json").write_text(json.dumps(record))
    base.write_text(base.read_text().replace("task: countdown4", "task: countdown3"))
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 2
    assert "written before sweeps were fingerprinted" in capsys.readouterr().err


def test_bad_destinations_and_emit_slurm_are_refused(grid_spec, fake_fit, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    assert main([str(grid_spec), "--archive", str(tmp_path / "a_file")], fit_prefix=fake_fit) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert main([str(grid_spec), "--archive", str(tmp_path)], fit_prefix=fake_fit) == 2  # holds the sweep
    assert "must lie outside the sweep directory" in capsys.readouterr().err
    args = [
        str(grid_spec),
        "--archive",
        str(tmp_path / "archive"),
        "--emit-slurm",
        str(tmp_path / "a.sbatch"),
    ]
    assert main(args, fit_prefix=fake_fit) == 2
    assert "not --emit-slurm" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "a.sbatch").exists()


def test_a_diverged_run_is_archived_when_it_stops(grid_spec, fake_fit, tmp_path, monkeypatch, capsys):
    dest = tmp_path / "archive"
    monkeypatch.setenv("FAKE_FIT_DIVERGE", NAMES[2])
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 1
    assert "DIVERGED" in capsys.readouterr().out
    assert json.loads((dest / NAMES[2] / "metrics.json").read_text())["status"] == "diverged"
    assert all(rundirs.run_state(dest / name).finished for name in NAMES if name != NAMES[2])


def test_a_copy_cut_short_never_reads_as_done_and_the_next_start_completes_it(
    grid_spec, fake_fit, tmp_path, monkeypatch, capsys
):
    from distill.experiments.run import archive as archive_module

    dest = tmp_path / "archive"
    real = archive_module.shutil.copyfile

    def fail_on_metrics(src, dst):
        if Path(src).name == "metrics.json":
            raise OSError("disk full")
        return real(src, dst)

    monkeypatch.setattr(archive_module.shutil, "copyfile", fail_on_metrics)
    assert main([str(grid_spec), "--only", NAMES[0], "--archive", str(dest)], fit_prefix=fake_fit) == 0
    assert "could not archive mix=0,seed=0" in capsys.readouterr().out
    assert (dest / NAMES[0] / "settings.json").is_file() and not rundirs.run_state(dest / NAMES[0]).done
    monkeypatch.undo()
    assert main([str(grid_spec), "--only", NAMES[0], "--archive", str(dest)], fit_prefix=fake_fit) == 0
    assert _calls(tmp_path / "runs" / NAMES[0]) == 1 and rundirs.run_state(dest / NAMES[0]).finished


def test_report_archive_after_a_fresh_clone_keeps_what_the_archive_holds(
    grid_spec, fake_fit, tmp_path, capsys
):
    from distill.experiments.report.report import main as report

    dest = tmp_path / "archive"
    assert main([str(grid_spec), "--archive", str(dest)], fit_prefix=fake_fit) == 0
    shutil.rmtree(tmp_path / "runs")  # a fresh clone, where one run was then started again and cut short
    partial = tmp_path / "runs" / NAMES[1]
    partial.mkdir(parents=True)
    (partial / "settings.json").write_text((dest / NAMES[1] / "settings.json").read_text())
    shutil.copyfile(dest / "sweep.json", tmp_path / "runs" / "sweep.json")
    assert report([str(tmp_path / "runs"), "--archive", str(dest), "--no-plots", "--n-boot", "10"]) == 0
    assert all(
        rundirs.run_state(dest / name).finished for name in NAMES
    )  # nothing replaced by the partial run
    from_sweep = (dest / "report" / "report.md").read_text().splitlines()
    # the same report as one from an archive written in one go by `distill report SWEEP --archive`
    assert main([str(grid_spec), "--out", str(tmp_path / "again")], fit_prefix=fake_fit) == 0
    assert (
        report([str(tmp_path / "again"), "--archive", str(tmp_path / "a2"), "--no-plots", "--n-boot", "10"])
        == 0
    )
    in_one_go = (tmp_path / "a2" / "report" / "report.md").read_text().splitlines()
    assert from_sweep[:2] + from_sweep[3:] == in_one_go[:2] + in_one_go[3:]


def test_archive_run_writes_the_done_marker_last(tmp_path, monkeypatch):
    from distill.experiments.run import archive as archive_module

    run = tmp_path / "sweep" / "lr=1e-3"
    (run / "tensorboard").mkdir(parents=True)
    (run / "settings.json").write_text('{"settings": {"lr": 0.001}}')
    (run / "metrics.json").write_text('{"status": "finished", "metrics": {}}')

    def cut(run_dir, path):
        Path(path).write_text("tag,step,value\n")  # half written, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(archive_module, "write_curves", cut)
    try:
        archive_module.archive_run(tmp_path / "sweep", run, tmp_path / "dest")
    except KeyboardInterrupt:
        pass
    target = tmp_path / "dest" / "lr=1e-3"
    assert (target / "settings.json").is_file()
    assert not rundirs.run_state(target).done and not (target / "curves.csv").exists()
    monkeypatch.undo()
    archive_module.archive_run(tmp_path / "sweep", run, tmp_path / "dest")
    assert rundirs.run_state(target).finished and (target / "curves.csv").read_text().startswith(
        "tag,step,value"
    )


@pytest.mark.parametrize("name", ["v3_grid", "v3_rlvr", "v3_robustness", "v3_style", "v3_sci"])
def test_the_v3_archives_carry_their_specs_fingerprint(name):
    """`make sweep-v3-*` resumes into its committed archive only while the archive's fingerprint is
    the spec's (`check_destination`); a change to a base config or the spec must restamp it."""
    from distill.experiments.run.spec import load_spec
    from distill.experiments.run.sweep_record import read_sweep_record, spec_fingerprint

    root = Path(__file__).resolve().parents[2]
    recorded = read_sweep_record(root / "experiments" / "results" / name)
    assert recorded["fingerprint"] == spec_fingerprint(load_spec(root / "experiments" / f"{name}.yaml"))

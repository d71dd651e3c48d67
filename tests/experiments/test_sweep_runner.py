"""`distill sweep`: dry run, parallel runs, failures, and resuming after a kill (with a fake fit)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from distill.experiments.run import rundirs
from distill.experiments.run.sweep import main

NAMES = ["mix=0,seed=0", "mix=0,seed=1", "mix=0.5,seed=0", "mix=0.5,seed=1"]


def _invocations(run_dir: Path) -> list[dict]:
    path = run_dir / "invocations.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_dry_run_lists_one_run_a_line_and_runs_nothing(grid_spec, fake_fit, capsys, tmp_path):
    assert main([str(grid_spec), "--dry-run"], fit_prefix=fake_fit) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line, name in zip(lines, NAMES):
        state, got, command = line.split(maxsplit=2)
        run_dir = tmp_path / "runs" / name
        assert (state, got) == ("todo", name)
        assert shlex.split(command) == [
            *fake_fit,
            "--config", str(tmp_path / "base.yaml"),
            "--config", str(run_dir / "overrides.yaml"),
            "--run_dir", str(run_dir),
        ]  # fmt: skip
    assert not (tmp_path / "runs").exists()


def test_default_prefix_is_this_python_running_distill_fit(grid_spec, capsys):
    assert main([str(grid_spec), "--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0].split(maxsplit=2)[2]
    assert shlex.split(first)[:4] == [sys.executable, "-m", "distill.cli", "fit"]


def test_two_jobs_run_everything_in_parallel(grid_spec, fake_fit, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FIT_SLEEP", "0.6")
    assert main([str(grid_spec), "--jobs", "2"], fit_prefix=fake_fit) == 0
    out = capsys.readouterr().out
    assert "[sweep] 4/4 done, 0 running, 0 left, 0 failed" in out
    assert "left (until " in out  # an estimate once the first run has finished
    status = json.loads((tmp_path / "runs" / "status.json").read_text())
    assert (status["state"], status["done"], status["left"], status["running"]) == ("ended", 4, 0, 0)
    assert status["mean_run_seconds"]["fit"] >= 0.6
    spans = []
    for name, mix in zip(NAMES, [0, 0, 0.5, 0.5]):
        run_dir = tmp_path / "runs" / name
        (call,) = _invocations(run_dir)
        spans.append((call["start"], call["end"]))
        assert call["cache"] == str(tmp_path / "runs" / "rollout_cache")
        metrics = json.loads((run_dir / "metrics.json").read_text())
        # the composed config: base, then the sweep's fixed overrides, then the axis values
        assert metrics["config"]["trainer"]["max_steps"] == 60
        assert metrics["config"]["data"] == {"mix": mix, "task": "countdown3"}
        assert metrics["config"]["seed_everything"] == int(name[-1])
        assert json.loads((run_dir / "settings.json").read_text())["settings"] == {
            "mix": mix,
            "seed": int(name[-1]),
        }
        assert "fake fit of" in (run_dir / "fit.log").read_text()
    overlapping = sum(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(spans) for b in spans[i + 1 :])
    assert overlapping >= 2  # two at a time: 4 runs of 0.6 s give at least two overlapping pairs
    record = json.loads((tmp_path / "runs" / "sweep.json").read_text())
    assert record["runs"] == NAMES and record["axes"] == {"mix": [0, 0.5], "seed": [0, 1]}


def test_a_failed_run_is_reported_and_the_sweep_goes_on(grid_spec, fake_fit, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FIT_CRASH", "mix=0,seed=1")
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 1
    out = capsys.readouterr().out
    log = tmp_path / "runs" / "mix=0,seed=1" / "fit.log"
    why = "exit code 3; failed at step 2: RuntimeError: boom; no checkpoint: it starts again"
    assert f"FAILED mix=0,seed=1 ({why}); log: {log}" in out
    assert "3 finished now, 0 skipped (finished before), 1 failed" in out
    status = json.loads((tmp_path / "runs" / "status.json").read_text())
    assert status["ended_by_state"] == {"failed": 1, "finished": 3}
    assert "boom" in log.read_text()
    assert [rundirs.run_state(tmp_path / "runs" / n).finished for n in NAMES] == [True, False, True, True]


def test_resume_skips_finished_and_redoes_partial_runs(grid_spec, fake_fit, tmp_path, capsys):
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 0
    runs = tmp_path / "runs"
    untouched, no_metrics, truncated, with_ckpt = (runs / n for n in NAMES)
    # simulate a kill: one run never wrote metrics.json, one wrote half of it, one left last.ckpt
    (no_metrics / "metrics.json").unlink()
    (no_metrics / "tensorboard").mkdir()
    (no_metrics / "tensorboard" / "events.out.tfevents.partial").write_text("x")
    (truncated / "metrics.json").write_text('{"status": "finish')
    (with_ckpt / "metrics.json").write_text(json.dumps({"status": "running"}))
    (with_ckpt / "checkpoints").mkdir()
    (with_ckpt / "checkpoints" / "last.ckpt").write_text("weights")
    before = (untouched / "metrics.json").stat().st_mtime_ns
    capsys.readouterr()

    assert main([str(grid_spec), "--dry-run"], fit_prefix=fake_fit) == 0
    states = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert states == ["done", "todo", "todo", "resume"]

    time.sleep(0.01)
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 0
    assert "1 skipped (finished before)" in capsys.readouterr().out
    assert (untouched / "metrics.json").stat().st_mtime_ns == before
    assert len(_invocations(untouched)) == 1
    assert not (no_metrics / "tensorboard").exists()
    assert len(_invocations(no_metrics)) == 1  # cleared, then run afresh
    assert len(_invocations(truncated)) == 1
    calls = _invocations(with_ckpt)
    assert len(calls) == 2 and calls[0]["ckpt"] is None
    assert calls[1]["ckpt"] == str(with_ckpt / "checkpoints" / "last.ckpt")
    assert (with_ckpt / "checkpoints" / "last.ckpt").read_text() == "weights"
    assert all(rundirs.run_state(runs / n).finished for n in NAMES)
    overrides = yaml.safe_load((truncated / "overrides.yaml").read_text())
    assert overrides == {"trainer": {"max_steps": 60}, "data": {"mix": 0.5}, "seed_everything": 0}


def test_prepare_refuses_to_touch_a_finished_run(grid_spec, fake_fit, tmp_path):
    from distill.experiments.run.spec import expand, load_spec

    run = expand(load_spec(grid_spec))[0]
    run.run_dir.mkdir(parents=True)
    (run.run_dir / "metrics.json").write_text(json.dumps({"status": "finished", "metrics": {}}))
    try:
        rundirs.prepare_run_dir(run, "grid")
    except ValueError as err:
        assert "never rewritten" in str(err)
    else:
        raise AssertionError("prepare_run_dir rewrote a finished run")
    assert sorted(p.name for p in run.run_dir.iterdir()) == ["metrics.json"]


def test_killed_sweep_process_stops_its_fits_and_resumes(grid_spec, fake_fit, tmp_path):
    cmd = [sys.executable, "-m", "distill.cli", "sweep", str(grid_spec), "--fit-prefix", shlex.join(fake_fit)]
    env = dict(os.environ, FAKE_FIT_SLEEP="0.8")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = tmp_path / "runs" / NAMES[0] / "metrics.json"
    deadline = time.time() + 30
    while not first.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the second fit is now mid-way
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "Rerun the same command to resume" in output
    time.sleep(1.0)  # an orphaned fit would finish within this
    finished = [rundirs.run_state(tmp_path / "runs" / n).finished for n in NAMES]
    assert finished == [True, False, False, False]  # the fit in flight was stopped with the sweep
    mtime = first.stat().st_mtime_ns
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(rundirs.run_state(tmp_path / "runs" / n).finished for n in NAMES)
    assert first.stat().st_mtime_ns == mtime
    assert len(_invocations(tmp_path / "runs" / NAMES[0])) == 1


def test_bad_spec_fails_before_anything_runs(tmp_path, fake_fit, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text(f"name: bad\nbase: b.yaml\nout: {tmp_path / 'runs'}\naxes: {{divergence: [fkl]}}\n")
    assert main([str(spec)], fit_prefix=fake_fit) == 2
    assert "unknown value 'fkl'; allowed: forward_kl" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    assert main([str(spec), "--jobs", "0"]) == 2


def test_only_runs_the_named_run(grid_spec, fake_fit, tmp_path, capsys):
    assert main([str(grid_spec), "--only", NAMES[2]], fit_prefix=fake_fit) == 0
    assert [rundirs.run_state(tmp_path / "runs" / n).finished for n in NAMES] == [False, False, True, False]
    assert main([str(grid_spec), "--only", "mix=9"], fit_prefix=fake_fit) == 2
    assert "no run named mix=9" in capsys.readouterr().err


def test_children_share_the_cores_unless_told_otherwise(tmp_path, monkeypatch):
    from distill.experiments.run.sweep import ROLLOUT_CACHE_ENV, child_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert child_env(tmp_path, jobs=2, cpus=2)["OMP_NUM_THREADS"] == "1"
    assert child_env(tmp_path, jobs=1, cpus=8)["OMP_NUM_THREADS"] == "8"
    assert child_env(tmp_path, jobs=16, cpus=2)["OMP_NUM_THREADS"] == "1"
    assert child_env(tmp_path, jobs=2, cpus=2)[ROLLOUT_CACHE_ENV] == str(tmp_path / "rollout_cache")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_env(tmp_path, jobs=2, cpus=2)["OMP_NUM_THREADS"] == "3"


def test_devices_give_each_running_fit_its_own_gpus(grid_spec, fake_fit, tmp_path, monkeypatch, capsys):
    """--devices 0,1,2,3 --jobs 2: every fit starts with CUDA_VISIBLE_DEVICES 0,1 or 2,3, and two
    fits that run at the same time never hold the same group."""
    monkeypatch.setenv("FAKE_FIT_SLEEP", "0.6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")  # the sweep's own value must not leak through
    assert main([str(grid_spec), "--jobs", "2", "--devices", "0,1,2,3"], fit_prefix=fake_fit) == 0
    calls = [call for name in NAMES for call in _invocations(tmp_path / "runs" / name)]
    assert len(calls) == 4 and {c["gpus"] for c in calls} == {"0,1", "2,3"}
    overlapping = [
        (a, b)
        for i, a in enumerate(calls)
        for b in calls[i + 1 :]
        if a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping and all(a["gpus"] != b["gpus"] for a, b in overlapping)


def test_devices_must_split_evenly_over_jobs(grid_spec, fake_fit, tmp_path, capsys):
    assert main([str(grid_spec), "--jobs", "3", "--devices", "0,1,2,3"], fit_prefix=fake_fit) == 2
    err = capsys.readouterr().err
    assert "--devices: 4 GPU(s) (0,1,2,3) do not split evenly over --jobs 3" in err
    assert not (tmp_path / "runs").exists()  # nothing ran
    assert main([str(grid_spec), "--devices", "0,0"], fit_prefix=fake_fit) == 2
    assert "--devices must be distinct GPU ids >= 0 separated by commas, got '0,0'" in capsys.readouterr().err


def test_a_tiny_world_not_installed_fails_before_any_run(grid_spec, fake_fit, tmp_path, monkeypatch, capsys):
    """A sweep on a fresh machine names the missing model once, with the command that installs it,
    and launches nothing (it used to fail every run in turn); a model an override names counts too."""
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path / "empty-cache"))
    base = tmp_path / "base.yaml"
    base.write_text(base.read_text() + "model: {init_args: {student: tiny-world:student}}\n")
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 2
    err = capsys.readouterr().err
    assert f"{base}: model.init_args.student: no model directory at" in err
    assert "tiny-world-v3/student" in err and "(run `distill tiny-world` first)" in err
    assert not (tmp_path / "runs").exists()
    # installed (a config.json is all the check reads besides weight headers): the override's model next
    (tmp_path / "empty-cache" / "tiny-world-v3" / "student").mkdir(parents=True)
    (tmp_path / "empty-cache" / "tiny-world-v3" / "student" / "config.json").write_text("{}")
    grid_spec.write_text(
        grid_spec.read_text().replace(
            "trainer.max_steps: 60", "trainer.max_steps: 60, model.init_args.teacher: tiny-world-v2:teacher"
        )
    )
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 2
    err = capsys.readouterr().err
    assert "mix=0,seed=0: model.teacher: no model directory at" in err
    assert "(run `distill tiny-world --version v2` first)" in err
    assert main([str(grid_spec), "--dry-run"], fit_prefix=fake_fit) == 0  # a dry run only lists

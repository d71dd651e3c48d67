"""A run's status record (`distill.run_status`) and a launched rank's death with its launcher
(`distill.stopping`); the fits that write them are in tests/faults/test_kill_resume.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distill import run_status

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def fresh_attempt(monkeypatch):
    monkeypatch.setenv(run_status.ATTEMPT_ENV, "attempt-a")


def test_the_first_failure_of_an_attempt_stays_and_a_new_attempt_replaces_it(tmp_path, monkeypatch):
    assert run_status.write(tmp_path, "running")
    assert run_status.write(tmp_path, "failed", reason="ValueError: bad row\n  more", rank=1, step=4)
    # rank 0's consequence of rank 1's failure does not replace the cause
    assert not run_status.write(tmp_path, "failed", reason="RuntimeError: Connection closed by peer", step=4)
    record = run_status.read(tmp_path)
    assert (record["state"], record["rank"], record["reason"]) == ("failed", 1, "ValueError: bad row")
    monkeypatch.setenv(run_status.ATTEMPT_ENV, "attempt-b")
    assert run_status.write(tmp_path, "interrupted", reason="SIGTERM", step=6)
    assert run_status.read(tmp_path)["state"] == "interrupted"
    assert run_status.write(tmp_path, "finished", step=10)  # a finish always replaces


def test_describe_says_state_step_rank_reason_and_where_a_resume_starts(tmp_path):
    run_status.write(
        tmp_path,
        "failed",
        reason="ValueError: x",
        rank=1,
        step=12,
        resume_from={"path": "checkpoints/last.ckpt", "step": 10},
    )
    assert run_status.describe(run_status.read(tmp_path)) == (
        "failed at step 12 on rank 1: ValueError: x; resumes from checkpoints/last.ckpt (step 10)"
    )
    run_status.write(tmp_path, "running")
    run_status.write(tmp_path, "interrupted", reason="SIGINT (KeyboardInterrupt)", step=0)
    assert run_status.describe(run_status.read(tmp_path)) == (
        "interrupted at step 0: SIGINT (KeyboardInterrupt); no checkpoint: it starts again"
    )


def test_a_running_record_whose_process_is_gone_reads_as_killed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_status.write(tmp_path, "running")
    record = json.loads((tmp_path / run_status.STATUS).read_text())
    assert run_status.effective_state(record) == "running"  # this process
    record["pid"] = dead.pid
    assert run_status.effective_state(record) == "killed"
    assert run_status.describe(record).startswith(f"killed (process {dead.pid} ended without a record")


def test_an_unwritable_run_directory_is_said_not_raised(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("not a directory")
    assert not run_status.write(target, "failed", reason="OSError: No space left on device")
    assert "could not write" in capsys.readouterr().err
    with pytest.raises(ValueError, match="state must be one of"):
        run_status.write(tmp_path, "crashed")


def test_a_launched_rank_ends_within_seconds_of_its_launcher_saying_why(tmp_path):
    """A process marked as rank 1 of a launch (LOCAL_RANK, the launcher's pid) asks for the
    parent-death signal; its launcher is SIGKILLed; it writes its record and exits at once."""
    child = textwrap.dedent(
        f"""
        import time
        from types import SimpleNamespace
        from distill.stopping import StopOnSignal, begin_launch
        begin_launch()
        stop = StopOnSignal({str(tmp_path)!r}, None, grace_s=600)
        stop.on_train_start(SimpleNamespace(global_rank=1, global_step=3), None)
        print("ready", flush=True)
        time.sleep(120)
        """
    )
    launcher = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = {{**os.environ, "LOCAL_RANK": "1", "DISTILL_LAUNCHER_PID": str(os.getpid())}}
        proc = subprocess.Popen([sys.executable, "-c", {child!r}], env=env, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        print(proc.pid, flush=True)
        time.sleep(120)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOCAL_RANK", None)
    parent = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, env=env)
    rank_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and run_status._alive(rank_pid):
        time.sleep(0.1)
    alive = run_status._alive(rank_pid)
    if alive:
        os.kill(rank_pid, signal.SIGKILL)
    assert not alive, "the launched rank outlived its launcher by 15 s"
    record = run_status.read(tmp_path)
    assert (record["state"], record["rank"], record["step"]) == ("interrupted", 1, 3)
    assert (
        record["reason"].startswith("SIGTERM: the launching process ")
        and "(rank 0) has ended" in record["reason"]
    )


def test_a_report_says_how_an_unfinished_run_ended(tmp_path):
    from distill.experiments.run.records import run_problem

    assert run_problem(tmp_path, None) == "unfinished"
    run_status.write(tmp_path, "running")
    assert run_problem(tmp_path, None) == "unfinished"  # still running (this process)
    resume = {"path": "checkpoints/last.ckpt", "step": 4}
    run_status.write(tmp_path, "interrupted", reason="SIGTERM: stopped", step=4, resume_from=resume)
    assert run_problem(tmp_path, None) == (
        "unfinished: interrupted at step 4: SIGTERM: stopped; resumes from checkpoints/last.ckpt (step 4)"
    )


def test_rank_0s_line_names_the_rank_that_failed_first_with_its_error(tmp_path, capsys):
    """Rank 1 failed first and wrote its record; rank 0 then fails on the closed connection: its
    line names rank 1 and rank 1's error, and it ends the rank it launched."""
    from types import SimpleNamespace

    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

    from distill.parallel import end_launched_ranks

    launcher = _SubprocessScriptLauncher(LightningEnvironment(), num_processes=2, num_nodes=1)
    launcher.procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])]
    run_status.write(tmp_path, "failed", reason="ValueError: a bad row on rank 1", rank=1, step=3)
    trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=launcher))
    try:
        end_launched_ranks(trainer, RuntimeError("Connection closed by peer"), tmp_path)
        assert launcher.procs[0].wait(timeout=10) == -signal.SIGKILL
    finally:
        launcher.procs[0].kill()
    assert capsys.readouterr().err == (
        "distill: rank 1 failed (ValueError: a bad row on rank 1); ending the 1 rank(s) rank 0 launched\n"
    )

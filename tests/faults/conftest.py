"""Shared by the fault-injection tests: another process that holds a run-directory lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hold_lock():
    """`hold_lock(dir)` starts a process that takes `RunLock(dir)` and sleeps; returns it once the
    lock is held. Every holder is killed (SIGKILL) at teardown."""
    holders: list[subprocess.Popen] = []

    def start(directory: Path) -> subprocess.Popen:
        code = (
            "from distill.rundir import RunLock; import time; "
            f"RunLock({str(directory)!r}).acquire(); print('held', flush=True); time.sleep(120)"
        )
        holder = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        holders.append(holder)
        assert holder.stdout.readline().strip() == "held"
        return holder

    yield start
    for holder in holders:
        holder.kill()
        holder.wait()

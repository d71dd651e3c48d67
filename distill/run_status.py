"""A run's status record: `status.json` in its run directory says what state the fit is in and, for
one that ended unfinished, why, on which rank, at which step, and from which checkpoint it resumes.

    {"state": "failed", "reason": "ValueError: ...", "rank": 1, "step": 12,
     "resume_from": {"path": "checkpoints/last.ckpt", "step": 10}, "attempt": "...", "pid": 4242, ...}

States: `running` (written when a fit starts), `finished`, `diverged` (the non-finite guard stopped
it), `failed` (an exception), `interrupted` (a signal: SIGTERM, SIGINT, the launcher's death).
`metrics.json` stays the record of results (a sweep reads `finished` there); this file is the record
of how the last attempt ended, for a person, `distill sweep` and `distill report`. A `running`
record whose process is gone (same host) reads as `killed`: nothing could write (SIGKILL, a power
cut, the OOM killer).

Under DDP the first rank to fail writes the record of its attempt and later ones leave it: the
first error is the cause; the others' (a peer's connection closed) are its consequences.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from distill.runinfo import write_json_atomic

STATUS = "status.json"
STATES = ("running", "finished", "diverged", "failed", "interrupted")
UNFINISHED = ("diverged", "failed", "interrupted")
ATTEMPT_ENV = "DISTILL_ATTEMPT"


def attempt_id() -> str:
    """An id shared by every rank of one launch: distill's own (set by the first process of a
    launch and inherited by the ranks Lightning starts), torchrun's run id or SLURM's step, else
    this process's."""
    for key in (ATTEMPT_ENV, "TORCHELASTIC_RUN_ID"):
        if os.environ.get(key):
            return os.environ[key]
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', 'batch')}"
    os.environ[ATTEMPT_ENV] = f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"
    return os.environ[ATTEMPT_ENV]


def read(run_dir: str | Path) -> dict | None:
    try:
        record = json.loads((Path(run_dir) / STATUS).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("state") in STATES else None


def write(
    run_dir: str | Path,
    state: str,
    *,
    reason: str | None = None,
    rank: int = 0,
    step: int | None = None,
    resume_from: dict | None = None,
) -> bool:
    """Write the record (atomically); an unfinished state does not replace the record another rank
    of the same attempt wrote first. Returns whether it wrote. Never raises for a disk that cannot
    take it (a full disk is a common reason to be here): says so on stderr instead."""
    if state not in STATES:
        raise ValueError(f"state must be one of {STATES}, got {state!r}")
    attempt = attempt_id()
    if state in UNFINISHED:
        old = read(run_dir)
        if old is not None and old.get("attempt") == attempt and old["state"] in UNFINISHED:
            return False
    record = {
        "state": state,
        "reason": None if reason is None else one_line(reason),
        "rank": rank,
        "step": step,
        "resume_from": resume_from,
        "attempt": attempt,
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    try:
        write_json_atomic(Path(run_dir) / STATUS, record)
    except OSError as err:
        import sys

        print(f"distill: could not write {Path(run_dir) / STATUS} ({err})", file=sys.stderr)
        return False
    return True


def one_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of `text`, at most `limit` characters."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def error_reason(err: BaseException) -> str:
    return one_line(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def effective_state(record: dict | None) -> str | None:
    """The record's state, `killed` for a `running` record whose process (on this host) is gone."""
    if record is None:
        return None
    state = record["state"]
    if state == "running" and record.get("host") == socket.gethostname() and not _alive(int(record["pid"])):
        return "killed"
    return state


def describe(record: dict | None) -> str | None:
    """One line for a person: "failed at step 12 on rank 1: ValueError: ...; resumes from
    checkpoints/last.ckpt (step 10)". None without a record."""
    state = effective_state(record)
    if state is None:
        return None
    if state == "killed":
        return f"killed (process {record['pid']} ended without a record: SIGKILL, out of memory, a crash)"
    text = state
    if record.get("step") is not None:
        text += f" at step {record['step']}"
    if record.get("rank"):
        text += f" on rank {record['rank']}"
    if record.get("reason"):
        text += f": {record['reason']}"
    resume = record.get("resume_from")
    if state in UNFINISHED and state != "diverged":
        text += (
            f"; resumes from {resume['path']} (step {resume['step']})"
            if resume
            else "; no checkpoint: it starts again"
        )
    return text

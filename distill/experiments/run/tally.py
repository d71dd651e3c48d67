"""What a running sweep has recorded: its result, its status (line and `status.json`), and the
finished runs it archives."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from distill import run_status
from distill.experiments.run import references, rundirs
from distill.experiments.run.archive import archive_run, archived
from distill.experiments.run.spec import Run, SweepSpec
from distill.rundir import read_metrics
from distill.runinfo import write_text_atomic


@dataclass
class SweepResult:
    skipped: list[str] = field(default_factory=list)  # already finished before this invocation
    finished: list[str] = field(default_factory=list)
    failed: list[tuple[str, int, Path]] = field(default_factory=list)  # name, exit code, log


class Progress:
    """The sweep's status: done / running / left / failed and, once a run has finished, the time
    left. One line rewritten in place on a terminal (a line per change otherwise), and the same
    figures in `status_path` (JSON, rewritten atomically) for another shell to read.

    The time left comes from the durations of the runs finished in this invocation, by kind (a
    reference's `distill test` is much shorter than a fit): each pending run takes the mean of its
    kind, a running run what is left of that mean, and the runs are dealt out to `jobs` slots in
    order, as the sweep does (chained runs waiting for a parent are not modelled)."""

    REFRESH_S = 10.0  # `tick` rewrites the status this often between events

    def __init__(
        self,
        total: int,
        stream: TextIO,
        jobs: int = 1,
        status_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.stream, self.jobs = total, stream, jobs
        self.status_path, self.clock = status_path, clock
        self.done = self.failed = 0
        self.states: dict[str, int] = {}  # how the runs that ended here ended, by state
        self.tty = stream.isatty()
        self.started: dict[str, tuple[str, float]] = {}  # running run -> (kind, start)
        self.durations: dict[str, list[float]] = {}  # kind -> seconds of each run finished here
        self.pending_kinds: list[str] = []  # the kind of each run not started yet, in order
        self.shown = -float("inf")
        self.state = "running"

    @property
    def running(self) -> int:
        return len(self.started)

    def begin(self, name: str, kind: str = "fit") -> None:
        if kind in self.pending_kinds:
            self.pending_kinds.remove(kind)
        self.started[name] = (kind, self.clock())
        self.show()

    def end(self, name: str, finished: bool) -> None:
        """A run exited; a `finished` one's duration joins the estimate."""
        kind, start = self.started.pop(name)
        if finished:
            self.durations.setdefault(kind, []).append(self.clock() - start)

    def _mean(self, kind: str) -> float | None:
        same = self.durations.get(kind)
        every = [d for ds in self.durations.values() for d in ds]
        chosen = same or every
        return sum(chosen) / len(chosen) if chosen else None

    def seconds_left(self) -> float | None:
        """The estimated seconds until every run has ended; None before any run has finished."""
        if not self.durations:
            return None
        now = self.clock()
        slots = sorted(max(0.0, self._mean(kind) - (now - start)) for kind, start in self.started.values())
        slots += [0.0] * max(0, self.jobs - len(slots))
        left = self.total - self.done - self.running - self.failed
        kinds = self.pending_kinds[-left:] if left else []
        kinds = ["fit"] * (left - len(kinds)) + kinds  # runs nobody named a kind for are fits
        for kind in kinds:
            slots.sort()
            slots[0] += self._mean(kind)
        return max(slots, default=0.0)

    def figures(self) -> dict:
        left = self.total - self.done - self.running - self.failed
        eta = self.seconds_left()
        return {
            "state": self.state,  # "ended" once the sweep process stops (a rerun resumes)
            "total": self.total,
            "done": self.done,
            "running": self.running,
            "left": left,
            "failed": self.failed,
            # finished / diverged / failed / interrupted / killed (each run's status record), and
            # blocked: never started (its parent did not finish, another process held it)
            "ended_by_state": dict(sorted(self.states.items())),
            "seconds_left": None if eta is None else round(eta),
            "finish_at": None if eta is None else _clock_time(time.time() + eta),
            "running_runs": sorted(self.started),
            "mean_run_seconds": {k: round(sum(d) / len(d), 1) for k, d in sorted(self.durations.items())},
            "updated": _clock_time(time.time()),
        }

    def show(self) -> None:
        f = self.figures()
        line = f"[sweep] {f['done']}/{f['total']} done, {f['running']} running, {f['left']} left, {f['failed']} failed"
        if f["seconds_left"] is not None and (f["left"] or f["running"]):
            line += f", about {_duration(f['seconds_left'])} left (until {f['finish_at'][11:16]})"
        self.stream.write(f"\r{line}\033[K" if self.tty else line + "\n")
        self.stream.flush()
        self._write(f)

    def tick(self) -> None:
        """Between events: refresh the status file (and a terminal's line) every `REFRESH_S`."""
        if self.clock() - self.shown < self.REFRESH_S:
            return
        self.shown = self.clock()
        if self.tty:
            self.show()
        else:
            self._write(self.figures())

    def _write(self, figures: dict) -> None:
        self.shown = self.clock()
        if self.status_path is None:
            return
        write_text_atomic(self.status_path, json.dumps(figures, indent=1) + "\n")

    def message(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.show()

    def close(self) -> None:
        self.state = "ended"
        self._write(self.figures())
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{round(seconds)} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(1, minutes)} min"


def _clock_time(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


@dataclass
class Tally:
    """What a sweep invocation has recorded so far: the result, the status line, and the run
    directories that will not finish in it (failed or blocked)."""

    result: SweepResult
    progress: Progress
    lost: set[Path] = field(default_factory=set)
    keep: Callable[[Run], None] | None = None  # archives a done run (`--archive`)

    def fail(self, run: Run, code: int, log: Path, message: str, blocked: bool = True) -> None:
        """A run that will not finish in this invocation: `blocked` (never started: its parent did
        not finish, another process holds it) or ended unfinished (`exited` counted its state)."""
        if blocked:
            self.progress.states["blocked"] = self.progress.states.get("blocked", 0) + 1
        self.lost.add(run.run_dir)
        self.result.failed.append((run.name, code, log))
        self.progress.failed += 1
        self.progress.message(message)

    def exited(self, run: Run, code: int, log_path: Path) -> None:
        """Record a fit (or a reference's test) that exited with `code`."""
        finished = code == 0 and rundirs.run_state(run).done
        self.progress.end(run.name, finished)
        state = rundirs.run_state(run).status if finished else None
        if state is None:
            state = run_status.effective_state(run_status.read(run.run_dir)) or "failed"
            state = "failed" if state in ("running", "finished") else state  # it exited, unfinished
        self.progress.states[state] = self.progress.states.get(state, 0) + 1
        if finished:
            self.result.finished.append(run.name)
            self.progress.done += 1
            if self.keep is not None:
                self.keep(run)
            self.progress.show()
            return
        if code == 0:  # exited cleanly but never wrote a finished metrics.json
            code = -1
        if rundirs.run_state(run).status == "diverged":  # a result too: archived like a finished run
            if self.keep is not None:
                self.keep(run)
            reason = (read_metrics(run.run_dir) or {}).get("reason", "")
            self.fail(run, code, log_path, f"[sweep] DIVERGED {run.name}: {reason}; log: {log_path}", False)
            return
        written = references.TEST_METRICS if run.reference else "finished metrics.json"
        why = f"no {written}" if code == -1 else f"exit code {code}"
        said = run_status.describe(run_status.read(run.run_dir))
        if said is not None and not said.startswith(("running", "finished")):
            why += f"; {said}"
        self.fail(run, code, log_path, f"[sweep] FAILED {run.name} ({why}); log: {log_path}", False)


def keep_in_archive(spec: SweepSpec, run: Run, dest: Path, progress: Progress) -> None:
    """Archive a done run into `dest`, unless its copy there is done already (a chained run's
    parent run again: the committed record stays). A failure is reported and the sweep goes on:
    the run stays done in the sweep directory, its archived copy not, so the next start archives
    it (`archive_run` writes the files that mark it done last)."""
    if rundirs.run_state(archived(run, spec.out, dest)).done:
        return
    try:
        archive_run(spec.out, run.run_dir, dest)
    except Exception as err:  # not only OSError: a fit still running must not be stopped for it
        progress.message(f"[sweep] could not archive {run.name} into {dest}: {err}")

"""What a running sweep has recorded: its result, its status line, and the finished runs it archives."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from distill.experiments import references, rundirs
from distill.experiments.archive import archive_run, archived
from distill.experiments.spec import Run, SweepSpec
from distill.rundir import read_metrics, read_status


@dataclass
class SweepResult:
    skipped: list[str] = field(default_factory=list)  # already finished before this invocation
    finished: list[str] = field(default_factory=list)
    failed: list[tuple[str, int, Path]] = field(default_factory=list)  # name, exit code, log


class Progress:
    """One status line: done / running / left / failed, rewritten in place on a terminal."""

    def __init__(self, total: int, stream: TextIO):
        self.total, self.stream = total, stream
        self.done = self.running = self.failed = 0
        self.tty = stream.isatty()

    def show(self) -> None:
        left = self.total - self.done - self.running - self.failed
        line = f"[sweep] {self.done}/{self.total} done, {self.running} running, {left} left, {self.failed} failed"
        self.stream.write(f"\r{line}\033[K" if self.tty else line + "\n")
        self.stream.flush()

    def message(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.show()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


@dataclass
class Tally:
    """What a sweep invocation has recorded so far: the result, the status line, and the run
    directories that will not finish in it (failed or blocked)."""

    result: SweepResult
    progress: Progress
    lost: set[Path] = field(default_factory=set)
    keep: Callable[[Run], None] | None = None  # archives a done run (`--archive`)

    def fail(self, run: Run, code: int, log: Path, message: str) -> None:
        self.lost.add(run.run_dir)
        self.result.failed.append((run.name, code, log))
        self.progress.failed += 1
        self.progress.message(message)

    def exited(self, run: Run, code: int, log_path: Path) -> None:
        """Record a fit (or a reference's test) that exited with `code`."""
        self.progress.running -= 1
        if code == 0 and rundirs.is_done(run):
            self.result.finished.append(run.name)
            self.progress.done += 1
            if self.keep is not None:
                self.keep(run)
            self.progress.show()
            return
        if code == 0:  # exited cleanly but never wrote a finished metrics.json
            code = -1
        if read_status(run.run_dir) == "diverged":  # a result too: archived like a finished run
            if self.keep is not None:
                self.keep(run)
            reason = (read_metrics(run.run_dir) or {}).get("reason", "")
            self.fail(run, code, log_path, f"[sweep] DIVERGED {run.name}: {reason}; log: {log_path}")
            return
        written = references.TEST_METRICS if run.reference else "finished metrics.json"
        why = f"no {written}" if code == -1 else f"exit code {code}"
        self.fail(run, code, log_path, f"[sweep] FAILED {run.name} ({why}); log: {log_path}")


def keep_in_archive(spec: SweepSpec, run: Run, dest: Path, progress: Progress) -> None:
    """Archive a done run into `dest`, unless its copy there is done already (a chained run's
    parent run again: the committed record stays). A failure is reported and the sweep goes on:
    the run stays done in the sweep directory, its archived copy not, so the next start archives
    it (`archive_run` writes the files that mark it done last)."""
    if rundirs.is_done(archived(run, spec.out, dest)):
        return
    try:
        archive_run(spec.out, run.run_dir, dest)
    except Exception as err:  # not only OSError: a fit still running must not be stopped for it
        progress.message(f"[sweep] could not archive {run.name} into {dest}: {err}")

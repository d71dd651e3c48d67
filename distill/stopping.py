"""Stopping a fit on a signal: every rank, soon, with a checkpoint where one can be written.

SLURM sends SIGTERM at preemption and before its time limit (`--signal`), `timeout` and `kill` send
it to one process, and a launcher's death leaves its ranks orphaned. What `StopOnSignal` does, on
every rank of a launch:

- **The handler only takes note.** It records the signal, passes it on to the rest of the launch
  (rank 0 to the ranks it launched, a launched rank to rank 0) and arms a watchdog. It runs no
  collective: Lightning's own handler broadcasts from inside the handler, which deadlocks when the
  signal lands on a rank that another rank waits for in a different collective (one compiling,
  the other in an evaluation's all-reduce: both asleep for good).
- **The ranks agree at a step's end.** After every optimiser step each rank all-reduces (max) one
  flag, "a signal came": every rank learns it at the same step, even one the signal never reached
  (torchrun, SLURM's per-task signals). They then write `checkpoints/last.ckpt` together (the
  ordinary end-of-step checkpoint, so a resume with `--ckpt_path last` is exact) and stop with
  `distill.errors.Interrupted`; `distill fit` writes an `interrupted` status record and exits
  128 + the signal's number.
- **A watchdog bounds the wait.** A rank that has not reached a step's end `grace_s` seconds after
  the signal (a compile, a long evaluation, a peer that died) writes its status record, naming the
  checkpoint a resume starts from (the last periodic one), and exits at once.
- **A launched rank dies with its launcher.** Ranks that Lightning's subprocess launcher starts ask
  the kernel for SIGTERM when their parent dies (Linux's parent-death signal); the handler of a
  rank whose launcher is gone exits at once, since no collective can complete without rank 0.

`distill fit` installs it as it installs its checkpointing; the grace comes from
`DISTILL_STOP_GRACE_S` (default 45 s: a stop within a minute, however the ranks stand).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from distill import run_status
from distill.errors import Interrupted

GRACE_ENV = "DISTILL_STOP_GRACE_S"
DEFAULT_GRACE_S = 45.0
LAUNCHER_ENV = "DISTILL_LAUNCHER_PID"  # set by the first process of a launch; its ranks inherit it
SIGNALS = (signal.SIGTERM,)


def grace_seconds() -> float:
    raw = os.environ.get(GRACE_ENV)
    if raw is None:
        return DEFAULT_GRACE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{GRACE_ENV} must be a number of seconds > 0, got {raw!r}")
    return value


def _launcher_pid() -> int | None:
    """The pid distill's first process of this launch recorded, when this process is a rank it
    launched (it has `LOCAL_RANK` and is not that process); None otherwise."""
    pid = os.environ.get(LAUNCHER_ENV)
    if pid is None or "LOCAL_RANK" not in os.environ or int(pid) == os.getpid():
        return None
    return int(pid)


def launched_by() -> int | None:
    """The pid of the process that launched this rank (Lightning's subprocess launcher: rank 0),
    None for the first process of a launch or a rank another launcher (torchrun, srun) started."""
    pid = _launcher_pid()
    return pid if pid is not None and os.getppid() == pid else None


def launcher_gone() -> str | None:
    """For a rank Lightning launched whose launcher (rank 0) has ended: why this rank stops, in
    one line; None otherwise. Its collectives fail too then, and that error is a consequence."""
    pid = _launcher_pid()
    return None if pid is None or os.getppid() == pid else f"the launching process {pid} (rank 0) has ended"


def begin_launch() -> None:
    """Called first by `distill fit|test` in every process. The first process of a launch marks
    itself (the ranks it starts inherit the mark, and a fresh attempt id for their status
    records); a rank Lightning launched asks to be sent SIGTERM when its launcher dies."""
    if "LOCAL_RANK" not in os.environ:
        os.environ[LAUNCHER_ENV] = str(os.getpid())
        os.environ.pop(run_status.ATTEMPT_ENV, None)
        run_status.attempt_id()  # fresh, for this launch
        return
    if _launcher_pid() is None or not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
    gone = launcher_gone()  # it died before the request was in place
    if gone is not None:
        print(f"distill: {gone}; rank exits", file=sys.stderr)
        os._exit(128 + int(signal.SIGTERM))


def checkpoint_point(run_dir: Path, checkpoint: Path | None) -> dict | None:
    """`{"path": <relative to run_dir>, "step": N}` for the checkpoint file at `checkpoint`, None
    when there is none (or it cannot be read)."""
    if checkpoint is None or not checkpoint.is_file():
        return None
    try:
        step = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)["global_step"]
    except Exception:  # a partial or foreign file: nothing to promise
        return None
    return {"path": str(checkpoint.relative_to(run_dir)), "step": int(step)}


def _take_note(signum, frame) -> None:
    """The Python-level handler: the wakeup pipe's reader acts (`StopOnSignal._listen`)."""


class StopOnSignal(Callback):
    """See the module docstring. `run_dir` receives the status record of a stop the watchdog
    forces; `checkpoint` is where the agreed stop writes (None: checkpointing is off)."""

    def __init__(self, run_dir: str | Path, checkpoint: str | Path | None, grace_s: float | None = None):
        self.run_dir = Path(run_dir)
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.grace_s = grace_seconds() if grace_s is None else grace_s
        self.signum: int | None = None
        self._original = {signum: signal.getsignal(signum) for signum in SIGNALS}
        self._stopping = threading.Event()  # the ranks agreed: the watchdog stands down
        self._trainer = None
        self._pipe: tuple[int, int] = (-1, -1)
        self._previous_wakeup = -1

    # --- the handler ------------------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        # Lightning registers its own SIGTERM handler just before training starts: replace it.
        # Python runs a handler only when the main thread is back in the interpreter, never while
        # it waits in a collective; the signal's number also goes down a wakeup pipe, written by
        # the C-level handler at once, and a thread reading it acts on it.
        self._trainer = trainer
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in SIGNALS:
            signal.signal(signum, _take_note)
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._pipe = (read, write)
        self._previous_wakeup = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        threading.Thread(target=self._listen, args=(read,), daemon=True, name="distill-signals").start()

    def restore(self) -> None:
        """Put back the handlers that were in place when this was made, and the wakeup pipe's
        predecessor (`distill fit` calls it last, whatever happened: an in-process caller, a test,
        keeps its own handling)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._original.items():
            signal.signal(signum, handler)
        if self._pipe[1] >= 0:
            signal.set_wakeup_fd(self._previous_wakeup)
            os.close(self._pipe[1])  # the listener reads end-of-file and ends
            self._pipe = (-1, -1)

    def _listen(self, read: int) -> None:
        with os.fdopen(read, "rb", buffering=0) as pipe:
            while byte := pipe.read(1):
                if byte[0] in SIGNALS:
                    self._on_signal(byte[0])

    def _on_signal(self, signum: int) -> None:
        if self.signum is not None:
            return  # once: forwarded copies come back
        self.signum = signum
        name = signal.Signals(signum).name
        rank = self._rank()
        gone = launcher_gone()
        if gone is not None:  # nothing can be agreed without rank 0: end now
            self._record(f"{name}: {gone}", rank)
            print(f"distill: rank {rank} stops: {gone}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(128 + signum)
        print(f"distill: rank {rank} received {name}; stopping at the end of this step", file=sys.stderr)
        self._forward(signum)
        self._watchdog(signum)

    def _forward(self, signum: int) -> None:
        from lightning.pytorch.strategies.launchers import _SubprocessScriptLauncher

        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        if isinstance(launcher, _SubprocessScriptLauncher):
            for proc in launcher.procs:
                if proc.poll() is None:
                    proc.send_signal(signum)
        parent = launched_by()
        if parent is not None:
            os.kill(parent, signum)

    def _watchdog(self, signum: int) -> None:
        if self._stopping.wait(self.grace_s):
            return
        name = signal.Signals(signum).name
        self._record(
            f"{name}: no step ended within {self.grace_s:g} s (a rank compiling, evaluating or waiting "
            "for a peer), stopped without a new checkpoint",
            self._rank(),
        )
        print(f"distill: rank {self._rank()} stopped by its watchdog after {name}", file=sys.stderr)
        sys.stderr.flush()
        os._exit(128 + signum)

    # --- the agreed stop --------------------------------------------------------------------------
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        signum = self._agreed(trainer)
        if not signum:
            return
        self._stopping.set()
        self.signum = self.signum or signum
        if self.checkpoint is not None:
            trainer.save_checkpoint(self.checkpoint)  # every rank: it holds a barrier
        raise Interrupted(signal.Signals(signum).name, trainer.global_step, self.resume_from())

    def _agreed(self, trainer) -> int:
        """The signal any rank received (its number), 0 for none: a collective under DDP."""
        flag = torch.tensor([self.signum or 0], device=trainer.strategy.root_device)
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def after_fit(self, trainer) -> None:
        """Called by `distill fit` once training is over and its checkpoint written, before the
        export and the test: a signal that came during the last step stops the run here (every
        rank), and from now on one raises `Interrupted` where the main thread stands (no step
        ends any more to agree at)."""
        self._stopping.set()
        signum = self._agreed(trainer)
        if signum:
            raise Interrupted(signal.Signals(signum).name, trainer.global_step, self.resume_from())
        if threading.current_thread() is threading.main_thread():
            step = trainer.global_step

            def interrupt(received, frame):
                self._forward(received)
                raise Interrupted(signal.Signals(received).name, step, self.resume_from())

            for signum in SIGNALS:
                signal.signal(signum, interrupt)

    def resume_from(self) -> dict | None:
        """The checkpoint a resume starts from, with its step, when there is one: the file as it
        is (a write that failed, a full disk, left the one before whole). Its step is read
        without its tensors (memory-mapped), so this costs little even for a large model."""
        return checkpoint_point(self.run_dir, self.checkpoint)

    def _rank(self) -> int:
        trainer = self._trainer
        return int(getattr(trainer, "global_rank", 0) or 0) if trainer is not None else 0

    def _record(self, reason: str, rank: int) -> None:
        trainer = self._trainer
        step = int(trainer.global_step) if trainer is not None else None
        run_status.write(
            self.run_dir, "interrupted", reason=reason, rank=rank, step=step, resume_from=self.resume_from()
        )


def wait_for_ranks(procs, seconds: float) -> None:
    """Give the launched ranks `seconds` to end by themselves (an agreed stop: each is finishing
    the same step), then kill those still running."""
    deadline = time.monotonic() + seconds
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            proc.kill()

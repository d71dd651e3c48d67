"""Shared fixtures: tiny models built from config (never downloaded), the char tokenizer."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The shipped configs compile their models (30-90 s a process); tests run them eagerly. The tests of
# compiling itself unset it (`monkeypatch.delenv`).
os.environ["DISTILL_COMPILE"] = "0"
# One thread in this process: fits run beside it in the background (`Cores`), and two threads on a
# core another process also uses wait on each other at every parallel op.
torch.set_num_threads(1)


TIMELINE = os.environ.get("DISTILL_TEST_TIMELINE")


class Cores:
    """Runs the suite's subprocesses (fits of one thread a rank) on the machine's cores, never more
    at once than there are cores. The main thread, which runs the in-process tests, holds one core
    while it works, its one-core subprocesses included, and lends it while it waits for a job
    (`result`, `held(0)`) or adds it to a two-core hold (`run`, `held`), so a module's slow fits
    can start early (`start_early`) and run beside the quick in-process tests that come before them. A
    job holds a core per process it runs; the cores go first come, first served, so that a job
    that needs both is not passed over forever by one-core jobs."""

    def __init__(self, n: int):
        self.n, self.free = n, n - 1  # the main thread's core is taken
        self.changed = threading.Condition()
        self.queue: deque = deque()
        self.pool = ThreadPoolExecutor(n, thread_name_prefix="cores")
        self.jobs: dict[str, Job] = {}  # by name: what `start_early` started
        self.started = False

    def _take(self, k: int, first: bool = False) -> None:
        """Wait for `k` free cores, in turn (`first`: ahead of every waiting job)."""
        ticket = object()
        with self.changed:
            if first:
                self.queue.appendleft(ticket)
            else:
                self.queue.append(ticket)
            self.changed.wait_for(lambda: self.queue[0] is ticket and self.free >= k)
            self.queue.popleft()
            self.free -= k
            self.changed.notify_all()

    def _give(self, k: int) -> None:
        with self.changed:
            self.free += k
            self.changed.notify_all()

    @contextmanager
    def held(self, k: int = 1):
        """Hold `k` cores (all of them at most) while the block runs; in the main thread, its own
        core counts among them: one core is that core, kept, and a core it lent comes back to it
        ahead of the waiting jobs (in turn with them, a main thread whose job had ended waited
        minutes for a core a long job had taken)."""
        k = min(k, self.n)
        main = threading.current_thread() is threading.main_thread()
        if main and k == 1:
            yield
            return
        if main:
            self._give(1)
        if k:  # lending a core needs no turn in the queue
            self._take(k)
        try:
            yield
        finally:
            self._give(k)
            if main:
                self._take(1, first=True)

    def result(self, job):
        """A job's result (`ahead`), the main thread's core lent while it waits: a main thread
        that waited holding it could wait forever for a job that needs both cores."""
        future = job.future if isinstance(job, Job) else job
        if future.done():
            return future.result()
        with self.held(0):
            return future.result()

    def run(self, command: list[str], cores: int = 1, **kwargs) -> subprocess.CompletedProcess:
        """`subprocess.run(command, **kwargs)` (output captured as text) once `cores` are free; the
        result's `seconds` is its wall time."""
        with self.held(cores):
            start = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, **kwargs)
        done.seconds = time.monotonic() - start
        return done

    def ahead(self, command, cores: int = 1, name: str = "", **kwargs) -> Job:
        """`run` in the background (or, for a callable, `command()` holding `cores`; it runs its
        processes itself, not through `run`): a `Job`, whose `result()` waits for it."""
        if callable(command):
            return Job(self, self.pool.submit(self._call, command, cores, name))
        return Job(self, self.pool.submit(self._call, lambda: self.run(command, 0, **kwargs), cores, name))

    def _call(self, work, cores: int, name: str = ""):
        queued = time.monotonic()
        with self.held(cores):
            started = time.monotonic()
            try:
                return work()
            finally:
                if TIMELINE:  # DISTILL_TEST_TIMELINE=file: when each job queued, started and ended
                    with open(TIMELINE, "a") as out:
                        ended = time.monotonic()
                        out.write(f"{name or work} cores={cores} queued={queued:.1f} started={started:.1f} ended={ended:.1f}\n")


class Job:
    """A background job of `Cores`; `result()` lends the main thread's core while it waits."""

    def __init__(self, cores: Cores, future: Future):
        self.cores, self.future = cores, future

    def result(self):
        return self.cores.result(self)


@pytest.fixture(scope="session")
def cores():
    """The session's `Cores` (one per CPU core)."""
    pool = Cores(os.cpu_count() or 1)
    yield pool
    pool.pool.shutdown(wait=True, cancel_futures=True)  # jobs of tests that never ran need not start


def _phase(item) -> int:
    """0: tests that keep both cores busy themselves (`cores` marker); 1: the rest; 2: the tests that
    read a fit started early (`early`): last, so that those fits have the session to run in."""
    if item.get_closest_marker("cores"):
        return 0
    return 2 if "early" in getattr(item, "fixturenames", ()) else 1


def _early_order(module) -> int:
    """A module's place among those with early jobs (`EARLY_ORDER`, lower first; 0 by default): its
    one-core jobs queue in this order, and its tests that read them run in it."""
    return getattr(module, "EARLY_ORDER", 0)


def pytest_collection_modifyitems(config, items):
    """Tests that keep both cores busy run first, alone; the tests that read fits started early run
    last, so that those fits have the rest of the session to run beside the in-process tests, in
    the order their fits were queued."""
    items.sort(key=lambda item: (_phase(item), _early_order(item.module) if _phase(item) == 2 else 0))


@pytest.fixture(autouse=True)
def _cores_of_the_test(request, cores):
    """A `cores(n)` test holds n cores; the first test after them starts the early fits."""
    marker = request.node.get_closest_marker("cores")
    if marker is not None:
        with cores.held(marker.args[0]):
            yield
        torch.set_num_threads(1)  # a tiny-world build sets its recipe's two threads
        return
    if not cores.started:
        start_early(request, cores)
    yield


@pytest.fixture(scope="session")
def early(request, cores):
    """`early(name)`: the `Job` a module's `early_jobs` named. The early jobs start at the first test
    that is not a `cores` test, or here, if a module-scoped fixture asks for one before that."""

    def job(name: str):
        if not cores.started:
            start_early(request, cores)
        return cores.jobs[name]

    return job


def start_early(request, cores) -> None:
    """Starts the slow fits of the selected tests: a test module's
    `early_jobs(request, selected) -> {name: (command or callable, cores, subprocess kwargs)}`
    names them, and its tests read them with the `early` fixture. One-core jobs go
    first (they run beside the in-process tests), in their modules' `EARLY_ORDER`, then those that
    need both cores (they run when the main thread waits)."""
    cores.started = True
    selected: dict = {}
    for item in request.session.items:
        selected.setdefault(item.module, []).append(item.name)
    specs = []
    for module, names in selected.items():
        if hasattr(module, "early_jobs"):
            order = _early_order(module)
            specs += [(order, name, spec) for name, spec in module.early_jobs(request, set(names)).items()]
    for _, name, (command, n, kwargs) in sorted(specs, key=lambda spec: (spec[2][1] > 1, spec[0])):
        cores.jobs[name] = cores.ahead(command, n, name=name, **kwargs)


@pytest.fixture(scope="session")
def char_tok():
    from distill.models.tiny import char_tokenizer

    return char_tokenizer()


def _tiny_lm(vocab_size: int, hidden: int, layers: int, seed: int):
    from transformers import LlamaForCausalLM

    from distill.models.tiny import llama_config

    torch.manual_seed(seed)
    cfg = llama_config(vocab_size=vocab_size, hidden_size=hidden, num_layers=layers, num_heads=2)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tiny_teacher(char_tok):
    """Random 2x64 Llama whose embedding is padded past the tokenizer (128 rows vs 100 tokens)."""
    return _tiny_lm(128, 64, 2, seed=1)


@pytest.fixture
def tiny_student(char_tok):
    """Random 1x32 Llama with a differently padded embedding (112 rows)."""
    return _tiny_lm(112, 32, 1, seed=2)


@pytest.fixture(scope="session")
def quick_world(tmp_path_factory):
    """A `--quick` tiny world (random-quality, built in seconds), shared by the whole session, in
    the default version's cache folder (`tiny-world-v3`); the other versions' folders
    (`tiny-world-v2`, `-v1`) link to it, so that configs of every version resolve."""
    from distill.models.tiny_world import QUICK, VERSIONS, build
    from distill.models.tiny_world_names import DEFAULT_VERSION, folder

    cache = tmp_path_factory.mktemp("cache")
    out = cache / folder(DEFAULT_VERSION)
    build(out, QUICK)
    torch.set_num_threads(1)  # the build set its recipe's threads
    for version in VERSIONS:
        if version != DEFAULT_VERSION:
            (cache / folder(version)).symlink_to(out, target_is_directory=True)
    return out


@pytest.fixture
def tiny_world_cache(quick_world, monkeypatch):
    """Point $DISTILL_CACHE at the quick world, so `tiny-world:teacher` (and `tiny-world-v2:`, ...)
    and configs/tiny resolve."""
    monkeypatch.setenv("DISTILL_CACHE", str(quick_world.parent))
    return quick_world


class RecordingBackend:
    """A torch.compile backend that counts the graphs dynamo captured and runs them as captured:
    what compiled decoding and compiled forward passes hand to dynamo is tested without inductor's
    code generation."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


@pytest.fixture
def recording():
    """`RecordingBackend` (call it for a backend); dynamo starts and ends the test with nothing
    compiled, so every test's models compile afresh."""
    torch._dynamo.reset()
    yield RecordingBackend
    torch._dynamo.reset()

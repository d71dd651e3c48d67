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
torch.set_num_threads(min(2, torch.get_num_threads()))


class Cores:
    """Runs the suite's subprocesses (fits of one thread a rank) on the machine's cores: ahead of the
    test that reads them (`ahead`), or now (`run`), never more processes at once than cores. A test
    that runs its fits one after another leaves a core idle while the other works; tests that start
    their independent fits here let two run side by side."""

    def __init__(self, n: int):
        self.n, self.free = n, n
        self.changed = threading.Condition()
        self.queue: deque = deque()
        self.pool = ThreadPoolExecutor(n, thread_name_prefix="cores")

    @contextmanager
    def held(self, k: int = 1):
        """Hold `k` cores (all of them at most) while the block runs. Served first come, first
        served: a job that needs both cores is not passed over forever by one-core jobs."""
        k = min(k, self.n)
        ticket = object()
        with self.changed:
            self.queue.append(ticket)
            self.changed.wait_for(lambda: self.queue[0] is ticket and self.free >= k)
            self.queue.popleft()
            self.free -= k
            self.changed.notify_all()
        try:
            yield
        finally:
            with self.changed:
                self.free += k
                self.changed.notify_all()

    def run(self, command: list[str], cores: int = 1, **kwargs) -> subprocess.CompletedProcess:
        """`subprocess.run(command, **kwargs)` (output captured as text) once `cores` are free; the
        result's `seconds` is its wall time."""
        with self.held(cores):
            start = time.monotonic()
            done = subprocess.run(command, capture_output=True, text=True, **kwargs)
        done.seconds = time.monotonic() - start
        return done

    def ahead(self, command: list[str], cores: int = 1, **kwargs) -> Future:
        """`run` in the background: its `Future`. Never wait for one while holding cores."""
        return self.pool.submit(self.run, command, cores, **kwargs)


@pytest.fixture(scope="session")
def cores():
    """The session's `Cores` (one per CPU core)."""
    pool = Cores(os.cpu_count() or 1)
    yield pool
    pool.pool.shutdown(wait=True)


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

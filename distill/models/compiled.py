"""Compiled forward passes: `torch.compile` for a model's scoring and training forwards.

The modules' `compile_forwards` / `compile_decoding` flags are off in the Python API and on in the
shipped configs (`configs/tiny`, `configs/tiny_v2`, `configs/paper`); `DISTILL_COMPILE=0` in the
environment runs every model eagerly whatever the config says (`compile_flags`; the test suite sets
it, so that tests do not pay a compile each).

`compile_forwards(model)` marks a Hugging Face causal LM so that `distill.models.forward.causal_logits`
(every full-sequence pass: the distillation step's student forward + backward and teacher
forward, evaluation scoring, GRPO's log-probabilities) runs `torch.compile(model.forward,
dynamic=True, fullgraph=True)` instead of the eager forward. On CPU a small model's forward is
mostly many small kernels (norms, rotary embeddings, activations) around a few matmuls; inductor
fuses them, and AOTAutograd compiles the backward too. Measured on the tiny world (one thread, B = 32,
50–71 tokens, CPU time with other work on the machine): the student's forward + backward 0.67x the
eager time, the teacher's no-grad forward 0.79x (`experiments/LOG.md`, 2026-12-02;
`benchmarks/RESULTS.md` has the step on two threads).

Shapes: sequence length, rows and `logits_to_keep` change every step, so the graph is compiled
with dynamic sizes from the start (one compile per model and mode, not one per shape); training and
evaluation (grad / no grad, train / eval mode) are compiled apart, a few compiles of tens of
seconds each on CPU. Each wrapper keeps its own recompile limit (see `Compiled`).

Numbers: the compiled pass computes the eager one's function; fused kernels may round differently
(float32 sums in another order), so losses agree to rounding, not to the bit.

Fallback: a compile that fails (no C++ compiler, a graph break under `fullgraph`, dynamo's
recompile limit) warns once, naming the error, and the model runs eagerly from then on. The call
is retried eagerly: a forward changes no state, so nothing is lost. The backward of a pass with
gradients is compiled with its forward (not lazily inside `backward()`), so that its failure falls
back the same way. Running out of memory is raised, not treated as a compile failure. A model
sharded with FSDP2 (whose hooks run in `Module.__call__`, which a compiled `forward` skips) is left
eager (`eager_if_sharded`).

The same wrapper serves compiled decoding (`distill.rollout.compiled`), which compiles the decode
step over a static KV cache.
"""

from __future__ import annotations

import inspect
import os
import sys
import time
import warnings
from collections.abc import Callable

import torch
import torch._functorch.config  # noqa: F401  (torch._functorch.config is not imported by `import torch`)
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from distill.parallel import is_sharded

COMPILE_ENV = "DISTILL_COMPILE"  # "0": every model runs eagerly, whatever the config says


def compile_flags(decoding: bool, forwards: bool, owner: str = "model") -> tuple[bool, bool]:
    """The (`compile_decoding`, `compile_forwards`) a module applies: its own, unless the
    environment says `DISTILL_COMPILE=0`. Logs what compiling costs when either is on."""
    if os.environ.get(COMPILE_ENV, "").strip() == "0":
        return False, False
    if decoding or forwards:
        what = " and ".join(
            n for n, on in (("the decode step", decoding), ("the forward passes", forwards)) if on
        )
        rank_zero_info(
            f"[distill] {owner}: compiling {what} (torch.compile): the first steps take about 30-90 s "
            f"longer per process; `--{owner}.init_args.compile_decoding false "
            f"--{owner}.init_args.compile_forwards false` (or {COMPILE_ENV}=0) runs eagerly"
        )
    return decoding, forwards


_ATTRIBUTE = "_distill_compiled_forward"  # on the model itself: freed with it


def describe(err: BaseException) -> str:
    """One line naming `err` and, for a wrapped error (dynamo's BackendCompilerFailed), its root."""
    root, seen = err, {id(err)}
    while True:
        inner = root.__cause__ or getattr(root, "inner_exception", None)
        if inner is None or id(inner) in seen:  # the end of the chain, or a cycle
            break
        root = inner
        seen.add(id(inner))
    text = f"{type(err).__name__}" + ("" if root is err else f" from {type(root).__name__}")
    detail = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    return f"{text}: {detail}"[:300] if detail else text


def _available(config, *keys: str) -> dict[str, bool]:
    """`{key: True}` for each key this torch's config module has (read once: a copy costs ~1 ms)."""
    present = config.get_config_copy()
    return {key: True for key in keys if key in present}


# Past the recompile limit, raise (dynamo would otherwise run eagerly without a word); for passes
# that are differentiated, compile the backward with the forward (AOTAutograd otherwise compiles it
# lazily inside `backward()`, where a failure could not fall back).
_DYNAMO_PATCH = _available(torch._dynamo.config, "fail_on_recompile_limit_hit")
_BACKWARD_PATCH = _available(torch._functorch.config, "force_non_lazy_backward_lowering")
# Each wrapper's own compiled entries and recompile limit (see `Compiled`), where torch has it.
_ISOLATE = (
    {"isolate_recompiles": True}
    if "isolate_recompiles" in inspect.signature(torch.compile).parameters
    else {}
)


LONG_COMPILE_S = 20.0


def _say_long_compile(purpose: str, seconds: float) -> None:
    """Under several ranks, a call that took long (a compile: ranks compile at their own pace) is
    said with its rank, so that the others' wait in their next collective reads as what it is."""
    if seconds < LONG_COMPILE_S or not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_world_size() > 1:
        print(
            f"[distill] rank {dist.get_rank()}: compiling {purpose} took {seconds:.0f} s; the other ranks "
            "waited for it in their next collective (a wait, not a hang)",
            file=sys.stderr,
            flush=True,
        )


class Compiled:
    """`torch.compile(model.forward)`, eager from its first failure on (`failed` says why).

    Each wrapper keeps its own compiled entries and recompile limit (`isolate_recompiles`, where
    torch has it): the student and teacher share a class, and decoding and forward passes compile
    the same `forward`, so by default they would all count against one limit."""

    def __init__(
        self,
        model: nn.Module,
        purpose: str,
        backend: str | Callable = "inductor",
        mode: str | None = None,
        dynamic: bool | None = None,
    ):
        self.purpose = purpose  # named in the fallback warning: "decoding", "forward passes"
        self.forward = torch.compile(
            model.forward, backend=backend, mode=mode, fullgraph=True, dynamic=dynamic, **_ISOLATE
        )
        self.failed: str | None = None

    def __call__(self, model: nn.Module, **kwargs):
        if self.failed is None:
            try:
                backward = _BACKWARD_PATCH if torch.is_grad_enabled() else {}
                start = time.monotonic()
                with torch._dynamo.config.patch(**_DYNAMO_PATCH), torch._functorch.config.patch(**backward):
                    out = self.forward(**kwargs)
                _say_long_compile(self.purpose, time.monotonic() - start)
                return out
            except torch.OutOfMemoryError:
                raise  # not a compile failure: the eager pass would run out of memory too
            except Exception as err:  # a compile failure: the eager call decides
                self.failed = describe(err)
                warnings.warn(
                    f"compiled {self.purpose} failed for {type(model).__name__} ({self.failed}); it "
                    "runs eagerly from now on (slower)",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return model(**kwargs)


def compile_forwards(
    model: nn.Module, backend: str | Callable = "inductor", mode: str | None = None
) -> nn.Module:
    """Run `model`'s full-sequence passes (`causal_logits`) compiled from now on (returns `model`).

    `backend` and `mode` go to `torch.compile` ("eager" traces the graph without generating code).
    """
    object.__setattr__(model, _ATTRIBUTE, Compiled(model, "forward passes", backend, mode, dynamic=True))
    return model


def compiled_forward(model: nn.Module) -> Compiled | None:
    """`model`'s compiled forward, or None when its passes run eagerly."""
    return model.__dict__.get(_ATTRIBUTE)


def uncompile_forwards(model: nn.Module) -> None:
    """Back to eager forward passes (a no-op for a model never compiled)."""
    model.__dict__.pop(_ATTRIBUTE, None)


def eager_if_sharded(model: nn.Module, stacklevel: int = 2) -> None:
    """An FSDP2-sharded `model` runs its forward passes eagerly, with a warning, even when marked by
    `compile_forwards` (a compiled `forward` would skip the all-gathers FSDP2 hooks into
    `Module.__call__`); call after sharding."""
    if is_sharded(model) and compiled_forward(model) is not None:
        uncompile_forwards(model)
        warnings.warn(
            f"model.execution.compile_forwards: {type(model).__name__} is sharded (FSDP2), so its forward passes run eagerly",
            stacklevel=stacklevel,
        )

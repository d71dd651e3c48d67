"""Compiled decoding (opt-in): a static KV cache and a `torch.compile`d decode step per model.

`compile_decoding(model)` marks a Hugging Face causal LM so that `decoding.decode` runs its decode
steps (one new token per row) through `torch.compile(model.forward)` over a
`transformers.StaticCache` sized for the prompt plus the token budget. The cache is written in
place instead of growing by concatenation each step, and the compiled step fuses the model's many
small kernels, which is most of a small model's decode time on CPU. The prefill stays eager: its
width changes with every batch.

Shapes: the first compile is for the shapes met first; a new batch size or cache length (sequence
mixing decodes each writer's rows apart; evaluation batches differ) compiles once more with dynamic
sizes (torch's automatic dynamic shapes), after which shapes no longer trigger compiles. Expect tens
of seconds per model for the first two compiles with the inductor backend on CPU. Greedy and seeded
decoding give the same tokens as eager decoding (tested).

Fallback: when a compiled step raises (no C++ compiler, a Python torch.compile does not support,
a graph inductor cannot build), a warning names the error and that model decodes eagerly from then
on, still with its static cache: the same tokens, only slower. CUDA graphs (`mode="reduce-overhead"`)
are not chosen for you: pass `mode` yourself on GPUs.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable

import torch
from torch import nn

from distill.models.forward import forward_accepts

_STEPS: weakref.WeakKeyDictionary[nn.Module, CompiledStep] = weakref.WeakKeyDictionary()


class CompiledStep:
    """One model's compiled decode step; eager from its first failure on."""

    def __init__(self, model: nn.Module, backend: str | Callable, mode: str | None):
        self.forward = torch.compile(model.forward, backend=backend, mode=mode)
        self.backend = backend
        self.failed: str | None = None  # the error that switched this model to eager decoding

    def __call__(self, model: nn.Module, **kwargs):
        if self.failed is None:
            try:
                return self.forward(**kwargs)
            except Exception as err:  # a compile (or compiled-run) failure: the eager step decides
                self.failed = describe(err)
                warnings.warn(
                    f"compiled decoding failed for {type(model).__name__} ({self.failed}); it decodes "
                    "eagerly from now on (same tokens, slower)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return model(**kwargs)

    @staticmethod
    def new_cache(model: nn.Module, max_cache_len: int):
        from transformers import StaticCache

        return StaticCache(config=model.config, max_cache_len=max_cache_len)


def describe(err: BaseException) -> str:
    """One line naming `err` and, for a wrapped error (dynamo's BackendCompilerFailed), its root."""
    root = err
    while (inner := root.__cause__ or getattr(root, "inner_exception", None)) is not None:
        root = inner
    text = f"{type(err).__name__}" + ("" if root is err else f" from {type(root).__name__}")
    detail = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    return f"{text}: {detail}"[:300] if detail else text


def compile_decoding(
    model: nn.Module, backend: str | Callable = "inductor", mode: str | None = None
) -> nn.Module:
    """Decode `model` with a static KV cache and a compiled step from now on (returns `model`).

    `backend` and `mode` go to `torch.compile` ("eager" traces the graph without generating code:
    what the tests use). Raises ValueError for a model that is not a Hugging Face causal LM with a
    KV-cache argument (a static cache needs the model's config).
    """
    has_cache = forward_accepts(model, "cache") or forward_accepts(model, "past_key_values")
    if getattr(model, "config", None) is None or not has_cache:
        raise ValueError(
            f"compiled decoding needs a Hugging Face causal LM (a `config` and a KV-cache argument), "
            f"got {type(model).__name__}"
        )
    _STEPS[model] = CompiledStep(model, backend, mode)
    return model


def compiled_step(model: nn.Module) -> CompiledStep | None:
    """`model`'s compiled decode step, or None when it decodes eagerly with a growing cache."""
    return _STEPS.get(model)


def uncompile_decoding(model: nn.Module) -> None:
    """Back to eager decoding with a growing cache (a no-op for a model never compiled)."""
    _STEPS.pop(model, None)

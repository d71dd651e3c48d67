"""Compiled decoding (opt-in): a static KV cache and a `torch.compile`d decode step per model.

`compile_decoding(model)` marks a Hugging Face causal LM so that `decoding.decode` runs its decode
steps (one new token per row) through `torch.compile(model.forward, fullgraph=True)` over a
`transformers.StaticCache`. The cache is written in place instead of growing by concatenation each
step, and the compiled step fuses the model's many small kernels, which is most of a small model's
decode time on CPU. The prefill stays eager: its width changes with every batch.

The cache starts with room for the prompt and `BLOCK` generated tokens and grows by `BLOCK` slots
when full (attention runs over the cache's whole width every step, so a cache sized for the whole
budget would make every step of a rollout that stops early cost as much as its last: measured, the
tiny teacher's compiled step at a 96-token budget was 1.6x slower than eager, at 40 tokens 0.72x).
The attention mask has the cache's width: the prompt's mask, then zeros for the generated slots,
each set to one just before the token that fills it is fed (so every attention kernel,
FlashAttention's included, sees exactly the tokens written so far).

Shapes: the first compile is for the shapes met first; a new batch size or cache length (sequence
mixing decodes each writer's rows apart; evaluation batches differ) compiles once more with dynamic
sizes (torch's automatic dynamic shapes), after which shapes no longer trigger compiles (a batch of
one row is specialised once more). Expect tens of seconds per model for each of these compiles with
the inductor backend on CPU.

Tokens: under dynamo the captured step computes what eager decoding does (the tests compare tokens
through a pass-through backend); inductor's fused kernels may round differently, so a near-tied
draw can occasionally go the other way: the same sampling distribution, not always the same bits.
The teacher-rollout cache does not tell compiled from eager rows apart for that reason.

Fallback: when a compiled step raises (no C++ compiler, a Python torch.compile does not support, a
graph break, dynamo's recompile limit), a warning names the error and that model decodes eagerly
from then on, still with its static cache, only slower. `fullgraph=True` makes such failures happen
before the step runs, so the cache is untouched when the eager step retries it. CUDA graphs
(`mode="reduce-overhead"`) are not supported: every rollout batch gets a new cache, so the graphs
would be recorded again for each.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import nn

from distill.models.compiled import Compiled
from distill.models.compiled import eager_if_sharded as forwards_eager_if_sharded
from distill.models.forward import forward_accepts
from distill.parallel import is_sharded

_ATTRIBUTE = "_distill_compiled_step"  # on the model itself: freed with it
BLOCK = 32  # generated-token slots a static cache starts with and gains at a time


def new_cache(model: nn.Module, prompt_width: int, max_new_tokens: int):
    """A static cache for the prompt and the first `BLOCK` generated tokens, grown by `grow` as
    decoding goes on; the whole budget at once where its layers are not all plain `StaticLayer`s
    (sliding-window and hybrid caches are not grown)."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=prompt_width + min(BLOCK, max_new_tokens))
    if not all(type(layer) is StaticLayer for layer in cache.layers):
        cache = StaticCache(config=model.config, max_cache_len=prompt_width + max_new_tokens)
    return cache


def capacity(cache) -> int:
    """Slots each layer of a static cache holds."""
    return cache.layers[0].max_cache_len


def make_room(cache, slot: int, limit: int) -> int:
    """Grow `cache` by `BLOCK` slots (at most to `limit`) when `slot` is past its end; returns how
    many slots were added (0: there was room)."""
    if slot < capacity(cache):
        return 0
    extra = min(BLOCK, limit - capacity(cache))
    grow(cache, extra)
    return extra


def grow(cache, extra: int) -> None:
    """`extra` more zero slots in every layer of a static cache of plain `StaticLayer`s, after the
    written ones: attention runs over a cache's whole width each step, so a cache sized for the
    whole budget would cost every step of a rollout that stops early as much as its last one."""
    for layer in cache.layers:
        if layer.is_initialized:
            for name in ("keys", "values"):
                old = getattr(layer, name)
                pad = old.new_zeros(*old.shape[:2], extra, old.shape[3])
                setattr(layer, name, torch.cat([old, pad], dim=2))
        layer.max_cache_len += extra


def compile_decoding(
    model: nn.Module, backend: str | Callable = "inductor", mode: str | None = None
) -> nn.Module:
    """Decode `model` with a static KV cache and a compiled step from now on (returns `model`).

    `backend` and `mode` go to `torch.compile` ("eager" traces the graph without generating code).
    Raises ValueError for a model that is not a Hugging Face causal LM with a KV-cache argument (a
    static cache needs the model's config).
    """
    has_cache = forward_accepts(model, "cache") or forward_accepts(model, "past_key_values")
    if getattr(model, "config", None) is None or not has_cache:
        raise ValueError(
            f"compiled decoding needs a Hugging Face causal LM (a `config` and a KV-cache argument), "
            f"got {type(model).__name__}"
        )
    object.__setattr__(model, _ATTRIBUTE, Compiled(model, "decoding", backend, mode))
    return model


def compiled_step(model: nn.Module) -> Compiled | None:
    """`model`'s compiled decode step, or None when it decodes eagerly with a growing cache."""
    return model.__dict__.get(_ATTRIBUTE)


def uncompile_decoding(model: nn.Module) -> None:
    """Back to eager decoding with a growing cache (a no-op for a model never compiled)."""
    model.__dict__.pop(_ATTRIBUTE, None)


def eager_if_sharded(model: nn.Module) -> None:
    """An FSDP2-sharded `model` decodes eagerly, with a warning, even when marked for compiled
    decoding (compiling through FSDP2's hooks is untested), and runs its forward passes eagerly
    (`distill.models.compiled.eager_if_sharded`); call after sharding."""
    forwards_eager_if_sharded(model, stacklevel=3)
    if is_sharded(model) and compiled_step(model) is not None:
        uncompile_decoding(model)
        warnings.warn(
            "model.execution.compile_decoding: the student is sharded (FSDP2), so it decodes eagerly", stacklevel=2
        )

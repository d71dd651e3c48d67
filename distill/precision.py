"""The precision a run computes in, outside the `*_step` methods too.

Lightning enters its precision plugin's context (autocast under `bf16-mixed` / `16-mixed`) only
around `training_step`, `validation_step` and friends; hooks such as `on_after_batch_transfer` and
every callback run outside it. Rollouts and measurements made there would then use another policy
than the one trained: under `bf16-mixed` a float32 student would *sample* in float32 (twice the
KV cache) while it is *trained* as the bf16-autocast policy. `step_precision` is that context, for
every forward pass made outside a step."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext


def step_precision(trainer) -> AbstractContextManager:
    """The context Lightning enters around a step (`precision_plugin.forward_context()`), or a no-op
    without a Trainer (a module used on its own)."""
    plugin = getattr(trainer, "precision_plugin", None) if trainer is not None else None
    return plugin.forward_context() if plugin is not None else nullcontext()

"""What the LightningModules, callbacks and evaluations share about a causal LM: its logits over
the real vocabulary, eval mode without gradients, a state-dict hook that keeps frozen models out
of checkpoints, and export."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn


def causal_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, vocab_size: int
) -> torch.Tensor:
    """Logits `[B, T-1, vocab_size]` predicting tokens 1..T-1. Positions count from each row's
    first real token, as in decoding (left padding), and padded embedding rows are cut off."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    return logits[:, :-1, :vocab_size]


@contextmanager
def eval_no_grad(*models: nn.Module) -> Iterator[None]:
    """Eval mode and `torch.no_grad()` for the duration; every submodule's mode is restored after."""
    modes = {id(m): (m, m.training) for model in models for m in model.modules()}
    for model in models:
        model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        # Set the flag itself: `Module.train(mode)` would recurse and undo the children's modes.
        for module, training in modes.values():
            module.training = training


def drop_from_state_dict(name: str):
    """A state-dict hook removing submodule `name` (a frozen teacher or reference: reloaded from
    its path, never checkpointed). Pair it with `strict_loading = False`."""

    def hook(module, state_dict, prefix, local_metadata):
        for key in [k for k in state_dict if k.startswith(f"{prefix}{name}.")]:
            del state_dict[key]
        return state_dict

    return hook


def export_pretrained(model, tokenizer, path: str | Path) -> Path:
    """`save_pretrained` a model and its tokenizer (loadable with the Auto* classes)."""
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

"""Helpers shared by the rollout tests (a plain module: `conftest` names clash across test dirs)."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 100  # the char tokenizer's real vocabulary; the models' logits are wider


def untie_head(model: nn.Module, seed: int) -> nn.Module:
    """Give a tied model its own random LM head, so greedy decoding stops copying the last input
    token (which both random fixtures otherwise do, and so always agree)."""
    g = torch.Generator().manual_seed(seed)
    head = model.get_output_embeddings()
    head.weight = nn.Parameter(torch.randn(head.weight.shape, generator=g) * 0.5)
    return model


def reference_generate(model, prompts, max_new_tokens: int, eos: int = 2, vocab: int = VOCAB):
    """`generate()` greedy output with ids at or above `vocab` suppressed (as the sampler slices)."""
    return model.generate(
        prompts.input_ids,
        attention_mask=prompts.attention_mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
        suppress_tokens=list(range(vocab, model.config.vocab_size)) or None,
    )


def teacher_forced_logits(model, batch):
    """Logits over a finished rollout in one pass (no KV cache): an independent recomputation."""
    mask = batch.attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions).logits[
            ..., :VOCAB
        ]

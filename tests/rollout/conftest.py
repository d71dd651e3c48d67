"""Fixtures for the rollout tests: a left-padded prompt batch and models that disagree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

ATTENTION_SHARPENING = 10.0


def untie_head(model: nn.Module, seed: int) -> nn.Module:
    """Give a tied model its own random LM head, so greedy decoding stops copying the last input
    token (which both random fixtures otherwise do, and so always agree), and sharpen attention:
    at initialisation it is nearly uniform, which would hide wrong position ids or masks."""
    g = torch.Generator().manual_seed(seed)
    head = model.get_output_embeddings()
    head.weight = nn.Parameter(torch.randn(head.weight.shape, generator=g) * 0.5)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight *= ATTENTION_SHARPENING
            layer.self_attn.k_proj.weight *= ATTENTION_SHARPENING
    return model


@pytest.fixture
def prompts(char_tok):
    """Three left-padded prompts of different lengths."""
    return char_tok(["12 34=46:", "5 6=", "ab"], return_tensors="pt", padding=True)


@pytest.fixture
def student(tiny_student):
    return untie_head(tiny_student, seed=11)


@pytest.fixture
def teacher(tiny_teacher):
    return untie_head(tiny_teacher, seed=12)

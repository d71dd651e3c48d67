"""Fixtures for the rollout tests: a left-padded prompt batch and models that disagree."""

from __future__ import annotations

import pytest
from rollout_helpers import untie_head


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

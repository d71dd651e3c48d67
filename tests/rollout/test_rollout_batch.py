"""RolloutBatch: validation, device moves, text helpers."""

from __future__ import annotations

import pytest
import torch

from distill.rollout import RolloutBatch


def make_batch(char_tok) -> RolloutBatch:
    # Prompts "ab" (padded) and "abc"; completions "xy<eos>" (y by the teacher) and "zz".
    p = char_tok(["ab", "abc"], return_tensors="pt", padding=True)
    ids = {c: char_tok.convert_tokens_to_ids(c) for c in "xyz"}
    gen = torch.tensor([[ids["x"], ids["y"], 2], [ids["z"], ids["z"], 0]])
    written = torch.tensor([[True, True, True], [True, True, False]])
    teacher = torch.tensor([[False, True, False], [True, True, False]])
    off = torch.zeros_like(p.input_ids, dtype=torch.bool)
    return RolloutBatch(
        input_ids=torch.cat([p.input_ids, gen], 1),
        attention_mask=torch.cat([p.attention_mask, written.long()], 1),
        completion_mask=torch.cat([off, written], 1),
        teacher_token_mask=torch.cat([off, teacher], 1),
        prompt_length=p.input_ids.shape[1],
        teacher_generated_tokens=3,
        student_generated_tokens=2,
    )


def test_text_helpers(char_tok):
    batch = make_batch(char_tok)
    assert batch.prompt_ids()[0] == char_tok("ab").input_ids
    assert batch.completions(char_tok) == ["xy", "zz"]
    assert batch.completions(char_tok, skip_special_tokens=False) == ["xy<eos>", "zz"]
    assert batch.render(char_tok) == ["abx⟦y⟧<eos>", "abc⟦zz⟧"]
    assert (batch.batch_size, batch.completion_tokens, batch.teacher_share) == (2, 5, 3 / 5)


def test_to_moves_tensors_and_keeps_counters(char_tok):
    batch = make_batch(char_tok)
    moved = batch.to("meta")
    assert moved.input_ids.device.type == "meta" and moved.teacher_token_mask.device.type == "meta"
    assert batch.input_ids.device.type == "cpu"  # the original is untouched
    assert (moved.prompt_length, moved.teacher_generated_tokens) == (batch.prompt_length, 3)


def test_validation(char_tok):
    batch = make_batch(char_tok)
    with pytest.raises(ValueError, match=r"completion_mask must have shape \(2, 7\)"):
        RolloutBatch(
            batch.input_ids, batch.attention_mask, batch.completion_mask[:, 1:], batch.teacher_token_mask, 4
        )
    outside = batch.teacher_token_mask.clone()
    outside[0, 0] = True
    with pytest.raises(ValueError, match="teacher_token_mask must be a subset of completion_mask"):
        RolloutBatch(batch.input_ids, batch.attention_mask, batch.completion_mask, outside, 4)

"""`RolloutBatch`: prompts plus completions, with masks saying what was generated and by whom."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

TEACHER_OPEN, TEACHER_CLOSE = "⟦", "⟧"


@dataclass
class RolloutBatch:
    """A batch of rollouts, laid out `[B, T]` with `T = prompt_length + generated length`.

    Prompts are left-padded (as given to the sampler); completions follow them right-padded with
    the pad id. `completion_mask` is True on generated tokens (each row's EOS included) and False
    on prompt and padding; `teacher_token_mask` is True on the generated tokens the teacher wrote
    (always a subset of `completion_mask`). `attention_mask` (long, 0/1) covers prompt and
    completion tokens.

    Cost counters: `*_generated_tokens` count completion tokens by writer; `*_forward_tokens`
    count the real tokens each model processed during the rollout (prompt prefill plus one per
    still-running row per decode step; padding and finished rows excluded, so the count does not
    depend on how prompts were batched). Teacher rows read from the cache cost no teacher forward
    tokens; `cached_teacher_rows` says how many there were. `truncated_rows`: rows that wrote no
    EOS, cut off by `max_new_tokens` (a training budget that truncates many rows distils a policy
    that never finishes). `policy_lag`: how many optimiser steps old the student weights that wrote
    its rows were (the vLLM engine, loaded every `sync_every` steps); None when they were the
    current weights by construction (the native decoder).

    Teacher-only context: when the teacher read a prompt of its own, `teacher_input_ids` /
    `teacher_attention_mask` (`[B, T_t]`) are that prompt (left-padded) followed by the same
    completion columns as `input_ids`; the two views align on their last `completion_width`
    columns. Both are None when the teacher read `input_ids` like the student.
    """

    input_ids: Tensor
    attention_mask: Tensor
    completion_mask: Tensor
    teacher_token_mask: Tensor
    prompt_length: int
    teacher_generated_tokens: int = 0
    student_generated_tokens: int = 0
    teacher_forward_tokens: int = 0
    student_forward_tokens: int = 0
    rollout_seconds: float = 0.0
    cached_teacher_rows: int = 0
    truncated_rows: int = 0
    policy_lag: int | None = None
    teacher_input_ids: Tensor | None = None
    teacher_attention_mask: Tensor | None = None

    def __post_init__(self) -> None:
        shape = self.input_ids.shape
        for name in ("attention_mask", "completion_mask", "teacher_token_mask"):
            if getattr(self, name).shape != shape:
                raise ValueError(
                    f"{name} must have shape {tuple(shape)} like input_ids, got {tuple(getattr(self, name).shape)}"
                )
        if bool((self.teacher_token_mask & ~self.completion_mask).any()):
            raise ValueError("teacher_token_mask must be a subset of completion_mask")
        if (self.teacher_input_ids is None) != (self.teacher_attention_mask is None):
            raise ValueError("teacher_input_ids and teacher_attention_mask must be given together")
        if self.teacher_input_ids is not None:
            t_shape, width = self.teacher_input_ids.shape, self.completion_width
            if self.teacher_attention_mask.shape != t_shape:
                raise ValueError(
                    f"teacher_attention_mask must have shape {tuple(t_shape)} like teacher_input_ids, "
                    f"got {tuple(self.teacher_attention_mask.shape)}"
                )
            if t_shape[0] != shape[0] or t_shape[1] <= width:
                raise ValueError(
                    f"teacher_input_ids must be [{shape[0]}, prompt + {width} completion columns], "
                    f"got {tuple(t_shape)}"
                )
            if not torch.equal(self.teacher_input_ids[:, -width:], self.input_ids[:, -width:]):
                raise ValueError("teacher_input_ids must end in the same completion columns as input_ids")

    @property
    def completion_width(self) -> int:
        """Columns after the prompt: generated tokens and the padding after each row's EOS."""
        return int(self.input_ids.shape[1]) - self.prompt_length

    def teacher_inputs(self) -> tuple[Tensor, Tensor]:
        """`(input_ids, attention_mask)` as the teacher reads them: its own view when it has one."""
        if self.teacher_input_ids is not None:
            return self.teacher_input_ids, self.teacher_attention_mask
        return self.input_ids, self.attention_mask

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def completion_tokens(self) -> int:
        return int(self.completion_mask.sum())

    @property
    def teacher_share(self) -> float:
        """Fraction of completion tokens written by the teacher (0.0 for an empty batch)."""
        total = self.completion_tokens
        return float(self.teacher_token_mask.sum()) / total if total else 0.0

    def to(self, device: torch.device | str) -> RolloutBatch:
        """A copy with every tensor on `device` (counters unchanged; not re-validated)."""
        moved = copy.copy(self)
        for name in ("input_ids", "attention_mask", "completion_mask", "teacher_token_mask"):
            setattr(moved, name, getattr(self, name).to(device))
        if self.teacher_input_ids is not None:
            moved.teacher_input_ids = self.teacher_input_ids.to(device)
            moved.teacher_attention_mask = self.teacher_attention_mask.to(device)
        return moved

    def prompt_ids(self) -> list[list[int]]:
        """Each row's prompt token ids, padding removed."""
        prompt, mask = self.input_ids[:, : self.prompt_length], self.attention_mask[:, : self.prompt_length]
        return [row[m.bool()].tolist() for row, m in zip(prompt.cpu(), mask.cpu())]

    def completion_ids(self) -> list[list[int]]:
        """Each row's generated token ids (EOS included, padding removed)."""
        return [row[m].tolist() for row, m in zip(self.input_ids.cpu(), self.completion_mask.cpu())]

    def completions(self, tokenizer, skip_special_tokens: bool = True) -> list[str]:
        """Each row's completion as text (EOS and pad dropped unless `skip_special_tokens=False`)."""
        return tokenizer.batch_decode(self.completion_ids(), skip_special_tokens=skip_special_tokens)

    def render(self, tokenizer) -> list[str]:
        """Prompt plus completion per row, with teacher-written spans wrapped in ⟦ ⟧ (EOS shown).

        Spans are decoded one at a time, so subword tokenizers may differ from a whole-text decode
        by a space at span boundaries; the char tokenizer renders exactly.
        """
        rows = []
        ids, comp, teach = self.input_ids.cpu(), self.completion_mask.cpu(), self.teacher_token_mask.cpu()
        for prompt, row, c, t in zip(self.prompt_ids(), ids, comp, teach):
            text = tokenizer.decode(prompt, skip_special_tokens=True)
            gen, by_teacher = row[c].tolist(), t[c].tolist()
            start = 0
            while start < len(gen):
                end = start
                while end < len(gen) and by_teacher[end] == by_teacher[start]:
                    end += 1
                span = tokenizer.decode(gen[start:end], skip_special_tokens=False)
                text += f"{TEACHER_OPEN}{span}{TEACHER_CLOSE}" if by_teacher[start] else span
                start = end
            rows.append(text)
        return rows

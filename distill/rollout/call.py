"""`SampleCall`: one `RolloutSampler.sample` call's state, from the prompt rows to the `RolloutBatch`.

It holds the call's inputs and the facts derived per row (unpadded prompts, each row's occurrence
among identical prompts, the sampling settings that key the random streams and the cache), collects
what the decode loops write into each row, and assembles the rows into a `RolloutBatch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from distill.rollout.batch import RolloutBatch
from distill.rollout.decoding import Decoded
from distill.rollout.streams import RowStreams
from distill.seeds import derive_seed


@dataclass
class SampleCall:
    """One `RolloutSampler.sample` call: its inputs, derived per-row facts, and what it fills."""

    input_ids: Tensor
    mask: Tensor
    prompts: list[list[int]]
    occurrence: list[int]  # index of each row among identical prompts of the batch
    settings: dict
    seed: int | None
    generator: torch.Generator | None
    vocab: int
    eos_ids: list[int]
    pad_id: int
    rows: list[list[int]]  # generated ids per row
    by_teacher: list[list[bool]]  # per generated token: written by the teacher
    forward_tokens: dict[str, int] = field(default_factory=lambda: {"teacher": 0, "student": 0})
    cached: int = 0  # teacher rows read from the cache
    # The teacher's own prompt batch (teacher-only context), or None: it reads `input_ids`.
    teacher_ids: Tensor | None = None
    teacher_mask: Tensor | None = None
    teacher_prompts: list[list[int]] | None = None
    step: int | None = None  # the optimiser step the student is at, when the caller knows it
    policy_lag: int | None = None  # steps between the student and the weights that wrote its rows

    def prompt_of(self, role: str) -> tuple[Tensor, Tensor]:
        """The left-padded prompt batch `role` ("teacher" or "student") decodes after."""
        if role == "teacher" and self.teacher_ids is not None:
            return self.teacher_ids, self.teacher_mask
        return self.input_ids, self.mask

    @property
    def decode_kwargs(self) -> dict:
        max_new, eos, pad = self.settings["max_new_tokens"], self.eos_ids, self.pad_id
        return dict(vocab_size=self.vocab, max_new_tokens=max_new, eos_token_ids=eos, pad_token_id=pad)

    def streams(self, role: str, rows: Sequence[int]) -> RowStreams:
        """Per-row keyed streams seeded by (seed, role, prompt, occurrence, settings) when seeded;
        else one shared stream drawn from the batch generator (or the global RNG)."""
        if self.seed is not None:
            return RowStreams.per_row(self.row_seeds(role, rows), self.input_ids.device)
        return RowStreams.shared_from(int(self._draw(1)[0]), self.input_ids.device)

    def row_seeds(self, role: str, rows: Sequence[int]) -> list[int]:
        """Each row's seed: from (seed, role, prompt, occurrence, settings) when the call is
        seeded, so that a row's tokens do not depend on its batch-mates; else drawn from the batch
        generator (or the global RNG)."""
        if self.seed is None:
            return self._draw(len(rows))
        return [derive_seed(self.seed, role, self.prompts[i], self.occurrence[i], self.settings) for i in rows]

    def _draw(self, n: int) -> list[int]:
        device = self.generator.device if self.generator is not None else "cpu"
        return torch.randint(2**62, (n,), generator=self.generator, device=device).tolist()

    def collect(self, out: Decoded, idx: list[int]) -> None:
        """Store a decode loop's tokens (up to each row's length) as rows `idx` of the call."""
        tokens, teacher, lengths = out.tokens.tolist(), out.teacher.tolist(), out.lengths.tolist()
        for j, i in enumerate(idx):
            self.rows[i], self.by_teacher[i] = tokens[j][: lengths[j]], teacher[j][: lengths[j]]

    def assemble(self, seconds: float) -> RolloutBatch:
        """The prompts and their written rows as a `RolloutBatch`, with the call's cost counters."""
        input_ids, mask, fwd = self.input_ids, self.mask, self.forward_tokens
        b, p = input_ids.shape
        n = max(len(r) for r in self.rows)
        gen = torch.full((b, n), self.pad_id, dtype=input_ids.dtype)
        written = torch.zeros(b, n, dtype=torch.bool)
        teacher = torch.zeros(b, n, dtype=torch.bool)
        for i, (r, t) in enumerate(zip(self.rows, self.by_teacher)):
            gen[i, : len(r)] = torch.tensor(r, dtype=input_ids.dtype)
            written[i, : len(r)] = True
            teacher[i, : len(t)] = torch.tensor(t, dtype=torch.bool)
        device = input_ids.device
        prompt_false = torch.zeros(b, p, dtype=torch.bool, device=device)
        completion = torch.cat([prompt_false, written.to(device)], dim=1)
        teacher_tokens = int(teacher.sum())
        teacher_view = {}
        if self.teacher_ids is not None:
            teacher_view = {
                "teacher_input_ids": torch.cat([self.teacher_ids, gen.to(device)], dim=1),
                "teacher_attention_mask": torch.cat([self.teacher_mask, written.to(device).long()], dim=1),
            }
        return RolloutBatch(
            input_ids=torch.cat([input_ids, gen.to(device)], dim=1),
            attention_mask=torch.cat([mask, written.to(device).long()], dim=1),
            completion_mask=completion,
            teacher_token_mask=torch.cat([prompt_false, teacher.to(device)], dim=1),
            prompt_length=p,
            teacher_generated_tokens=teacher_tokens,
            student_generated_tokens=int(written.sum()) - teacher_tokens,
            teacher_forward_tokens=fwd["teacher"],
            student_forward_tokens=fwd["student"],
            rollout_seconds=seconds,
            cached_teacher_rows=self.cached,
            truncated_rows=sum(1 for r in self.rows if r[-1] not in self.eos_ids),
            policy_lag=self.policy_lag,
            **teacher_view,
        )


def unpadded(input_ids: Tensor, mask: Tensor) -> list[list[int]]:
    """Each row's ids with the padding (mask 0) removed."""
    return [row[m.bool()].tolist() for row, m in zip(input_ids.cpu(), mask.cpu())]

"""Who writes each token of a rollout: the four granularities of `RolloutSampler`.

`batch` and `sequence` give whole rows to the teacher (`teacher_rows`) and decode each model's rows
apart, the teacher's through the teacher-rollout cache (`sample_per_row`); `token` and
`speculative` step both models together, a rule choosing each token's writer (`sample_per_token`).
Each function reads the sampler's settings and fills a `SampleCall`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from distill.rollout.cache import row_key, teacher_identity
from distill.rollout.call import SampleCall
from distill.rollout.decoding import StepRule, choose_tokens, decode, strip_common_padding
from distill.rollout.streams import RowStreams

if TYPE_CHECKING:
    from distill.rollout.sampler import RolloutSampler


def sample_per_row(sampler: RolloutSampler, call: SampleCall, student: nn.Module, teacher: nn.Module) -> None:
    """`batch` / `sequence`: whole rows written by one model; teacher rows come from the cache
    when it has them (seeded or greedy sampling), else are decoded and stored."""
    b = call.input_ids.shape[0]
    teacher_idx = teacher_rows(sampler.granularity, sampler.mix, b, call.generator)
    student_idx = [i for i in range(b) if i not in set(teacher_idx)]
    keys = {}
    if sampler.cache is not None and (call.seed is not None or sampler.temperature == 0) and teacher_idx:
        identity = teacher_identity(teacher)
        key_seed = None if sampler.temperature == 0 else call.seed  # greedy output ignores the seed
        own = call.teacher_prompts  # the teacher's own prompt, when it reads one
        keys = {
            i: row_key(
                identity,
                call.prompts[i],
                call.occurrence[i],
                call.settings,
                key_seed,
                **({} if own is None else {"teacher_prompt": own[i]}),
            )
            for i in teacher_idx
        }
    todo = []
    for i in teacher_idx:
        hit = sampler.cache.get(keys[i]) if i in keys else None
        if hit is None or not 1 <= len(hit) <= sampler.max_new_tokens:
            todo.append(i)
        else:
            call.rows[i], call.by_teacher[i] = hit, [True] * len(hit)
            call.cached += 1
    if todo:
        _decode_rows(sampler, call, teacher, "teacher", todo)
        for i in todo:
            if i in keys:
                sampler.cache.put(keys[i], call.rows[i])
    if student_idx:
        _decode_rows(sampler, call, student, "student", student_idx)


def _decode_rows(
    sampler: RolloutSampler, call: SampleCall, model: nn.Module, role: str, idx: list[int]
) -> None:
    ids, m = call.prompt_of(role)
    ids, m = strip_common_padding(ids[idx], m[idx])
    rule = single_rule(sampler, role == "teacher")
    out = decode([model], ids, m, rule, call.streams(role, idx), **call.decode_kwargs)
    call.forward_tokens[role] += out.forward_tokens[0]
    call.collect(out, idx)


def sample_per_token(
    sampler: RolloutSampler, call: SampleCall, student: nn.Module, teacher: nn.Module
) -> None:
    """`token` / `speculative`: both models step together; a rule picks each token's writer."""
    b = call.input_ids.shape[0]
    rule = token_rule(sampler) if sampler.granularity == "token" else speculative_rule(sampler, call.vocab)
    streams = call.streams(sampler.granularity, range(b))
    own = None if call.teacher_ids is None else [None, call.prompt_of("teacher")]
    out = decode(
        [student, teacher],
        call.input_ids,
        call.mask,
        rule,
        streams,
        model_prompts=own,
        **call.decode_kwargs,
    )
    call.forward_tokens["student"], call.forward_tokens["teacher"] = out.forward_tokens
    call.collect(out, list(range(b)))


# -- choosing who writes ---------------------------------------------------------------------------


def teacher_rows(granularity: str, mix: float, b: int, generator: torch.Generator | None) -> list[int]:
    """The rows of a `b`-row batch the teacher writes: all or none by one coin (`batch`), else
    round(mix·b) rows of a random permutation (`sequence`)."""
    device = generator.device if generator is not None else "cpu"
    if granularity == "batch":
        coin = torch.rand((), generator=generator, device=device)
        return list(range(b)) if bool(coin < mix) else []
    n = math.floor(mix * b + 0.5)
    return sorted(torch.randperm(b, generator=generator, device=device)[:n].tolist())


def _choose(sampler: RolloutSampler, logits: Tensor, streams: RowStreams, purpose: str = "token") -> Tensor:
    return choose_tokens(logits, streams, sampler.temperature, sampler.top_k, sampler.top_p, purpose)


def single_rule(sampler: RolloutSampler, teacher: bool) -> StepRule:
    """One model writes every token; `teacher` says which one it is."""

    def rule(logits: list[Tensor], streams: RowStreams) -> tuple[Tensor, Tensor]:
        tokens = _choose(sampler, logits[0], streams)
        return tokens, torch.full_like(tokens, teacher, dtype=torch.bool)

    return rule


def token_rule(sampler: RolloutSampler) -> StepRule:
    """Each token from the mixture (1 − mix)·p_S + mix·p_T: a Bernoulli(mix) draw picks the writer."""

    def rule(logits: list[Tensor], streams: RowStreams) -> tuple[Tensor, Tensor]:
        student, teacher = logits
        pick_teacher = streams.uniform(student.shape[0], "mix") < sampler.mix
        # Filtering is per row, so sampling each row from its writer's logits is the mixture.
        return _choose(sampler, torch.where(pick_teacher[:, None], teacher, student), streams), pick_teacher

    return rule


def speculative_rule(sampler: RolloutSampler, vocab: int) -> StepRule:
    """The student proposes; a proposal outside the teacher's top `speculative_top_k` is replaced
    by a sample from the teacher."""
    k = min(sampler.speculative_top_k, vocab)

    def rule(logits: list[Tensor], streams: RowStreams) -> tuple[Tensor, Tensor]:
        student, teacher = logits
        proposal = _choose(sampler, student, streams)
        accepted = (teacher.topk(k, dim=-1).indices == proposal[:, None]).any(dim=-1)
        replacement = _choose(sampler, teacher, streams, "replacement")
        return torch.where(accepted, proposal, replacement), ~accepted

    return rule

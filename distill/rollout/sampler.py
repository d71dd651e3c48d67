"""`RolloutSampler`: rollouts from a student/teacher mixture, at four granularities.

The sampler holds and checks the settings and runs a call; its per-row bookkeeping is a
`call.SampleCall`. Who writes each token: `batch` and `sequence` give whole rows to the teacher
(`teacher_rows`) and decode each model's rows apart, the teacher's through the teacher-rollout cache
(`sample_per_row`); `token` and `speculative` step both models together, a rule choosing each
token's writer (`sample_per_token`). Whole rows are decoded by the native decoder or, with
`engine="vllm"`, by each model's vLLM engine (`vllm_engine`).
"""

from __future__ import annotations

import math
import os
import time

import torch
from torch import Tensor, nn

from distill.checks import is_int, is_number
from distill.models.forward import eval_no_grad
from distill.names import GRANULARITIES
from distill.rollout.batch import RolloutBatch
from distill.rollout.cache import RolloutCache, row_key, teacher_identity
from distill.rollout.call import SampleCall, unpadded
from distill.rollout.decoding import (
    StepRule,
    check_left_padded,
    choose_tokens,
    decode,
    logit_width,
    strip_common_padding,
)
from distill.rollout.special_ids import special_ids
from distill.rollout.streams import RowStreams
from distill.rollout.vllm_engine import ENGINES, Engines, VLLMSettings, check_installed
from distill.seeds import derive_seed


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
    if sampler.engines is not None:
        _generate_rows(sampler, call, model, role, idx)
        return
    ids, m = call.prompt_of(role)
    ids, m = strip_common_padding(ids[idx], m[idx])
    rule = single_rule(sampler, role == "teacher")
    out = decode([model], ids, m, rule, call.streams(role, idx), **call.decode_kwargs)
    call.forward_tokens[role] += out.forward_tokens[0]
    call.collect(out, idx)


def _generate_rows(
    sampler: RolloutSampler, call: SampleCall, model: nn.Module, role: str, idx: list[int]
) -> None:
    """Rows `idx` written by `role`'s vLLM engine, one request a row, each seeded as the native
    decoder seeds that row's stream (`SampleCall.row_seeds`)."""
    if role == "student":
        engine, call.policy_lag = sampler.engines.student(model, call.step)
    else:
        engine = sampler.engines.engine(role, model)
    ids, m = call.prompt_of(role)
    prompts = unpadded(ids[idx], m[idx])
    rows = engine.generate(
        prompts,
        call.row_seeds(role, idx),
        temperature=sampler.temperature,
        top_k=sampler.top_k,
        top_p=sampler.top_p,
        max_new_tokens=sampler.max_new_tokens,
        eos_ids=call.eos_ids,
        vocab=call.vocab,
    )
    for i, prompt, row in zip(idx, prompts, rows):
        call.rows[i], call.by_teacher[i] = row, [role == "teacher"] * len(row)
        # As the native decoder counts: the prompt once, then each written token but the last.
        call.forward_tokens[role] += len(prompt) + len(row) - 1


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


CACHE_ENV = "DISTILL_ROLLOUT_CACHE"


class RolloutSampler:
    """Generates completions for a prompt batch from a mixture of the student and the teacher.

    Args:
        mix: The teacher's share λ in [0, 1]: 0 = fully on-policy student rollouts, 1 = fully
            teacher rollouts. Not used by the "speculative" granularity (there `speculative_top_k`
            sets how often the teacher steps in).
        granularity: Who decides, and how often:
            "batch": one Bernoulli(mix) draw per batch; the teacher or the student writes the
            whole batch (as TRL's GKD). "sequence": exactly round(mix·B) rows of each batch
            (half rounds up; rows from a random permutation) are written by the teacher, the
            rest by the student. "token": every token is drawn from the mixture
            (1−mix)·p_S + mix·p_T of the two filtered distributions, by drawing Bernoulli(mix)
            per token to pick the writer and sampling from that model. "speculative": the
            student proposes each token; one outside the teacher's top `speculative_top_k` is
            replaced by a sample from the teacher (Speculative Knowledge Distillation).
            In batch and sequence modes each model decodes only its own rows.
            `teacher_token_mask` marks: every token of a teacher-written row (batch, sequence);
            the tokens whose Bernoulli draw picked the teacher (token); the replaced proposals
            (speculative: a proposal inside the teacher's top-k stays student-written).
        max_new_tokens: Most tokens generated per row (EOS included).
        temperature: Sampling temperature; 0 means greedy (argmax) decoding.
        top_k: Keep only the k most likely tokens before sampling (None: no limit).
        top_p: Nucleus sampling: keep the most likely tokens up to this total probability, in (0, 1].
        eos_token_id: Id(s) that end a row. None: from the models' generation config or config.
        pad_token_id: Id written after a row's EOS. None: from the models' generation config or config.
        vocab_size: Logit columns that are real tokens (the tokenizer's length); ids at or above
            it are never produced. None: the smaller of the two models' logit widths.
        speculative_top_k: Teacher top-k a student proposal must fall in ("speculative" only).
            At or above the vocabulary size nothing is ever replaced; 1 with greedy decoding
            reproduces the teacher's greedy output.
        cache_dir: Directory caching teacher-only rows (batch and sequence modes) across runs;
            used when `sample` gets a `seed` or decoding is greedy. None: the
            `DISTILL_ROLLOUT_CACHE` environment variable if set, else no cache.
        engine: Who decodes whole rows: "native" (distill's decoder, every granularity) or
            "vllm" (each model's vLLM engine; batch and sequence granularity only, since token and
            speculative granularity step both models together).
        vllm: The engines' settings with `engine="vllm"` (`vllm_engine.VLLMSettings`; None: its
            defaults).
    """

    def __init__(
        self,
        mix: float,
        granularity: str = "sequence",
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | list[int] | None = None,
        pad_token_id: int | None = None,
        vocab_size: int | None = None,
        speculative_top_k: int = 5,
        cache_dir: str | None = None,
        engine: str = "native",
        vllm: VLLMSettings | None = None,
    ):
        if not is_number(mix) or not 0.0 <= mix <= 1.0:
            raise ValueError(f"mix must be in [0, 1], got {mix!r}")
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}; got {granularity!r}")
        if not is_int(max_new_tokens) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        if not is_number(temperature) or temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
        if top_k is not None and (not is_int(top_k) or top_k < 1):
            raise ValueError(f"top_k must be None or an integer >= 1, got {top_k!r}")
        if top_p is not None and (not is_number(top_p) or not 0.0 < top_p <= 1.0):
            raise ValueError(f"top_p must be None or in (0, 1], got {top_p!r}")
        eos_list = [eos_token_id] if is_int(eos_token_id) else eos_token_id
        if eos_list is not None and (
            not isinstance(eos_list, (list, tuple))
            or not eos_list
            or not all(is_int(e) and e >= 0 for e in eos_list)
        ):
            raise ValueError(
                f"eos_token_id must be None, an id >= 0 or a non-empty list of them, got {eos_token_id!r}"
            )
        if pad_token_id is not None and (not is_int(pad_token_id) or pad_token_id < 0):
            raise ValueError(f"pad_token_id must be None or an id >= 0, got {pad_token_id!r}")
        if vocab_size is not None and (not is_int(vocab_size) or vocab_size < 1):
            raise ValueError(f"vocab_size must be None or an integer >= 1, got {vocab_size!r}")
        if not is_int(speculative_top_k) or speculative_top_k < 1:
            raise ValueError(f"speculative_top_k must be an integer >= 1, got {speculative_top_k!r}")
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}; got {engine!r}")
        if engine == "vllm" and granularity not in ("batch", "sequence"):
            raise ValueError(
                f"engine vllm writes whole rows (granularity batch or sequence); granularity "
                f"{granularity!r} steps both models together, which only the native engine does"
            )
        if engine == "vllm":
            check_installed(vllm or VLLMSettings())
        if cache_dir is None:
            cache_dir = os.environ.get(CACHE_ENV) or None
        self.mix = float(mix)
        self.granularity = granularity
        self.max_new_tokens = max_new_tokens
        self.temperature = float(temperature)
        self.top_k = top_k
        self.top_p = None if top_p is None else float(top_p)
        self.eos_token_id = None if eos_list is None else [int(e) for e in eos_list]
        self.pad_token_id = pad_token_id
        self.tokenizer_ids: tuple[list[int], int | None] = ([], None)  # see `use_tokenizer`
        self.vocab_size = vocab_size
        self.speculative_top_k = speculative_top_k
        self.cache = RolloutCache(cache_dir) if cache_dir else None
        self.engine = engine
        self.engines = Engines(vllm or VLLMSettings()) if engine == "vllm" else None

    def __repr__(self) -> str:
        return (
            f"RolloutSampler(mix={self.mix}, granularity={self.granularity!r}, "
            f"max_new_tokens={self.max_new_tokens}, temperature={self.temperature}, top_k={self.top_k}, "
            f"top_p={self.top_p}, speculative_top_k={self.speculative_top_k}, engine={self.engine!r})"
        )

    def sample(
        self,
        student: nn.Module,
        teacher: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        teacher_input_ids: Tensor | None = None,
        teacher_attention_mask: Tensor | None = None,
        step: int | None = None,
    ) -> RolloutBatch:
        """Roll out a left-padded prompt batch (`input_ids`, `attention_mask`: `[B, P]`).

        Teacher-only context: `teacher_input_ids` / `teacher_attention_mask` (`[B, P_t]`, left-padded,
        the same rows) is the prompt the teacher reads instead, e.g. with a system prompt or
        privileged context the student never sees. The teacher then writes its tokens after its
        own prompt, the student after `input_ids`; the batch carries both views
        (`RolloutBatch.teacher_input_ids`), aligned on the same completion tokens.

        Randomness: batch-level choices (the batch coin, the sequence permutation) use
        `generator` if given, else a generator seeded from `seed` and the batch's prompts, else
        torch's global RNG. Per-token draws with a `seed` are keyed per row by a row seed hashed
        from (seed, role, prompt row, its occurrence among identical prompts in the batch, the
        sampling settings) and come from a counter-based hash of (row seed, decode position,
        purpose) (`streams.RowStreams`), so a row's rollout does not depend on its batch-mates
        (this is what makes teacher rows cacheable); without a seed they come from one generator
        drawn from `generator` / the global RNG.

        Both models run under `torch.no_grad()` in eval mode, and get their previous modes back.
        The models must be on the device of `input_ids`.

        `step`: the optimiser step the student's weights are at; with the vLLM engine, it decides
        when they are loaded into the student's engine again (`VLLMSettings.sync_every`; None:
        whenever they changed).
        """
        start = time.perf_counter()
        check_left_padded(input_ids, attention_mask)
        if seed is not None and not is_int(seed):
            raise ValueError(f"seed must be None or an integer, got {seed!r}")
        call = self._prepare(student, teacher, input_ids, attention_mask, generator, seed)
        call.step = step
        if (teacher_input_ids is None) != (teacher_attention_mask is None):
            raise ValueError("teacher_input_ids and teacher_attention_mask must be given together")
        if teacher_input_ids is not None:
            check_left_padded(teacher_input_ids, teacher_attention_mask)
            if teacher_input_ids.shape[0] != input_ids.shape[0]:
                raise ValueError(
                    f"teacher_input_ids must have {input_ids.shape[0]} rows like input_ids, "
                    f"got {teacher_input_ids.shape[0]}"
                )
            call.teacher_ids, call.teacher_mask = teacher_input_ids, teacher_attention_mask.long()
            call.teacher_prompts = unpadded(teacher_input_ids, call.teacher_mask)
        with eval_no_grad(student, teacher):
            if self.granularity in ("batch", "sequence"):
                sample_per_row(self, call, student, teacher)
            else:
                sample_per_token(self, call, student, teacher)
        return call.assemble(time.perf_counter() - start)

    def _prepare(self, student, teacher, input_ids, attention_mask, generator, seed) -> SampleCall:
        eos_ids, pad_id = special_ids(
            self.eos_token_id, self.pad_token_id, student, teacher, self.tokenizer_ids
        )
        vocab = self._vocab(student, teacher)
        settings = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "eos": eos_ids,
            "pad": pad_id,
            "vocab_size": vocab,
        }
        if self.engine != "native":  # another sampler: other tokens for the same row seed
            settings["engine"] = self.engine
        mask = attention_mask.long()
        prompts = unpadded(input_ids, mask)
        seen: dict[tuple[int, ...], int] = {}
        occurrence = []
        for p in prompts:
            occurrence.append(seen.get(tuple(p), 0))
            seen[tuple(p)] = occurrence[-1] + 1
        if generator is None and seed is not None:
            generator = torch.Generator().manual_seed(derive_seed(seed, "batch", prompts))
        b = input_ids.shape[0]
        return SampleCall(
            input_ids=input_ids,
            mask=mask,
            prompts=prompts,
            occurrence=occurrence,
            settings=settings,
            seed=seed,
            generator=generator,
            vocab=vocab,
            eos_ids=eos_ids,
            pad_id=pad_id,
            rows=[[] for _ in range(b)],
            by_teacher=[[] for _ in range(b)],
        )

    # -- inputs and outputs ----------------------------------------------------------------

    def use_tokenizer(self, tokenizer) -> RolloutSampler:
        """Take the real vocabulary size and the fallback EOS and pad ids from `tokenizer` (see
        `special_ids.special_ids`: hub instruct models such as Llama-3 have no pad id in their
        generation config, and more EOS ids in it than their tokenizer names)."""
        self.vocab_size = len(tokenizer)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.tokenizer_ids = ([] if eos is None else [int(eos)], getattr(tokenizer, "pad_token_id", None))
        return self

    def _vocab(self, student: nn.Module, teacher: nn.Module) -> int:
        widths = min(logit_width(student), logit_width(teacher))
        if self.vocab_size is None:
            return widths
        if self.vocab_size > widths:
            raise ValueError(
                f"vocab_size must be <= the models' logit widths ({widths}), got {self.vocab_size}"
            )
        return self.vocab_size

"""Decoding helpers: logit filtering, token choice, the KV-cached decode loop (random streams: `streams`).

The loop steps one or more Hugging Face causal LMs together over a left-padded prompt batch; a
`rule` turns the models' next-token logits into tokens and a "teacher wrote it" flag, which is how
the sampler's granularities differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from distill.models.forward import forward_accepts
from distill.rollout.compiled import capacity, compiled_step, make_room, new_cache
from distill.rollout.streams import RowStreams, diverged_error

# One decode step's draws: rule(logits per model [b, V] float32, streams at this position)
# -> (tokens [b], teacher_written [b] bool)
StepRule = Callable[[list[Tensor], RowStreams], tuple[Tensor, Tensor]]


def filter_logits(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None) -> Tensor:
    """Temperature, then top-k, then top-p (nucleus) filtering, in Hugging Face's order.

    Removed entries become -inf. Top-p keeps the smallest set of most likely tokens whose total
    probability reaches `top_p` (always at least one token). `temperature` must be > 0 here; greedy
    decoding (temperature 0) takes the argmax of the raw logits instead.
    """
    logits = logits.float() if temperature == 1 else logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the more likely ones before it already reach top_p.
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def choose_tokens(
    logits: Tensor,
    streams: RowStreams,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    purpose: str = "token",
) -> Tensor:
    """Greedy argmax when `temperature == 0`, else a sample from the filtered distribution."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, temperature, top_k, top_p).softmax(dim=-1)
    return streams.categorical(probs, purpose)


def logit_width(model: nn.Module) -> int:
    """How many logit columns the model produces (its output embedding rows, padding included)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and hasattr(head, "weight"):
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def _forward_kwargs(model: nn.Module) -> tuple[str, bool]:
    """The KV-cache argument's name (`cache` from transformers 5.2x, `past_key_values` before) and
    whether the model accepts `logits_to_keep` (skips the LM head over the prompt)."""
    cache = "cache" if forward_accepts(model, "cache") else "past_key_values"
    return cache, forward_accepts(model, "logits_to_keep")


def _cache_of(output: object) -> object:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def check_left_padded(input_ids: Tensor, attention_mask: Tensor) -> None:
    """Raise unless `input_ids`/`attention_mask` are a non-empty left-padded `[B, P]` batch."""
    if input_ids.ndim != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, P] tensor, got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
        )
    mask = attention_mask.long()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 and 1")
    if bool((mask[:, 1:] < mask[:, :-1]).any()) or bool((mask[:, -1] == 0).any()):
        raise ValueError(
            "prompts must be left-padded: each attention_mask row is 0…0 1…1 with at least one 1"
        )


@dataclass
class Decoded:
    """Tokens written by one decode loop over a (sub-)batch."""

    tokens: Tensor  # [b, n] generated ids, pad after each row's EOS
    teacher: Tensor  # [b, n] bool, True where the teacher wrote the token
    lengths: Tensor  # [b] generated tokens per row, EOS included
    forward_tokens: list[int]  # real tokens each model processed (prompt prefill included)


def strip_common_padding(input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Drop leading columns that are padding in every row (a sub-batch rarely needs them)."""
    first = int(attention_mask.long().argmax(dim=-1).min())
    return input_ids[:, first:], attention_mask[:, first:]


def decode(
    models: Sequence[nn.Module],
    input_ids: Tensor,
    attention_mask: Tensor,
    rule: StepRule,
    streams: RowStreams,
    *,
    vocab_size: int,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    model_prompts: Sequence[tuple[Tensor, Tensor] | None] | None = None,
) -> Decoded:
    """Decode a left-padded batch with every model in `models` stepped together (KV caches).

    Position ids follow `generate()`: cumsum of the attention mask minus one, so left padding does
    not shift positions. A row stops at its first EOS and then emits `pad_token_id`; the loop ends
    when every row has stopped or `max_new_tokens` tokens were written. Logits are sliced to
    `vocab_size` columns so padded embedding rows are never sampled. Call under `eval_no_grad`.

    `model_prompts[i]`, when given and not None, is model i's own left-padded prompt batch
    `(input_ids, attention_mask)` (same rows, any width) in place of `input_ids`: a teacher
    conditioned on a context the student does not see. Every model then reads the same
    generated tokens after its own prompt.

    A model marked by `distill.rollout.compiled.compile_decoding` decodes with a static KV cache
    and its compiled step after an eager prefill; cache and mask grow a block of slots at a time,
    each generated slot switched on just before its token is fed. The others decode with a cache
    and a mask that grow each step.
    """
    b, device = input_ids.shape[0], input_ids.device
    own = list(model_prompts) if model_prompts is not None else [None] * len(models)
    if len(own) != len(models) or any(p is not None and p[0].shape[0] != b for p in own):
        raise ValueError(f"model_prompts must give one ({b}-row prompt batch or None) per model")
    prompts = [(input_ids, attention_mask) if p is None else p for p in own]
    masks = [m.long() for _, m in prompts]
    step_ids = [ids for ids, _ in prompts]
    step_positions = [(m.cumsum(-1) - 1).masked_fill(m == 0, 0) for m in masks]
    eos = torch.tensor(list(eos_token_ids), device=device)
    caches: list[object] = [None] * len(models)
    calls = [_forward_kwargs(model) for model in models]
    forward_tokens = [int(m.sum()) for m in masks]
    compiled = [compiled_step(model) for model in models]
    widths = [m.shape[1] for m in masks]  # each model's prompt width
    for i, step in enumerate(compiled):
        if step is not None:  # the prompt's slots, then generated ones, none written yet
            caches[i] = new_cache(models[i], widths[i], max_new_tokens)
            slots = capacity(caches[i]) - widths[i]
            masks[i] = torch.cat([masks[i], masks[i].new_zeros(b, slots)], dim=-1)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    live = torch.zeros((), dtype=torch.long, device=device)  # tokens fed after the prompt, summed
    streams = streams.deferring()  # one host sync per step: the stop check below
    tokens, teacher = [], []
    for _ in range(max_new_tokens):
        logits = []
        for i, model in enumerate(models):
            cache_arg, keep_arg = calls[i]
            extra = {"logits_to_keep": 1} if keep_arg else {}
            inputs = dict(
                input_ids=step_ids[i],
                attention_mask=masks[i],
                position_ids=step_positions[i],
                use_cache=True,
                **{cache_arg: caches[i]},
                **extra,
            )
            if compiled[i] is None:
                out = model(**inputs)
                caches[i] = _cache_of(out)
            else:  # the static cache is written in place; the prefill (its width varies) runs eagerly
                out = compiled[i](model, **inputs) if tokens else model(**inputs)
            logits.append(out.logits[:, -1, :vocab_size].float())
        next_ids, by_teacher = rule(logits, streams.at(len(tokens)))
        next_ids = next_ids.masked_fill(done, pad_token_id)
        tokens.append(next_ids)
        teacher.append(by_teacher & ~done)
        done = done | torch.isin(next_ids, eos)
        stop, unhealthy = torch.stack([done.all(), streams.unhealthy(device)]).tolist()
        if unhealthy:
            raise diverged_error()
        if stop or len(tokens) == max_new_tokens:
            break
        live = live + (~done).sum()
        step_ids = [next_ids[:, None]] * len(models)
        step_positions = [p[:, -1:] + 1 for p in step_positions]
        for i, c in enumerate(compiled):
            if c is None:
                masks[i] = torch.cat([masks[i], masks[i].new_ones(b, 1)], dim=-1)
            else:  # the slot the token just written is fed into (in place: the shape stays static)
                slot = widths[i] + len(tokens) - 1
                grown = make_room(caches[i], slot, widths[i] + max_new_tokens)  # a full cache grows
                if grown:
                    masks[i] = torch.cat([masks[i], masks[i].new_zeros(b, grown)], dim=-1)
                masks[i][:, slot] = 1
    tokens_t = torch.stack(tokens, dim=1)
    written = torch.ones_like(tokens_t, dtype=torch.bool)
    # A position counts until (and including) the row's first EOS.
    hit = torch.isin(tokens_t, eos).long()
    after_eos = (hit.cumsum(dim=1) - hit) > 0
    written &= ~after_eos
    forward_tokens = [n + int(live) for n in forward_tokens]
    return Decoded(tokens_t, torch.stack(teacher, dim=1) & written, written.sum(dim=1), forward_tokens)

"""Which ids end a rollout row and which pad it: from the models' generation configs, the caller,
and the tokenizer, in that order (hub instruct models disagree on where they keep them)."""

from __future__ import annotations

from torch import nn


def model_token_id(student: nn.Module, teacher: nn.Module, name: str) -> int | list[int] | None:
    """`name` from the models' generation config (else config); an error if the two disagree."""
    found = []
    for model in (student, teacher):
        for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
            value = getattr(source, name, None) if source is not None else None
            if value is not None:
                found.append(value)
                break
    if len(found) == 2 and found[0] != found[1]:
        raise ValueError(
            f"student and teacher disagree on {name} ({found[0]} vs {found[1]}): pass {name} to RolloutSampler"
        )
    return found[0] if found else None


def special_ids(
    eos_token_id: list[int] | None,
    pad_token_id: int | None,
    student: nn.Module,
    teacher: nn.Module,
    tokenizer_ids: tuple[list[int], int | None] = ([], None),
) -> tuple[list[int], int]:
    """The EOS ids that end a row and the pad id written after it.

    EOS: the ids given, else the models' generation config (or config) merged with the tokenizer's
    EOS (`tokenizer_ids[0]`), in that order without repeats: Llama-3-Instruct ends turns with
    `<|eot_id|>`, which its generation config lists beside `<|end_of_text|>`. Pad: the id given,
    else the models' generation config, else the tokenizer's pad (`tokenizer_ids[1]`), else the
    first EOS (Llama-3 has no pad id; a pad after EOS is never read, so any id serves).
    """
    tok_eos, tok_pad = tokenizer_ids
    eos = eos_token_id
    if eos is None:
        found = model_token_id(student, teacher, "eos_token_id")
        found = [] if found is None else [found] if isinstance(found, int) else list(found)
        eos = list(dict.fromkeys([*found, *tok_eos]))
    if not eos:
        raise ValueError(
            "eos_token_id is unset: pass it to RolloutSampler, or set it in the models' "
            "generation_config or the tokenizer"
        )
    pad = pad_token_id
    if pad is None:
        pad = model_token_id(student, teacher, "pad_token_id")
    pad = pad[0] if isinstance(pad, (list, tuple)) else pad
    pad = tok_pad if pad is None else pad
    pad = eos[0] if pad is None else pad
    return [int(e) for e in eos], int(pad)

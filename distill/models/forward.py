"""What the LightningModules, callbacks and evaluations share about a causal LM: its logits over
the real vocabulary (all positions, or only the completion region: "lean" forward passes), eval
mode without gradients, a state-dict hook that keeps frozen models out of checkpoints, and export."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch import nn

from distill.checks import check_int, check_number
from distill.models.compiled import compiled_forward
from distill.parallel import full_state_dict, gathered


def forward_accepts(model, name: str) -> bool:
    """Whether `model`'s forward takes the keyword `name` (HF causal LMs take `logits_to_keep`)."""
    return name in inspect.signature(model.forward).parameters


def completion_width(mask: torch.Tensor) -> int:
    """K: how many trailing columns of `mask` (`[B, T-1]`, the completion mask aligned with the
    logits) hold all of its True entries, at least 1. Rollouts are left-padded prompts followed by
    completions, so every completion ends a row in the same last columns: only the last K
    positions need logits. Counted from the right, so two models whose prompts differ in width
    (a teacher with its own context) still align on the same completion tokens."""
    columns = mask.bool().any(0).nonzero()
    return mask.shape[-1] - int(columns[0]) if columns.numel() else 1


def causal_logits(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vocab_size: int,
    keep: int | None = None,
) -> torch.Tensor:
    """Logits `[B, T-1, vocab_size]` predicting tokens 1..T-1, or with `keep` = K only the last K:
    `[B, K, vocab_size]` predicting tokens T-K..T-1 (`completion_width`). Positions count from each
    row's first real token, as in decoding (left padding), and padded embedding rows are cut off.

    With `keep`, only those K positions go through the LM head when the model's forward takes
    `logits_to_keep` (HF Llama, Qwen2 and the other decoder-only models of transformers >= 5); a
    model that does not take it computes every position's logits and they are sliced (the same
    numbers, without the memory saving). Hidden states are not sliced by hand: that would skip
    whatever a model's head does besides the projection (final soft-capping, logit scaling).

    A model marked by `distill.models.compiled.compile_forwards` runs its compiled forward."""
    seq = input_ids.shape[1]
    width = seq - 1 if keep is None else check_int("keep", keep, 1, seq - 1)
    kwargs = {}
    if keep is not None and forward_accepts(model, "logits_to_keep"):
        kwargs["logits_to_keep"] = keep + 1  # the last position predicts nothing and is dropped
    elif keep is not None:
        warnings.warn(
            f"{type(model).__name__}.forward takes no logits_to_keep: every position's logits are "
            "computed and sliced (the same numbers, without the memory saving)",
            stacklevel=2,
        )
    if forward_accepts(model, "use_cache"):
        kwargs["use_cache"] = False  # a scoring pass needs no KV cache (it would hold every layer's)
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
    compiled = compiled_forward(model)
    out = model(**inputs) if compiled is None else compiled(model, **inputs)
    return out.logits[:, -(width + 1) : -1, :vocab_size]


def causal_nll(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    vocab_size: int,
    mask: torch.Tensor,
    budget_mb: float,
) -> torch.Tensor:
    """Float32 negative log-likelihoods `[N]` of the tokens `mask` selects (`[B, T-1]`, aligned as
    `causal_logits` aligns tokens 1..T-1), in row-major order, with only `budget_mb` MiB of float32
    logits alive at once (cross-entropy holds one more chunk of the same size), never `[B, T, V]`.

    The trunk runs once, through the model's own forward (so FSDP's hooks run) with
    `logits_to_keep=1`, while a hook keeps its decoder's final hidden states; the LM head then
    scores the selected positions in chunks (`row_chunks`). Applying the head by hand would skip
    whatever a head does besides the projection (final soft-capping, a logit scale), so the last
    position's logits are checked against the model's own and such a model is refused. It runs
    the eager forward even for a model marked by `compile_forwards`: the hook needs it."""
    if not forward_accepts(model, "logits_to_keep"):
        raise ValueError(f"{type(model).__name__}.forward takes no logits_to_keep: cannot score text lean")
    captured = []
    hook = model.get_decoder().register_forward_hook(lambda module, args, out: captured.append(out[0]))
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    try:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=1,
            use_cache=False,
        )
    finally:
        hook.remove()
    hidden, head = captured[-1], model.get_output_embeddings()
    if not torch.allclose(head(hidden[:, -1:]).float(), out.logits.float(), 1e-2, 1e-2, equal_nan=True):
        raise ValueError(
            f"{type(model).__name__}'s logits are not its LM head applied to its decoder's output "
            "(soft-capping or scaling?): cannot score text lean"
        )
    hidden, targets = hidden[:, :-1][mask], input_ids[:, 1:][mask]
    nll = torch.empty(targets.shape, dtype=torch.float32, device=hidden.device)
    for rows in row_chunks(targets.numel(), 1, out.logits.shape[-1], budget_mb, 4):
        logits = head(hidden[rows])[:, :vocab_size].float()
        nll[rows] = F.cross_entropy(logits, targets[rows], reduction="none")
        del logits  # before the next chunk's logits exist, not after
    return nll


def row_chunks(batch: int, width: int, vocab_size: int, budget_mb: float, itemsize: int) -> list[slice]:
    """Row slices of a `batch` whose `[rows, width, vocab_size]` logits at `itemsize` bytes each
    stay within `budget_mb` megabytes (2**20 bytes) per chunk (at least one row per chunk)."""
    check_number("budget_mb", budget_mb, 0, open_min=True)
    rows = max(1, int(budget_mb * 2**20) // max(1, width * vocab_size * itemsize))
    return [slice(start, start + rows) for start in range(0, batch, rows)]


@contextmanager
def eval_no_grad(*models: nn.Module) -> Iterator[None]:
    """Eval mode and `torch.no_grad()` for the duration; every submodule's mode is restored after.
    An FSDP-sharded model is kept whole meanwhile (`distill.parallel.gathered`: its forwards inside
    are local, so ranks may decode different numbers of tokens), a collective every rank enters."""
    modes = {id(m): (m, m.training) for model in models for m in model.modules()}
    for model in models:
        model.eval()
    try:
        with torch.no_grad(), gathered(*models):
            yield
    finally:
        # Set the flag itself: `Module.train(mode)` would recurse and undo the children's modes.
        for module, training in modes.values():
            module.training = training


def drop_from_state_dict(name: str):
    """A state-dict hook removing submodule `name` (a frozen teacher or reference: reloaded from
    its path, never checkpointed). Pair it with `strict_loading = False`."""

    def hook(module, state_dict, prefix, local_metadata):
        for key in [k for k in state_dict if k.startswith(f"{prefix}{name}.")]:
            del state_dict[key]
        return state_dict

    return hook


def export_pretrained(model, tokenizer, path: str | Path) -> Path:
    """`save_pretrained` a model and its tokenizer (loadable with the Auto* classes). Call it on
    every rank: an FSDP-sharded model is gathered (`distill.parallel.full_state_dict`, a
    collective), and only rank 0 writes."""
    path = Path(path)
    state = full_state_dict(model)
    if rank_zero_only.rank == 0:
        model.save_pretrained(path, **({} if state is None else {"state_dict": state}))
        tokenizer.save_pretrained(path)
    return path

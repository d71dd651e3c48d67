"""How much of a model an update touched: the share of entries left (numerically) unchanged.

Comparisons happen in float32 on the values as stored: each slice of a bf16/fp16 tensor is cast
to float32 before differencing, so a one-ulp bf16 change is measured exactly and squared sums
cannot overflow fp16. Work is done tensor by tensor, in slices of at most `chunk_numel` entries,
so no float32 copy of the whole model (or of one huge embedding) is ever made. An update smaller
than the storage dtype's spacing never reaches the stored weights and so is not seen here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from distill.checks import check_int, check_number

CHUNK_NUMEL = 1 << 24  # 16M entries: 64 MB per float32 slice

MODULE_TYPES = ("attention", "mlp", "embedding", "norm", "other")
_EMBEDDING = {"embed_tokens", "lm_head", "wte", "wpe", "embed_in", "embed_out", "word_embeddings"}
_ATTENTION = {
    "self_attn", "attn", "attention", "self_attention", "cross_attn",
    "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "c_attn", "query_key_value",
}  # fmt: skip
_MLP = {"mlp", "feed_forward", "ffn", "gate_proj", "up_proj", "down_proj", "gate_up_proj", "c_fc", "experts"}
_NORM = re.compile(r".*norm.*|ln(_.*)?")


def module_type(name: str) -> str:
    """Group a parameter name into "attention", "mlp", "embedding", "norm" or "other".

    Name components are read from the innermost module outwards and the first one recognised
    decides, so `layers.0.self_attn.q_norm.weight` (Qwen3) is a norm and GPT-2's
    `h.0.mlp.c_proj.weight` is mlp. Recognised: Llama/Qwen/Mistral names (`self_attn`, `q_proj`,
    ..., `mlp`, `gate_proj`, ..., `embed_tokens`, `lm_head`, `*norm*`) and GPT-2 names (`attn`,
    `c_attn`, `c_fc`, `wte`, `wpe`, `ln_*`).
    """
    for part in reversed(name.split(".")):
        if _NORM.fullmatch(part):
            return "norm"
        if part in _EMBEDDING:
            return "embedding"
        if part in _ATTENTION:
            return "attention"
        if part in _MLP:
            return "mlp"
    return "other"


class UpdateCounts(NamedTuple):
    """Per-tensor tallies; add them field by field to combine tensors."""

    num_within_atol: int  # entries with |after - before| <= atol
    num_exact_equal: int  # entries with after == before
    numel: int
    sq_diff_sum: float  # sum of (after - before)^2
    sq_before_sum: float  # sum of before^2
    num_equal_bf16: int = 0  # entries equal once both sides are rounded to bfloat16

    def __add__(self, other: UpdateCounts) -> UpdateCounts:  # type: ignore[override]
        return UpdateCounts(*(a + b for a, b in zip(self, other)))


@torch.no_grad()
def tensor_update_counts(
    before: Tensor,
    after: Tensor,
    atol: float = 1e-5,
    *,
    chunk_numel: int = CHUNK_NUMEL,
    name: str = "tensor",
) -> UpdateCounts:
    """Compare one floating tensor before and after an update, in float32 slices (`name` is
    only used in error messages).

    `before` may live on another device than `after` (e.g. a CPU snapshot of GPU weights); each
    slice is moved to `after`'s device. Squared sums are float32 within a slice and accumulated
    across slices in Python floats (double).
    """
    check_number("atol", atol, 0)
    check_int("chunk_numel", chunk_numel, 1)
    if before.shape != after.shape:
        raise ValueError(f"{name!r} has shape {tuple(before.shape)} before and {tuple(after.shape)} after")
    if not (before.is_floating_point() and after.is_floating_point()):
        raise TypeError(
            f"{name!r} must be floating on both sides, got {before.dtype} before and {after.dtype} after"
        )
    flat_before, flat_after = before.reshape(-1), after.reshape(-1)
    within = equal = equal_bf16 = 0
    sq_diff = sq_before = 0.0
    for start in range(0, flat_after.numel(), chunk_numel):
        a = flat_after[start : start + chunk_numel].to(torch.float32)
        b = flat_before[start : start + chunk_numel].to(device=a.device, dtype=torch.float32)
        diff = a - b
        within += int((diff.abs() <= atol).sum())
        equal += int((a == b).sum())
        equal_bf16 += int((a.to(torch.bfloat16) == b.to(torch.bfloat16)).sum())
        sq_diff += float(diff.square().sum())
        sq_before += float(b.square().sum())
    return UpdateCounts(within, equal, flat_after.numel(), sq_diff, sq_before, equal_bf16)


@dataclass(frozen=True)
class SparsityReport:
    """Shares of unchanged entries. A tensor with no entries counts as fully unchanged (1.0)."""

    overall: float  # fraction of entries with |after - before| <= atol
    per_tensor: dict[str, float]  # name -> that fraction within the tensor
    exact_zero: float  # fraction of entries with after == before exactly
    bf16_unchanged: (
        float  # fraction equal once before and after are rounded to bfloat16 (the paper's reading)
    )
    per_module_type: dict[str, float]  # module type (see `module_type`) -> fraction; present types only
    relative_update_norm: float  # ||after - before|| / ||before|| over all compared tensors
    numel: int  # entries compared


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 1.0


def update_sparsity(
    before: Mapping[str, Tensor],
    after: Mapping[str, Tensor],
    atol: float = 1e-5,
    *,
    chunk_numel: int = CHUNK_NUMEL,
) -> SparsityReport:
    """Measure which entries of a state dict an update left unchanged.

    Args:
        before: name -> tensor at the start (e.g. a CPU snapshot of θ0).
        after: name -> tensor now; must have exactly the same names and shapes.
        atol: an entry is unchanged when |after - before| <= atol (in float32).
        chunk_numel: most entries cast to float32 at once.

    Floating tensors are compared; non-floating ones (integer buffers) are skipped, and a name
    that is floating on one side only is an error. A tied weight listed under two names (a
    tied model's `state_dict()` lists `lm_head.weight` too) counts twice; `named_parameters()`
    lists it once. `relative_update_norm` is inf when θ0 is all
    zeros but something changed (0.0 when nothing did).
    """
    check_number("atol", atol, 0)
    missing_after = sorted(set(before) - set(after))
    missing_before = sorted(set(after) - set(before))
    if missing_after or missing_before:
        raise KeyError(
            f"update_sparsity: state dicts differ: missing from after: {missing_after[:10]}, "
            f"missing from before: {missing_before[:10]}"
        )
    per_tensor: dict[str, float] = {}
    totals = UpdateCounts(0, 0, 0, 0.0, 0.0)
    by_type: dict[str, UpdateCounts] = {}
    for name, new in after.items():
        old = before[name]
        if not (old.is_floating_point() or new.is_floating_point()):
            continue
        counts = tensor_update_counts(old, new, atol, chunk_numel=chunk_numel, name=name)
        per_tensor[name] = _share(counts.num_within_atol, counts.numel)
        totals = totals + counts
        group = module_type(name)
        by_type[group] = by_type.get(group, UpdateCounts(0, 0, 0, 0.0, 0.0)) + counts
    if not per_tensor:
        raise ValueError("update_sparsity: no floating-point tensors to compare")
    if totals.sq_before_sum > 0:
        relative = math.sqrt(totals.sq_diff_sum / totals.sq_before_sum)
    else:
        relative = math.inf if totals.sq_diff_sum > 0 else 0.0
    return SparsityReport(
        overall=_share(totals.num_within_atol, totals.numel),
        per_tensor=per_tensor,
        exact_zero=_share(totals.num_exact_equal, totals.numel),
        bf16_unchanged=_share(totals.num_equal_bf16, totals.numel),
        per_module_type={
            g: _share(by_type[g].num_within_atol, by_type[g].numel) for g in MODULE_TYPES if g in by_type
        },
        relative_update_norm=relative,
        numel=totals.numel,
    )

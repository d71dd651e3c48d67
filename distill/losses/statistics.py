"""Per-position logging statistics: both KL directions and both entropies, exact and gradient-free."""

from __future__ import annotations

import torch
from torch import Tensor

from distill.checks import check_int, check_number
from distill.losses.chunked import compute_dtype, resolve_chunk_size
from distill.losses.functional import STATISTICS, fill_statistics, log_probs


@torch.no_grad()
def token_statistics(
    student_logits: Tensor,
    teacher_logits: Tensor,
    vocab_size: int | None = None,
    chunk_size: int | None = None,
    temperature: float = 1.0,
) -> dict[str, Tensor]:
    """Exact ``forward_kl`` (KL(p_T||p_S)), ``reverse_kl`` (KL(p_S||p_T)), ``student_entropy`` and
    ``teacher_entropy`` at every position: a dict of ``[B, T]`` float32 tensors (nats), computed in
    float32, ``chunk_size`` positions at a time (None: ``2**23 // V``), without gradients. Logits are
    cut to ``vocab_size`` (None: the smaller of the two widths), as the divergences do, so the figures
    are comparable whichever divergence is optimised. ``temperature`` divides both (default 1).
    """
    if student_logits.dim() != 3 or teacher_logits.shape[:2] != student_logits.shape[:2]:
        raise ValueError(
            "student_logits and teacher_logits must be [B, T, V] with the same B and T; got "
            f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}"
        )
    check_number("temperature", temperature, 0, open_min=True)
    width = min(student_logits.shape[-1], teacher_logits.shape[-1])
    if vocab_size is not None:
        width = check_int("vocab_size", vocab_size, 1, width)
    chunk_size = resolve_chunk_size(chunk_size, width)
    batch, seq = student_logits.shape[:2]
    dtype = compute_dtype(student_logits)
    out = torch.empty(batch * seq, len(STATISTICS), dtype=dtype, device=student_logits.device)
    rows = torch.arange(batch * seq, device=student_logits.device)
    for start in range(0, batch * seq, chunk_size):
        r = rows[start : start + chunk_size]
        b, t = r // seq, r % seq
        s = log_probs(student_logits[b, t, :width].to(dtype) / temperature)
        lt = log_probs(teacher_logits[b, t, :width].to(dtype) / temperature)
        fill_statistics(out[start : start + chunk_size], s, lt)
    return {k: v.view(batch, seq) for k, v in zip(STATISTICS, out.unbind(-1))}

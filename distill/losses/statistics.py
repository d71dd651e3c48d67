"""Per-position logging statistics: both KL directions and both entropies, exact and gradient-free."""

from __future__ import annotations

import torch
from torch import Tensor

from distill.losses.chunked import compute_dtype, resolve_chunk_size
from distill.losses.functional import log_probs, rowdot

STATISTICS = ("forward_kl", "reverse_kl", "student_entropy", "teacher_entropy")


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
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r} is not allowed; temperature must be > 0")
    width = min(student_logits.shape[-1], teacher_logits.shape[-1])
    if vocab_size is not None:
        if not 1 <= vocab_size <= width:
            raise ValueError(f"vocab_size={vocab_size!r} is not allowed; it must be in [1, {width}]")
        width = vocab_size
    chunk_size = resolve_chunk_size(chunk_size, width)
    batch, seq = student_logits.shape[:2]
    dtype = compute_dtype(student_logits)
    out = {k: torch.empty(batch * seq, dtype=dtype, device=student_logits.device) for k in STATISTICS}
    rows = torch.arange(batch * seq, device=student_logits.device)
    for start in range(0, batch * seq, chunk_size):
        r = rows[start : start + chunk_size]
        b, t = r // seq, r % seq
        s = log_probs(student_logits[b, t, :width].to(dtype) / temperature)
        lt = log_probs(teacher_logits[b, t, :width].to(dtype) / temperature)
        p_s, p_t = s.exp(), lt.exp()
        d = lt - s
        out["forward_kl"][r] = rowdot(p_t, d).clamp_min_(0.0)
        out["reverse_kl"][r] = rowdot(p_s, d).neg_().clamp_min_(0.0)
        out["student_entropy"][r] = rowdot(p_s, s).neg_().clamp_min_(0.0)
        out["teacher_entropy"][r] = rowdot(p_t, lt).neg_().clamp_min_(0.0)
    return {k: v.view(batch, seq) for k, v in out.items()}

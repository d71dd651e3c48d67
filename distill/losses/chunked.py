"""Chunked evaluation of a row-wise divergence with a hand-written backward.

The forward pass walks over the selected positions ``chunk_size`` rows at a time, converts each chunk
to float32, and computes the per-position value and (when the student needs a gradient) the closed
form gradient w.r.t. the student logits, which it writes into one buffer of the student's shape and
dtype. Nothing ``[B, T, V]``-sized in float32 is kept for backward; the backward pass only scales
that buffer in place and hands it to autograd. A second backward through the same graph
(``retain_graph=True``, ``gradcheck``) recomputes the gradient chunk by chunk from the saved inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from distill.checks import check_int
from distill.losses.functional import STATISTICS, fill_statistics, log_probs

# kernel(u_s, u_t, b_idx, t_idx, want_grad, stats) -> (value [n], grad w.r.t. scaled student logits
# [n, V]); when `stats` ([n, 4]) is given the kernel also writes the rows' statistics into it
# (`functional.fill_statistics`) from the softmaxes it computes anyway.
RowKernel = Callable[[Tensor, Tensor, Tensor, Tensor, bool, "Tensor | None"], "tuple[Tensor, Tensor | None]"]


# Default chunk: this many logits (32 MiB per float32 buffer), i.e. 2**23 // V positions. Smaller
# chunks save little memory (the [B, T, V] gradient dominates) and cost per-op overhead.
CHUNK_ELEMENTS = 2**23


def resolve_chunk_size(chunk_size: int | None, width: int) -> int:
    """Positions per chunk: ``chunk_size``, or when None ``max(1, CHUNK_ELEMENTS // width)``."""
    if chunk_size is not None:
        return check_int("chunk_size", chunk_size, 1)
    return max(1, CHUNK_ELEMENTS // width)


def compute_dtype(x: Tensor) -> torch.dtype:
    """float32 for every input dtype except float64, which is kept (gradcheck needs it)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _flat(x: Tensor) -> Tensor | None:
    """``x`` as ``[B*T, V]`` without a copy, or None when its strides do not allow it."""
    try:
        return x.view(-1, x.shape[-1])
    except RuntimeError:
        return None


def _scaled(rows: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    """``rows / temperature`` in ``dtype``; may be a view of the input (kernels never write to it)."""
    u = rows.to(dtype)
    if temperature != 1.0:
        u = u / temperature if u.data_ptr() == rows.data_ptr() else u.div_(temperature)
    return u


@dataclass(frozen=True)
class ChunkPlan:
    """How `ChunkedDivergence` evaluates rows: the row kernel, the vocabulary width compared, the
    temperature, rows per chunk, whether the output is the scalar sum (else ``[B, T]``), and whether
    the logging statistics (both KLs, both entropies at temperature 1) come out of the same pass."""

    kernel: RowKernel
    width: int
    temperature: float
    chunk_size: int
    reduce: bool
    statistics: bool = False


def _run(
    plan: ChunkPlan, student: Tensor, teacher: Tensor, rows: Tensor, row_scale: Tensor, want_grad: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Values ``[B*T]`` (zero outside ``rows``; float32, or float64 for float64 inputs); if
    ``want_grad``, the gradient w.r.t. ``student`` scaled per row by ``row_scale``; if
    ``plan.statistics``, the statistics ``[B*T, 4]`` (zero outside ``rows``)."""
    kernel, width, temperature, chunk_size = plan.kernel, plan.width, plan.temperature, plan.chunk_size
    batch, seq = student.shape[:2]
    n = batch * seq
    dtype = compute_dtype(student)
    values = torch.zeros(n, dtype=dtype, device=student.device)
    stats = torch.zeros(n, len(STATISTICS), dtype=dtype, device=student.device) if plan.statistics else None
    # At temperature 1 the kernel's own softmaxes give the statistics; otherwise they are computed
    # from the unscaled rows of the same chunk.
    shared = stats is not None and temperature == 1.0
    grad = None
    if want_grad:
        partial = rows.numel() < n or width < student.shape[-1]
        alloc = torch.zeros if partial else torch.empty
        grad = alloc(student.shape, dtype=student.dtype, device=student.device)
    flats = (_flat(student), _flat(teacher), None if grad is None else grad.view(n, -1))
    # Every position selected and flat views available: contiguous slices, no gather copies.
    dense = rows.numel() == n and flats[0] is not None and flats[1] is not None
    for start in range(0, rows.numel(), chunk_size):
        if dense:
            r = slice(start, min(start + chunk_size, n))
            b = t = torch.arange(r.start, r.stop, device=student.device)
            b, t = b // seq, t % seq
            s_rows, t_rows = flats[0][r, :width], flats[1][r, :width]
        else:
            r = rows[start : start + chunk_size]
            b, t = r // seq, r % seq
            # advanced indexing copies only this chunk, whatever the strides of the inputs
            s_rows, t_rows = student[b, t, :width], teacher[b, t, :width]
        chunk_stats = None
        if stats is not None:
            chunk_stats = torch.empty(s_rows.shape[0], len(STATISTICS), dtype=dtype, device=student.device)
        if chunk_stats is not None and not shared:
            fill_statistics(chunk_stats, log_probs(s_rows.to(dtype)), log_probs(t_rows.to(dtype)))
        u_s, u_t = _scaled(s_rows, temperature, dtype), _scaled(t_rows, temperature, dtype)
        value, g = kernel(u_s, u_t, b, t, want_grad, chunk_stats if shared else None)
        del s_rows, t_rows, u_s, u_t
        if stats is not None:
            stats[r] = chunk_stats
        values[r] = value
        if grad is not None and g is not None:
            scale = (row_scale[r] / temperature).unsqueeze(-1)
            if dense:  # scale, cast and store in one pass
                torch.mul(g, scale, out=flats[2][r, :width])
            else:
                grad[b, t, :width] = g.mul_(scale).to(grad.dtype)
        del g
    return values, grad, stats


def _no_autocast(x: Tensor) -> torch.autocast:
    return torch.autocast(x.device.type, enabled=False)


class ChunkedDivergence(torch.autograd.Function):
    """``apply(student, teacher, rows, row_scale, plan, grad_enabled)`` (pass
    ``torch.is_grad_enabled()`` as the last: inside ``forward`` it is always off; `plan`: `ChunkPlan`).

    ``rows``: flat indices into ``B*T`` of the positions to evaluate. ``row_scale``: ``[B*T]`` float32
    weights. With ``reduce`` the output is the scalar ``sum(row_scale * value)``; otherwise the
    ``[B, T]`` values (``row_scale`` is then all ones). With ``plan.statistics`` a second output, the
    ``[B, T, 4]`` statistics (not differentiable). No gradient flows to the teacher.
    """

    @staticmethod
    def forward(ctx, student, teacher, rows, row_scale, plan: ChunkPlan, grad_enabled: bool):
        # needs_input_grad is True even under torch.no_grad(), where no backward can follow
        want_grad = ctx.needs_input_grad[0] and grad_enabled
        # Under autocast (`bf16-mixed`) a kernel's matmuls would run in bf16: the chunks are float32.
        with torch.no_grad(), _no_autocast(student):
            values, grad, stats = _run(plan, student, teacher, rows, row_scale, want_grad)
        ctx.grad = grad
        ctx.plan = replace(plan, statistics=False)  # a recomputing backward needs no statistics
        ctx.save_for_backward(student, teacher, rows, row_scale)
        out = (values * row_scale).sum() if plan.reduce else values.view(student.shape[:2])
        if stats is None:
            return out
        stats = stats.view(*student.shape[:2], len(STATISTICS))
        ctx.mark_non_differentiable(stats)
        return out, stats

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, *_):
        grad = ctx.grad
        ctx.grad = None  # drop our reference so autograd may take the buffer without a copy
        if grad is None:  # a second backward through a retained graph: recompute
            student, teacher, rows, row_scale = ctx.saved_tensors
            with torch.no_grad(), _no_autocast(student):
                _, grad, _ = _run(ctx.plan, student, teacher, rows, row_scale, True)
        if ctx.plan.reduce:
            if not bool(grad_out == 1):
                grad.mul_(grad_out.to(grad.dtype))
        else:
            grad.mul_(grad_out.to(grad.dtype).unsqueeze(-1))
        return grad, None, None, None, None, None

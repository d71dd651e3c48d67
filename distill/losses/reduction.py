"""Loss normalisation by the completion tokens of the whole optimiser step.

Dividing each micro-batch's masked sum by the step's token count (all micro-batches, all ranks)
makes 8 micro-batches of 1 sequence give the same update as 1 batch of 8, whatever the completion
lengths (a per-micro-batch mean mis-weights them; see TRL issue #4719).

Under data parallelism (DDP, FSDP) each rank backpropagates its local token sum and the engine
*averages* the ranks' gradients, which divides by the world size W once more. `gradient_denominator`
is the one place that compensates: each rank divides its local sum by ``num_items / W``, so the
averaged gradient is exactly the single-process gradient of (sum over every rank's tokens) /
``num_items`` on the same global batch. `global_sum` turns local sums into the step's totals for
logging.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def step_token_count(masks: list[Tensor]) -> Tensor:
    """Number of completion tokens in the optimiser step: the sum of all local ``masks`` (one per
    micro-batch), all-reduced (SUM) over ranks when ``torch.distributed`` is initialised.

    Returns a scalar tensor on the first mask's device: int64 when every mask is bool or integer,
    float32 (the sum of weights) otherwise. Pass it as ``num_items`` to a divergence's ``forward``.
    """
    if not masks:
        raise ValueError("step_token_count: masks must be a non-empty list of [B, T] tensors, got []")
    integral = all(not m.is_floating_point() for m in masks)
    dtype = torch.int64 if integral else torch.float32
    device = masks[0].device
    total = torch.zeros((), dtype=dtype, device=device)
    for m in masks:
        total += m.detach().to(device).sum(dtype=dtype)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def gradient_denominator(num_items: Tensor) -> Tensor:
    """What each rank divides its local masked loss sum by before backward: ``num_items / W``
    (float32; W = the world size of the default process group, 1 without ``torch.distributed``).

    DDP and FSDP average gradients over ranks; with this denominator the averaged gradient equals
    the gradient of (all ranks' token sums) / ``num_items``, i.e. the single-process update on the
    same global batch. ``num_items`` is the step's global count (`step_token_count`); an empty step
    (0 tokens) keeps a denominator of 0, which `row_scale` turns into a zero loss.
    """
    return num_items.detach().float() / _world_size()


def global_sum(values: Tensor) -> Tensor:
    """``values`` summed over ranks (a new tensor; the input itself when not distributed): turns
    each rank's token sums into the step's sums, so that logged means are global per-token means."""
    if _world_size() == 1:
        return values
    total = values.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def row_scale(
    mask: Tensor, num_items: int | float | Tensor | None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Flat ``[B*T]`` weights in ``dtype``: ``mask / num_items``, or ``mask / mask.sum()`` when None.

    A zero denominator (empty mask) gives all-zero weights, hence a loss of 0 with zero gradient.
    """
    m = mask.detach().reshape(-1).to(dtype)
    if num_items is None:
        denom = m.sum()
    elif isinstance(num_items, Tensor):
        if num_items.numel() != 1:
            raise ValueError(f"num_items must be a scalar, got a tensor of shape {tuple(num_items.shape)}")
        denom = num_items.detach().to(device=m.device, dtype=dtype).reshape(())
    else:
        if not num_items >= 0:
            raise ValueError(f"num_items must be >= 0 (completion tokens in the step), got {num_items!r}")
        denom = torch.tensor(float(num_items), dtype=dtype, device=m.device)
    return torch.where(denom > 0, m / denom.clamp_min(torch.finfo(dtype).tiny), 0.0)

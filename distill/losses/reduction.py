"""Loss normalisation by the completion tokens of the whole optimiser step.

Dividing each micro-batch's masked sum by the step's token count (all micro-batches, all ranks)
makes 8 micro-batches of 1 sequence give the same update as 1 batch of 8, whatever the completion
lengths (a per-micro-batch mean mis-weights them; see TRL issue #4719).
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

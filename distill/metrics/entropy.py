"""Per-token entropy of next-token distributions, and masked token means."""

from __future__ import annotations

import torch
from torch import Tensor


def token_entropy(logits: Tensor) -> Tensor:
    """Entropy in nats of softmax(`logits`) over the last dimension, in float32 (`[..., V]` -> `[...]`).

    Computed as logsumexp(z) - sum p z, which stays finite where p underflows to 0 (-inf logits
    are allowed: they contribute nothing).
    """
    z = logits.float()
    log_norm = torch.logsumexp(z, dim=-1)
    p = torch.softmax(z, dim=-1)
    pz = torch.where(p > 0, p * z, torch.zeros_like(z))
    return log_norm - pz.sum(-1)


def masked_sum_count(values: Tensor, mask: Tensor) -> tuple[float, int]:
    """(sum of `values` where `mask`, number of such entries): the parts of a mean that can be
    accumulated across batches."""
    if values.shape != mask.shape:
        raise ValueError(f"values {tuple(values.shape)} and mask {tuple(mask.shape)} must have one shape")
    m = mask.bool()
    return float(values.float()[m].sum()), int(m.sum())

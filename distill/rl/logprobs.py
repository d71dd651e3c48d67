"""Per-token log-probabilities of sampled tokens, chunked like the divergences (`distill.losses.chunked`).

`log softmax(z / temperature)[token]` needs every logit of a row, so the direct formula keeps a
float32 `[B, T, V]` copy of the logits (and its softmax) for backward. Here the forward walks over
`chunk_size` positions at a time in float32 and keeps only each row's log-sum-exp; the backward
recomputes each chunk's softmax from the saved logits and writes `(onehot - softmax) / temperature`
scaled by the incoming gradient into one buffer of the logits' shape and dtype. The same pass can
give the exact KL(policy || reference) at every position from the softmax it computes anyway.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from distill.checks import check_number
from distill.losses.chunked import compute_dtype, resolve_chunk_size
from distill.losses.functional import LOG_PROB_FLOOR, STATISTICS, fill_statistics, log_probs

_REVERSE_KL = STATISTICS.index("reverse_kl")


def _scaled(rows: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    return rows.to(dtype) / temperature


def _chunks(batch: int, seq: int, chunk_size: int, device) -> list[tuple[slice, Tensor, Tensor]]:
    """(flat slice, row ids, column ids) of each chunk of the `batch * seq` positions."""
    out = []
    for start in range(0, batch * seq, chunk_size):
        flat = torch.arange(start, min(start + chunk_size, batch * seq), device=device)
        out.append((slice(start, start + chunk_size), flat // seq, flat % seq))
    return out


class ChunkedLogprobs(torch.autograd.Function):
    """``apply(logits [B, T, V], tokens [B, T], temperature, chunk_size, reference [B, T, V] | None)``
    -> ``(logp [B*T], reverse_kl [B*T] | None)``; only `logits` gets a gradient. Each chunk's rows
    are gathered by index, so a strided view of the logits is never copied whole."""

    @staticmethod
    def forward(ctx, logits, tokens, temperature, chunk_size, reference):
        dtype = compute_dtype(logits)
        batch, seq = tokens.shape
        logp = torch.empty(batch * seq, dtype=dtype, device=logits.device)
        lse = torch.empty_like(logp)
        kl = None if reference is None else torch.empty_like(logp)
        with torch.no_grad():
            for r, b, t in _chunks(batch, seq, chunk_size, logits.device):
                u = _scaled(logits[b, t], temperature, dtype)
                lse[r] = torch.logsumexp(u, dim=-1)
                logp[r] = u.gather(-1, tokens[b, t].unsqueeze(-1)).squeeze(-1) - lse[r]
                if kl is not None:
                    s = (u - lse[r].unsqueeze(-1)).clamp_min_(LOG_PROB_FLOOR)  # the policy's log-softmax
                    stats = torch.empty(s.shape[0], len(STATISTICS), dtype=dtype, device=logits.device)
                    fill_statistics(stats, s, log_probs(_scaled(reference[b, t], temperature, dtype)))
                    kl[r] = stats[:, _REVERSE_KL]
                del u
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.save_for_backward(logits, tokens, lse)
        if kl is None:
            return logp, None
        ctx.mark_non_differentiable(kl)
        return logp, kl

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp, _):
        logits, tokens, lse = ctx.saved_tensors
        temperature, dtype = ctx.temperature, lse.dtype
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        for r, b, t in _chunks(*tokens.shape, ctx.chunk_size, logits.device):
            g = (_scaled(logits[b, t], temperature, dtype) - lse[r].unsqueeze(-1)).exp_().neg_()
            g.scatter_add_(-1, tokens[b, t].unsqueeze(-1), torch.ones_like(g[:, :1]))
            grad[b, t] = g.mul_((grad_logp[r].to(dtype) / temperature).unsqueeze(-1)).to(grad.dtype)
        return grad, None, None, None, None


def token_logprobs_and_kl(
    logits: Tensor,
    tokens: Tensor,
    temperature: float = 1.0,
    reference: Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """`log softmax(logits / temperature)` at `tokens` (`[B, T, V]`, `[B, T]` -> `[B, T]`, float32
    or float64 for float64 logits; differentiable w.r.t. `logits`), and with `reference` logits
    (`[B, T, V]` as well) the exact KL(policy || reference) at each position at the same
    temperature (`[B, T]`, no gradient), from the same softmax. `chunk_size` positions at a time
    (None: `2**23 // V`); no float32 `[B, T, V]` copy is kept for backward."""
    if logits.dim() != 3 or logits.shape[:2] != tokens.shape:
        raise ValueError(
            f"logits [B, T, V] and tokens [B, T] disagree: {tuple(logits.shape)} vs {tuple(tokens.shape)}"
        )
    if reference is not None and reference.shape != logits.shape:
        raise ValueError(
            f"reference logits must have the logits' shape {tuple(logits.shape)}, got {tuple(reference.shape)}"
        )
    check_number("temperature", temperature, 0, open_min=True)
    chunk = resolve_chunk_size(chunk_size, logits.shape[-1])
    ref = None if reference is None else reference.detach()
    logp, kl = ChunkedLogprobs.apply(logits, tokens, float(temperature), chunk, ref)
    shape = tokens.shape
    return logp.view(shape), None if kl is None else kl.view(shape)

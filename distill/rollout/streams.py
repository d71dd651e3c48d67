"""Per-row random streams for sampling: a counter-based hash keyed by each row's seed, inverse-CDF
token draws, and `RowStreams`, which the decode loop hands to a step's rule.

A seeded row's draws depend only on its own seed, the decode position and what the draw is for, so
a row's rollout does not depend on its batch-mates: the teacher-rollout cache and GRPO's groups rely
on that (`RowStreams`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from distill.errors import Diverged

# Bumped whenever seeded sampling would produce different tokens for the same row seed; it enters
# the teacher-rollout cache keys, so entries written by an older sampler are never served.
# 1: one torch.Generator per row (torch.multinomial / torch.rand); 2: the counter-based hash below.
SAMPLER_VERSION = 2

# What a draw is for; part of the hashed counter, so each purpose has its own stream. Adding one
# changes every counter (their count is the stride): bump SAMPLER_VERSION then.
PURPOSES = {"token": 0, "mix": 1, "replacement": 2}

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # SplitMix64's increment, 2**64 / golden ratio
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB  # SplitMix64's finaliser multipliers


def _signed(x: int) -> int:
    """A uint64 value as the int64 with the same bits (torch has no uint64 arithmetic)."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def mix64_int(x: int) -> int:
    """SplitMix64's finaliser (a bijection of 64-bit words with full avalanche) on a Python int."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bit patterns: `>>` is arithmetic, so mask the copied sign bits."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix64(x: Tensor) -> Tensor:
    """`mix64_int` elementwise on an int64 tensor holding uint64 bit patterns.

    int64 multiplication wraps modulo 2**64 (two's complement) in torch, which gives the same low
    64 bits as the unsigned product; tests compare this against `mix64_int`.
    """
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    return x ^ _shr(x, 31)


def stream_key(seed: int) -> int:
    """A row's 64-bit key (int64 bits): SplitMix64's first output for `seed`."""
    return _signed(mix64_int(seed + _GOLDEN))


def counter(position: int, purpose: str) -> int:
    """The hashed (decode position, purpose) counter shared by every row (int64 bits)."""
    return _signed(mix64_int((position * len(PURPOSES) + PURPOSES[purpose] + 1) * _GOLDEN))


def keyed_uniforms(keys: Tensor, positions: Sequence[int], purpose: str) -> Tensor:
    """U[0, 1) float64, [len(positions), rows]: a pure function of (row key, position, `purpose`).

    Two SplitMix64 rounds over the key and the counter c: `mix64(mix64(key ^ c) + c)`; the top 53
    bits of the result, times 2**-53, are the uniform (every value k / 2**53, k < 2**53).
    """
    c = torch.tensor([counter(p, purpose) for p in positions], dtype=torch.int64, device=keys.device)[:, None]
    bits = mix64(mix64(keys[None, :] ^ c) + c)
    return _shr(bits, 11).double() * 2.0**-53


def keyed_uniform(keys: Tensor, position: int, purpose: str) -> Tensor:
    """`keyed_uniforms` at one position: shape [rows]."""
    return keyed_uniforms(keys, [position], purpose)[0]


def diverged_error() -> Diverged:
    return Diverged(
        "a model's next-token probabilities are not finite (nan/inf) while sampling rollouts: its "
        "weights have diverged"
    )


def inverse_cdf(probs: Tensor, uniforms: Tensor, unhealthy: list[Tensor] | None = None) -> Tensor:
    """One token per row of `probs` [n, V]: the first index whose float64 cumulative probability
    exceeds `uniforms` [n] times the row's total.

    Ties in the cumulative sum (zero-probability tokens, e.g. removed by top-k/top-p) are never
    chosen: `searchsorted(right=True)` returns i with cdf[i-1] <= u·total < cdf[i], so p_i > 0.
    Raises `Diverged` when a row's total is not finite (a nan/inf probability); with `unhealthy`
    given, appends that finding to it as a 0-d bool tensor instead (no device sync: the caller
    checks it later, e.g. with its own once-per-step sync).
    """
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[:, -1:]
    if unhealthy is not None:
        unhealthy.append(~torch.isfinite(total).all())
    elif not math.isfinite(float(total.sum())):  # one reduction and one sync
        raise diverged_error()
    chosen = torch.searchsorted(cdf, uniforms[:, None] * total, right=True)
    # u < 1, but u * total can round up to the total itself (an event of about 2**-53): the index
    # is then past the end; take the last token with probability > 0 instead.
    last = torch.searchsorted(cdf, total.contiguous(), right=False)  # a column view: copy it once
    return torch.minimum(chosen, last).squeeze(-1)


class RowStreams:
    """Randomness for a batch of rows at one decode position: keyed per row, or one shared generator.

    Seeded (`per_row`): each row holds a 64-bit key hashed from its seed; every draw is
    `keyed_uniform(key, position, purpose)`, a counter-based hash, computed for the whole batch in
    a handful of elementwise int64 ops. A row's draws therefore depend only on its own seed, the
    decode position (its generated-token index, which left padding does not shift) and what the
    draw is for, never on which other rows share the batch or where the row sits in it: that is
    what the teacher-rollout cache and GRPO groups rely on. Tokens come from inverse-CDF sampling
    with one uniform per row. Unseeded (`shared_from`): one generator samples the whole batch
    (`torch.multinomial`, `torch.rand`), as when nothing needs to be reproduced per row.

    The decode loop calls `at(position)` before each step; a rule then draws with `uniform` and
    `categorical`, each purpose at most once per step. Keyed uniforms are hashed for `BLOCK`
    positions at a time and kept, so a step costs one lookup, not a dozen small int64 kernels.
    Streams made by `deferring()` record non-finite probabilities instead of checking them at once
    (a device sync); `unhealthy()` collects the records as one tensor for the loop's own sync.
    """

    BLOCK = 32

    def __init__(
        self,
        keys: Tensor | None,
        shared: torch.Generator | None = None,
        position: int = 0,
        tables: dict | None = None,
        records: list[Tensor] | None = None,
    ):
        if (keys is None) == (shared is None):
            raise ValueError("RowStreams needs either per-row keys or one shared generator")
        self.keys = keys
        self.shared = shared
        self.position = position
        self._tables = {} if tables is None else tables  # (purpose, block) -> [BLOCK, rows]
        self._records = records  # deferred finiteness findings, shared by every `at()` copy

    @classmethod
    def per_row(cls, seeds: Sequence[int], device: torch.device) -> RowStreams:
        return cls(torch.tensor([stream_key(s) for s in seeds], dtype=torch.int64, device=device))

    @classmethod
    def shared_from(cls, seed: int, device: torch.device) -> RowStreams:
        return cls(None, torch.Generator(device=device).manual_seed(seed))

    def at(self, position: int) -> RowStreams:
        """These streams at decode `position` (the shared generator just continues)."""
        return RowStreams(self.keys, self.shared, position, self._tables, self._records)

    def deferring(self) -> RowStreams:
        """These streams, recording non-finite probabilities for `unhealthy()` instead of raising
        at once (keyed draws only; the shared path has no sync to save)."""
        return RowStreams(self.keys, self.shared, self.position, self._tables, [])

    def unhealthy(self, device: torch.device) -> Tensor:
        """A 0-d bool tensor: whether any draw since the last call met non-finite probabilities
        (always False unless `deferring()`); clears the records. No device sync."""
        found = torch.zeros((), dtype=torch.bool, device=device)
        for record in self._records or ():
            found = found | record
        if self._records:
            self._records.clear()
        return found

    def subset(self, rows: Sequence[int]) -> RowStreams:
        if self.keys is None:
            return self
        return RowStreams(self.keys[list(rows)], None, self.position)

    def uniform(self, n: int, purpose: str = "mix") -> Tensor:
        """One U[0, 1) draw per row, shape [n] (float64 when keyed)."""
        if self.keys is None:
            return torch.rand(n, generator=self.shared, device=self.shared.device)
        if n != self.keys.shape[0]:
            raise ValueError(f"{self.keys.shape[0]} keyed rows, but {n} draws were asked for")
        block, offset = divmod(self.position, self.BLOCK)
        table = self._tables.get((purpose, block))
        if table is None:
            start = block * self.BLOCK
            table = keyed_uniforms(self.keys, range(start, start + self.BLOCK), purpose)
            self._tables[(purpose, block)] = table
        return table[offset]

    def categorical(self, probs: Tensor, purpose: str = "token") -> Tensor:
        """One sample per row of `probs` [n, V]; `Diverged` if they are not finite (on the shared
        path checked only when sampling fails, so the common path costs no device sync)."""
        if self.keys is not None:
            return inverse_cdf(probs, self.uniform(probs.shape[0], purpose), self._records)
        try:
            return torch.multinomial(probs, 1, generator=self.shared).squeeze(-1)
        except RuntimeError:
            if not bool(torch.isfinite(probs).all()):
                raise diverged_error() from None
            raise

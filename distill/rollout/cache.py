"""On-disk cache of teacher-only rollouts, one JSON file per prompt row.

Entries are per row, not per batch: in the sequence granularity the rows the teacher writes
change with the permutation and with `mix`, and batches are reshuffled between epochs and runs,
so only a per-row key lets a sweep (every λ, every learning rate) reuse what one run generated.

A key hashes the teacher's identity, the prompt ids (padding removed), the row's occurrence
index among identical prompts in its batch (so repeated prompts get distinct samples), the
sampling settings, the seed (omitted under greedy decoding, where it has no effect) and
`SAMPLER_VERSION`: a new sampling scheme draws different tokens from the same seed, so entries
written by an older sampler must not be served (greedy entries are recomputed once too).

Writes are atomic: a temp file in the same directory, flushed and fsync'ed, then `os.replace`d
onto the entry's name, so an interrupted write leaves at most a temp file, which is never read.
An unreadable or malformed entry counts as a miss and is overwritten by the next write.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch import nn

from distill.rollout.streams import SAMPLER_VERSION
from distill.runinfo import write_json_atomic

# How many evenly spaced elements of each sampled parameter enter the fingerprint.
_FINGERPRINT_ELEMENTS = 4096


def _picks(n: int, device) -> torch.Tensor:
    """Up to `_FINGERPRINT_ELEMENTS` evenly spaced indices into `n` elements. Up to 2**24 elements
    they are float32 `linspace`'s, as every cache key written so far has them; past it float32
    cannot hold the indices (a 49,152 x 576 embedding's last one rounded to 28,311,552, out of
    range), so they are computed in integers."""
    k = min(_FINGERPRINT_ELEMENTS, n)
    if n <= 2**24:
        return torch.linspace(0, n - 1, k, device=device).long()
    return torch.arange(k, device=device, dtype=torch.int64) * (n - 1) // max(1, k - 1)


def teacher_identity(model: nn.Module) -> str:
    """`config._name_or_path` plus a cheap fingerprint of the weights.

    The fingerprint hashes every parameter's name, shape and dtype, and the values of up to 4096
    evenly spaced elements from each of the first, middle and last parameters. Two checkpoints
    that share a path but differ in training almost surely differ there; it costs milliseconds
    even for multi-billion-parameter models.
    """
    params = list(model.named_parameters())
    digest = hashlib.sha256()
    for name, p in params:
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
    for index in sorted({0, len(params) // 2, len(params) - 1} if params else set()):
        flat = params[index][1].detach().reshape(-1)
        digest.update(flat[_picks(flat.numel(), flat.device)].float().cpu().numpy().tobytes())
    name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
    return f"{name}@{digest.hexdigest()[:16]}"


def row_key(
    identity: str,
    prompt_ids: list[int],
    occurrence: int,
    settings: dict,
    seed: int | None,
    teacher_prompt: list[int] | None = None,
) -> str:
    """The cache key (hex SHA-256) of one teacher-written row. `teacher_prompt`: the teacher's own
    prompt when it reads one the student does not (teacher-only context); `prompt_ids` still seeds
    the row's random stream, so both enter the key."""
    fields = {
        "teacher": identity,
        "prompt": prompt_ids,
        "occurrence": occurrence,
        "settings": settings,
        "seed": seed,
        "sampler": SAMPLER_VERSION,
    }
    if teacher_prompt is not None:  # absent otherwise, so keys written before it still match
        fields["teacher_prompt"] = teacher_prompt
    blob = json.dumps(
        fields,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


class RolloutCache:
    """A directory of teacher rollouts: `get(key)` returns the generated ids (EOS included) or None."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        # Two-character fan-out keeps directories small on large sweeps.
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> list[int] | None:
        try:
            entry = json.loads(self.path(key).read_text())
            tokens = entry["tokens"]
            if entry["key"] != key or not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
                return None
            return tokens
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, tokens: list[int]) -> None:
        write_json_atomic(self.path(key), {"key": key, "tokens": [int(t) for t in tokens]})

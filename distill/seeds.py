"""Seeds derived by hashing: stable across processes, machines and Python's hash randomisation.

Two spellings exist because every committed result depends on their exact values:
`derive_seed` hashes a JSON description (rollout sampling streams, teacher-rollout cache keys);
`path_seed` hashes `"/".join(parts)` (data splits, their order, evaluation problems)."""

from __future__ import annotations

import hashlib
import json


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from a JSON-serialisable description."""
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & (2**63 - 1)


def path_seed(*parts: object) -> int:
    """A 63-bit seed from parts joined like a path (`path_seed("train", 0)` hashes "train/0")."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little") >> 1

"""Where each tiny world lives and what configs call it: one folder per version, named by it, in the
cache (`$DISTILL_CACHE/tiny-world-v3`, `-v2`, `-v1`) and among the committed builds
(`distill/models/assets/tiny-world-v2`, ...), and the names `tiny-world-vN:NAME` (that version's
model NAME) and `tiny-world:NAME` (the default version's). A version's results can then never be
read as another's: a name resolves to one folder, and each run's `env.json` also records the
world's version and weights fingerprint (`tiny_world.world_of`)."""

from __future__ import annotations

import os
from pathlib import Path

from distill.models.tiny_world_recipes import VERSIONS

# What `tiny-world:NAME`, `distill tiny-world` and configs/tiny/ mean; `tiny-world-v2:` names the
# previous world. A default without a committed build (a future version while it is built) makes
# `distill tiny-world` stop with a message instead of training it for hours (`tiny_world.main`).
DEFAULT_VERSION = "v3"

# Committed full builds (package data), installed by `distill tiny-world` without retraining.
ASSETS_ROOT = Path(__file__).parent / "assets"

# v2's cache folder before each version had its own: no longer read, since `tiny-world:` is not v2.
LEGACY_FOLDER = "tiny-world"


def folder(version: str) -> str:
    return f"tiny-world-{version}"


def cache_root() -> Path:
    return Path(os.environ.get("DISTILL_CACHE", Path.home() / ".cache" / "distill"))


def default_dir(version: str = DEFAULT_VERSION) -> Path:
    """Where `distill tiny-world` installs or builds a version: `$DISTILL_CACHE/tiny-world-VERSION`
    (default cache: ~/.cache/distill)."""
    return cache_root() / folder(version)


def assets_dir(version: str = DEFAULT_VERSION) -> Path:
    """Where a version's committed build lives (whether or not it is committed yet)."""
    return ASSETS_ROOT / folder(version)


# `tiny-world-vN:NAME` is model NAME of version vN; `tiny-world:NAME` of the default version.
PREFIXES = {"tiny-world:": DEFAULT_VERSION, **{f"{folder(v)}:": v for v in sorted(VERSIONS)}}


def split_name(path: str) -> tuple[str, str] | None:
    """(version, model name) of a `tiny-world[-vN]:NAME` path, None for any other path."""
    for prefix, version in PREFIXES.items():
        if path.startswith(prefix):
            return version, path[len(prefix) :]
    return None

"""What a run directory records besides the config (package versions, git revision), and the one\nway the project writes a file atomically."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import BinaryIO

PACKAGES = (
    "distill",
    "torch",
    "lightning",
    "transformers",
    "datasets",
    "torchmetrics",
    "jsonargparse",
    "tensorboard",
)


def git_revision(where: str | Path | None = None) -> dict:
    """HEAD of the repository holding `where` (default: this package), and whether it is dirty."""
    cwd = Path(where or Path(__file__).resolve().parent)
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return {"revision": None}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
        )
        return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"revision": None}


def environment() -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": machine(),
        "packages": versions,
        "git": git_revision(),
        "argv": sys.argv,
    }


def machine() -> dict:
    """The CPU that computes here and the kernels torch picks for it: CPU float results, and so
    retrained weights, can differ between two kinds of CPU (`distill tiny-world --verify`)."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}


def write_atomic(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(file)` on a temporary file beside `path`, fsync it and rename it over `path`:
    readers (and a process killed mid-write) see the old file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def replace_atomic(path: str | Path, fill: Callable[[Path], object]) -> None:
    """Call `fill(tmp)` on a temporary path beside `path` (a file or a folder `fill` creates
    there), then rename it over `path`: a reader, and a process killed mid-way, find the old
    content or the complete new one, never a part. A folder at `path` goes just before the rename
    (a rename cannot replace a non-empty folder), so for that instant there may be none."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    _remove(tmp)
    try:
        fill(tmp)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text.encode()))


def write_json_atomic(path: str | Path, obj, sort_keys: bool = True) -> None:
    """Strict JSON (NaN/inf refused), indented, atomically (`write_atomic`)."""
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, default=float, allow_nan=False) + "\n"
    write_text_atomic(path, text)

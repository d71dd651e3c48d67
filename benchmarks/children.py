"""What the memory benchmarks share: each case runs in a fresh Python process (so that its peak
resident memory is its own), which prints its result as JSON on its last line."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys


def maxrss_mib() -> float:
    """This process's peak resident memory so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_child(script: str, args: list[str], what: str) -> dict:
    """Run `script` with `args` in a fresh interpreter and return the JSON of its last stdout line;
    a failed child raises with `what` and its stderr."""
    proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, env=os.environ)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child {what} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])

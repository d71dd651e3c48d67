"""A study run on tiny world v3 against the same run on v2, side by side (: a v3
run may take at most 1.5x the wall time of the same v2 run).

Run:  .venv/bin/python benchmarks/worlds.py                 # 2 rounds of 300 steps (~15-20 minutes)
      .venv/bin/python benchmarks/worlds.py --steps 100 --rounds 3

Each round runs `distill fit` once per world, alternately (v2, v3, v2, v3, ...) so that load from
other jobs falls on both alike: `configs/tiny_v2/base.yaml` on world v2 and `configs/tiny/base.yaml`
on world v3, with the same knobs (forward KL, on-policy, lr 3e-4, seed 0, 64 rollouts a step) and
`--steps` optimiser steps; each world keeps its own test set and budgets, as its study does. Every
run is a fresh process, so imports, compilation and the test phase count, as they do in a sweep.
Reported: the medians per world of the whole run's wall seconds and of its cost figures (`cost/time/*`
from the run's metrics.json), and the v3 / v2 ratio of each, against the bar of 1.5. Both worlds
must be installed (`distill tiny-world --version v2`, `--version v3`) under $DISTILL_CACHE.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distill.models.tiny_world_names import cache_root, default_dir

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"v2": ROOT / "configs" / "tiny_v2" / "base.yaml", "v3": ROOT / "configs" / "tiny" / "base.yaml"}
BAR = 1.5


def run(world: str, steps: int, out: Path) -> dict[str, float]:
    """One `distill fit` of `world`'s study config; its wall seconds and `cost/time/*` figures."""
    cmd = [
        sys.executable, "-m", "distill.cli", "fit", "--config", str(CONFIGS[world]),
        "--trainer.max_steps", str(steps), "--model.init_args.optimizer.init_args.lr", "3e-4",
        "--run_dir", str(out),
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{world}: distill fit failed:\n{done.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    figures = {k.removeprefix("cost/time/"): v for k, v in metrics.items() if k.startswith("cost/time/")}
    return {"process wall": wall, **figures}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps per run (default 300)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per world, interleaved (default 2)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.rounds < 1:
        parser.error(f"--steps and --rounds must be >= 1, got {args.steps} and {args.rounds}")
    missing = [v for v in CONFIGS if not (default_dir(v) / "teacher").is_dir()]
    if missing:
        raise SystemExit(
            f"world(s) {missing} not installed under {cache_root()}: `distill tiny-world --version V`"
        )
    print(f"1-minute load average before the first run (0 on idle cores): {os.getloadavg()[0]:.2f}")
    results: dict[str, list[dict[str, float]]] = {"v2": [], "v3": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for world in ("v2", "v3"):
                figures = run(world, args.steps, Path(tmp) / f"{world}-{r}")
                results[world].append(figures)
                print(f"round {r} {world}: {figures['process wall']:.1f} s", flush=True)
    print(f"\nmedians of {args.rounds} run(s) per world, {args.steps} steps each (seconds; ratio v3 / v2):")
    for key in results["v2"][0]:
        v2 = statistics.median(f[key] for f in results["v2"])
        v3 = statistics.median(f.get(key, 0.0) for f in results["v3"])
        ratio = f"{v3 / v2:.2f}" if v2 > 0 else "-"
        print(f"  {key:26s} v2 {v2:8.1f}  v3 {v3:8.1f}  ratio {ratio}")
    wall = [statistics.median(f["process wall"] for f in results[w]) for w in ("v2", "v3")]
    verdict = "within" if wall[1] / wall[0] <= BAR else "OVER"
    print(f"\nv3 / v2 wall time: {wall[1] / wall[0]:.2f} ({verdict} the bar of {BAR})")


if __name__ == "__main__":
    main()

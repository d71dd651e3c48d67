"""Compiled vs eager: does compiling change results beyond seed noise?

The runs (run.sh): configs/tiny/base.yaml on tiny world v2, 300 steps, seeds 0 and 1, each once
eager and once with compile_decoding + compile_forwards. For every final figure: the mean
|compiled - eager| at the same seed against the mean |seed 0 - seed 1| in the same mode.
Usage: python experiments/probes/compiled_vs_eager/compare.py
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
RUNS = ["eager_s0", "eager_s1", "compiled_s0", "compiled_s1"]
m = {r: json.loads((HERE / r / "metrics.json").read_text())["metrics"] for r in RUNS}
ratios, larger = [], 0
for key in sorted(m["eager_s0"]):
    if not key.startswith(("test/", "val/", "train/", "forgetting/")):
        continue
    e0, e1, c0, c1 = (m[r].get(key) for r in RUNS)
    if not all(isinstance(x, (int, float)) for x in (e0, e1, c0, c1)):
        continue
    same_seed = (abs(c0 - e0) + abs(c1 - e1)) / 2
    between_seeds = (abs(e0 - e1) + abs(c0 - c1)) / 2
    if between_seeds == 0 and same_seed == 0:
        continue  # a floor (0 everywhere): says nothing
    larger += same_seed > between_seeds
    if between_seeds:
        ratios.append(same_seed / between_seeds)
    print(
        f"{key:40s} eager {e0:.4f} {e1:.4f}  compiled {c0:.4f} {c1:.4f}  "
        f"|c-e| {same_seed:.4f}  |s0-s1| {between_seeds:.4f}"
    )
print(
    f"{len(ratios)} figures off the floor: compiled-vs-eager larger than seed-vs-seed in {larger}; "
    f"median ratio {statistics.median(ratios):.2f}"
)

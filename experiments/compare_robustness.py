"""The robustness checks against the main grid: do the grid's effects hold under each check?

Run:  .venv/bin/python experiments/compare_robustness.py   # reads experiments/results/{tiny_grid,tiny_robustness}

`tiny_robustness` repeats the main grid's lr-1e-3 cells (mix {0, 0.5, 1} x {forward, reverse} KL x
2 seeds) under one change per stage (`experiments/tiny_robustness.yaml`). For each stage this prints,
per metric, (1) the stage's shift from the grid, paired by (mix, divergence, seed) over the 12
cells, and (2) the grid's two headline contrasts, on - off-policy (mix 0 - mix 1) within each
direction and forward - reverse KL over every mix, measured within the grid's lr-1e-3 runs and
within the stage: a finding holds when its sign and interval agree. Every figure is an
`effects.contrast` (the paired mean difference with its 95 % interval: bootstrap from 5 pairs,
Student's t below). Markdown on stdout; experiments/LOG.md quotes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from distill.experiments.report.effects import contrast
from distill.experiments.run.records import is_share, load_records

ROOT = Path(__file__).resolve().parent / "results"
STAGES = ("no_clip", "topk", "longchain")
METRICS = {
    "test/countdown3/accuracy": "C3 accuracy",
    "test/countdown3/pass@8": "C3 pass@8",
    "test/countdown4/pass@8": "C4 pass@8",
    "forgetting/mean_delta": "forgetting (+ = more)",
    "train/grad_norm": "grad norm",
}


MIXES = (0, 0.5, 1)  # the stages' mixes; the grid also ran 0.25 and 0.75


def grid_cells(grid: Path, lr: float) -> list:
    """The grid's runs at `lr` and the stages' mixes, with the lr dropped from their settings (so
    they pair with a stage's)."""
    out = []
    for r in load_records(grid):
        at_lr = math.isclose(float(r.settings.get("lr", math.nan)), lr)
        if r.metrics and at_lr and any(math.isclose(float(r.settings["mix"]), m) for m in MIXES):
            settings = {k: v for k, v in r.settings.items() if k != "lr"}
            out.append(dataclasses.replace(r, settings=settings))
    return out


def tagged(records: list, source: str) -> list:
    return [dataclasses.replace(r, settings={**r.settings, "source": source}) for r in records if r.metrics]


def fmt(effect, metric: str) -> str:
    if effect is None:
        return "—"
    scale, unit, digits = (100, " pp", 1) if is_share(metric) else (1, "", 2)
    point = f"{scale * effect.difference:+.{digits}f}{unit}"
    if not effect.paired:
        point += " unpaired"
    if math.isnan(effect.low):
        return f"{point} (n={effect.n})"
    return f"{point} [{scale * effect.low:+.{digits}f}, {scale * effect.high:+.{digits}f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, default=ROOT / "tiny_grid")
    parser.add_argument("--robustness", type=Path, default=ROOT / "tiny_robustness")
    parser.add_argument("--lr", type=float, default=1e-3, help="the grid's lr the stages ran at")
    args = parser.parse_args(argv)
    grid = tagged(grid_cells(args.grid, args.lr), "grid")
    print(f"Grid cells at lr {args.lr:g}: {len(grid)} runs.\n")
    for stage in STAGES:
        stage_dir = args.robustness / stage
        runs = tagged(load_records(stage_dir), stage) if stage_dir.is_dir() else []
        print(f"### `{stage}` ({len(runs)} runs)\n")
        if not runs:
            print("No finished runs yet.\n")
            continue
        print(
            "| metric | stage − grid (paired cells) | on − off, forward: grid / stage | on − off, reverse: grid / stage | forward − reverse: grid / stage |"
        )
        print("|---|---|---|---|---|")
        for metric, label in METRICS.items():
            shift = contrast(grid + runs, metric, "source", stage, "grid")
            cells = [fmt(shift, metric)]
            for within in (("divergence", "forward_kl"), ("divergence", "reverse_kl"), None):
                if within is None:
                    pair = [
                        contrast(rs, metric, "divergence", "forward_kl", "reverse_kl") for rs in (grid, runs)
                    ]
                else:
                    pair = [contrast(rs, metric, "mix", 0, 1, within=within) for rs in (grid, runs)]
                cells.append(" / ".join(fmt(e, metric) for e in pair))
            print(f"| {label} | " + " | ".join(cells) + " |")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

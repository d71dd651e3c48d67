"""Sweeps, run directories, aggregation, report and plots.

- `spec`: the sweep spec format (YAML), parsing and expansion into runs;
- `schema`: the spec's keys, stage entries and `slurm:` section as dataclasses (checked by jsonargparse);
- `axes`: axis shorthands and the checks of their values, config paths, run names;
- `rundirs`: what a run directory holds, when a run is finished, resuming, the fit command;
- `sweep`: `distill sweep SPEC` (local runner: `--jobs`, `--dry-run`, `--only`);
- `slurm`: `distill sweep SPEC --emit-slurm FILE` (a job array, one task per run);
- `references`: the reference runs (the untouched student and the teacher, tested like every run);
- `records`: reading a sweep directory back (settings + metrics per run, runs.csv, TB curves);
- `analysis`: factor importance (eta² per knob with bootstrap intervals);
- `plots`: the report's PNG figures;
- `tables`: the report's markdown tables (metrics by knob, side effects, cost);
- `report`: `distill report SWEEP_DIR` (runs.csv, report.md, plots/; factor importance sections).
"""

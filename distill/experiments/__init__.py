"""Sweeps, run directories, statistics, verdicts and reports, by concern in three subpackages;
each imports only those above it here, and none imports torch or Lightning.

`run`: running sweeps and reading them back.

- `run.schema`: the spec's keys, stage entries and `slurm:` section as dataclasses (checked by jsonargparse);
- `run.axes`: axis shorthands and the checks of their values, config paths, run names;
- `run.claims`: claims files, the paper's claims declared as primary contrasts before a sweep runs;
- `run.spec`: the sweep spec format (YAML), parsing and expansion into runs;
- `run.references`: the reference runs (the untouched student and the teacher, tested like every run);
- `run.rundirs`: what a run directory holds, the state it is in (`run_state`), preparing it, the fit command;
- `run.fit_env`: each fit's environment (rollout cache, CPU share, `--devices`, tiny-world models);
- `run.sweep`: `distill sweep SPEC` (local runner: `--jobs`, `--dry-run`, `--only`);
- `run.tally`: a running sweep's result, status line and `status.json`, archiving finished runs;
- `run.slurm`: `distill sweep SPEC --emit-slurm FILE` (a job array, one task per run);
- `run.sweep_record`: a sweep's own `sweep.json` and the fingerprint that keeps other sweeps out of its archive;
- `run.records`: reading a sweep directory back (settings + metrics per run, runs.csv, TB curves, stages);
- `run.archive`: `--archive DEST`, the committable part of a sweep.

`stats`: numbers from the records.

- `stats.intervals`: paired-difference intervals (t, bootstrap), strata, Holm, minimum detectable effect;
- `stats.analysis`: factor importance (eta² per knob with bootstrap intervals);
- `stats.verdicts`: each declared claim's verdict from its archive (the rule: `decide`);
- `stats.power`: planning seeds, each claim's minimum detectable effect at the planned specs.

`report`: what `distill report` writes.

- `report.tables`: the report's markdown tables (metrics by knob, side effects, cost);
- `report.effects`: exploratory effect sizes of the study's contrasts;
- `report.plots`: the report's PNG figures;
- `report.stages`: staged sweeps, one report per stage and before/after;
- `report.verdict_table`: the verdict table (markdown, JSON), which claims file a sweep names;
- `report.quoted`: the verdict blocks the docs quote, regenerated (`make outcome`) or checked;
- `report.report`: `distill report SWEEP_DIR` (runs.csv, report.md, plots/; factor importance sections).
"""

"""`distill sweep SPEC --emit-slurm FILE`: a SLURM job-array script with one array task per run.

Two files are written: FILE (the sbatch script) and, beside it, FILE with suffix `.commands`,
one line per run (the reference runs first, when the spec has them): `python -m distill.cli sweep
SPEC --out OUT --only NAME`. Array task i runs
line i + 1 through the sweep runner, so a finished run is skipped and an interrupted one resumes
from its `last.ckpt`, exactly as in a local sweep. Task logs go to `<out>/slurm/%A_%a.out`.

sbatch options come from the spec's `slurm:` section, overridden by command-line flags:
`partition`, `account`, `gpus`, `cpus_per_task`, `mem`, `time`, `signal` (default `B:TERM@120`:
SIGTERM to the task 2 minutes before its time limit, which the task's sweep runner, `exec`ed by the
script, passes to its fit; the fit stops at its next step with a checkpoint and the next task
resumes it), `max_parallel` (the array's
`%N` throttle), `extra` (a list of further sbatch options, e.g. `--qos=high`) and `setup` (shell
lines run before the task, e.g. `source .venv/bin/activate`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from distill.experiments.run.schema import SlurmFields, parse_fields
from distill.experiments.run.spec import Run, SweepSpec

OPTION_FLAGS = {  # spec key -> sbatch option
    "partition": "--partition",
    "account": "--account",
    "gpus": "--gpus",
    "cpus_per_task": "--cpus-per-task",
    "mem": "--mem",
    "time": "--time",
    "signal": "--signal",
}


def add_slurm_arguments(group: argparse._ArgumentGroup) -> None:
    for key, flag in OPTION_FLAGS.items():
        group.add_argument(flag, dest=f"slurm_{key}", metavar=key.upper(), help=f"sbatch {flag}")
    group.add_argument(
        "--max-parallel", dest="slurm_max_parallel", type=int, metavar="N", help="array throttle (%%N)"
    )
    group.add_argument(
        "--sbatch",
        dest="slurm_extra",
        action="append",
        metavar="OPTION",
        help="extra sbatch option, written --sbatch=--qos=high (repeatable)",
    )


def slurm_options(section: dict[str, Any], args: argparse.Namespace | None = None) -> dict[str, Any]:
    """The spec's `slurm:` section with the command-line flags in `args` applied, checked against
    `SlurmFields` (every key, missing ones None or empty); raises SpecError (a ValueError)."""
    options = dict(section)
    if args is not None:
        for key in (*OPTION_FLAGS, "max_parallel"):
            if getattr(args, f"slurm_{key}", None) is not None:
                options[key] = getattr(args, f"slurm_{key}")
        if getattr(args, "slurm_extra", None):
            options["extra"] = list(options.get("extra") or []) + list(args.slurm_extra)
    return dataclasses.asdict(parse_fields(SlurmFields, options, "slurm"))


def task_command(
    spec: SweepSpec, run: Run, fit_prefix: list[str] | None = None, test_prefix: list[str] | None = None
) -> list[str]:
    """The command of one array task: the sweep runner restricted to one run."""
    if spec.path is None:
        raise ValueError("--emit-slurm needs a spec read from a file (the tasks re-read it)")
    cmd = [
        sys.executable,
        "-m",
        "distill.cli",
        "sweep",
        str(spec.path),
        "--out",
        str(spec.out),
        "--only",
        run.name,
    ]
    if fit_prefix is not None:
        cmd += ["--fit-prefix", shlex.join(fit_prefix)]
    if test_prefix is not None and run.reference:
        cmd += ["--test-prefix", shlex.join(test_prefix)]
    return cmd


def render_script(spec: SweepSpec, n_tasks: int, commands: Path, options: dict[str, Any]) -> str:
    array = f"0-{n_tasks - 1}"
    if options.get("max_parallel") is not None:
        array += f"%{int(options['max_parallel'])}"
    lines = [
        "#!/bin/bash",
        f"# Written by: distill sweep {spec.path} --emit-slurm; submit with: sbatch <this file>",
        "# Task i runs line i+1 of the commands file; finished runs are skipped, killed ones resume.",
        f"#SBATCH --job-name={spec.name}",
        f"#SBATCH --array={array}",
        f"#SBATCH --output={spec.out / 'slurm' / '%A_%a.out'}",
    ]
    lines += [
        f"#SBATCH {flag}={options[key]}" for key, flag in OPTION_FLAGS.items() if options.get(key) is not None
    ]
    lines += [f"#SBATCH {option}" for option in options.get("extra", [])]
    lines += ["", "set -euo pipefail", f"cd {shlex.quote(os.getcwd())}", *options.get("setup", [])]
    lines += [
        f"COMMANDS={shlex.quote(str(commands))}",
        'line=$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" "$COMMANDS")',
        'if [ -z "$line" ]; then echo "no line $((SLURM_ARRAY_TASK_ID + 1)) in $COMMANDS" >&2; exit 2; fi',
        'echo "task $SLURM_ARRAY_TASK_ID: $line"',
        'eval "exec $line"',  # the runner itself receives --signal's SIGTERM, not a shell
    ]
    return "\n".join(lines) + "\n"


def write_slurm(
    spec: SweepSpec,
    runs: list[Run],
    script: Path,
    options: dict[str, Any],
    fit_prefix: list[str] | None = None,
    test_prefix: list[str] | None = None,
) -> tuple[Path, Path]:
    """Write the sbatch script and its commands file; returns both paths. Runs nothing."""
    if not runs:
        raise ValueError("no runs to put in a job array")
    script = Path(script).resolve()
    commands = script.with_suffix(".commands")
    if commands == script:
        raise ValueError(f"--emit-slurm {script}: the script may not itself end in .commands")
    script.parent.mkdir(parents=True, exist_ok=True)
    (spec.out / "slurm").mkdir(parents=True, exist_ok=True)  # sbatch does not create --output dirs
    commands.write_text(
        "".join(shlex.join(task_command(spec, run, fit_prefix, test_prefix)) + "\n" for run in runs)
    )
    script.write_text(render_script(spec, len(runs), commands, options))
    script.chmod(0o755)
    return script, commands

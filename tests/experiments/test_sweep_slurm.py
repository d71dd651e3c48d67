"""`distill sweep --emit-slurm`: the job-array script, its commands file, and one task run by bash."""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys

import pytest

from distill.experiments.run import rundirs
from distill.experiments.run.schema import SlurmFields
from distill.experiments.run.slurm import OPTION_FLAGS, slurm_options
from distill.experiments.run.sweep import main


def test_emit_slurm_writes_array_script_and_commands(grid_spec, fake_fit, tmp_path, capsys):
    with grid_spec.open("a") as f:
        f.write("slurm: {partition: gpu, gpus: 1, time: '04:00:00', setup: ['echo setup-ran']}\n")
    script = tmp_path / "jobs" / "grid.sbatch"
    argv = [str(grid_spec), "--emit-slurm", str(script), "--time", "01:00:00", "--max-parallel", "2"]
    assert main(argv + ["--sbatch=--qos=low"], fit_prefix=fake_fit) == 0
    assert "4 array tasks" in capsys.readouterr().out
    text = script.read_text()
    assert "#SBATCH --array=0-3%2" in text
    assert "#SBATCH --partition=gpu" in text and "#SBATCH --gpus=1" in text
    assert "#SBATCH --time=01:00:00" in text and "04:00:00" not in text  # the flag wins over the spec
    assert "#SBATCH --qos=low" in text and "#SBATCH --job-name=grid" in text
    assert (
        "#SBATCH --signal=B:TERM@120" in text and 'eval "exec $line"' in text
    )  # preemption: distill.stopping
    assert f"#SBATCH --output={tmp_path / 'runs' / 'slurm' / '%A_%a.out'}" in text
    # every #SBATCH line precedes the first command, or sbatch ignores it
    lines = text.splitlines()
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(lines) if line.startswith("#SBATCH"))
    commands = (tmp_path / "jobs" / "grid.commands").read_text().splitlines()
    assert len(commands) == 4
    assert shlex.split(commands[2])[-4:] == ["--only", "mix=0.5,seed=0", "--fit-prefix", shlex.join(fake_fit)]
    assert not any((tmp_path / "runs").glob("mix=*"))  # nothing ran

    env = dict(os.environ, SLURM_ARRAY_TASK_ID="2", PYTHONPATH=os.getcwd())
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "setup-ran" in done.stdout
    finished = [rundirs.run_state(d).finished for d in sorted((tmp_path / "runs").glob("mix=*"))]
    assert finished == [True]
    assert rundirs.run_state(tmp_path / "runs" / "mix=0.5,seed=0").finished
    again = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "1 skipped (finished before)" in again.stdout
    env["SLURM_ARRAY_TASK_ID"] = "4"
    missing = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no line 5" in missing.stderr


def test_default_slurm_tasks_use_the_real_fit(grid_spec, tmp_path):
    assert main([str(grid_spec), "--emit-slurm", str(tmp_path / "a.sh")]) == 0
    line = shlex.split((tmp_path / "a.commands").read_text().splitlines()[0])
    assert line[:4] == [sys.executable, "-m", "distill.cli", "sweep"] and "--fit-prefix" not in line


def test_bad_slurm_section_is_rejected(grid_spec, tmp_path, capsys):
    with grid_spec.open("a") as f:
        f.write("slurm: {partitions: gpu}\n")
    assert main([str(grid_spec), "--emit-slurm", str(tmp_path / "a.sh")]) == 2
    assert "slurm: unknown key(s) partitions; allowed: partition" in capsys.readouterr().err
    assert main([str(grid_spec), "--dry-run"]) == 2  # the whole spec is checked before anything runs
    assert "slurm: unknown key(s) partitions" in capsys.readouterr().err
    assert not (tmp_path / "a.sh").exists()
    for section, field in [({"setup": "echo"}, "slurm.setup"), ({"max_parallel": 0}, "slurm.max_parallel")]:
        try:
            slurm_options(section)
        except ValueError as err:
            assert field in str(err)
        else:
            raise AssertionError(f"{section} accepted")


def test_command_line_flags_are_checked_like_the_spec_section():
    flags = argparse.Namespace(slurm_gpus="2", slurm_time="01:00:00", slurm_max_parallel=0, slurm_extra=None)
    with pytest.raises(ValueError, match="'slurm.max_parallel' must be a positive integer, got 0"):
        slurm_options({"max_parallel": 4}, flags)
    flags.slurm_max_parallel = 3
    options = slurm_options({"gpus": 1, "time": "04:00:00", "extra": ["--qos=high"]}, flags)
    assert options["gpus"] == "2" and options["time"] == "01:00:00" and options["max_parallel"] == 3
    assert options["extra"] == ["--qos=high"] and options["setup"] == [] and options["partition"] is None


def test_the_slurm_schema_has_every_option_the_script_writes():
    keys = {f.name for f in dataclasses.fields(SlurmFields)}
    assert keys == {*OPTION_FLAGS, "max_parallel", "extra", "setup"}

"""benchmarks/gpu_smoke.sh without a GPU: its argument checks, its refusal without cached models or
a GPU, and the commands it would run (they resolve, and name the models it checks for)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from distill.lightning_cli import run_lightning_cli

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_smoke.sh"
MODELS = {
    "llama": ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
    "qwen": ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct"),
}


def smoke(*args: str, hf_home: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HOME": str(hf_home), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def cache(hf_home: Path, repos) -> Path:
    """A hub cache holding each repo's config.json, in huggingface_hub's layout."""
    for repo in repos:
        folder = hf_home / "hub" / f"models--{repo.replace('/', '--')}"
        (folder / "refs").mkdir(parents=True)
        (folder / "refs" / "main").write_text("0" * 40)
        (folder / "snapshots" / ("0" * 40)).mkdir(parents=True)
        (folder / "snapshots" / ("0" * 40) / "config.json").write_text("{}")
    return hf_home


def test_the_script_parses_and_explains_itself(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    shown = smoke("--help", hf_home=tmp_path)
    assert shown.returncode == 0 and "HF_HUB_OFFLINE=1" in shown.stdout and "--timeout" in shown.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps must be an integer >= 1, got '0'"),
        (["--pairs", "llama,gpt"], "--pairs must name pairs from llama, qwen; got 'gpt'"),
        (["--timeout", "soon"], "--timeout must be seconds >= 1, got 'soon'"),
        (["--fast"], "unknown argument '--fast'"),
    ],
)
def test_bad_arguments_fail_naming_the_argument(tmp_path, args, message):
    result = smoke(*args, hf_home=tmp_path)
    assert result.returncode == 2 and message in result.stderr


def test_models_missing_from_the_cache_are_named_with_the_fetch_command(tmp_path):
    hf_home = cache(tmp_path, [MODELS["llama"][1]])  # only the Llama teacher is there
    result = smoke("--pairs", "llama", hf_home=hf_home)
    assert result.returncode == 2
    assert "not in the hub cache (HF_HOME): meta-llama/Llama-3.2-1B-Instruct;" in result.stderr
    assert "huggingface-cli download meta-llama/Llama-3.2-1B-Instruct" in result.stderr
    assert "Llama-3.1-8B" not in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_refuses_before_running_anything(tmp_path):
    hf_home = cache(tmp_path / "hf", [m for pair in MODELS.values() for m in pair])
    result = smoke("--out", str(tmp_path / "out"), hf_home=hf_home)
    assert result.returncode == 2 and "no CUDA GPU visible" in result.stderr
    assert not (tmp_path / "out").exists()


def test_dry_run_commands_resolve_to_short_runs_of_the_checked_models(tmp_path, capsys, monkeypatch):
    hf_home = cache(tmp_path / "hf", [m for pair in MODELS.values() for m in pair])
    result = smoke("--dry-run", "--steps", "3", "--out", str(tmp_path / "out"), hf_home=hf_home)
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert set(lines) == {"llama", "qwen"}
    monkeypatch.chdir(ROOT)
    for pair, line in lines.items():
        argv = shlex.split(line)[3:]  # after "<python> -m distill.cli"
        with pytest.raises(SystemExit):
            run_lightning_cli([*argv, "--print_config"])
        printed = yaml.safe_load(capsys.readouterr().out)
        init = printed["model"]["init_args"]
        assert (init["student"], init["teacher"]) == MODELS[pair]
        assert printed["trainer"]["max_steps"] == 3 and printed["trainer"]["limit_val_batches"] == 0
        assert [c["class_path"] for c in printed["trainer"]["callbacks"]] == ["distill.callbacks.CostMeter"]
        assert printed["run_dir"] == str(tmp_path / "out" / pair)
    text = SCRIPT.read_text()  # the models whose cache it checks are the configs' models
    assert all(
        f"[{pair}]={student}" in text and f"[{pair}]={teacher}" in text
        for pair, (student, teacher) in MODELS.items()
    )

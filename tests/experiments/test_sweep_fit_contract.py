"""The sweep's overrides compose with the real `distill fit` config (checked with --print_config)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from distill.experiments.run import rundirs
from distill.experiments.run.spec import expand, parse_spec

BASE = Path(__file__).resolve().parents[2] / "configs" / "tiny" / "base.yaml"


@pytest.mark.slow
def test_every_shorthand_lands_where_fit_reads_it(tmp_path):
    if not BASE.is_file():
        pytest.skip(f"{BASE} not present")
    pytest.importorskip("distill.lightning_cli")
    spec = parse_spec(
        {
            "name": "contract",
            "base": str(BASE),
            "out": str(tmp_path / "runs"),
            "overrides": {"trainer.max_steps": 3, "gradient_clip": 0.5, "data.sampling.max_new_tokens": 16},
            "axes": {
                "divergence": ["reverse_kl"],
                "estimator": ["k3"],
                "granularity": ["token"],
                "lr": [2e-4],  # not the base config's rate
                "mix": [0.25],
                "seed": [4],
                "task": ["countdown4"],
            },
        }
    )
    (run,) = expand(spec)
    rundirs.prepare_run_dir(run, spec.name)
    cmd = [*rundirs.fit_command(run, spec.base), "--print_config"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    config = yaml.safe_load(done.stdout)
    model = config["model"]["init_args"]
    assert config["seed_everything"] == 4 and config["run_dir"] == str(run.run_dir)
    assert config["trainer"]["max_steps"] == 3
    assert model["divergence"]["class_path"] == "distill.losses.ReverseKL"
    assert model["divergence"]["init_args"]["estimator"] == "k3"
    assert model["optimizer"]["init_args"]["lr"] == 2e-4
    assert model["gradient_clip_val"] == 0.5
    data = config["data"]
    assert (data["mix"], data["granularity"], data["task"], data["sampling"]["max_new_tokens"]) == (
        0.25,
        "token",
        "countdown4",
        16,
    )

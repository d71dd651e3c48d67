"""`distill fit` with the GRPO configs: every grpo YAML parses, and a tiny run writes the run dir."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(ROOT.glob("configs/*/grpo_*.yaml"))


def _fit(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distill.cli", "fit", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_configs_state_their_command():
    assert {p.name for p in CONFIGS} >= {"grpo_countdown.yaml", "grpo_llama.yaml", "grpo_qwen.yaml"}
    for path in CONFIGS:
        first = path.read_text().splitlines()[0]
        assert first == f"# distill fit --config {path.relative_to(ROOT)}", path


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_grpo_config_parses(path, capsys, monkeypatch):
    from distill.lightning_cli import run_lightning_cli

    monkeypatch.chdir(ROOT)  # in-process: a subprocess per config cost ~9 s of imports each
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(path), "--print_config"])
    assert exit_info.value.code in (0, None)
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["model"]["class_path"] == "distill.rl.GRPOModule"
    assert config["data"]["mix"] == 0.0 and config["data"]["group_size"] >= 2


@pytest.mark.slow
def test_tiny_grpo_fit_from_an_exported_student(policy_dir, tmp_path):
    run_dir = tmp_path / "run"
    # GradientStats every 2 optimiser steps: with num_iterations 2, batch 1 takes steps 1-2 (due),
    # batch 2 step 3 (not due), so exactly one measurement, at step 2.
    config = yaml.safe_load((ROOT / "configs" / "tiny" / "grpo_countdown.yaml").read_text())
    callbacks = config["trainer"]["callbacks"]
    for callback in callbacks:
        if callback["class_path"].endswith("GradientStats"):
            callback["init_args"]["every_n_steps"] = 2
    (tmp_path / "callbacks.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": callbacks}}))
    done = _fit(
        "--config", "configs/tiny/grpo_countdown.yaml",
        "--config", str(tmp_path / "callbacks.yaml"),
        "--model.init_args.student", policy_dir,
        "--trainer.max_steps", "3",
        "--trainer.val_check_interval", "2",
        "--data.batch_size", "2", "--data.group_size", "3", "--data.sampling.max_new_tokens", "8",
        "--data.evaluation.val_size", "4", "--data.evaluation.test_size", "4", "--data.evaluation.batch_size", "4",
        "--data.evaluation.max_new_tokens", "8",
        "--run_dir", str(run_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run_dir / "metrics.json").read_text())
    assert record["status"] == "finished"
    metrics = record["metrics"]
    for key in (
        "train/loss",
        "train/reward_mean",
        "train/reward_std",
        "train/zero_signal_groups",
        "train/clip_fraction",
        "train/kl_to_start",
        "train/kl_penalty",
        "train/completion_length",
        "train/lr",
        "val/countdown3/accuracy",
        "test/countdown3/accuracy",
        "test/countdown4/accuracy",
        "test/countdown3_large/accuracy",
        "test/countdown_chain/accuracy",
    ):
        assert key in metrics, key
    # max_steps counts optimiser steps: 3 steps at num_iterations 2 = 2 rollout batches (2 + 1 passes).
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert checkpoint["global_step"] == 3
    assert all(k.startswith("student.") for k in checkpoint["state_dict"])
    assert (run_dir / "student" / "config.json").is_file()
    # The frozen reference (kl_coef > 0) is costed: its tokens and its seconds.
    assert metrics["cost/reference_forward_tokens"] > 0 and metrics["cost/time/reference_forward"] > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("grad/param_norm")] == [2]
    assert metrics["grad/param_norm"] == pytest.approx(events.Scalars("grad/param_norm")[0].value)

"""`--drop_checkpoints`: a finished run loses its resume state (checkpoints, θ0) and keeps its
figures, its student and its curves; a run that did not finish keeps everything it needs to resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distill.lightning_cli import run_lightning_cli
from distill.rundir import RunDirError, drop_checkpoints

ROOT = Path(__file__).resolve().parents[1]
SHORT = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "1", "--data.batch_size", "4"]
SHORT += ["--data.evaluation.val_size", "8", "--data.evaluation.batch_size", "8", "--data.sampling.max_new_tokens", "12"]
SHORT += ["--data.evaluation.max_new_tokens", "12", "--data.train_size", "64", "--trainer.log_every_n_steps", "1"]


def fake_run(run: Path, metrics: str | None) -> None:
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights and optimiser state")
    (run / "theta0.safetensors").write_bytes(b"theta0")
    (run / "student").mkdir()
    (run / "student" / "model.safetensors").write_bytes(b"student")
    (run / "tensorboard").mkdir()
    if metrics is not None:
        (run / "metrics.json").write_text(metrics)


def test_a_finished_run_loses_only_its_resume_state(tmp_path):
    fake_run(tmp_path, json.dumps({"status": "finished", "metrics": {"x": 1.0}}))
    assert drop_checkpoints(tmp_path) == ["checkpoints", "theta0.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "student", "tensorboard"]
    assert (tmp_path / "student" / "model.safetensors").read_bytes() == b"student"
    assert drop_checkpoints(tmp_path) == []  # nothing left to drop: no error


@pytest.mark.parametrize(
    "metrics",
    [None, json.dumps({"status": "diverged", "reason": "nan"}), '{"status": "fini'],
    ids=["interrupted", "diverged", "truncated"],
)
def test_a_run_that_did_not_finish_keeps_its_checkpoint(tmp_path, metrics):
    fake_run(tmp_path, metrics)
    with pytest.raises(RunDirError, match="holds no finished run .* stay so that it can resume"):
        drop_checkpoints(tmp_path)
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file() and (tmp_path / "theta0.safetensors").is_file()


@pytest.mark.slow
def test_fit_with_drop_checkpoints_keeps_metrics_student_and_curves(tiny_world_cache, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    argv = ["fit", "--config", "configs/tiny/base.yaml", *SHORT, "--test_after_fit", "false"]
    run_lightning_cli([*argv, "--run_dir", str(run), "--drop_checkpoints", "true"])
    assert json.loads((run / "metrics.json").read_text())["status"] == "finished"
    assert not (run / "checkpoints").exists() and not (run / "theta0.safetensors").exists()
    assert any((run / "tensorboard").iterdir())
    assert AutoModelForCausalLM.from_pretrained(run / "student") is not None

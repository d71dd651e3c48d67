"""`distill fit` on the quick tiny world with every callback of configs/tiny/base.yaml: the values
reach metrics.json and TensorBoard, and a resumed fit keeps θ0, the step-0 baselines and the totals."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distill.lightning_cli import run_lightning_cli

SHRINK = [
    "--data.batch_size", "4",
    "--data.train_size", "64",
    "--data.evaluation.val_size", "8",
    "--data.evaluation.test_size", "8",
    "--data.evaluation.batch_size", "64",
    "--data.sampling.max_new_tokens", "16",
    "--data.evaluation.max_new_tokens", "16",
    "--trainer.val_check_interval", "5",
    "--trainer.enable_progress_bar", "false",
    "--trainer.enable_model_summary", "false",
]  # fmt: skip

# configs/tiny/base.yaml's test tasks
TASKS = ("countdown3", "countdown4", "countdown3_large", "countdown_chain")
TRAINING_KEYS = [
    *(f"forgetting/{s}/{m}" for s in ("addition", "reversal") for m in ("score", "delta")),
    "forgetting/mean_delta",
    *(f"sparsity/{k}" for k in ("overall", "exact_zero", "relative_update_norm", "attention", "mlp", "norm")),
    "grad/logit_sq_norm",
    "grad/logit_sq_norm_student_tokens",
    "grad/param_norm",
    "style/teacher_style_share",
    *(f"cost/{k}" for k in ("teacher_generated_tokens", "student_generated_tokens", "flops", "wall_s")),
    *(f"cost/{k}" for k in ("teacher_forward_tokens", "student_forward_tokens")),
    *(f"cost/time/{p}" for p in ("rollout", "teacher_forward", "student_forward_backward", "evaluation")),
]
EVAL_KEYS = [
    f"{split}/countdown3/{m}" for split in ("val", "test") for m in ("pass@1", "pass@4", "pass@8")
] + [f"test/{t}/{m}" for t in TASKS for m in ("pass@1", "pass@8", "distinct_correct", "sample_entropy")]


def fit(run_dir, max_steps: int, *extra: str) -> dict:
    args = ["fit", "--config", "configs/tiny/base.yaml", *SHRINK, "--trainer.max_steps", str(max_steps)]
    run_lightning_cli([*args, "--run_dir", str(run_dir), *extra])
    return json.loads((run_dir / "metrics.json").read_text())["metrics"]


def scalars(run_dir) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0})
    events.Reload()
    return events


@pytest.mark.slow
def test_all_callbacks_report_and_resume(tiny_world_cache, tmp_path):
    run = tmp_path / "run"
    first = fit(run, 5)
    missing = [k for k in TRAINING_KEYS + EVAL_KEYS + ["cost/time/test"] if k not in first]
    assert not missing, missing
    assert 0 <= first["sparsity/overall"] < 1 and first["sparsity/relative_update_norm"] > 0
    assert first["cost/student_generated_tokens"] > 0 and first["cost/teacher_generated_tokens"] == 0
    assert first["test/countdown3/sample_entropy"] > 0
    events = scalars(run)
    tags = set(events.Tags()["scalars"])
    assert not [k for k in TRAINING_KEYS + EVAL_KEYS if k not in tags]
    assert "sparsity/per_tensor" in events.Tags()["histograms"]
    assert [e.step for e in events.Scalars("forgetting/addition/score")] == [0, 5]
    start = {s: events.Scalars(f"forgetting/{s}/score")[0].value for s in ("addition", "reversal")}

    theta0 = run / "theta0.safetensors"
    written = theta0.stat().st_mtime_ns
    # Continue the finished run for two more steps (a recorded config change: max_steps 5 -> 7).
    extend = ("--overwrite", "true", "--allow_config_change", "true")
    second = fit(run, 7, "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), *extend)
    assert theta0.stat().st_mtime_ns == written  # θ0 read back, not re-taken from resumed weights
    for s in ("addition", "reversal"):  # deltas still measured against the step-0 scores
        assert second[f"forgetting/{s}/delta"] == pytest.approx(start[s] - second[f"forgetting/{s}/score"])
    assert [e.step for e in scalars(run).Scalars("forgetting/addition/score")] == [0, 5, 7]
    for key in ("cost/student_forward_tokens", "cost/flops", "cost/wall_s", "cost/student_generated_tokens"):
        assert second[key] > first[key], key

"""The real pair (SmolLM2-135M-Instruct and SmolLM2 taught Countdown-3, configs/real/smollm2.yaml)
through what a researcher runs: `distill sweep` over precision {32-true, bf16-mixed} x mix {0, 1}
with every measurement, one of its fits stopped by SIGTERM and resumed by the sweep's rerun,
`distill report` over it, GRPO from a distilled student, and a two-rank DDP fit. Each fit is two
steps of two short rollouts: the path is what is tested, not what it learns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from distill.models import real
from distill.models.loading import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
# Last of the one-core early jobs (tests/conftest.py): the longest, and its tests only read it.
EARLY_ORDER = 3
CONFIG = ROOT / "configs" / "real" / "smollm2.yaml"
STOPPED = "mix=1,trainer.precision=bf16-mixed"  # the run SIGTERM stops after step 1

pytestmark = pytest.mark.slow


def short_config(where: Path) -> Path:
    """configs/real/smollm2.yaml at two steps of two rollouts, its measurements on a few rows, and
    the fault injector (tests/faults/inject.py) armed by the environment."""
    config = yaml.safe_load(CONFIG.read_text())
    smaller = {
        "TaskEvaluation": {"num_problems": 1, "num_samples": 2, "ks": [1, 2]},
        "Forgetting": {"num_examples": 2, "every_n_steps": 2},
        "UpdateSparsity": {"every_n_steps": 2},
        "StyleProbe": {"num_prompts": 1, "every_n_steps": 2},
    }
    for callback in config["trainer"]["callbacks"]:
        callback.setdefault("init_args", {}).update(
            smaller.get(callback["class_path"].rsplit(".", 1)[-1], {})
        )
    config["trainer"]["callbacks"].append({"class_path": "inject.SignalAt"})
    config["trainer"].update(max_steps=2, val_check_interval=2)
    data = config["data"]
    data.update(batch_size=2, train_size=8)
    # Four new tokens a rollout: decoding is most of a fit's time (each token reads the whole model).
    data["sampling"]["max_new_tokens"] = 4
    data["evaluation"].update(val_size=2, test_size=2, batch_size=2, max_new_tokens=4)
    path = where / "real_short.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def environment(**extra: str) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "faults")]),
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def distill(*args: str) -> list[str]:
    return [sys.executable, "-m", "distill.cli", *args]


def grpo_config(student: Path, where: Path) -> Path:
    """A two-step GRPO stage from `student` through the chat template, with the cost meter."""
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": 2,
            "val_check_interval": 2,
            "check_val_every_n_epoch": None,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 1,
            "precision": "bf16-mixed",
            "callbacks": [{"class_path": "distill.callbacks.CostMeter"}],
        },
        "model": {
            "class_path": "distill.rl.GRPOModule",
            "init_args": {
                "student": str(student),
                "execution": {"compile_decoding": False, "compile_forwards": False},
                "objective": {"num_iterations": 2, "kl_coef": 0.01},
            },
        },
        "data": {
            "task": "countdown3",
            "mix": 0.0,
            "group_size": 2,
            "batch_size": 1,
            "train_size": 4,
            "sampling": {"max_new_tokens": 4, "temperature": 1.0},
            "prompts": {"chat_template": True},
            "evaluation": {"val_size": 2, "test_size": 2, "batch_size": 2, "max_new_tokens": 4},
        },
    }
    path = where / "grpo.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def early_jobs(request, selected: set[str]) -> dict:
    """The sweep, its rerun, the GRPO stage and the report, one after another on one core, for
    `start_early` (tests/conftest.py) to start at the session's start."""
    if not selected - {"test_a_two_rank_ddp_fit_of_the_real_pair"}:
        return {}
    where = request.getfixturevalue("tmp_path_factory").mktemp("real")
    env = environment()  # now: the job runs while other tests change os.environ (monkeypatch)
    return {"real_pipeline": (lambda: sweep_rerun_grpo_report(where, env), 1, {})}


def sweep_rerun_grpo_report(where: Path, env: dict) -> dict:
    """{"out": the sweep's output, "config": the short config, "first", "rerun", "report": those
    processes, "status": the sweep's status after the first invocation, "grpo": the GRPO stage's
    process}. One fit at a time, one thread each."""
    config = short_config(where)
    spec = where / "real.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "real_pair",
                "base": str(config),
                "out": str(where / "runs"),
                "references": False,
                "axes": {"trainer.precision": ["32-true", "bf16-mixed"], "mix": [0, 1]},
            }
        )
    )

    def run(*args: str, **armed: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            distill(*args), cwd=ROOT, env={**env, **armed}, capture_output=True, text=True, timeout=900
        )

    first = run("sweep", str(spec), DISTILL_TEST_SIGNAL_AT_STEP="1", DISTILL_TEST_SIGNAL_RUN=STOPPED)
    status = json.loads((where / "runs" / "status.json").read_text())
    rerun = run("sweep", str(spec))
    student = where / "runs" / "mix=0,trainer.precision=bf16-mixed" / "student"
    grpo = run("fit", "--config", str(grpo_config(student, where)), "--run_dir", str(where / "grpo"))
    report = run("report", str(where / "runs"))
    out = {"out": where / "runs", "config": config, "status": status, "grpo": grpo}
    return {**out, "first": first, "rerun": rerun, "report": report}


@pytest.fixture(scope="module")
def swept(early) -> dict:
    """The pipeline's processes and outputs (`sweep_rerun_grpo_report`), started early."""
    return early("real_pipeline").result()


def test_a_sweep_of_the_real_pair_stops_resumes_and_reports(swept):
    out, first, rerun, report, status = (swept[k] for k in ("out", "first", "rerun", "report", "status"))
    stopped = out / STOPPED
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    said = (
        "interrupted at step 1: SIGTERM: stopped at the end of step 1 on every rank; resumes from "
        "checkpoints/last.ckpt (step 1)"
    )
    assert f"FAILED {STOPPED} (exit code 143; {said})" in first.stdout
    assert status["ended_by_state"] == {"finished": 3, "interrupted": 1}
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "1 finished now, 3 skipped (finished before), 0 failed" in rerun.stdout
    assert json.loads((stopped / "status.json").read_text())["state"] == "finished"
    assert "--ckpt_path" in (stopped / "fit.log").read_text()  # resumed, not restarted
    assert report.returncode == 0, report.stderr[-3000:]
    assert "4 finished runs of 4" in (out / "report" / "report.md").read_text()


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
@pytest.mark.parametrize("mix", [0, 1])
def test_every_run_measures_everything_through_the_chat_template(swept, precision, mix):
    run = swept["out"] / f"mix={mix},trainer.precision={precision}"
    record = json.loads((run / "metrics.json").read_text())
    assert record["status"] == "finished"
    m = record["metrics"]
    assert yaml.safe_load((run / "config.yaml").read_text())["trainer"]["precision"] == precision
    assert m["train/teacher_share"] == mix  # who wrote the rollouts: the knob, exactly
    assert m["train/reverse_kl"] > 0 and m["train/teacher_entropy"] > 0
    assert {"test/countdown3/accuracy", "val/countdown3/pass@2", "val/countdown3/reverse_kl"} <= set(m)
    assert m["forgetting/passages/score"] > 0 and "forgetting/passages/delta" in m  # NLL of real text
    assert 0 < m["sparsity/overall"] < 1 and m["sparsity/relative_update_norm"] > 0
    assert m["grad/param_norm"] > 0 and "style/teacher_style_share" in m
    assert m["cost/flops"] > 0
    models = json.loads((run / "env.json").read_text())["models"]
    assert models["teacher"]["real"]["name"] == "real:smollm2-countdown"
    assert models["student"]["real"]["name"] == "real:smollm2"
    assert models["student"]["path"] == real.resolve("real:smollm2")
    exported = load_tokenizer(str(run / "student"))  # the chat template travels with the student
    assert exported.chat_template == load_tokenizer("real:smollm2").chat_template


def test_grpo_from_a_distilled_real_student(swept):
    """A GRPO stage from the exported student of a distillation run, through the chat template."""
    done, run = swept["grpo"], swept["out"].parent / "grpo"
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run / "metrics.json").read_text())
    assert record["status"] == "finished"
    metrics = record["metrics"]
    assert {"train/reward_mean", "train/kl_to_start", "test/countdown3/accuracy"} <= set(metrics)
    assert metrics["cost/student_generated_tokens"] > 0
    student = swept["out"] / "mix=0,trainer.precision=bf16-mixed" / "student"
    assert json.loads((run / "env.json").read_text())["models"]["student"]["path"] == str(student)


# No `cores(2)`: its two ranks keep 0.8 of a core busy between them (they wait on each other), so
# the test's own core is enough; beside a background job it leaves neither core idle.
def test_a_two_rank_ddp_fit_of_the_real_pair(tmp_path):
    run = tmp_path / "run"
    ddp = ["--trainer.devices=2", "--trainer.strategy=ddp", "--data.batch_size=1", "--trainer.max_steps=1"]
    ddp += ["--trainer.val_check_interval=1", "--run_dir", str(run)]
    fit = distill("fit", "--config", str(short_config(tmp_path)), *ddp)
    done = subprocess.run(fit, cwd=ROOT, env=environment(), timeout=900, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((run / "metrics.json").read_text())
    assert record["status"] == "finished" and record["metrics"]["train/reverse_kl"] > 0
    assert json.loads((run / "status.json").read_text())["state"] == "finished"

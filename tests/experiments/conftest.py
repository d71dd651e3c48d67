"""Fixtures for the sweep tests: a fake `distill fit` (and `distill test`) that trains nothing."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

# Behaves like a fit on the run-dir contract: reads the composed configs, logs its invocation,
# crashes, sleeps or diverges on demand (env FAKE_FIT_CRASH / FAKE_FIT_DIVERGE = substring of the
# run name, FAKE_FIT_SLEEP = seconds), then writes metrics.json last and atomically (a diverged
# run's status "diverged", exit code 3). Called with `test` instead of `fit` (a
# reference run), it writes test_metrics.json instead: accuracy 0.8 when the student is the
# teacher, 0.05 otherwise.
FAKE_FIT = textwrap.dedent(
    """
    import json, os, sys, time
    import yaml

    args = sys.argv[1:]
    command = args.pop(0)
    configs = [args[i + 1] for i, a in enumerate(args) if a == "--config"]
    run_dir = args[args.index("--run_dir") + 1]
    ckpt = args[args.index("--ckpt_path") + 1] if "--ckpt_path" in args else None

    def merge(into, new):
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = value

    config = {}
    for path in configs:
        merge(config, yaml.safe_load(open(path)) or {})
    start = time.time()
    name = os.path.basename(run_dir)
    print("fake fit of", name, flush=True)
    crash = os.environ.get("FAKE_FIT_CRASH")
    if crash and crash in name:  # with the status record `distill fit` leaves
        print("boom", file=sys.stderr)
        record = {"state": "failed", "reason": "RuntimeError: boom", "rank": 0, "step": 2,
                  "resume_from": None, "pid": os.getpid()}
        with open(os.path.join(run_dir, "status.json"), "w") as f:
            json.dump(record, f)
        sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_FIT_SLEEP", "0")))
    record = {"argv": args, "ckpt": ckpt, "cache": os.environ.get("DISTILL_ROLLOUT_CACHE"),
              "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"),
              "start": start, "end": time.time(), "command": command}
    with open(os.path.join(run_dir, "invocations.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\\n")
    if command == "test":
        model = config.get("model", {})
        student = model.get("student", model.get("init_args", {}).get("student"))
        teacher = model.get("teacher", model.get("init_args", {}).get("teacher"))
        acc = 0.8 if student == teacher else 0.05
        out = {"metrics": {"test/countdown3/accuracy": acc, "test/countdown3/pass@4": acc + 0.1},
               "config": config}
        with open(os.path.join(run_dir, "test_metrics.json.tmp"), "w") as f:
            json.dump(out, f)
        os.replace(os.path.join(run_dir, "test_metrics.json.tmp"), os.path.join(run_dir, "test_metrics.json"))
        sys.exit(0)
    settings = json.load(open(os.path.join(run_dir, "settings.json")))["settings"]
    metrics = {"test/countdown3/accuracy": float(config["data"]["mix"]) / 2 + 0.1,
               "train/steps": float(config["trainer"]["max_steps"])}
    out = {"status": "finished", "metrics": metrics, "settings": settings, "config": config}
    diverge = os.environ.get("FAKE_FIT_DIVERGE")
    if diverge and diverge in name:  # as `distill fit` when the non-finite guard stops it
        out.update(status="diverged", reason="loss is nan at step 7")
    with open(os.path.join(run_dir, "metrics.json.tmp"), "w") as f:
        json.dump(out, f)
    os.replace(os.path.join(run_dir, "metrics.json.tmp"), os.path.join(run_dir, "metrics.json"))
    sys.exit(3 if out["status"] == "diverged" else 0)
    """
)


@pytest.fixture
def fake_fit(tmp_path: Path) -> list[str]:
    """Command prefix that runs the fake fit script; ending in `fit`, as the real one does, so that
    the sweep derives the references' test command (`... test`) from it."""
    script = tmp_path / "fake_fit.py"
    script.write_text(FAKE_FIT)
    return [sys.executable, str(script), "fit"]


@pytest.fixture
def grid_spec(tmp_path: Path) -> Path:
    """A 2 x 2 spec (mix x seed) whose base config and output live under tmp_path; no reference
    runs (those have their own tests, with `ref_spec`)."""
    base = tmp_path / "base.yaml"
    base.write_text("trainer: {max_steps: 10}\ndata: {mix: 0.5, task: countdown3}\n")
    spec = tmp_path / "grid.yaml"
    spec.write_text(
        f"name: grid\nbase: {base}\nout: {tmp_path / 'runs'}\nreferences: false\n"
        "overrides: {trainer.max_steps: 60}\naxes:\n  mix: [0, 0.5]\n  seed: [0, 1]\n"
    )
    return spec


@pytest.fixture
def ref_spec(tmp_path: Path) -> Path:
    """A 2 x 2 spec (mix x seed) with a student and a teacher in its base, references on (the
    default)."""
    base = tmp_path / "base.yaml"
    base.write_text(
        "model: {init_args: {student: tiny-s, teacher: tiny-t}}\n"
        "trainer: {max_steps: 10}\ndata: {mix: 0.5, task: countdown3}\n"
    )
    spec = tmp_path / "grid.yaml"
    spec.write_text(
        f"name: grid\nbase: {base}\nout: {tmp_path / 'runs'}\n"
        "overrides: {trainer.max_steps: 60}\naxes:\n  seed: [3, 1]\n  mix: [0, 0.5]\n"
    )
    return spec

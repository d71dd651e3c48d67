"""benchmarks/gpu_smoke.py (run by benchmarks/gpu_smoke.sh): its arguments, its refusal without a GPU
(before building anything), the real shapes its dry run plans, and a whole run at toy shapes on the
CPU that reports every phase of every fit, the callbacks by name, decoding speed against the
bandwidth floor and the TRL comparison (or why it was skipped)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_smoke.py"
CALLBACKS = {"TaskEvaluation", "Forgetting", "UpdateSparsity", "GradientStats", "CostMeter"}


def smoke(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = ["bash", str(ROOT / "benchmarks" / "gpu_smoke.sh"), *args]
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env | {"PYTHON": sys.executable}, timeout=timeout
    )


@pytest.fixture
def in_process(monkeypatch, capsys):
    """`in_process(*args)`: (exit code, stdout, stderr) of the script's `main` run in this process,
    for what builds nothing (argument checks, the dry run): a subprocess would spend seconds on
    imports. The wrapper itself runs as a subprocess in the tests of `--help` and of the refusal."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("gpu_smoke_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", [str(SCRIPT), *args])
        capsys.readouterr()
        try:
            script.main()
            code = 0
        except SystemExit as exit_info:
            code = exit_info.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_the_wrapper_runs_the_script_and_its_header_says_how():
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_smoke.sh")]).returncode == 0
    shown = smoke("--help")
    assert shown.returncode == 0 and "--toy" in shown.stdout and "--bandwidth-tbs" in shown.stdout
    assert "make gpu-smoke" in SCRIPT.read_text().split('"""')[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pairs", "llama,gpt"], "--pairs must name some of llama, qwen; got 'gpt'"),
        (
            ["--jobs", "base,zero3"],
            "--jobs must name some of decode, base, ddp, fsdp, grpo, trl; got 'zero3'",
        ),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
    ],
)
def test_bad_arguments_fail_naming_the_argument(args, message, in_process):
    code, _, err = in_process(*args, "--dry-run")
    assert code == 2 and message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_it_refuses_before_building_anything(tmp_path):
    result = smoke("--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "no CUDA GPU visible" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_dry_run_plans_the_real_shapes_and_builds_nothing(in_process):
    code, out, err = in_process("--dry-run")
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == {
        *(f"llama-{job}" for job in ("decode", "base", "ddp", "fsdp", "grpo", "trl")),
        *(f"qwen-{job}" for job in ("decode", "base", "grpo", "trl")),
    }
    assert "Llama-3.2-1B (1.24 B params), teacher Llama-3.1-8B" in lines["llama-base"]
    assert "Qwen2.5-1.5B (1.54 B params), teacher Qwen2.5-7B" in lines["qwen-base"]
    assert "reference Llama-3.2-1B" in lines["llama-grpo"]
    for name in ("llama-base", "llama-ddp", "llama-fsdp", "llama-grpo", "qwen-base", "qwen-grpo"):
        assert all(f"{phase} " in lines[name] for phase in ("rollout", "step", "evaluation", "callbacks"))


def test_a_real_shape_model_is_never_built_on_the_cpu(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import smoke_parts

        from distill.memory import LLAMA_1B
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smoke_parts.write_model(tmp_path / "student", LLAMA_1B, "float32", 512)
    originals = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained
    try:
        smoke_parts.build_from_configs(torch.device("cpu"))
        with pytest.raises(
            RuntimeError, match=r"refusing to build Llama-3.2-1B \(1,235,814,400 params\) on the CPU"
        ):
            AutoModelForCausalLM.from_pretrained(path)
        assert AutoTokenizer.from_pretrained(path)("two words").input_ids == [1, 3, 3]  # as written
    finally:
        AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained = originals


@pytest.mark.slow  # one process at a time: the test's own core (no `cores(2)`)
def test_a_toy_run_reports_every_phase_callback_and_speed(tmp_path):
    """Three processes (decode, base, GRPO; 30 s on 2 idle cores). The DDP and FSDP2 jobs are the
    base job's fit on 2 ranks: the dry run above checks their plan; 2-rank updates under each
    strategy are tests/test_ddp.py's, a whole 2-rank FSDP2 fit tests/faults/test_kill_resume.py's
    (the toy run with them took 50 s)."""
    jobs = "decode,base,grpo,trl"
    result = smoke(
        "--toy", "--pairs", "llama", "--jobs", jobs, "--steps", "1", "--out", str(tmp_path), timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    figures = json.loads((tmp_path / "results.json").read_text())
    assert set(figures) == {"llama-decode", "llama-base", "llama-grpo"}
    for name in ("llama-base", "llama-grpo"):
        fit = figures[name]
        assert {"rollout", "step", "evaluation"} <= set(fit["peak"]), name
        assert CALLBACKS <= set(fit["peak"]), name
        assert all(fit["peak"][k] > 0 for k in fit["peak"]) and fit["metrics"]["cost/wall_s"] > 0
        assert set(fit["predicted"]) == {"rollout", "step", "evaluation", "callbacks", "peak"}
        assert fit["shapes"]["rollout"][0] == {"llama-grpo": 128, "llama-base": 32}.get(name, 8)
        line = next(x for x in result.stdout.splitlines() if x.startswith(name))
        assert all(f"{phase} " in line for phase in ("rollout", "step", "evaluation", "callbacks"))
    assert "StyleProbe" in figures["llama-base"]["peak"]
    for role in ("student", "teacher"):
        speed = figures["llama-decode"][role]
        assert speed["tokens_per_s"] > 0 and 0 < speed["share"] < 1
    assert result.stdout.count("% of the bandwidth floor") == 2
    if importlib.util.find_spec("trl") is None:
        assert re.search(r"^llama-trl +skipped: TRL is not installed", result.stdout, re.M)
    else:
        assert "TRL GKD" in result.stdout

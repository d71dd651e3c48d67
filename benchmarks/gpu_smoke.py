"""GPU smoke run: what the paper's runs do, at the real shapes, with random-initialised models.

Run:  make gpu-smoke                                     # = bash benchmarks/gpu_smoke.sh, one GPU, <= 10 min
      .venv/bin/python benchmarks/gpu_smoke.py [--pairs llama,qwen] [--jobs decode,base,...] [--out DIR]
      .venv/bin/python benchmarks/gpu_smoke.py --dry-run   # the jobs and the formula's figures; builds nothing
      .venv/bin/python benchmarks/gpu_smoke.py --toy       # tiny shapes on the CPU (tests/test_gpu_smoke.py)

The models are Llama-3.1-8B / 3.2-1B and Qwen2.5-7B / 1.5B as shapes (`distill.memory`: layers,
widths, heads, vocabulary sizes), built from config on the GPU with random weights: nothing is
downloaded (benchmarks/smoke_parts.py: config-only model directories with a tokenizer of the real
vocabulary size, local stand-ins for the hub's retention sets). Jobs, each in its own process:

- `decode`: tokens/s of each model decoding alone (32 rows, 128 new tokens, under the step's bf16
  autocast) and that figure as a share of the memory-bandwidth floor, rows / (bytes of bf16 weights
  and KV cache read per decode step / `--bandwidth-tbs`, H200: 4.8 TB/s);
- `base`: configs/paper/<pair>_base.yaml at mix 0.5 (both models write rollouts), with validation and
  every measurement callback: TaskEvaluation, Forgetting (task and text sets), UpdateSparsity,
  GradientStats (every step), CostMeter, and StyleProbe from <pair>_style_es.yaml;
- `ddp`, `fsdp`: configs/paper/llama_ddp.yaml and llama_fsdp.yaml on one GPU (DDP, FSDP2);
- `grpo`: configs/paper/grpo_<pair>.yaml;
- `trl`: seconds per step of TRL's GKD trainer and of distill on the same shapes and batch
  (benchmarks/step.py's contenders, on-policy); skipped, saying why, without TRL.

The fits keep the configs' batch sizes (rollout rows, micro-batches, evaluation and callback
batches) and cut the rest: `--steps` optimiser steps, `--new-tokens` for every token budget,
one validation at the end, one batch per measurement. Reported per fit and phase (rollout, step,
evaluation, each callback): the peak of `torch.cuda.max_memory_allocated` (reset between phases)
beside `distill.memory`'s prediction for the shapes the run had, and seconds; on the CPU (`--toy`)
the process's peak RSS so far. Results: <out>/results.json. Exit 2 without a CUDA GPU (unless
`--toy` or `--dry-run`), 1 when a job fails or times out (its log: <out>/<job>.log). All jobs stay
within `--budget` seconds (default 570): each is stopped at `--timeout` or what is left, and none
starts with less than a minute left.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from smoke_parts import (
    PAPER,
    ROOT,
    build_from_configs,
    paper_config,
    smoke_callbacks,
    write_data,
    write_model,
)

from distill.memory import GB, HUB, TOKENIZER_SIZE, Architecture, Run, decode, decode_bytes_per_step, estimate

TOY = {  # tiny shapes of the same families for the CPU: (student, teacher, tokenizer size)
    "llama": (
        Architecture("toy-llama-1B", "llama", 2, 64, 4, 2, 128, 512, True, 2048),
        Architecture("toy-llama-8B", "llama", 2, 96, 4, 2, 192, 512, False, 2048),
        512,
    ),
    "qwen": (
        Architecture("toy-qwen-1.5B", "qwen2", 2, 48, 4, 2, 96, 640, True, 2048),
        Architecture("toy-qwen-7B", "qwen2", 2, 64, 4, 2, 128, 648, False, 2048),
        600,
    ),
}
JOBS = ("decode", "base", "ddp", "fsdp", "grpo", "trl")  # in running order
PAIR_JOBS = {"llama": JOBS, "qwen": ("decode", "base", "grpo", "trl")}  # DDP/FSDP recipes: Llama only
FITS = {
    "base": "{pair}_base.yaml",
    "ddp": "llama_ddp.yaml",
    "fsdp": "llama_fsdp.yaml",
    "grpo": "grpo_{pair}.yaml",
}
PHASES = ("rollout", "step", "evaluation", "callbacks")


def models(pair: str, toy: bool) -> tuple[Architecture, Architecture, int]:
    """(student, teacher, tokenizer size) of a pair: its base config's models."""
    if toy:
        return TOY[pair]
    init = paper_config(f"{pair}_base.yaml")["model"]["init_args"]
    student, teacher = HUB[init["student"]], HUB[init["teacher"]]
    return student, teacher, TOKENIZER_SIZE[student.family]


# --- fits -------------------------------------------------------------------------------------------


def fit_job(pair: str, kind: str, dirs: dict, data: dict, out: Path, args) -> dict:
    """A child's spec: the `distill fit` arguments, and what `predicted` needs."""
    name = FITS[kind].format(pair=pair)
    config = paper_config(name)
    init, d = config["model"]["init_args"], config["data"]
    style = [paper_config(f"{pair}_style_es.yaml")["trainer"]["callbacks"][-1]] if kind == "base" else []
    callbacks = smoke_callbacks(config, style, data, args.new_tokens, args.steps)
    per_batch = init.get("objective", {}).get("num_iterations", 1)  # GRPO: optimiser steps per rollout batch
    argv = ["fit", "--config", str(PAPER / name), "--run_dir", str(out / "runs" / f"{pair}-{kind}")]
    options = {
        "overwrite": "true",
        "trainer.accelerator": "gpu" if torch.cuda.is_available() else "cpu",
        "trainer.devices": "1",
        "trainer.max_steps": str(args.steps),
        "trainer.val_check_interval": str(max(1, args.steps // per_batch)),
        "trainer.enable_checkpointing": "false",
        "trainer.enable_progress_bar": "false",
        "trainer.callbacks": json.dumps(callbacks),
        "checkpoint_every_n_steps": "0",
        "test_after_fit": "false",
        "drop_checkpoints": "true",
        "model.init_args.student": dirs["student"],
        "data.sampling.max_new_tokens": str(args.new_tokens),
        "data.evaluation.max_new_tokens": str(args.new_tokens),
        "data.train_size": str(d["batch_size"] * (args.steps + 1)),
        "data.evaluation.val_size": str(d["evaluation"]["batch_size"]),  # one validation batch
    }
    if kind != "grpo":
        options["model.init_args.teacher"] = dirs["teacher"]
    if kind == "base":
        options["data.mix"] = "0.5"
    if kind == "fsdp":
        options["trainer.strategy.init_args.data_parallel_size"] = "1"
    for key, value in options.items():
        argv += [f"--{key}", value]
    forgetting = next(c["init_args"] for c in callbacks if c["class_path"].endswith(".Forgetting"))
    run = {
        "strategy": kind if kind in ("ddp", "fsdp") else "single",
        "rollout_rows": d["batch_size"] * d.get("group_size", 1),
        "teacher_share": float(options.get("data.mix", d["mix"])),
        "micro_batch": init["micro_batch_size"],
        "eval_rows": d["evaluation"]["batch_size"],
        "forgetting_rows": forgetting["batch_size"],
    }
    return {"kind": "fit", "argv": argv, "grpo": kind == "grpo", "run": run}


def predicted(job: dict, student: Architecture, teacher: Architecture, shapes: dict, new: int) -> dict:
    """`distill.memory`'s phase peaks (GB) for a fit with the rollout shapes it had (`shapes`;
    before running: the config's rows and 256-token prompts)."""
    rows, prompt, _ = shapes.get("rollout", [job["run"]["rollout_rows"], 256, new])
    # GRPO's reference is the starting policy in the policy's dtype (float32).
    frozen = dict(reference=student, frozen_itemsize=4) if job["grpo"] else dict(teacher=teacher)
    shape = dict(rollout_rows=rows, prompt_tokens=prompt, new_tokens=new, eval_new_tokens=new)
    run = Run(student, **frozen, **(job["run"] | shape), forgetting_new_tokens=new)
    return {k: v / GB for k, v in estimate(run)["phases"].items()}


def fit_lines(name: str, result: dict) -> list[str]:
    peak = {k: v / GB for k, v in result["peak"].items()}
    named = sorted(k for k in peak if k not in ("setup", "other", *PHASES))
    measured = {p: peak.get(p) for p in PHASES[:3]}
    measured["callbacks"] = max((peak[k] for k in named), default=None)
    pred = result["predicted"]
    cells = "  ".join(f"{p} {measured[p] or 0:.1f} / {pred[p]:.1f}" for p in PHASES)
    seconds = sorted(result["seconds"].items(), key=lambda kv: -kv[1])
    lines = [
        f"{name:<12} {cells}",
        f"{'':<12} callbacks: " + ", ".join(f"{k} {peak[k]:.1f}" for k in named),
        f"{'':<12} seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds),
    ]
    m = result["metrics"]
    if m.get("cost/time/rollout"):
        made = m["cost/teacher_generated_tokens"] + m["cost/student_generated_tokens"]
        lines.append(f"{'':<12} rollouts: {made / m['cost/time/rollout']:.0f} tokens/s (CostMeter)")
    return lines


# --- children ---------------------------------------------------------------------------------------


def child(spec: dict) -> dict:
    """Run one job in this process (`--child SPEC.json`) and return its figures."""
    import smoke_phases  # the module PhaseMark's class_path names: one RECORDER

    gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
    build_from_configs(device)
    if spec["kind"] == "fit":
        from distill.lightning_cli import run_lightning_cli

        metrics = run_lightning_cli(spec["argv"])
        rec = smoke_phases.RECORDER
        cost = {k: v for k, v in metrics.items() if k.startswith("cost/")}
        return {"peak": rec.peak, "seconds": rec.seconds, "shapes": rec.shapes, "metrics": cost}
    if spec["kind"] == "decode":
        return decode_speed(spec, device)
    import step

    options = dict(batch=spec["rows"], new_tokens=spec["new_tokens"], steps=spec["steps"], warmup=1, lr=1e-6)
    ns = argparse.Namespace(**options, device=device.type, scratch=tempfile.mkdtemp())
    paths = (Path(spec["student"]), Path(spec["teacher"]))
    distill_s, distill_tokens = step.run_distill(paths, False, ns, seed=0)
    trl_s, trl_tokens = step.run_trl(paths, False, ns, seed=0)
    return {
        "distill_s": distill_s,
        "trl_s": trl_s,
        "distill_tokens": distill_tokens,
        "trl_tokens": trl_tokens,
    }


def decode_speed(spec: dict, device: torch.device) -> dict:
    """Tokens/s of the student alone and of the teacher alone on `rows` random prompts, every row
    running to `new_tokens` (an EOS id past the vocabulary), under bf16 autocast as in a run."""
    from distill.models.loading import load_model, load_tokenizer
    from distill.rollout import RolloutSampler

    tokenizer = load_tokenizer(spec["student"])
    student = load_model(spec["student"], "float32", trainable=True)
    teacher = load_model(spec["teacher"], "bfloat16", trainable=False)
    ids = torch.randint(8, len(tokenizer), (spec["rows"], spec["prompt"]), device=device)
    out = {}
    for role, mix in (("student", 0.0), ("teacher", 1.0)):
        for tokens in (4, spec["new_tokens"]):  # a short warm-up, then the timed run
            sampler = RolloutSampler(
                mix=mix, granularity="batch", max_new_tokens=tokens, eos_token_id=len(tokenizer)
            )
            sampler.use_tokenizer(tokenizer)
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            # Lightning's context (`distill.precision`): no weight cache, each copy lives for its op
            with torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False):
                sampler.sample(student, teacher, ids, torch.ones_like(ids), seed=0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        weights = sum(p.numel() * p.element_size() for p in (*student.parameters(), *teacher.parameters()))
        peak = torch.cuda.max_memory_allocated() - weights if device.type == "cuda" else None
        out[role] = {"tokens_per_s": spec["rows"] * spec["new_tokens"] / seconds, "peak_beyond_weights": peak}
    return out


def decode_lines(name: str, result: dict, spec: dict, pair_models, bandwidth_tbs: float) -> list[str]:
    lines = []
    rows, prompt, new = spec["rows"], spec["prompt"], spec["new_tokens"]
    for role, arch in zip(("student", "teacher"), pair_models):
        r, student = result[role], role == "student"
        per_step = decode_bytes_per_step(arch, rows, prompt + new // 2, student)
        floor = rows * bandwidth_tbs * 1e12 / per_step
        r |= {"floor_tokens_per_s": floor, "share": r["tokens_per_s"] / floor}
        pred = decode(arch, rows, prompt, new, 2 * arch.cast_params() if student else 0) / GB
        peak = "n/a" if r["peak_beyond_weights"] is None else f"{r['peak_beyond_weights'] / GB:.1f}"
        lines.append(
            f"{name:<12} {arch.name:<14} {r['tokens_per_s']:>9.0f} tokens/s = {100 * r['share']:.1f} % of the "
            f"bandwidth floor ({floor:.0f}); peak beyond weights {peak} GB / {pred:.1f} predicted"
        )
    return lines


def run_child(name: str, spec: dict, out: Path, timeout: float) -> tuple[dict | None, str]:
    """Run a job in a fresh process: (its figures, "") or (None, why it failed)."""
    (out / f"{name}.json").write_text(json.dumps(spec))
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("DISTILL_ROLLOUT_CACHE", None)  # fresh rollouts, never cached teacher rows
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(out / f"{name}.json")]
    with open(out / f"{name}.log", "w") as log:
        try:
            done = subprocess.run(
                cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=ROOT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return None, f"did not finish within {timeout:.0f} s"
    if done.returncode != 0:
        last = (out / f"{name}.log").read_text().strip().splitlines()[-1:] or [""]
        return None, f"exit {done.returncode}: {last[0][:300]}"
    return json.loads(done.stdout.strip().splitlines()[-1]), ""


# --- main -------------------------------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="llama,qwen", help="comma-separated, of: llama, qwen")
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of: {', '.join(JOBS)}")
    parser.add_argument("--steps", type=int, default=2, help="optimiser steps per fit (default 2)")
    parser.add_argument("--new-tokens", type=int, help="every token budget (default 256; --toy: 8)")
    parser.add_argument("--bandwidth-tbs", type=float, default=4.8, help="memory bandwidth, TB/s (H200: 4.8)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per job (default 240)")
    parser.add_argument("--budget", type=float, default=570, help="seconds for all jobs (default 570)")
    parser.add_argument(
        "--out", type=Path, help="results, logs and run directories (default: a new temp dir)"
    )
    parser.add_argument("--toy", action="store_true", help="tiny shapes (on the CPU without a GPU)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the jobs and predicted peaks; build nothing"
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return args
    args.pairs, args.jobs = args.pairs.split(","), args.jobs.split(",")
    for values, allowed, flag in ((args.pairs, PAIR_JOBS, "--pairs"), (args.jobs, JOBS, "--jobs")):
        wrong = [v for v in values if v not in allowed]
        if wrong:
            parser.exit(2, f"gpu_smoke: {flag} must name some of {', '.join(allowed)}; got {wrong[0]!r}\n")
    if args.steps < 1:
        parser.exit(2, f"gpu_smoke: --steps must be >= 1, got {args.steps}\n")
    args.new_tokens = args.new_tokens or (8 if args.toy else 256)
    if not (torch.cuda.is_available() or args.toy or args.dry_run):
        parser.exit(
            2, "gpu_smoke: no CUDA GPU visible (torch.cuda.is_available() is False); use a GPU or --toy\n"
        )
    return args


def main() -> None:
    args = arguments()
    if args.child:
        print(json.dumps(child(json.loads(args.child.read_text()))))
        return
    gpu = torch.cuda.is_available()
    print(
        f"gpu_smoke: {torch.cuda.get_device_name() if gpu else 'CPU'}, torch {torch.__version__}; {args.steps} "
        f"steps, {args.new_tokens} new tokens for every budget{'; toy shapes' if args.toy else ''}"
    )
    jobs = [(f"{p}-{k}", p, k) for k in JOBS for p in args.pairs if k in PAIR_JOBS[p] and k in args.jobs]
    if args.dry_run:
        for name, pair, kind in jobs:
            student, teacher, size = models(pair, args.toy)
            frozen = f"reference {student.name}" if kind == "grpo" else f"teacher {teacher.name}"
            line = f"{name:<12} student {student.name} ({student.params() / 1e9:.2f} B params), {frozen}"
            if kind in FITS:
                spec = fit_job(
                    pair, kind, {"student": "", "teacher": ""}, {"sciq": "", "medreason": ""}, Path(), args
                )
                pred = predicted(spec, student, teacher, {}, args.new_tokens)
                line += "; predicted GB: " + ", ".join(f"{p} {pred[p]:.1f}" for p in PHASES)
            print(line)
        return
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_smoke."))
    out.mkdir(parents=True, exist_ok=True)
    data = write_data(out / "data", sentences=4 if args.toy else 48)
    dirs = {}
    for pair in args.pairs:
        student, teacher, size = models(pair, args.toy)
        folder = out / "models" / pair
        dirs[pair] = {
            "student": write_model(folder / "student", student, "float32", size),
            "teacher": write_model(folder / "teacher", teacher, "bfloat16", size),
        }
    memory = "peak GB allocated" if gpu else "peak RSS GB so far (CPU)"
    print(f"fits, per phase: {memory} / predicted by distill.memory")
    results, failed, began = {}, [], time.perf_counter()
    for name, pair, kind in jobs:
        student, teacher, size = models(pair, args.toy)
        left = args.budget - (time.perf_counter() - began)
        if left < 60:
            print(f"{name:<12} skipped: less than 60 s left of the {args.budget:.0f} s budget")
            continue
        if kind == "trl" and importlib.util.find_spec("trl") is None:
            print(f"{name:<12} skipped: TRL is not installed (pip install -e '.[bench]')")
            continue
        if kind == "decode":
            spec = {"kind": "decode", "rows": 32, "prompt": 32 if args.toy else 256, **dirs[pair]}
            spec["new_tokens"] = 8 if args.toy else 128
        elif kind == "trl":  # TRL's GKD refuses differing vocabulary sizes: the teacher gets the student's
            same = dataclasses.replace(teacher, vocab=student.vocab)
            teacher_dir = write_model(out / "models" / pair / "teacher-trl", same, "bfloat16", size)
            spec = {"kind": "trl", "rows": 8, "new_tokens": args.new_tokens, "steps": 4}
            spec |= {"student": dirs[pair]["student"], "teacher": teacher_dir}
        else:
            spec = fit_job(pair, kind, dirs[pair], data, out, args)
        result, why = run_child(name, spec, out, min(args.timeout, left))
        shutil.rmtree(out / "runs", ignore_errors=True)  # exported students and θ0: gigabytes each
        if result is None:
            print(f"{name:<12} FAILED: {why} (log: {out / name}.log)")
            failed.append(name)
            continue
        if kind == "decode":
            lines = decode_lines(name, result, spec, (student, teacher), args.bandwidth_tbs)
        elif kind == "trl":
            ratio = result["trl_s"] / result["distill_s"]
            lines = [
                f"{name:<12} s/step on-policy: distill {result['distill_s']:.2f}, TRL GKD {result['trl_s']:.2f} "
                f"(x{ratio:.2f}); completion tokens/row {result['distill_tokens']:.0f} / {result['trl_tokens']:.0f}"
            ]
        else:
            result["predicted"] = predicted(spec, student, teacher, result["shapes"], args.new_tokens)
            lines = fit_lines(name, result)
        print("\n".join(lines), flush=True)
        results[name] = result
        (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"results: {out / 'results.json'}; {time.perf_counter() - began:.0f} s")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

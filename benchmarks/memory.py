"""Peak memory of a distillation step and of an evaluation: every position's logits (before) vs the
lean forward passes (after: completion columns only, evaluation chunked by a budget).

Run:  .venv/bin/python benchmarks/memory.py            # V = 32000, 128256, 151936 (a few minutes)
      .venv/bin/python benchmarks/memory.py --quick    # V = 32000 only, a smaller batch (seconds)
      make bench-memory

The models are built from config with a real vocabulary size (Llama-2's 32000, Llama-3's 128256,
Qwen2.5's 151936) but tiny depth and width (1 layer, hidden 64 / 96, tied embeddings), with a
word-level tokenizer of that many tokens, and saved to a temporary directory: the memory that
differs between the two paths is the logits' (`[B, T, V]` against `[B, K, V]`), which only the
vocabulary and the batch shape decide, so tiny models show it on a CPU in seconds.

Each (vocabulary, phase, variant) runs in a fresh subprocess, which loads the models through
`DistillationModule` (the code path `distill fit` runs), builds a rollout batch (left-padded prompts
of different widths, completions of different lengths), records `ru_maxrss` (the process's
high-water mark), runs the phase once, and reports the growth: the peak extra memory of the phase.
PyTorch has no allocator statistics on CPU, and reading RSS afterwards misses transient peaks;
the high-water mark of a fresh process catches them and costs nothing at run time (torch's CPU
memory profiler would, and it attributes memory to operators rather than giving one peak).
Phases: `train` is `accumulate_gradients` (teacher forward, student forward + backward through the
divergence, the step's statistics); `eval` is the evaluation's statistics
(`distill.training.completion_statistics`). *Before* is `lean_logits=False` with evaluation
unchunked (the whole batch at once, as before `eval_logit_budget_mb` existed); *after* is the
default (`lean_logits=True`, `eval_logit_budget_mb=512`). `|dvalue|` compares the loss (train) or the
forward KL (eval) of the two paths: the lean path computes the same numbers. On a machine shared
with other jobs the seconds are noisy; the peaks much less so.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from children import maxrss_mib, run_child

VOCABS = (32000, 128256, 151936)


def build_pair(root: Path, vocab: int) -> Path:
    """Save a tokenizer of `vocab` word tokens with a 1 x 64 student and a 1 x 96 teacher."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

    from distill.models.tiny import llama_config

    words = {w: i for i, w in enumerate(("<pad>", "<bos>", "<eos>", "<unk>"))}
    words.update({f"w{i}": i for i in range(len(words), vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    for name, hidden, seed in (("student", 64, 1), ("teacher", 96, 2)):
        torch.manual_seed(seed)
        config = llama_config(
            vocab_size=vocab, hidden_size=hidden, num_layers=1, num_heads=2, max_positions=512
        )
        LlamaForCausalLM(config).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return root


def rollout_batch(vocab: int, batch: int, prompt: int, completion: int):
    """Left-padded prompts (widths prompt/2..prompt), right-padded completions (lengths
    completion/4..completion), as the sampler lays them out."""
    from distill.rollout import RolloutBatch

    g = torch.Generator().manual_seed(0)
    total = prompt + completion
    ids = torch.zeros(batch, total, dtype=torch.long)
    attn = torch.zeros(batch, total, dtype=torch.long)
    comp = torch.zeros(batch, total, dtype=torch.bool)
    for i in range(batch):
        p = prompt - (i * prompt // 2) // max(1, batch - 1)
        n = completion - (i * 3 * completion // 4) // max(1, batch - 1)
        ids[i, prompt - p : prompt + n] = torch.randint(4, vocab, (p + n,), generator=g)
        attn[i, prompt - p : prompt + n] = 1
        comp[i, prompt : prompt + n] = True
    teacher = comp & (torch.rand(batch, total, generator=g) < 0.5)
    return RolloutBatch(ids, attn, comp, teacher, prompt)


def worker(root: str, phase: str, variant: str, vocab: int, shape: list[int]) -> dict:
    from distill.module import DistillationModule
    from distill.training import completion_statistics

    lean = variant == "after"
    budget = 512.0 if lean else 1e12  # before: the whole batch in one pass
    module = DistillationModule(
        student=f"{root}/student", teacher=f"{root}/teacher", execution={"lean_logits": lean, "eval_logit_budget_mb": budget}
    )
    module.configure_model()
    rollout = rollout_batch(vocab, *shape)
    base = maxrss_mib()
    start = time.perf_counter()
    if phase == "train":
        means, _, _ = module.accumulate_gradients(rollout)
        value = float(means.loss)
    else:
        module.student.eval()
        sums, count = completion_statistics(module.student, module.teacher, rollout, vocab, budget, lean)
        value = float(sums["forward_kl"] / count)
    seconds = time.perf_counter() - start
    return {"peak_mib": maxrss_mib() - base, "seconds": seconds, "value": value}


def _spawn(root: Path, phase: str, variant: str, vocab: int, shape: list[int]) -> dict:
    args = ["--worker", str(root), phase, variant, str(vocab), "--shape", *map(str, shape)]
    return run_child(__file__, args, f"{vocab}/{phase}/{variant}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="V=32000 only, B=4, prompt 64, completion 32")
    parser.add_argument("--vocabs", type=int, nargs="*", default=None, help=f"default {list(VOCABS)}")
    parser.add_argument(
        "--shape",
        type=int,
        nargs=3,
        metavar=("B", "PROMPT", "COMPLETION"),
        default=None,
        help="rows, prompt width and completion width of the rollout batch (default 8 192 64)",
    )
    parser.add_argument(
        "--worker", nargs=4, metavar=("ROOT", "PHASE", "VARIANT", "V"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    shape = args.shape or ([4, 64, 32] if args.quick else [8, 192, 64])
    if args.worker:
        root, phase, variant, vocab = args.worker
        print(json.dumps(worker(root, phase, variant, int(vocab), shape)))
        return
    vocabs = args.vocabs or ([32000] if args.quick else list(VOCABS))
    b, prompt, completion = shape
    full_mib = b * (prompt + completion - 1) * 4 / 2**20
    print(f"rollout batch B={b}, prompt {prompt}, completion {completion}; float32 logits of every position:")
    print(
        f"  {full_mib:.4f} MiB per vocabulary entry, e.g. {full_mib * vocabs[-1]:.0f} MiB at V={vocabs[-1]}"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; peak = growth of ru_maxrss in a fresh process"
    )
    print(
        f"{'V':>7} {'phase':<6} {'before MiB':>10} {'after MiB':>9} {'ratio':>6} {'before s':>8} {'after s':>7} {'|dvalue|':>9}"
    )
    for vocab in vocabs:
        with tempfile.TemporaryDirectory() as tmp:
            root = build_pair(Path(tmp), vocab)
            for phase in ("train", "eval"):
                before, after = (_spawn(root, phase, v, vocab, shape) for v in ("before", "after"))
                print(
                    f"{vocab:>7} {phase:<6} {before['peak_mib']:>10.0f} {after['peak_mib']:>9.0f} "
                    f"{after['peak_mib'] / max(before['peak_mib'], 1e-9):>6.2f} {before['seconds']:>8.2f} "
                    f"{after['seconds']:>7.2f} {abs(before['value'] - after['value']):>9.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""The measurement callbacks' figures on 1 process or on N `gloo` ranks.

    python tests/ddp_measure.py OUT RANK WORLD_SIZE PORT

Run by tests/test_ddp.py (not collected by pytest: no test_ prefix). Each rank scores its share of
`Forgetting`'s task sets and text set, `StyleProbe`'s prompts and `TaskEvaluation`'s problems with a random
tiny Llama (the character tokenizer's) and writes `OUT/rank<r>.json`: the figures (which every rank must log alike, equal
to one process's) and the rows it rolled out. Sampling calls hold the same rows on 1 and N ranks
(batch size 1; whole problems), so the figures are equal to the last bit. A stand-in verifier that
a random student passes about half the time keeps the figures away from 0 and 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM

import distill.callbacks.forgetting as forgetting
from distill.callbacks import Forgetting, StyleProbe, TaskEvaluation
from distill.models.tiny import char_tokenizer, llama_config
from distill.rollout import RolloutSampler
from distill.tasks.registry import get_task


def even_code_sum(text: str) -> bool:
    return sum(map(ord, text)) % 2 == 0


class EvenCodeSumTask:
    """Correct iff the completion's code points add up to an even number; its first character is
    the answer."""

    def score(self, completion: str, row: dict) -> float:
        return float(even_code_sum(completion))

    def answer(self, completion: str) -> str | None:
        return completion[:1] or None


if __name__ == "__main__":
    out, rank, world, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    tokenizer = char_tokenizer()
    torch.manual_seed(2)
    config = llama_config(vocab_size=112, hidden_size=32, num_layers=1, num_heads=2)
    student = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than HF's init: greedy completions that vary by prompt
        for weight in student.parameters():
            if weight.dim() == 2:
                weight.normal_(0, 0.3)
    module = SimpleNamespace(
        student=student,
        teacher=None,
        tokenizer=tokenizer,
        vocab_size=len(tokenizer),
        device=torch.device("cpu"),
    )
    trainer = SimpleNamespace(global_step=0, loggers=[], callback_metrics={}, datamodule=None)
    sampled = []
    sample = RolloutSampler.sample

    def counting_sample(self, student, teacher, input_ids, *args, **kwargs):
        sampled.append(int(input_ids.shape[0]))
        return sample(self, student, teacher, input_ids, *args, **kwargs)

    RolloutSampler.sample = counting_sample
    figures, rows = {}, {}
    texts = ["the cat sat on the mat", "12+7=19", "reversal of words", "a b c d e f", "Use 3 4 to make 7."]
    measure = Forgetting(
        sets=["addition", "reversal"],
        num_examples=5,
        max_new_tokens=4,
        batch_size=1,
        nll_texts={"texts": texts},
    )
    scored = []
    nll_sums = Forgetting.nll_sums
    Forgetting.nll_sums = lambda self, pl_module, texts: (
        scored.append(len(texts)),
        nll_sums(self, pl_module, texts),
    )[1]
    forgetting.get_task = lambda name: EvenCodeSumTask()  # scoring only: the retention rows are real
    figures |= {f"forgetting/{k}": v for k, v in measure.scores(trainer, module).items()}
    rows["forgetting"], rows["nll_texts"], sampled[:] = sum(sampled), sum(scored), []
    probe = StyleProbe(pattern=even_code_sum, num_prompts=5, max_new_tokens=4, batch_size=1)
    figures["style/share"] = probe.share(trainer, module)
    rows["style"], sampled[:] = sum(sampled), []
    evaluation = TaskEvaluation(tasks=["addition"], num_problems=3, num_samples=4, ks=(1, 2, 4), seed=5)
    sampler = RolloutSampler(mix=0.0, max_new_tokens=4, temperature=1.0)
    problems = get_task("addition").rows(3, seed=0)
    coverage = evaluation.evaluate(trainer, module, EvenCodeSumTask(), problems, sampler, batch_size=6)
    figures |= {f"coverage/{k}": v for k, v in coverage.items()}
    rows["coverage"] = sum(sampled)
    (out / f"rank{rank}.json").write_text(json.dumps({"figures": figures, "rows": rows}))
    if world > 1:
        dist.destroy_process_group()

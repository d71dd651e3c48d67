"""Candidate held-out variants screened on models that exist: greedy accuracy on 200 problems of
each Countdown difficulty below (defined here, not registered) for the start student, the teacher
and distilled students. Usage: variants.py THREADS MODEL_DIR...   (LOG, 2026-12-03)"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import countdown
from distill.tasks.countdown import Difficulty

torch.set_num_threads(int(sys.argv[1]))
CANDS = {
    "bigtarget": Difficulty(3, 1, 99, 100, 999),
    "small3": Difficulty(3, 1, 20, 1, 99),
    "small4": Difficulty(4, 1, 20, 1, 99),
    "smalltarget3": Difficulty(3, 1, 99, 1, 20),
    "cd4_smalltarget": Difficulty(4, 1, 99, 1, 30),
}
countdown.DIFFICULTIES.update(CANDS)
models = sys.argv[2:]
for name in CANDS:
    probs = countdown.generate(200, seed=777, difficulty_name=name)
    prompts = [countdown.prompt(p.numbers, p.target) for p in probs]
    for src in models:
        tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
        texts = greedy_completions(model, tok, prompts, 128)
        acc = sum(countdown.score(t, p.numbers, p.target) for t, p in zip(texts, probs)) / len(probs)
        print(
            json.dumps(
                {
                    "variant": name,
                    "model": src.replace("/work/v3runs/", "").replace("/work/v3out/tiny-world-v3/", ""),
                    "acc": acc,
                }
            ),
            flush=True,
        )

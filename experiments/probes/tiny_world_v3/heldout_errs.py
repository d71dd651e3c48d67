"""Why do v3's held-out variants fall under distillation on Countdown-3? Greedy answers of the
start and of distilled students on 200 fixed problems of a task, each failure classified by its
first false step (an arithmetic error in a middle or the last step), a plan whose arithmetic holds
but ends off the target, numbers not the problem's, or no steps at all.
Usage: heldout_errs.py TASK BUDGET MODEL_DIR...   (LOG, 2026-12-03)"""

import json
import re
import sys
from fractions import Fraction

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks.registry import get_task

torch.set_num_threads(2)
task, budget, dirs = get_task(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
rows = task.rows(200, seed=12345)
out = {}
for src in dirs:
    tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
    texts = greedy_completions(model, tok, [r["prompt"] for r in rows], budget)
    kinds, lengths = {}, []
    for text, row in zip(texts, rows):
        steps = re.findall(r"(\d+)([-+*/])(\d+)=(\d+(?:/\d+)?)", text.split("</think>")[0])
        lengths.append(len(steps))
        if task.score(text, row) > 0:
            kind = "right"
        else:
            kind = None
            for i, (a, op, b, c) in enumerate(steps):
                a, b, c = Fraction(a), Fraction(b), Fraction(c)
                want = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
                if want != c:
                    kind = ("last" if i == len(steps) - 1 else "middle") + " step false"
                    break
            if kind is None:
                kind = "plan off target" if steps else "no steps"
        kinds[kind] = kinds.get(kind, 0) + 1
    out[src] = {"shares": {k: v / len(rows) for k, v in sorted(kinds.items())}, "mean_steps": sum(lengths) / len(rows)}
    print(src, json.dumps(out[src]))

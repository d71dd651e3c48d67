"""Where a model's Countdown answers go wrong, step by step: on 200 fixed problems per task, greedy,
the share of reasoning steps (`a op b=c`) that are true by operation, of first steps that are true,
of answers whose every step is true, of answers whose expression is the one their steps describe
(faithful), and the accuracy. Usage: steps.py MODEL_DIR...   (LOG, 2026-12-03;
with small_numbers/ on PYTHONPATH it measures that world)"""

import json
import re
import sys
from collections import Counter
from fractions import Fraction

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import expression
from distill.tasks.registry import get_task

TASKS = (("countdown3", 96), ("countdown4", 128), ("countdown3_large", 128), ("countdown_chain", 192))
STEP = re.compile(r"(\d+)([-+*/])(\d+)=(\d+)")
OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: Fraction(a, b) if b else None,
}


def described(steps) -> str | None:
    """The expression the steps build (each result standing for the expression that made it)."""
    made: dict[str, str] = {}
    for a, op, b, c in steps:
        made[c] = f"({made.pop(a, a)}{op}{made.pop(b, b)})"
    return list(made.values())[-1] if made else None


def flat(text: str) -> str:
    return re.sub(r"[()\s]", "", text)


torch.set_num_threads(2)
for name, budget in TASKS:
    task = get_task(name)
    rows = task.rows(200, seed=4242)
    for src in sys.argv[1:]:
        tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
        texts = greedy_completions(model, tok, [r["prompt"] for r in rows], budget)
        true, seen, n = Counter(), Counter(), Counter()
        for text, row in zip(texts, rows):
            steps = STEP.findall(text.split("</think>")[0])
            truth = [OPS[op](int(a), int(b)) == int(c) for a, op, b, c in steps]
            for (_, op, _, _), ok in zip(steps, truth):
                seen[op] += 1
                true[op] += ok
            n["first step true"] += bool(truth and truth[0])
            n["every step true"] += bool(truth) and all(truth)
            built = described(steps)
            n["faithful"] += built is not None and flat(built) == flat(expression.last_answer(text) or "")
            n["accuracy"] += task.score(text, row)
        out = {k: v / len(rows) for k, v in n.items()}
        out["step true, by op"] = {op: round(true[op] / seen[op], 3) for op in sorted(seen)}
        print(json.dumps({"task": name, "model": src, **out}), flush=True)

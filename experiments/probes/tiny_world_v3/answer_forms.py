"""What distillation on Countdown-3 does to the held-out answers' form: on 200 fixed problems of a
task, the share of greedy answers whose <answer> uses k numbers, and the share whose numbers are
the problem's (as a multiset), for the start and distilled students.
Usage: answer_forms.py TASK BUDGET MODEL_DIR...   (LOG, 2026-12-03)"""

import json
import re
import sys
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import expression
from distill.tasks.registry import get_task

torch.set_num_threads(2)
task, budget, dirs = get_task(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
rows = task.rows(200, seed=12345)
for src in dirs:
    tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
    texts = greedy_completions(model, tok, [r["prompt"] for r in rows], budget)
    counts, own = Counter(), 0
    for text, row in zip(texts, rows):
        answer = expression.last_answer(text) or ""
        literals = [int(x) for x in re.findall(r"\d+", answer)]
        counts[len(literals)] += 1
        own += Counter(literals) == Counter(row["numbers"])
    shares = {f"{k} numbers": v / len(rows) for k, v in sorted(counts.items())}
    print(json.dumps({"model": src, **shares, "the problem's numbers": own / len(rows)}), flush=True)

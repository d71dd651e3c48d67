"""The held-out answers' shape: how many reasoning steps and how many numbers in the answer, greedy
on 200 fixed Countdown-4 and long-chain problems, per model (does the pool's two-step shape leak?).
Usage: shape.py MODEL_DIR...   (LOG, 2026-12-03; the last model's first answer
is printed as an example)"""

import re
import sys
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import expression
from distill.tasks.registry import get_task

torch.set_num_threads(2)
for tname, budget in [("countdown4", 128), ("countdown_chain", 192)]:
    rows = get_task(tname).rows(200, seed=4242)
    for src in sys.argv[1:]:
        tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
        texts = greedy_completions(model, tok, [r["prompt"] for r in rows], budget)
        steps = Counter(len(re.findall(r"\d+[-+*/]\d+=\d+", t.split("</think>")[0])) for t in texts)
        nums = Counter(len(re.findall(r"\d+", expression.last_answer(t) or "")) for t in texts)
        print(
            tname,
            src[-45:],
            "steps",
            dict(sorted(steps.items())),
            "answer numbers",
            dict(sorted(nums.items())),
            flush=True,
        )
        if src == sys.argv[-1]:
            print("   e.g.", rows[0]["prompt"].strip(), "|", texts[0][:150])

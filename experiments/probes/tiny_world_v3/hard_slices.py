"""Is there a harder Countdown-3 that distillation on Countdown-3 can move? The v3 sizing probes
lowered every held-out variant that differs from the pool in form (one more number, 3-digit
numbers, a chained second problem). This scores models greedy on fresh Countdown-3 problems split
by how hard their search is: how many solution plans reach the target (integer steps, commutative
orders counted once), and whether any plan uses only + and -.
Usage: hard_slices.py N MODEL_DIR...   (LOG, 2026-12-03)"""

import json
import sys
from fractions import Fraction

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import countdown


def plans(numbers, target):
    """Every ((x op y) op z) plan over three numbers with integer, non-negative steps: (ops, count)."""
    out = []
    idx = range(3)
    for i in idx:
        for j in idx:
            if i == j:
                continue
            k = 3 - i - j
            for op1 in countdown.OPS:
                if op1 in "+*" and i > j:
                    continue
                v = countdown._apply(op1, Fraction(numbers[i]), Fraction(numbers[j]))
                if v is None or v.denominator != 1 or v < 0:
                    continue
                for a, b in ((v, Fraction(numbers[k])), (Fraction(numbers[k]), v)):
                    for op2 in countdown.OPS:
                        if op2 in "+*" and a is not v:
                            continue
                        w = countdown._apply(op2, a, b)
                        if w is not None and w == target:
                            out.append(op1 + op2)
    return out


def slice_of(p):
    found = plans(p.numbers, p.target)
    plain = any(set(ops) <= set("+-") for ops in found)
    return ("single" if len(found) <= 1 else "several") + ("" if plain else "+muldiv_only")


if __name__ == "__main__":
    torch.set_num_threads(2)
    n, dirs = int(sys.argv[1]), sys.argv[2:]
    problems = countdown.generate(n, seed=777)
    slices = [slice_of(p) for p in problems]
    names = sorted(set(slices))
    print("slices", {s: slices.count(s) for s in names}, flush=True)
    prompts = [countdown.prompt(*p) for p in problems]
    for src in dirs:
        tok, model = AutoTokenizer.from_pretrained(src), AutoModelForCausalLM.from_pretrained(src)
        texts = greedy_completions(model, tok, prompts, 96)
        right = [countdown.score(t, *p) for t, p in zip(texts, problems)]
        acc = {s: round(100 * sum(r for r, x in zip(right, slices) if x == s) / slices.count(s), 1) for s in names}
        acc["all"] = round(100 * sum(right) / n, 1)
        print(json.dumps({"model": src, **acc}), flush=True)

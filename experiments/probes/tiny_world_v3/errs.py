import re
import sys
from fractions import Fraction

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.tasks import countdown

torch.set_num_threads(1)
src = sys.argv[1]
diff = sys.argv[2]
tok = AutoTokenizer.from_pretrained(src)
m = AutoModelForCausalLM.from_pretrained(src)
probs = countdown.generate(300, 99, diff)
texts = greedy_completions(m, tok, [countdown.prompt(*p) for p in probs], 128)
kinds = {"ok": 0, "arith": 0, "plan": 0, "numbers": 0, "other": 0}
for t, (nums, target) in zip(texts, probs):
    if countdown.score(t, nums, target):
        kinds["ok"] += 1
        continue
    steps = re.findall(r"(\d+)([-+*/])(\d+)=(\d+(?:/\d+)?)", t.split("</think>")[0])
    bad = None
    for i, (a, op, b, c) in enumerate(steps):
        a, b, c = Fraction(a), Fraction(b), Fraction(c)
        want = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
        if want != c and bad is None:
            bad = (i == len(steps) - 1, op)
    if bad:
        key = ("last_" if bad[0] else "mid_") + bad[1]
        kinds[key] = kinds.get(key, 0) + 1
    elif steps and Fraction(steps[-1][3]) != target:
        kinds["plan"] += 1
    elif steps:
        kinds["numbers"] += 1
    else:
        kinds["other"] += 1
print(diff, {k: round(v / len(probs), 3) for k, v in kinds.items()})

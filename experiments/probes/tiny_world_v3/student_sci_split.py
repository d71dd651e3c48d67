"""student-sci on tinysci questions about facts its training stated vs the others."""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from distill.models.evaluation import greedy_completions
from distill.tasks import qa, tinysci

torch.set_num_threads(1)
src = sys.argv[1]
tok = AutoTokenizer.from_pretrained(src)
m = AutoModelForCausalLM.from_pretrained(src).eval()
known = tinysci.student_facts()
qs = tinysci.generate(int(sys.argv[2]) if len(sys.argv) > 2 else 800, 0, "train")
texts = greedy_completions(m, tok, [tinysci.prompt(q) for q in qs], 64)
res = {"known": [0, 0], "unknown": [0, 0], "partial": [0, 0]}
for q, t in zip(qs, texts):
    inside = [f in known for f in q.steps]
    key = "known" if all(inside) else ("unknown" if not any(inside) else "partial")
    res[key][0] += qa.score(t, list(q.options), qa.letter(q.answer_index))
    res[key][1] += 1
print(src, {k: (round(a / n, 3) if n else None, n) for k, (a, n) in res.items()}, flush=True)

"""Does the retry format raise the v2 teacher's greedy Countdown? Fine-tune it on v2's mixture with
Countdown rows in the retry format. Usage: python probe_retry.py OUT STEPS LR"""

import json
import math
import random
import sys
import time

import torch

ARGS = sys.argv[1:]
sys.argv = sys.argv[:1]
import probe
import retry
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.tiny_world_train import Collator
from distill.tasks import countdown, prior

OUT, STEPS, LR = ARGS[0], int(ARGS[1]), float(ARGS[2])
torch.set_num_threads(2)
MIX = [
    ("countdown3", 0.45),
    ("countdown4", 0.25),
    ("countdown3_large", 0.1),
    ("addition", 0.1),
    ("reversal", 0.1),
]


def rows(task, n, seed, rng):
    if task in prior.TASKS:
        return [(prior.prompt(e.task, e.query), e.completion) for e in prior.generate(task, n, seed=seed)]
    return [(countdown.prompt(*p), retry.solution(*p, rng)) for p in countdown.generate(n, seed, task)]


def stream():
    rng = random.Random(7)
    chunk = 0
    while True:
        pools = {t: rows(t, 256, 7 * 10**6 + chunk, rng) for t, _ in MIX}
        chunk += 1
        for i in range(256):
            t = rng.choices([t for t, _ in MIX], [w for _, w in MIX])[0]
            yield pools[t][i]


src = "/work/main/distill/models/assets/tiny-world/teacher"
tok = AutoTokenizer.from_pretrained(src)
model = AutoModelForCausalLM.from_pretrained(src)
for k in ("cd3", "cd4", "large"):  # budgets for up to three attempts
    probe.EVAL[k] = (*probe.EVAL[k][:2], {"cd3": 160, "cd4": 224, "large": 192}[k], probe.EVAL[k][3])
del probe.EVAL["chain"], probe.EVAL["cd5"]
res = {"mix": MIX, "lr": LR, "rows": []}
torch.manual_seed(0)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
warm = 100
sched = torch.optim.lr_scheduler.LambdaLR(
    opt,
    lambda s: (
        min(1, (s + 1) / warm)
        * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * max(0, s - warm) / (STEPS - warm))))
    ),
)
col = Collator(tok)
it = stream()
losses = []
t0 = time.time()
for step in range(1, STEPS + 1):
    batch = col([next(it) for _ in range(32)])
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(loss.item())
    if step % 100 == 0:
        print(step, round(sum(losses[-100:]) / 100, 4), round((time.time() - t0) / step, 3), flush=True)
    if step % 1000 == 0:
        model.eval()
        r = {"step": step, **probe.evaluate(model, tok)}
        model.train()
        res["rows"].append(r)
        print(r, flush=True)
        json.dump(res, open(OUT, "w"), indent=1)
model.save_pretrained(OUT + ".model")
tok.save_pretrained(OUT + ".model")

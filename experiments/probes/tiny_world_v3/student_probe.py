"""v3 student sizing: a 2x128 student from scratch on a candidate mixture; greedy on every task
at the end (and at a midpoint). Usage: python student_probe.py OUT STEPS MIXNAME [threads]"""

import json
import math
import sys
import time

import probe
import torch
from transformers import LlamaForCausalLM

from distill.models.evaluation import prior_accuracy
from distill.models.tiny import char_tokenizer, llama_config
from distill.models.tiny_world_train import Collator
from distill.tasks import prior

OUT, STEPS, MIXNAME = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
MIXES = {
    "a": [
        ("cd3", 0.14),
        ("cd4", 0.05),
        ("large", 0.05),
        ("chain", 0.05),
        ("addition", 0.41),
        ("reversal", 0.30),
    ],
    "b": [
        ("cd3", 0.12),
        ("cd4", 0.08),
        ("large", 0.08),
        ("chain", 0.08),
        ("addition", 0.37),
        ("reversal", 0.27),
    ],
}
probe.MIX = MIXES[MIXNAME]
tok = char_tokenizer()
cfg = llama_config(
    vocab_size=112,
    hidden_size=128,
    num_layers=2,
    num_heads=4,
    intermediate_size=256,
    bos_token_id=tok.bos_token_id,
    eos_token_id=tok.eos_token_id,
    pad_token_id=tok.pad_token_id,
)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, betas=(0.9, 0.98))
warm = max(1, STEPS // 20)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt,
    lambda s: (
        (s + 1) / warm
        if s < warm
        else 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (s - warm) / (STEPS - warm)))
    ),
)
col = Collator(tok)
it = probe.stream(1)
res = {"mix": probe.MIX, "steps": STEPS, "rows": []}
t0 = time.time()
losses = []
for step in range(1, STEPS + 1):
    batch = col([next(it) for _ in range(64)])
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    losses.append(loss.item())
    if step % 100 == 0:
        print(step, round(sum(losses[-100:]) / 100, 4), round((time.time() - t0) / step, 3), flush=True)
    if step == STEPS or step == STEPS // 2:
        model.eval()
        r = {
            "step": step,
            **probe.evaluate(model, tok),
            **{t: prior_accuracy(model, tok, prior.generate(t, 200, 77)) for t in ("addition", "reversal")},
        }
        model.train()
        res["rows"].append(r)
        print(r, flush=True)
        json.dump(res, open(OUT, "w"), indent=1)
model.save_pretrained(OUT + ".model")

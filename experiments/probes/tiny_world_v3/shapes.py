import statistics
import sys
import time

import torch

sys.argv = ["x"]
import probe
from transformers import LlamaForCausalLM

from distill.models.tiny import char_tokenizer, llama_config
from distill.models.tiny_world_train import Collator

torch.set_num_threads(2)
tok = char_tokenizer()
col = Collator(tok)
it = probe.stream(3)
batches = [col([next(it) for _ in range(32)]) for _ in range(4)]
shapes = [(3, 192), (4, 256), (4, 224), (5, 192)]
models = {}
for l, h in shapes:
    cfg = llama_config(
        vocab_size=128,
        hidden_size=h,
        num_layers=l,
        num_heads=4,
        intermediate_size=2 * h,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    m = LlamaForCausalLM(cfg)
    models[(l, h)] = (m, torch.optim.AdamW(m.parameters(), lr=1e-4))
times = {s: [] for s in shapes}
fwd = {s: [] for s in shapes}
for rep in range(5):
    for s in shapes:
        m, opt = models[s]
        t = time.perf_counter()
        for b in batches:
            loss = m(**b).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        times[s].append((time.perf_counter() - t) / len(batches))
        t = time.perf_counter()
        with torch.no_grad():
            for b in batches:
                m(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        fwd[s].append((time.perf_counter() - t) / len(batches))
base = statistics.median(times[shapes[0]])
fbase = statistics.median(fwd[shapes[0]])
for s in shapes:
    n = sum(p.numel() for p in models[s][0].parameters())
    print(
        s,
        f"params {n / 1e6:.2f}M",
        f"train step x{statistics.median(times[s]) / base:.2f}",
        f"forward x{statistics.median(fwd[s]) / fbase:.2f}",
        f"(3x192 step {base:.3f}s)" if s == shapes[0] else "",
    )

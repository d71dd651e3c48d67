"""Tiny world v3 sizing probe: fine-tune the v2 teacher on a v3 mixture and watch the
held-out variants climb. Usage: python probe.py OUT_JSON [steps] [eval_every]"""

import json
import random
import sys
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from distill.models.evaluation import greedy_completions
from distill.models.tiny_world_train import Collator
from distill.tasks import countdown, prior

torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 2)
OUT = sys.argv[1] if len(sys.argv) > 1 else "/dev/null"
STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
EVERY = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
LARGE = countdown.Difficulty(3, 1, 999, 1, 999)


def gen_large(n, seed):
    rng = random.Random(f"large/{seed}")
    out = []
    while len(out) < n:
        nums = [rng.randint(LARGE.low, LARGE.high) for _ in range(3)]
        t = countdown.random_target(rng, nums)
        if t is not None and LARGE.target_low <= t <= LARGE.target_high:
            out.append((tuple(nums), t))
    return out


def gen_chain(n, seed):
    """Two chained Countdown-3 problems: the first's target is a number of the second."""
    rng = random.Random(f"chain/{seed}")
    out = []
    first = countdown.generate(4 * n, seed=10**7 + seed)
    for nums1, t1 in first:
        if len(out) == n:
            break
        n2 = [rng.randint(1, 99) for _ in range(2)]
        if t1 in n2:
            continue
        t2 = countdown.random_target(rng, [t1, *n2])
        if t2 is None or not 1 <= t2 <= 99:
            continue
        out.append((tuple(nums1), t1, tuple(n2), t2))
    return out


def chain_prompt(p):
    nums1, t1, n2, t2 = p
    return f"Use {' '.join(map(str, nums1))} to make {t1}, then {' '.join(map(str, n2))} to make {t2}.\n"


def _subst(tree, value, sub):
    if isinstance(tree, int):
        return (sub, True) if tree == value else (tree, False)
    op, l, r = tree
    l2, done = _subst(l, value, sub)
    if done:
        return (op, l2, r), True
    r2, done = _subst(r, value, sub)
    return (op, l, r2), done


def chain_solution(p):
    nums1, t1, n2, t2 = p
    tree1 = countdown.solve_tree(nums1, t1)
    tree2 = countdown.solve_tree((t1, *n2), t2)
    if tree1 is None or tree2 is None:
        return None
    full, _ = _subst(tree2, t1, tree1)
    parts = countdown.steps(tree1) + countdown.steps(tree2)
    return f"<think>{', '.join(parts)}</think><answer>{countdown.render(full)}</answer>"


def chain_score(text, p):
    nums1, t1, n2, t2 = p
    return countdown.score(text, (*nums1, *n2), t2)


MIX = [("cd3", 0.35), ("cd4", 0.25), ("large", 0.15), ("chain", 0.15), ("addition", 0.05), ("reversal", 0.05)]


def rows(task, n, seed):
    if task == "cd3":
        return [
            (countdown.prompt(*p), countdown.solution(*p)) for p in countdown.generate(n, seed, "countdown3")
        ]
    if task == "cd4":
        return [
            (countdown.prompt(*p), countdown.solution(*p)) for p in countdown.generate(n, seed, "countdown4")
        ]
    if task == "large":
        return [(countdown.prompt(*p), countdown.solution(*p)) for p in gen_large(n, seed)]
    if task == "chain":
        return [(chain_prompt(p), s) for p in gen_chain(n, seed) if (s := chain_solution(p))]
    return [(prior.prompt(e.task, e.query), e.completion) for e in prior.generate(task, n, seed=seed)]


def stream(seed=0):
    rng = random.Random(seed)
    chunk = 0
    while True:
        pools = {t: rows(t, 256, 5 * 10**6 + chunk) for t, _ in MIX}
        chunk += 1
        for i in range(256):
            t = rng.choices([t for t, _ in MIX], [w for _, w in MIX])[0]
            yield pools[t][i % len(pools[t])]


EVAL = {
    "cd3": (
        [countdown.prompt(*p) for p in countdown.generate(200, 99, "countdown3")],
        countdown.generate(200, 99, "countdown3"),
        96,
        lambda t, p: countdown.score(t, *p),
    ),
    "cd4": (
        [countdown.prompt(*p) for p in countdown.generate(200, 99, "countdown4")],
        countdown.generate(200, 99, "countdown4"),
        128,
        lambda t, p: countdown.score(t, *p),
    ),
    "cd5": (
        [countdown.prompt(*p) for p in countdown.generate(200, 99, "countdown5")],
        countdown.generate(200, 99, "countdown5"),
        160,
        lambda t, p: countdown.score(t, *p),
    ),
    "large": (
        [countdown.prompt(*p) for p in gen_large(200, 99)],
        gen_large(200, 99),
        128,
        lambda t, p: countdown.score(t, *p),
    ),
    "chain": ([chain_prompt(p) for p in gen_chain(200, 99)], gen_chain(200, 99), 192, chain_score),
}


def evaluate(model, tok):
    out = {}
    for k, (prompts, probs, budget, score) in EVAL.items():
        texts = greedy_completions(model, tok, prompts, budget)
        out[k] = round(sum(score(t, p) for t, p in zip(texts, probs)) / len(probs), 3)
    return out


if __name__ == "__main__":
    src = sys.argv[5] if len(sys.argv) > 5 else "/work/main/distill/models/assets/tiny-world/teacher"
    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src)
    res = {"mix": MIX, "src": src, "rows": []}

    def record(step, loss=None):
        t0 = time.time()
        r = {"step": step, "loss": loss, **evaluate(model, tok), "eval_s": round(time.time() - t0)}
        res["rows"].append(r)
        print(r, flush=True)
        json.dump(res, open(OUT, "w"), indent=1)

    record(0)
    if STEPS == 0:
        sys.exit()
    torch.manual_seed(0)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.98))
    warm = 200
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1, (s + 1) / warm)
            * (
                0.05
                + 0.95
                * 0.5
                * (1 + __import__("math").cos(__import__("math").pi * max(0, s - warm) / (STEPS - warm)))
            )
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
            print(
                step,
                round(sum(losses[-100:]) / 100, 4),
                round((time.time() - t0) / step, 3),
                "s/step",
                flush=True,
            )
        if step % EVERY == 0:
            model.eval()
            record(step, round(sum(losses[-EVERY:]) / EVERY, 4))
            model.train()

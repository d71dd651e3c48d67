"""Retry format: zero to two honest near-miss attempts ("... no; ") before the solution."""

import random
from fractions import Fraction

from distill.tasks import countdown


def _fmt(v):
    return countdown._fmt(v)


def _moves(pool):
    for i in range(len(pool)):
        for j in range(i + 1, len(pool)):
            a, b = max(pool[i], pool[j]), min(pool[i], pool[j])
            rest = [x for k, x in enumerate(pool) if k not in (i, j)]
            for op in "+-*/":
                if op == "/" and (b == 0 or a % b):
                    continue
                v = countdown._apply(op, a, b)
                yield f"{_fmt(a)}{op}{_fmt(b)}={_fmt(v)}", rest + [v]


def closest(pool, target):
    """(|miss|, steps) of the reduction of `pool` ending closest to `target`."""
    if len(pool) == 1:
        return abs(pool[0] - target), []
    best = None
    for step, nxt in _moves(pool):
        miss, steps = closest(nxt, target)
        if best is None or miss < best[0]:
            best = (miss, [step] + steps)
    return best


def near_misses(numbers, target, first_good):
    out = []
    for step, nxt in _moves([Fraction(n) for n in numbers]):
        if step == first_good:
            continue
        miss, steps = closest(nxt, target)
        if miss:
            out.append((miss, [step] + steps))
    out.sort(key=lambda x: x[0])
    return [s for _, s in out]


def solution(numbers, target, rng, weights=(0.5, 0.3, 0.2), top=4):
    tree = countdown.solve_tree(numbers, target)
    good = countdown.steps(tree)
    k = rng.choices(range(len(weights)), weights)[0]
    cands = near_misses(numbers, target, good[0])[:top]
    tries = rng.sample(cands, min(k, len(cands)))
    parts = [", ".join(t) + " no" for t in tries] + [", ".join(good)]
    return f"<think>{'; '.join(parts)}</think><answer>{countdown.render(tree)}</answer>"


if __name__ == "__main__":
    import time

    rng = random.Random(0)
    for p in countdown.generate(5, 1, "countdown3"):
        print(countdown.prompt(*p).strip(), solution(*p, rng))
    t = time.time()
    for p in countdown.generate(3, 1, "countdown4"):
        print(countdown.prompt(*p).strip(), solution(*p, rng))
    print(time.time() - t)

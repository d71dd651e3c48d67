"""A probe world with small numbers (LOG 2026-12-03, fourteenth session): on PYTHONPATH, every process
(the build's training, `distill fit`, `distill sweep`) reads Countdown-3, Countdown-4 and the long
chain over numbers 1..20 (targets 1..99), so that a step's arithmetic is a small table a 2 x 128
student can learn and what the teacher knows better is the search. Nothing outside the probe uses it."""

import random

from distill.tasks import countdown, countdown_chain

HIGH = 20
countdown.DIFFICULTIES["countdown3"] = countdown.Difficulty(3, 1, HIGH, 1, 99)
countdown.DIFFICULTIES["countdown4"] = countdown.Difficulty(4, 1, HIGH, 1, 99)


def generate(n: int, seed: int = 0):
    """countdown_chain.generate with the second link's two numbers in 1..HIGH (targets 1..99)."""
    rng = random.Random(f"countdown/{countdown_chain.NAME}/{seed}")
    spec = countdown.difficulty(countdown_chain.FIRST)
    out = []
    while len(out) < n:
        first = [rng.randint(spec.low, spec.high) for _ in range(spec.count)]
        via = countdown.random_target(rng, first)
        if via is None or not spec.target_low <= via <= spec.target_high:
            continue
        second = tuple(rng.randint(1, HIGH) for _ in range(2))
        if via in second:
            continue
        target = countdown.random_target(rng, [via, *second])
        if target is not None and 1 <= target <= 99:
            out.append(countdown_chain.ChainProblem(tuple(first), via, second, target))
    return out


countdown_chain.generate = generate

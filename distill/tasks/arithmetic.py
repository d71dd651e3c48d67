"""One arithmetic step, written the way a Countdown solution writes it: a drill for a tiny-world
student (a training stream, `ModelRecipe.mixture`, and a registered task for measuring it).

v3's first student failed its held-out variants on arithmetic in a middle step (59 % of the 3-digit
variant's problems), so a student was given the steps those variants need (operands up to four
digits) in the text a solution step is (`568-345=223`). It did not help: after 3,000 steps the
drill was 61.5 % right and distillation on Countdown-3 still took the 3-digit variant from 26 % to
7-10 % (LOG, 2026-12-03). No committed recipe uses it; it stays as the record of
that attempt and for students that can learn it. It is not a prior ability: forgetting is measured
on `prior.TASKS`.

    >>> Step(568, "-", 345).completion
    '568-345=223'
    >>> prompt(Step(12, "*", 7))
    'Calc 12*7\\n'
"""

from __future__ import annotations

import random
import re
from typing import NamedTuple

NAME = "arithmetic"
OPS = ("+", "-", "*", "/")
OP_WEIGHTS = (0.4, 0.4, 0.1, 0.1)  # Countdown's steps are mostly sums and differences
DIGITS = (1, 2, 3, 4)
DIGIT_WEIGHTS = (0.15, 0.35, 0.4, 0.1)  # an operand of + and -: v3's numbers go to 999, sums past it
_STEP = re.compile(r"\s*(\d+)([-+*/])(\d+)=(\d+)\s*$")


class Step(NamedTuple):
    a: int
    op: str
    b: int

    @property
    def result(self) -> int:
        a, op, b = self
        return {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]

    @property
    def completion(self) -> str:
        return f"{self.a}{self.op}{self.b}={self.result}"


def prompt(step: Step) -> str:
    return f"Calc {step.a}{step.op}{step.b}\n"


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(1 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def generate(n: int, seed: int = 0) -> list[Step]:
    """`n` steps, deterministic in `seed`. Sums and differences of operands of 1-4 digits (a
    difference never negative, as in Countdown); products and exact quotients of 1-2 digit factors."""
    rng = random.Random(f"arithmetic/{seed}")
    out = []
    for _ in range(n):
        op = rng.choices(OPS, OP_WEIGHTS)[0]
        if op in "+-":
            a, b = (_operand(rng, rng.choices(DIGITS, DIGIT_WEIGHTS)[0]) for _ in range(2))
            if op == "-" and a < b:
                a, b = b, a
        else:
            x, y = (_operand(rng, rng.randint(1, 2)) for _ in range(2))
            a, b = (x, y) if op == "*" else (x * y, y)
        out.append(Step(a, op, b))
    return out


def score(completion: str, step: Step) -> float:
    """1.0 iff the completion's first line is the step with its true result (`568-345=223`)."""
    found = _STEP.match(completion.split("\n", 1)[0])
    if found is None:
        return 0.0
    a, op, b, c = found.groups()
    return float((int(a), op, int(b)) == tuple(step) and int(c) == step.result)

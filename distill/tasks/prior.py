"""The tiny-world student's prior abilities: multi-digit addition and string reversal.

The student learns these before distillation; distilling on Countdown alone can erase them, so
they are the default retention sets for measuring forgetting. Scored by exact match of the text
before the first newline (the completion ends at EOS).

    >>> prompt("addition", "12+345")
    'Add 12+345=\\n'
    >>> Example("addition", "12+345", "357").completion
    '357'
"""

from __future__ import annotations

import random
import string
from typing import NamedTuple

TASKS = ("addition", "reversal")
_PROMPTS = {"addition": "Add {}=\n", "reversal": "Reverse {}=\n"}


class Example(NamedTuple):
    task: str
    query: str
    completion: str


def _check(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"prior task must be one of {list(TASKS)}, got {task!r}")


def prompt(task: str, query: str) -> str:
    _check(task)
    return _PROMPTS[task].format(query)


def answer(task: str, query: str) -> str:
    """The correct completion for a query (ground truth, computed without evaluating text)."""
    _check(task)
    if task == "reversal":
        return query[::-1]
    left, right = query.split("+")
    return str(int(left) + int(right))


def generate(task: str, n: int, seed: int = 0) -> list[Example]:
    """`n` examples, deterministic in (`task`, `seed`): addends of 1-2 digits; 3-8 lowercase letters."""
    _check(task)
    rng = random.Random(f"prior/{task}/{seed}")
    out = []
    for _ in range(n):
        if task == "addition":
            a, b = (rng.randint(0, 10 ** rng.randint(1, 2) - 1) for _ in range(2))
            query = f"{a}+{b}"
        else:
            query = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))
        out.append(Example(task, query, answer(task, query)))
    return out


def score(completion: str, task: str, query: str) -> float:
    """1.0 iff the completion (up to its first newline, surrounding spaces ignored) is the answer."""
    _check(task)
    return 1.0 if completion.split("\n", 1)[0].strip() == answer(task, query) else 0.0

"""Countdown arithmetic (the TinyZero task): combine all given numbers with + - * / to hit a target.

Pure Python. Completions hold reasoning in ``<think>…</think>`` and the final expression in
``<answer>…</answer>``; `score` judges the last answer exactly (rational arithmetic, hand-written
parser in `distill.tasks.expression`) and never evaluates model text as code.

    >>> prompt((74, 98, 39), 15)
    'Use 74 98 39 to make 15.\\n'
    >>> solve((74, 98, 39), 15)
    '39-(98-74)'
    >>> solution((74, 98, 39), 15)
    '<think>98-74=24, 39-24=15</think><answer>39-(98-74)</answer>'
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from distill.tasks import expression

OPS = ("+", "-", "*", "/")
# The Spanish reasoning style: connectives that the tiny world's `teacher-es` (and the whole v1
# teacher) writes and its student never sees (the analogue of the paper's teacher induced to reason
# in Spanish). `STYLE_PATTERN` detects it.
TEACHER_CONNECTIVES = ("pues", "luego")
STYLE_PATTERN = r"\b(?:pues|luego)\b"


@dataclass(frozen=True)
class Difficulty:
    """A problem distribution: `count` numbers from [low, high], target in [target_low, target_high]."""

    count: int
    low: int = 1
    high: int = 99
    target_low: int = 1
    target_high: int = 99


DIFFICULTIES: dict[str, Difficulty] = {
    "countdown3": Difficulty(3),
    "countdown4": Difficulty(4),  # the paper's harder variants
    "countdown5": Difficulty(5),
    # Tiny world v3's second held-out variant: Countdown-3's search over numbers and targets up to
    # 999 (3-digit arithmetic at every step).
    "countdown3_large": Difficulty(3, 1, 999, 1, 999),
    # v2's longer reasoning chains: more numbers, hence more steps, and a wider target range (its
    # teacher solved none; v3's long chain is `distill.tasks.countdown_chain`).
    "longchain": Difficulty(6, 1, 25, 100, 999),
}


class Problem(NamedTuple):
    numbers: tuple[int, ...]
    target: int


def difficulty(name: str) -> Difficulty:
    if name not in DIFFICULTIES:
        raise ValueError(f"countdown difficulty must be one of {sorted(DIFFICULTIES)}, got {name!r}")
    return DIFFICULTIES[name]


def prompt(numbers, target) -> str:
    """The plain-text prompt that base models and the tiny world are trained on."""
    return f"Use {' '.join(str(n) for n in numbers)} to make {target}.\n"


def chat_messages(numbers, target) -> list[dict[str, str]]:
    """The same problem for instruct models, for `tokenizer.apply_chat_template`."""
    nums = ", ".join(str(n) for n in numbers)
    return [
        {
            "role": "user",
            "content": (
                f"Using the numbers [{nums}], create an equation that equals {target}. You can use "
                "basic arithmetic operations (+, -, *, /) and each number must be used exactly once. "
                "Show your work in <think> </think> tags and return the final equation in "
                "<answer> </answer> tags, for example <answer>(1 + 2) / 3</answer>."
            ),
        }
    ]


# --- solving -----------------------------------------------------------------------------------
# A solution is a tree: an int leaf or (op, left, right). Steps are its internal nodes in post-order.


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return None if b == 0 else a / b


def _search(items: list, target: Fraction, integral: bool, seen: set):
    """Depth-first search over pairwise merges; `items` are (value, tree). Returns a tree or None."""
    if len(items) == 1:
        return items[0][1] if items[0][0] == target else None
    key = tuple(sorted(v for v, _ in items))
    if key in seen:
        return None
    seen.add(key)
    for i in range(len(items)):
        for j in range(len(items)):
            if i == j:
                continue
            (a, ta), (b, tb) = items[i], items[j]
            rest = [items[k] for k in range(len(items)) if k not in (i, j)]
            for op in OPS:
                if op in "+*" and i > j:  # commutative: one order suffices
                    continue
                value = _apply(op, a, b)
                if value is None:
                    continue
                if integral and (value.denominator != 1 or value < 0):
                    continue
                found = _search(rest + [(value, (op, ta, tb))], target, integral, seen)
                if found is not None:
                    return found
    return None


def solve_tree(numbers, target):
    """A solution tree, preferring non-negative integer intermediate results; None if unsolvable."""
    items = [(Fraction(n), int(n)) for n in numbers]
    for integral in (True, False):
        tree = _search(list(items), Fraction(target), integral, set())
        if tree is not None:
            return tree
    return None


def render(tree, top: bool = True) -> str:
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    text = f"{render(left, False)}{op}{render(right, False)}"
    return text if top else f"({text})"


def _value(tree) -> Fraction:
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    return _apply(op, _value(left), _value(right))


def _fmt(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def steps(tree) -> list[str]:
    """The solution as steps, innermost first: ``['98-74=24', '39-24=15']``."""
    if isinstance(tree, int):
        return []
    op, left, right = tree
    here = f"{_fmt(_value(left))}{op}{_fmt(_value(right))}={_fmt(_value(tree))}"
    return steps(left) + steps(right) + [here]


def solve(numbers, target) -> str | None:
    """One expression using every number exactly once that equals `target`, or None."""
    tree = solve_tree(numbers, target)
    return None if tree is None else render(tree)


STYLES = ("plain", "spanish", "teacher")  # "teacher": v1's name for "spanish", kept for its recipe


def solution(numbers, target, style: str = "plain") -> str | None:
    """A step-by-step completion (training data). `style="spanish"` (alias `"teacher"`, the v1 tiny
    world's name) writes the Spanish connectives (``pues 98-74=24, luego 39-24=15``); `"plain"`
    writes bare steps."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {list(STYLES)}, got {style!r}")
    tree = solve_tree(numbers, target)
    if tree is None:
        return None
    parts = steps(tree)
    if style != "plain":
        first, then = TEACHER_CONNECTIVES
        parts = [f"{first if i == 0 else then} {s}" for i, s in enumerate(parts)]
    return f"<think>{', '.join(parts)}</think><answer>{render(tree)}</answer>"


# --- generating ----------------------------------------------------------------------------------


def random_target(rng: random.Random, numbers: list[int]) -> int | None:
    """Combine the numbers in random order with random ops (integer steps only); the result."""
    pool = [Fraction(n) for n in numbers]
    while len(pool) > 1:
        a = pool.pop(rng.randrange(len(pool)))
        b = pool.pop(rng.randrange(len(pool)))
        a, b = max(a, b), min(a, b)
        op = rng.choice(OPS)
        if op == "/" and (b == 0 or a % b != 0):
            op = rng.choice("+-*")
        pool.append(_apply(op, a, b))
    return int(pool[0]) if pool[0].denominator == 1 else None


def generate(n: int, seed: int = 0, difficulty_name: str = "countdown3") -> list[Problem]:
    """`n` solvable problems, deterministic in (`seed`, `difficulty_name`).

    Numbers are drawn uniformly from the difficulty's range; the target comes from combining all of
    them at random (so it is reachable by construction) and is kept when it falls in the target range.
    """
    spec = difficulty(difficulty_name)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"countdown/{difficulty_name}/{seed}")
    out: list[Problem] = []
    while len(out) < n:
        numbers = [rng.randint(spec.low, spec.high) for _ in range(spec.count)]
        target = random_target(rng, numbers)
        if target is not None and spec.target_low <= target <= spec.target_high:
            out.append(Problem(tuple(numbers), target))
    return out


# --- scoring -------------------------------------------------------------------------------------


def score(completion: str, numbers, target) -> float:
    """1.0 iff the last ``<answer>…</answer>`` holds an expression of ASCII integer literals, + - * /,
    parentheses and whitespace whose literals are `numbers` as a multiset and whose exact value is
    `target`; else 0.0. Never raises, never evaluates text as code."""
    try:
        answer = expression.last_answer(completion)
        return 1.0 if answer is not None and expression.judge(answer, numbers, target) else 0.0
    except Exception:  # a verifier must never crash a training run on hostile text
        return 0.0

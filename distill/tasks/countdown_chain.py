"""The tiny world's long-chain task (v3): two Countdown-3 problems, chained.

The first problem's target is a number of the second, so a solution is twice as many steps as a
Countdown-3 one (about 1.8x its reasoning characters) while each step is as hard as Countdown-3's:
a longer chain, not a deeper search. The answer is one expression over all five numbers, judged
by `countdown.score` against the second target (the first is a waypoint the prompt names).

    >>> p = ChainProblem((74, 98, 39), 15, (7, 3), 42)
    >>> prompt(p)
    'Use 74 98 39 to make 15, then 7 3 to make 42.\\n'
    >>> solution(p)
    '<think>98-74=24, 39-24=15, 15+7=22, ... </think><answer>...</answer>'  # doctest: +SKIP
"""

from __future__ import annotations

import random
from typing import NamedTuple

from distill.tasks import countdown

NAME = "countdown_chain"
FIRST = "countdown3"  # the first link's problems
SECOND_HIGH = 99  # the second link's two new numbers: 1..99, as Countdown-3's
TARGET_HIGH = 99  # its target: 1..99, as Countdown-3's


class ChainProblem(NamedTuple):
    first: tuple[int, ...]  # the first link's three numbers
    via: int  # its target, a number of the second link
    second: tuple[int, ...]  # the second link's two new numbers
    target: int

    @property
    def numbers(self) -> tuple[int, ...]:
        """Every number the answer must use, once each."""
        return (*self.first, *self.second)


def prompt(p: ChainProblem) -> str:
    return (
        f"Use {' '.join(map(str, p.first))} to make {p.via}, "
        f"then {' '.join(map(str, p.second))} to make {p.target}.\n"
    )


def chat_messages(p: ChainProblem) -> list[dict[str, str]]:
    """For instruct models: the whole problem, with the waypoint as a hint."""
    nums = ", ".join(map(str, p.numbers))
    return [
        {
            "role": "user",
            "content": (
                f"Using the numbers [{nums}], create an equation that equals {p.target}. Use each "
                f"number exactly once with + - * /. Hint: first make {p.via} from "
                f"{', '.join(map(str, p.first))}. Show your work in <think> </think> tags and return the "
                "final equation in <answer> </answer> tags."
            ),
        }
    ]


def _replace_leaf(tree, value: int, sub):
    """`tree` with its first leaf equal to `value` replaced by `sub`; (tree, replaced?)."""
    if isinstance(tree, int):
        return (sub, True) if tree == value else (tree, False)
    op, left, right = tree
    left, done = _replace_leaf(left, value, sub)
    if not done:
        right, done = _replace_leaf(right, value, sub)
    return (op, left, right), done


def solve_tree(p: ChainProblem):
    """The whole answer as one tree (the first link's tree in place of its waypoint), with each
    link's tree; None if a link is unsolvable."""
    first = countdown.solve_tree(p.first, p.via)
    second = countdown.solve_tree((p.via, *p.second), p.target)
    if first is None or second is None:
        return None
    whole, _ = _replace_leaf(second, p.via, first)
    return whole, first, second


def solution(p: ChainProblem, style: str = "plain") -> str | None:
    """The first link's steps, then the second's, and the one expression (`countdown.solution`'s
    format and styles)."""
    if style not in countdown.STYLES:
        raise ValueError(f"style must be one of {list(countdown.STYLES)}, got {style!r}")
    trees = solve_tree(p)
    if trees is None:
        return None
    whole, first, second = trees
    parts = countdown.steps(first) + countdown.steps(second)
    if style != "plain":
        opener, then = countdown.TEACHER_CONNECTIVES
        parts = [f"{opener if i == 0 else then} {s}" for i, s in enumerate(parts)]
    return f"<think>{', '.join(parts)}</think><answer>{countdown.render(whole)}</answer>"


def generate(n: int, seed: int = 0) -> list[ChainProblem]:
    """`n` solvable chains, deterministic in `seed` (a stream of their own, apart from Countdown-3's):
    a Countdown-3 problem, then two new numbers (neither equal to its target, so the waypoint's place
    in the answer is unambiguous) and a target in 1..99 reachable from the three."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(f"countdown/{NAME}/{seed}")
    spec = countdown.difficulty(FIRST)
    out: list[ChainProblem] = []
    while len(out) < n:
        first = [rng.randint(spec.low, spec.high) for _ in range(spec.count)]
        via = countdown.random_target(rng, first)
        if via is None or not spec.target_low <= via <= spec.target_high:
            continue
        second = tuple(rng.randint(1, SECOND_HIGH) for _ in range(2))
        if via in second:
            continue
        target = countdown.random_target(rng, [via, *second])
        if target is not None and 1 <= target <= TARGET_HIGH:
            out.append(ChainProblem(tuple(first), via, second, target))
    return out


def score(completion: str, p: ChainProblem) -> float:
    """1.0 iff the last answer uses all five numbers once each and equals the final target."""
    return countdown.score(completion, p.numbers, p.target)

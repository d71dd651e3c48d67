"""Tiny world v3's long chain: two Countdown-3 problems, the first's target a number of the second."""

from __future__ import annotations

import re
import statistics
from fractions import Fraction

import pytest

from distill.tasks import countdown, countdown_chain
from distill.tasks.countdown_chain import ChainProblem
from distill.tasks.registry import get_task


def _checked_steps(think: str) -> list[tuple[Fraction, str, Fraction, Fraction]]:
    """Each `a op b=c` step of a reasoning, its arithmetic recomputed here."""
    out = []
    for a, op, b, c in re.findall(r"(\d+)([-+*/])(\d+)=(\d+(?:/\d+)?)", think):
        a, b, c = Fraction(a), Fraction(b), Fraction(c)
        want = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]
        assert want == c, f"step {a}{op}{b}={c} is wrong"
        out.append((a, op, b, c))
    return out


def test_every_generated_chain_has_a_correct_two_link_solution():
    for p in countdown_chain.generate(200, seed=3):
        assert p.via not in p.second and 1 <= p.target <= 99 and 1 <= p.via <= 99
        text = countdown_chain.solution(p)
        assert countdown_chain.score(text, p) == 1.0
        steps = _checked_steps(text.split("</think>")[0])
        assert len(steps) == 4  # two steps a link
        assert steps[1][3] == p.via  # the first link ends at the waypoint ...
        assert steps[-1][3] == p.target  # ... the second at the target


def test_generation_is_deterministic_in_the_seed():
    assert countdown_chain.generate(20, seed=1) == countdown_chain.generate(20, seed=1)
    assert countdown_chain.generate(20, seed=1) != countdown_chain.generate(20, seed=2)


def test_the_chain_needs_at_least_one_and_a_half_times_countdown3s_reasoning():
    def reasoning(text):
        return len(text.split("<think>")[1].split("</think>")[0])

    chain = statistics.mean(reasoning(countdown_chain.solution(p)) for p in countdown_chain.generate(500, 0))
    single = statistics.mean(reasoning(countdown.solution(*p)) for p in countdown.generate(500, 0))
    assert chain >= 1.5 * single


def test_answers_must_use_all_five_numbers_and_reach_the_final_target():
    p = ChainProblem((74, 98, 39), 15, (7, 3), 24)  # 15 + 7 + ... : 15+(7+3)=25 no; 15+7-3=19 no
    assert countdown_chain.score("<answer>39-(98-74)</answer>", p) == 0.0  # only the first link
    assert countdown_chain.score("<answer>(39-(98-74))+7+3</answer>", p) == 0.0  # 25, not 24
    assert countdown_chain.score("<answer>(39-(98-74))*3-7*3</answer>", p) == 0.0  # 3 used twice
    assert countdown_chain.score("<answer>((39-(98-74))-7)*3</answer>", p) == 1.0


def test_the_spanish_style_and_a_bad_style():
    p = countdown_chain.generate(1, seed=5)[0]
    text = countdown_chain.solution(p, style="spanish")
    assert text.startswith("<think>pues ") and text.count("luego ") == 3
    assert countdown_chain.score(text, p) == 1.0
    with pytest.raises(ValueError, match="style must be one of"):
        countdown_chain.solution(p, style="french")


def test_the_registry_serves_the_chain_and_the_large_variant():
    task = get_task("countdown_chain")
    row = task.rows(1, seed=0)[0]
    p = countdown_chain.generate(1, seed=0)[0]
    assert row["prompt"] == countdown_chain.prompt(p) and row["numbers"] == list(p.numbers)
    assert task.score(countdown_chain.solution(p), row) == 1.0
    large = get_task("countdown3_large").rows(300, seed=0)
    assert max(max(r["numbers"]) for r in large) > 99 and all(1 <= r["target"] <= 999 for r in large)

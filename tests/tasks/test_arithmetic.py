"""The tiny world v3 student's arithmetic drill: steps as a Countdown solution writes them."""

import re
from fractions import Fraction

import pytest

from distill.models.tiny_world_train import _chunk, _example
from distill.tasks import arithmetic, countdown
from distill.tasks.registry import get_task


def test_every_step_is_true_arithmetic_checked_with_fractions():
    steps = arithmetic.generate(2000, seed=3)
    for s in steps:
        a, b = Fraction(s.a), Fraction(s.b)
        exact = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[s.op]
        assert exact == s.result and exact >= 0  # quotients exact, differences never negative
        assert s.completion == f"{s.a}{s.op}{s.b}={s.result}"
    ops = {op: sum(s.op == op for s in steps) / len(steps) for op in arithmetic.OPS}
    assert ops["+"] == pytest.approx(0.4, abs=0.04) and ops["/"] == pytest.approx(0.1, abs=0.03)
    assert max(len(str(s.a)) for s in steps if s.op in "+-") == 4  # operands past v3's 999


def test_it_is_seeded_and_differs_between_seeds():
    assert arithmetic.generate(50, seed=1) == arithmetic.generate(50, seed=1)
    assert arithmetic.generate(50, seed=1) != arithmetic.generate(50, seed=2)


def test_a_step_reads_as_a_countdown_solution_step():
    # The drill's completion is the text of one step of a Countdown-3 (large) solution.
    p = countdown.generate(1, seed=0, difficulty_name="countdown3_large")[0]
    first = re.search(r"<think>([^,<]+)", countdown.solution(p.numbers, p.target)).group(1)
    a, op, b = re.match(r"(\d+)([-+*/])(\d+)=", first).groups()
    assert arithmetic.Step(int(a), op, int(b)).completion == first


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("568-345=223", 1.0),
        (" 568-345=223 \nmore", 1.0),
        ("568-345=224", 0.0),
        ("568-354=214", 0.0),
        ("223", 0.0),
        ("", 0.0),
    ],
)
def test_score_needs_the_same_step_and_its_true_result(completion, expected):
    assert arithmetic.score(completion, arithmetic.Step(568, "-", 345)) == expected


def test_registered_task_and_training_stream_agree():
    task = get_task("arithmetic")
    rows = task.rows(20, seed=5)
    assert all(task.score(r["reference"], r) == 1.0 for r in rows)
    assert [r["prompt"] for r in rows] == [arithmetic.prompt(s) for s in arithmetic.generate(20, 5)]
    pairs = [_example("arithmetic", item, "spanish") for item in _chunk("arithmetic", 20, 5)]
    assert pairs == [(r["prompt"], r["reference"]) for r in rows]  # no style: a drill is plain
    # Its rows load as a `datasets` table (how the data module reads an evaluated task).
    from datasets import Dataset

    table = Dataset.from_list(rows)
    assert all(task.score(r["reference"], r) == 1.0 for r in table)

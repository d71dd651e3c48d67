from fractions import Fraction

import pytest

from distill.tasks import countdown
from distill.tasks.expression import parse


def _value(expr: str) -> Fraction:
    return parse(expr).value


@pytest.mark.parametrize("name", sorted(countdown.DIFFICULTIES))
def test_generated_problems_are_solvable_and_in_range(name):
    spec = countdown.DIFFICULTIES[name]
    problems = countdown.generate(30 if spec.count < 6 else 8, seed=3, difficulty_name=name)
    for numbers, target in problems:
        assert len(numbers) == spec.count
        assert all(spec.low <= n <= spec.high for n in numbers)
        assert spec.target_low <= target <= spec.target_high
        expr = countdown.solve(numbers, target)
        assert expr is not None
        assert sorted(parse(expr).literals) == sorted(numbers)
        assert _value(expr) == target


def test_generator_is_deterministic_by_seed_and_difficulty():
    assert countdown.generate(20, seed=1) == countdown.generate(20, seed=1)
    assert countdown.generate(20, seed=1) != countdown.generate(20, seed=2)
    assert countdown.generate(5, 1, "countdown3") != countdown.generate(5, 1, "countdown4")


def test_countdown3_targets_cover_the_range():
    targets = {t for _, t in countdown.generate(2000, seed=0)}
    assert min(targets) == 1 and max(targets) == 99 and len(targets) > 90


def test_solve_returns_none_when_unreachable():
    assert countdown.solve((1, 1, 1), 99) is None
    assert countdown.solve((2, 2), 5) is None


def test_solve_finds_rational_intermediates_when_needed():
    # 8 / (3 - 8/3) = 24 needs the fraction 1/3 on the way.
    expr = countdown.solve((8, 3, 8, 3), 24)
    assert expr is not None and _value(expr) == 24


def test_solution_steps_and_answer_agree():
    for numbers, target in countdown.generate(50, seed=5):
        text = countdown.solution(numbers, target)
        assert countdown.score(text, numbers, target) == 1.0
        think = text[len("<think>") : text.index("</think>")]
        steps = think.split(", ")
        assert len(steps) == len(numbers) - 1
        for step in steps:
            lhs, rhs = step.split("=")
            assert _value(lhs) == _value(rhs)
        assert steps[-1].endswith(f"={target}")


def test_teacher_style_marks_every_step_and_plain_never_does():
    import re

    numbers, target = (74, 98, 39), 15
    teacher = countdown.solution(numbers, target, style="spanish")
    assert countdown.solution(numbers, target, style="teacher") == teacher  # v1's name
    plain = countdown.solution(numbers, target, style="plain")
    assert re.search(countdown.STYLE_PATTERN, teacher)
    assert not re.search(countdown.STYLE_PATTERN, plain)
    assert teacher.startswith("<think>pues ") and ", luego " in teacher
    assert countdown.score(teacher, numbers, target) == 1.0
    with pytest.raises(ValueError, match="style must be"):
        countdown.solution(numbers, target, style="french")


def test_prompt_and_chat_messages():
    assert countdown.prompt((74, 98, 39), 15) == "Use 74 98 39 to make 15.\n"
    (msg,) = countdown.chat_messages((74, 98, 39), 15)
    assert msg["role"] == "user" and "[74, 98, 39]" in msg["content"] and "<answer>" in msg["content"]


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>x</think><answer>39-(98-74)</answer>", 1.0),
        ("<answer>39 - ( 98 - 74 )</answer>", 1.0),
        ("<answer>1+1</answer> then <answer>39-(98-74)</answer>", 1.0),  # the last block counts
        ("<answer>39-(98-74)</answer><answer>98-74</answer>", 0.0),
        ("<answer>98-74</answer>", 0.0),  # a number missing
        ("<answer>39-(98-74)+74-74</answer>", 0.0),  # a number reused
        ("<answer>39-(98-74)</answer".replace("</answer", ""), 0.0),  # unclosed
        ("39-(98-74)", 0.0),  # no answer block
        ("<answer>__import__('os').system('true')</answer>", 0.0),
        ("<answer>39-(98-74)**1</answer>", 0.0),
        ("<answer>-74+98+39-48</answer>", 0.0),
        ("<answer>39/(98-98)*74</answer>", 0.0),
    ],
)
def test_score(completion, expected):
    assert countdown.score(completion, (74, 98, 39), 15) == expected


def test_score_never_raises_on_odd_inputs():
    for bad in (None, 12, b"<answer>1</answer>", "<answer>" * 10_000, "(" * 100_000):
        assert countdown.score(bad, (1, 2), 3) == 0.0


def test_unknown_difficulty_is_a_clear_error():
    with pytest.raises(ValueError, match="countdown difficulty must be one of"):
        countdown.generate(1, difficulty_name="countdown9")


def test_the_pooled_task_draws_each_difficulty_by_weight_and_scores_as_countdown():
    from collections import Counter

    from distill.tasks.registry import get_task

    task = get_task("countdown_mix")
    rows = task.rows(1000, seed=7)
    assert rows == task.rows(1000, seed=7) and rows != task.rows(1000, seed=8)
    shares = Counter(r["difficulty"] for r in rows)
    assert shares["countdown3"] / 1000 == pytest.approx(0.6, abs=0.05)
    assert shares["countdown4"] / 1000 == pytest.approx(0.2, abs=0.04)
    for row in rows[:60]:
        assert len(row["numbers"]) == countdown.difficulty(row["difficulty"]).count
        solution = countdown.solution(row["numbers"], row["target"])
        assert task.score(solution, row) == 1.0 and task.score("<answer>1+1</answer>", row) == 0.0
    # A difficulty's rows are that difficulty's own problems for the seed, in order.
    large = [r["prompt"] for r in rows if r["difficulty"] == "countdown3_large"]
    assert large == [r["prompt"] for r in get_task("countdown3_large").rows(len(large), 7)]
    # The data module reads it as a generated task (a seed), not a dataset's fixed parts.
    from distill.data.module import _rows

    assert _rows(task, 50, 7, "train") == task.rows(50, 7)

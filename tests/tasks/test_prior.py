import pytest

from distill.tasks import prior
from distill.tasks.registry import TASKS, get_task


def test_addition_and_reversal_answers():
    for e in prior.generate("addition", 200, seed=1):
        a, b = map(int, e.query.split("+"))
        assert int(e.completion) == a + b and len(str(a)) <= 2
    for e in prior.generate("reversal", 200, seed=1):
        assert e.completion == "".join(reversed(e.query)) and 3 <= len(e.query) <= 8


def test_scoring_is_exact_match_of_the_first_line():
    assert prior.score("357\nmore", "addition", "12+345") == 1.0
    assert prior.score(" 357 ", "addition", "12+345") == 1.0
    assert prior.score("358", "addition", "12+345") == 0.0
    assert prior.score("cba", "reversal", "abc") == 1.0
    assert prior.score("abc", "reversal", "abc") == 0.0


def test_unknown_task_is_a_clear_error():
    with pytest.raises(ValueError, match="prior task must be one of"):
        prior.generate("copy", 1)
    with pytest.raises(ValueError, match="task must be one of"):
        get_task("gsm8k")


@pytest.mark.parametrize("name", sorted(TASKS))
def test_registry_rows_score_their_reference(name):
    task = get_task(name)
    rows = task.rows(10, seed=0)
    assert len(rows) == 10 and all(r["prompt"] and r["messages"] for r in rows)
    assert rows == task.rows(10, seed=0)
    for row in rows:
        if "reference" in row:
            reference = row["reference"]
        else:
            from distill.tasks import countdown

            reference = countdown.solution(row["numbers"], row["target"])
        assert task.score(reference, row) == 1.0
        assert task.score("nonsense", row) == 0.0

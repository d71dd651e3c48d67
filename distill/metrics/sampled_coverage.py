"""Coverage of n sampled answers per problem: mean pass@k and mean number of distinct correct answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distill.metrics.coverage import distinct_answers, normalize_answer, pass_at_k


def coverage_metrics(
    correct: Sequence[Sequence[bool]],
    answers: Sequence[Sequence[str | None]],
    ks: Sequence[int],
    normalize: Callable[[str], str] = normalize_answer,
) -> dict[str, float]:
    """Average over problems of the unbiased pass@k (each k in `ks`) and of the number of distinct
    correct answers.

    Args:
        correct: per problem, one flag per sample (every problem has the same number n of samples).
        answers: per problem, the extracted answer of each sample (None: nothing extracted).
        ks: the k of each pass@k; each must satisfy 1 <= k <= n.
        normalize: answer normal form for counting distinct answers (see `distinct_answers`).

    Returns `{"pass@<k>": ..., "distinct_correct": ...}`.
    """
    if not correct:
        raise ValueError("coverage_metrics: correct must hold at least one problem, got none")
    if len(answers) != len(correct):
        raise ValueError(
            f"coverage_metrics: {len(correct)} problems in correct but {len(answers)} in answers"
        )
    n = len(correct[0])
    for i, (c, a) in enumerate(zip(correct, answers)):
        if len(c) != n or len(a) != n:
            raise ValueError(
                f"coverage_metrics: problem {i} has {len(c)} flags and {len(a)} answers; expected {n} of each"
            )
    bad = [k for k in ks if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n]
    if bad:
        raise ValueError(f"coverage_metrics: ks must be integers in [1, n={n}], got {list(ks)}")
    out = {f"pass@{k}": sum(pass_at_k(n, sum(map(bool, c)), k) for c in correct) / len(correct) for k in ks}
    distinct = [distinct_answers(zip(a, map(bool, c)), normalize) for c, a in zip(correct, answers)]
    out["distinct_correct"] = sum(distinct) / len(correct)
    return out

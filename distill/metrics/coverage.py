"""Coverage of sampled answers: unbiased pass@k and the number of distinct correct answers."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from distill.checks import check_int


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from `n` samples of which `c` are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k).

    Computed as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i), which stays accurate where the
    binomials overflow a float. Requires 0 <= c <= n and 1 <= k <= n; 1.0 when n - c < k.
    """
    check_int("pass_at_k: n", n, 0)
    check_int(f"pass_at_k: c (of n={n})", c, 0, n)
    check_int(f"pass_at_k: k (of n={n})", k, 1, n)
    if n - c < k:
        return 1.0
    miss = 1.0  # probability that k samples drawn without replacement are all wrong
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def normalize_answer(answer: str) -> str:
    """Drop all whitespace, so `(3 + 4) * 2` and `(3+4)*2` count as one answer."""
    return "".join(answer.split())


def distinct_answers(
    samples: Iterable[tuple[str | None, bool]],
    normalize: Callable[[str], str] = normalize_answer,
) -> int:
    """Number of distinct correct answers among one problem's samples.

    Args:
        samples: `(answer, correct)` pairs; `answer` is the extracted answer text (None when
            nothing was extracted, which is never counted).
        normalize: maps an answer to the form compared for equality (default: whitespace removed;
            no other rewriting, so `3+4` and `4+3` are two answers).
    """
    return len({normalize(answer) for answer, correct in samples if correct and answer is not None})

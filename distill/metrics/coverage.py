"""Coverage of sampled answers: unbiased pass@k and the number of distinct correct answers."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"pass_at_k: {name} must be an int, got {value!r}")
    return value


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from `n` samples of which `c` are correct (Chen et al. 2021,
    "Evaluating Large Language Models Trained on Code", eq. 1): 1 - C(n-c, k) / C(n, k).

    Computed as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i), which stays accurate where the
    binomials overflow a float. Requires 0 <= c <= n and 1 <= k <= n; 1.0 when n - c < k.
    """
    n, c, k = _check_count("n", n), _check_count("c", c), _check_count("k", k)
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must satisfy 0 <= c <= n (n={n}), got c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: k must satisfy 1 <= k <= n (n={n}), got k={k}")
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

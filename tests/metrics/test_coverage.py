"""pass@k against the closed form and brute-force enumeration; distinct correct answers."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from distill.metrics.coverage import distinct_answers, normalize_answer, pass_at_k


def closed_form(n, c, k):
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def test_matches_exact_closed_form_on_a_grid():
    for n in range(1, 41):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(closed_form(n, c, k)), abs=1e-12), (n, c, k)


def test_matches_brute_force_enumeration_of_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                share = Fraction(sum(any(s) for s in subsets), len(subsets))
                assert pass_at_k(n, c, k) == pytest.approx(float(share), abs=1e-12)


def test_large_n_stays_finite_and_accurate():
    # C(2000, 1000) overflows a float; the product form does not.
    assert pass_at_k(2000, 3, 1000) == pytest.approx(float(closed_form(2000, 3, 1000)), rel=1e-12)
    assert pass_at_k(2000, 0, 1000) == 0.0
    assert pass_at_k(2000, 1, 1) == pytest.approx(1 / 2000)


def test_edge_cases():
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k: every 3-subset holds a correct sample
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)


@pytest.mark.parametrize(
    "n, c, k, error, message",
    [
        (5, 6, 1, ValueError, r"^pass_at_k: c \(of n=5\) must be an integer in \[0, 5\], got 6$"),
        (5, -1, 1, ValueError, r"c \(of n=5\) must be an integer in \[0, 5\], got -1$"),
        (5, 2, 0, ValueError, r"^pass_at_k: k \(of n=5\) must be an integer in \[1, 5\], got 0$"),
        (5, 2, 6, ValueError, r"k \(of n=5\) must be .*, got 6$"),
        (5.0, 2, 1, ValueError, r"^pass_at_k: n must be an integer >= 0, got 5.0$"),
        (5, True, 1, ValueError, r"c \(of n=5\) must be an integer in \[0, 5\], got True$"),
    ],
)
def test_invalid_arguments(n, c, k, error, message):
    with pytest.raises(error, match=message):
        pass_at_k(n, c, k)


def test_distinct_answers_counts_only_correct_normalised_answers():
    samples = [
        ("(3 + 4) * 2", True),
        ("(3+4)*2", True),  # same after whitespace removal
        ("\t(3+4)*2\n", True),
        ("2*(3+4)", True),  # a different expression
        ("3*4+2", True),
        ("3*4+2", False),
        ("9-1", False),  # wrong answers never count
        (None, True),  # nothing extracted
    ]
    assert distinct_answers(samples) == 3
    assert distinct_answers([]) == 0
    assert distinct_answers([("A", True), ("a", True)], normalize=str.lower) == 1
    assert normalize_answer(" 1 +\t2\n") == "1+2"

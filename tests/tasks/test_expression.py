"""The arithmetic judge: exact values, strict grammar, and bounded time on hostile text."""

from __future__ import annotations

import random
import time
from fractions import Fraction

import pytest

from distill.tasks.expression import Parsed, judge, last_answer, parse

# Loose bound: catches exponential or quadratic behaviour, not a benchmark.
FAST = 0.05


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    elapsed = time.perf_counter() - start
    assert elapsed < FAST, f"{fn.__name__} took {elapsed:.3f}s"
    return result


@pytest.mark.parametrize(
    "text, value, literals",
    [
        ("1+2", 3, (1, 2)),
        ("2+3*4", 14, (2, 3, 4)),
        ("(2+3)*4", 20, (2, 3, 4)),
        ("10-4-3", 3, (10, 4, 3)),  # left-associative
        ("100/10/5", 2, (100, 10, 5)),
        ("8-2*3+1", 3, (8, 2, 3, 1)),
        ("7/2", Fraction(7, 2), (7, 2)),
        ("(7/2)*2", 7, (7, 2, 2)),
        ("1/3+1/6", Fraction(1, 2), (1, 3, 1, 6)),
        ("2-5", -3, (2, 5)),  # negative results are fine, negative literals are not
        (" \t(98 - 74)\n* 3 / 2 ", 36, (98, 74, 3, 2)),
        ("((((5))))", 5, (5,)),
        ("007+1", 8, (7, 1)),  # INT is [0-9]+: leading zeros allowed
        ("0*(1/0)", None, (0, 1, 0)),
        ("5/(3-3)", None, (5, 3, 3)),
    ],
)
def test_parse_values(text, value, literals):
    assert timed(parse, text) == Parsed(value=None if value is None else Fraction(value), literals=literals)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "-3+5",  # unary minus
        "+3",
        "3*-2",
        "2**3",
        "9**9**9**9",
        "8//2",
        "1.5*2",
        ".5",
        "1e3",
        "0x10",
        "1 2",
        "(1+2",
        "1+2)",
        ")(",
        "()",
        "(1)(2)",
        "2(3)",
        "1+",
        "*1",
        "1%2",
        "1^2",
        "\u0663+1",  # Arabic-Indic three
        "\uff13+1",  # full-width three
        "3\u00b2",  # superscript two
        "\U0001d7d1+1",  # mathematical bold digit one
        "1\r+2",  # only space, tab and newline are whitespace
        "1\u00a0+2",  # no-break space
        "1\u2212 2",  # Unicode minus sign
        "__import__('os').system('echo hi')",
        "1+1;import os",
        "lambda: 1",
        "f'{1+1}'",
        "(1).__class__",
        "True+1",
        "1_000+1",
        "1234567890+1",  # 10-digit literal
    ],
)
def test_parse_rejects(text):
    assert timed(parse, text) is None


def test_parse_never_raises_on_non_strings():
    for bad in (None, 12, b"1+2", ["1", "+", "2"]):
        assert parse(bad) is None
        assert last_answer(bad) is None
        assert judge(bad, [1, 2], 3) is False


def test_parse_limit_arguments_are_validated():
    with pytest.raises(ValueError, match="max_depth must be an integer >= 0, got -1"):
        parse("1", max_depth=-1)
    with pytest.raises(ValueError, match="max_chars must be an integer >= 1, got 0"):
        parse("1", max_chars=0)


def test_depth_64_is_judged_and_65_is_rejected():
    deep = "(" * 64 + "3+4" + ")" * 64
    assert timed(judge, deep, [3, 4], 7)
    assert timed(parse, "(" * 65 + "3+4" + ")" * 65) is None
    assert parse("(" * 65 + "3+4" + ")" * 65, max_depth=65).value == 7


def test_very_deep_nesting_is_rejected_quickly_without_recursion():
    deep = "(" * 10_000 + "1" + ")" * 10_000
    assert timed(parse, deep) is None  # too long
    assert timed(parse, deep, max_chars=10**6) is None  # too deep
    assert timed(parse, deep, max_chars=10**6, max_depth=10_000) == Parsed(Fraction(1), (1,))


def test_longest_allowed_inputs_are_fast_and_exact():
    # 100 nine-digit literals multiplied: a ~900-digit exact product.
    chain = "*".join(["999999999"] * 100)
    assert len(chain) <= 1000
    assert timed(parse, chain).value == 999999999**100
    # Sums of fractions with coprime denominators grow the denominator as fast as allowed.
    primes = [999999937, 999999929, 999999893, 999999883, 999999797, 999999761, 999999757]
    terms = "+".join(f"1/{p}" for p in primes * 11)
    assert len(terms) <= 1000
    assert timed(parse, terms).value == sum(Fraction(11, p) for p in primes)
    many_parens = "+".join(["((1))"] * 166)
    assert timed(parse, many_parens).value == 166


def test_judge_counts_numbers_as_a_multiset():
    assert judge("(98-74)*3/2", [3, 98, 2, 74], 36)
    assert judge("6/(1-3/4)", [6, 1, 3, 4], 24)  # exact rational intermediate
    assert judge("5*5-1", [5, 5, 1], 24)
    assert not judge("5*5-1", [5, 1], 24)  # reuses 5
    assert not judge("5*4", [5, 4, 1], 20)  # misses 1
    assert not judge("5*4*1*1", [5, 4, 1], 20)  # extra 1
    assert not judge("5*4", [5, 4], 21)  # wrong value
    assert not judge("10/4", [10, 4], 2)  # 5/2 is not 2: no integer division
    assert judge("10/4", [10, 4], Fraction(5, 2))
    assert not judge("5/(3-3)", [5, 3, 3], 0)
    assert not judge("", [], 0)
    assert not judge("-3+5", [3, 5], 2)


def test_judge_passes_limits_to_parse():
    deep = "(" * 70 + "3+4" + ")" * 70
    assert not judge(deep, [3, 4], 7)
    assert judge(deep, [3, 4], 7, max_depth=70)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>1+2</answer>", "1+2"),
        ("think <answer>1</answer> more <answer> 2+3 </answer> done", " 2+3 "),
        ("<answer>1+2</answer> trailing </answer>", "1+2"),  # stray close tag
        ("<answer>1+2</answer><answer>3", "1+2"),  # unclosed last block
        ("<answer>a<answer>4*5</answer>", "4*5"),  # nested: innermost last block
        ("<answer>a<answer>4*5</answer></answer>", "4*5"),
        ("<answer></answer>", ""),
        ("</answer><answer>", None),
        ("<answer>1+2", None),
        ("1+2</answer>", None),
        ("<ANSWER>1</ANSWER>", None),
        ("no tags", None),
        ("", None),
    ],
)
def test_last_answer(text, expected):
    assert timed(last_answer, text) == expected


def test_last_answer_size_limit():
    assert last_answer("<answer>" + "1" * 1001 + "</answer>") is None
    assert last_answer("<answer>" + "1" * 1001 + "</answer>", max_chars=None) == "1" * 1001
    assert last_answer("<answer>" + "1" * 1000 + "</answer>") == "1" * 1000


def test_huge_inputs_return_quickly():
    ten_mb = "x" * 10_000_000
    assert timed(last_answer, ten_mb) is None
    assert timed(last_answer, ten_mb + "<answer>1+2</answer>") == "1+2"
    assert timed(last_answer, "<answer>1+2</answer>" + ten_mb) == "1+2"
    assert timed(last_answer, "<answer>" * 1_000_000) is None
    assert timed(last_answer, "</answer>" * 1_000_000) is None
    assert timed(last_answer, "<answer>" * 500_000 + "7</answer>") == "7"
    assert timed(last_answer, "<answer>1</answer>" * 500_000) == "1"
    one_mb_digits = "1" * 1_000_000
    assert timed(last_answer, f"<answer>{one_mb_digits}</answer>") is None
    assert timed(parse, one_mb_digits) is None
    assert timed(parse, one_mb_digits, max_chars=10**7) is None  # literal too long
    assert timed(parse, "1+" * 499 + "1").value == 500


def test_whitespace_variants_judged_alike():
    for text in ("3*4", " 3 * 4 ", "\t3\t*\t4\t", "\n3\n*\n4\n", "( 3 )*( 4 )"):
        assert judge(text, [3, 4], 12), repr(text)


def _random_tree(rng, depth):
    if depth == 0 or rng.random() < 0.3:
        return rng.randint(0, 12)
    return (rng.choice("+-*/"), _random_tree(rng, depth - 1), _random_tree(rng, depth - 1))


def _tree_value(tree):
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = _tree_value(left), _tree_value(right)
    if a is None or b is None or (op == "/" and b == 0):
        return None
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[op]


def _render(tree, rng):
    """Minimal parentheses (so precedence and associativity are exercised), random spacing."""
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    prec = {"+": 1, "-": 1, "*": 2, "/": 2}
    left_s, right_s = _render(left, rng), _render(right, rng)
    if not isinstance(left, int) and prec[left[0]] < prec[op]:
        left_s = f"({left_s})"
    if not isinstance(right, int) and prec[right[0]] <= prec[op]:
        right_s = f"({right_s})"
    space = rng.choice(["", " ", "\t", "\n "])
    return f"{left_s}{space}{op}{space}{right_s}"


def _tree_literals(tree):
    return (tree,) if isinstance(tree, int) else _tree_literals(tree[1]) + _tree_literals(tree[2])


def test_parse_matches_independent_tree_evaluation():
    rng = random.Random(0)
    for _ in range(500):
        tree = _random_tree(rng, 5)
        text = _render(tree, rng)
        assert parse(text) == Parsed(_tree_value(tree), _tree_literals(tree)), text

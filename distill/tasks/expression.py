"""A safe, exact judge for arithmetic answers such as Countdown's `(98-74)*3/2`.

Model output is untrusted text: it is never evaluated as code (no `eval`, `exec`, `compile`,
`ast`). A hand-written tokenizer feeds an iterative operator-precedence (shunting-yard) parser
for

    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := INT | '(' expr ')'
    INT    := [0-9]+                       (ASCII digits only)

with ASCII space, tab and newline as the only whitespace. Anything else is rejected: unary minus
or plus, `**`, `//`, decimals, exponents, letters, non-ASCII digits ('٣', '３', '²'), empty or
unbalanced text. Values are exact `Fraction`s, so `(7/2)*2 == 7`.

Every call runs in time linear in the text it inspects (no recursion, no backtracking regex):
  - `parse` rejects text longer than `max_chars` (default 1,000) before reading it, parentheses
    nested deeper than `max_depth` (default 64), and integer literals longer than
    `max_literal_digits` (default 9). Bounded literals keep the exact arithmetic small: the
    numerator and denominator of any value have at most about as many digits as the text.
  - `last_answer` uses `str.rfind`/`str.find` only, so 10 MB of text costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from distill.checks import check_int

MAX_CHARS = 1000
MAX_DEPTH = 64
MAX_LITERAL_DIGITS = 9

OPEN_TAG = "<answer>"
CLOSE_TAG = "</answer>"

_DIGITS = frozenset("0123456789")
_SPACE = frozenset(" \t\n")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass(frozen=True)
class Parsed:
    """A well-formed expression.

    `value` is its exact value, or None when it divides by zero anywhere (even in a factor that
    is later multiplied by 0). `literals` are its integer literals in order of appearance.
    """

    value: Fraction | None
    literals: tuple[int, ...]


def _apply(op: str, left: Fraction | None, right: Fraction | None) -> Fraction | None:
    if left is None or right is None:
        return None
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    if right == 0:
        return None
    return left / right


def _reduce(values: list[Fraction | None], ops: list[str], min_precedence: int) -> None:
    """Pop and apply operators (left-associative) while the top one binds at least as tightly."""
    while ops and ops[-1] != "(" and _PRECEDENCE[ops[-1]] >= min_precedence:
        right = values.pop()
        left = values.pop()
        values.append(_apply(ops.pop(), left, right))


def parse(
    text: str,
    *,
    max_chars: int = MAX_CHARS,
    max_depth: int = MAX_DEPTH,
    max_literal_digits: int = MAX_LITERAL_DIGITS,
) -> Parsed | None:
    """Parse `text` as an arithmetic expression; None if it is not one (never raises on text).

    Args:
        text: the candidate expression (untrusted; non-`str` input gives None).
        max_chars: longer text is rejected before it is read.
        max_depth: most levels of nested parentheses accepted (`((1))` has depth 2).
        max_literal_digits: most digits in one integer literal, leading zeros included.
    """
    check_int("max_chars", max_chars, 1)
    check_int("max_depth", max_depth, 0)
    check_int("max_literal_digits", max_literal_digits, 1)
    if not isinstance(text, str) or len(text) > max_chars:
        return None

    values: list[Fraction | None] = []
    ops: list[str] = []  # operators and "(" markers
    literals: list[int] = []
    depth = 0
    expect_operand = True
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif expect_operand:
            if ch in _DIGITS:
                start = i
                while i < n and text[i] in _DIGITS:
                    i += 1
                    if i - start > max_literal_digits:  # stop at once: the digit run may be huge
                        return None
                literal = int(text[start:i])
                literals.append(literal)
                values.append(Fraction(literal))
                expect_operand = False
            elif ch == "(":
                depth += 1
                if depth > max_depth:
                    return None
                ops.append("(")
                i += 1
            else:  # unary signs, ")", operators, letters, non-ASCII digits
                return None
        elif ch in _PRECEDENCE:
            _reduce(values, ops, _PRECEDENCE[ch])
            ops.append(ch)
            expect_operand = True
            i += 1
        elif ch == ")":
            _reduce(values, ops, 0)
            if not ops:  # no matching "("
                return None
            ops.pop()
            depth -= 1
            i += 1
        else:  # ".", "e", a digit after whitespace ("1 2"), "(" after an operand, ...
            return None
    if expect_operand or depth != 0:  # empty, trailing operator, or unclosed "("
        return None
    _reduce(values, ops, 0)
    return Parsed(value=values[0], literals=tuple(literals))


def judge(
    expression: str,
    numbers: Iterable[int],
    target: int | Fraction,
    **limits: int,
) -> bool:
    """True iff `expression` parses, uses exactly `numbers` (as a multiset, each once) as its
    literals, and its exact value equals `target` (division by zero is never correct).

    `limits` are passed to `parse` (`max_chars`, `max_depth`, `max_literal_digits`).
    """
    parsed = parse(expression, **limits)
    if parsed is None or parsed.value is None or parsed.value != target:
        return False
    return sorted(parsed.literals) == sorted(numbers)


def last_answer(text: str, *, max_chars: int | None = MAX_CHARS) -> str | None:
    """The content of the last complete `<answer>...</answer>` block, or None.

    The block chosen is opened by the last `<answer>` that some `</answer>` follows and closed by
    the first `</answer>` after it, so a stray trailing `</answer>` or an unclosed trailing
    `<answer>` does not hide an earlier complete block, and in `<answer>a<answer>b</answer>` the
    inner `b` wins. Tags are exact and case-sensitive. Content is returned unstripped; content
    longer than `max_chars` gives None (it could not be judged anyway; None: no limit).
    """
    if max_chars is not None:
        check_int("max_chars", max_chars, 0)
    if not isinstance(text, str):
        return None
    last_close = text.rfind(CLOSE_TAG)
    if last_close < 0:
        return None
    start = text.rfind(OPEN_TAG, 0, last_close)
    if start < 0:
        return None
    start += len(OPEN_TAG)
    end = text.find(CLOSE_TAG, start)
    if max_chars is not None and end - start > max_chars:
        return None
    return text[start:end]

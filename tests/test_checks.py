"""The one argument checker: what passes, and the message when it does not."""

from __future__ import annotations

import math

import pytest

from distill.checks import check_choice, check_int, check_number


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_int("a.n", 0, 1), "a.n must be an integer >= 1, got 0"),
        (lambda: check_int("a.n", True, 0), "a.n must be an integer >= 0, got True"),
        (lambda: check_int("a.n", 2.0, 0), "a.n must be an integer >= 0, got 2.0"),
        (lambda: check_int("a.n", 5, 1, 4, optional=True), "a.n must be None or an integer in [1, 4], got 5"),
        (lambda: check_number("t", 0, 0, open_min=True), "t must be a finite number > 0, got 0"),
        (lambda: check_number("t", math.inf, 0), "t must be a finite number >= 0, got inf"),
        (lambda: check_number("t", math.nan), "t must be a finite number, got nan"),
        (lambda: check_number("t", "1", 0), "t must be a finite number >= 0, got '1'"),
        (lambda: check_number("b", 1.0, 0, 1, open_max=True), "b must be a finite number in [0, 1), got 1.0"),
        (lambda: check_number("b", -1, maximum=0.5, open_max=True), None),
        (
            lambda: check_choice("g", "tok", ("batch", "token")),
            "g must be one of ['batch', 'token'], got 'tok'",
        ),
    ],
)
def test_messages_name_field_allowed_and_value(call, message):
    if message is None:
        call()
        return
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_values_that_pass_come_back_normalised():
    assert check_int("n", 3, 1) == 3 and check_int("n", None, 1, optional=True) is None
    assert check_number("x", 2, 0) == 2.0 and isinstance(check_number("x", 2, 0), float)
    assert check_number("x", None, optional=True) is None
    assert check_number("x", 1.0, 0, 1) == 1.0 and check_number("x", 0, 0, 1) == 0.0
    assert check_choice("g", "token", ("batch", "token")) == "token"

"""Amounts of money: exact decimal text outside, integer micro-units inside (management/market/money.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from management.market.money import MICRO, BadAmount, amount_text, parse_amount

AMOUNTS = st.integers(min_value=0, max_value=999_999_999 * MICRO + 999_999)  # what a spec's Amount takes


@given(AMOUNTS)
def test_an_amount_written_as_a_number_is_exactly_the_amount_its_text_gives(micro):
    """``bid = 0.5`` in a spec file reaches the CLI as a float: its text is the decimal that was written, to the
    micro-unit, for every amount a spec takes (never a float's binary neighbour, 0.1000000000000000055...)."""
    written = f"{micro // MICRO}.{micro % MICRO:06d}"
    assert parse_amount(amount_text(float(written))) == micro


@pytest.mark.parametrize(
    ("number", "said"),
    [
        (float("nan"), "nan is not an amount"),
        (float("-inf"), "-inf is not an amount"),
        (-0.01, "-0.01 is negative"),
        (0.0000001, "more than 6 decimals"),
        (1e13, "is not an amount"),  # more than 12 digits before the point
    ],
)
def test_a_number_that_is_no_amount_is_refused_saying_why(number, said):
    with pytest.raises(BadAmount, match=said):
        amount_text(number)

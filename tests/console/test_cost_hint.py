"""The rent and launch forms' cost line (``cost_hint``), a pure function of the price and the renter's funds: what the
balance lasts at, and what that rate counts (the forms themselves are walked in test_renter_pages.py and
test_launch_forms.py)."""

from __future__ import annotations

from management.console.pages.renter import cost_hint
from management.services.market import FundsDetail


def funds(running_per_hour: int) -> FundsDetail:
    return FundsDetail(account="rita", available=12_000_000, held=500_000, running_per_hour=running_per_hour, currency="USD")


def test_the_balance_lasts_at_the_forms_total_when_nothing_else_runs():
    hint = cost_hint(1_200_000, 1, funds=funds(0), priced_by="the offer's on-demand price", currency="USD")
    assert hint == (
        "Total 1.20 USD per hour for 1 GPU(s) at the offer's on-demand price; your balance of 12.50 USD lasts about "
        "10.4 h at that rate."
    )


def test_what_already_runs_is_named_with_its_rate_not_silently_added():
    """Issue 37: "lasts about 2.1 h at that rate" counted what already ran at a rate the line did not show."""
    hint = cost_hint(1_200_000, 1, funds=funds(4_800_000), priced_by="the offer's on-demand price", currency="USD")
    assert hint == (
        "Total 1.20 USD per hour for 1 GPU(s) at the offer's on-demand price; your balance of 12.50 USD lasts about "
        "2.1 h at 6.00 USD per hour, this and the 4.80 of what already runs."
    )

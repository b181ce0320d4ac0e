"""The rules of money out (management/payments/payouts.py), pure: matured earnings after the dispute window, when a
payout is due and its entry, and the reconciliation of the ledger's payouts with the provider's transfers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from management.payments.payouts import (
    Difference,
    due,
    earned_within,
    matured,
    payout_entry,
    payout_key,
    period_label,
    reconcile,
)
from management.payments.provider import TransferRecord
from master.port import LedgerEntry, LedgerLine

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC).timestamp()
DAY = 86400.0
WEEK = 7 * DAY
ACME = "provider:acme"


def entry(ts: float, amount: int, *, account: str = ACME, kind: str = "charge", key: str = "") -> LedgerEntry:
    """An entry moving ``amount`` to ``account`` (negative: away from it), from the renter's hold."""
    lines = [LedgerLine(account=account, amount=amount), LedgerLine(account="hold:ann", amount=-amount)]
    return LedgerEntry(key=key or f"e{ts}:{amount}", ts=ts, kind=kind, memo="", lines=lines)


def test_earnings_older_than_the_window_are_payable_and_newer_ones_wait():
    entries = [entry(NOW - 10 * DAY, 50), entry(NOW - 8 * DAY, 30), entry(NOW - 2 * DAY, 20)]

    assert matured(entries, ACME, 100, NOW, WEEK) == 80
    assert matured(entries, ACME, 100, NOW + 5 * DAY + 1, WEEK) == 100  # the last one matured too


def test_money_moved_away_from_the_provider_is_never_paid():
    """A refund or a dispute's hold takes from the balance; what is left of it is what matures, never more."""
    entries = [entry(NOW - 10 * DAY, 50), entry(NOW - 1 * DAY, -40, kind="adjust"), entry(NOW - 1 * DAY, 20)]
    balance = 50 - 40 + 20

    assert earned_within(entries, ACME, NOW - WEEK) == 20  # the move away is not an earning
    assert matured(entries, ACME, balance, NOW, WEEK) == 10


def test_what_was_earned_within_the_window_beyond_the_balance_leaves_nothing_payable():
    assert matured([entry(NOW - DAY, 70)], ACME, 40, NOW, WEEK) == 0


def test_an_entry_at_exactly_the_window_s_edge_has_matured():
    assert matured([entry(NOW - WEEK, 70)], ACME, 70, NOW, WEEK) == 70


def test_other_accounts_lines_count_nothing():
    assert matured([entry(NOW - DAY, 70, account="provider:other")], ACME, 70, NOW, WEEK) == 70


def test_a_payout_is_due_once_per_period_and_only_from_the_minimum():
    assert due("acme", 9, 10, "2026-W50") is None
    assert due("acme", 0, 0, "2026-W50") is None
    found = due("acme", 10, 10, period_label(NOW, "week"))
    assert found is not None and found.key == payout_key("acme", "2026-W50") == "payout:acme:2026-W50"
    assert period_label(NOW, "day") == "2026-12-07" and period_label(NOW, "month") == "2026-12"


def test_a_payout_is_in_whole_cents_and_the_rest_waits():
    found = due("acme", 12_345_678, 0, "2026-W50", unit=10_000)
    assert found is not None and found.amount == 12_340_000
    assert due("acme", 9_999, 0, "2026-W50", unit=10_000) is None


def test_a_payout_entry_moves_the_amount_from_the_provider_to_external():
    made = payout_entry("acme", 25, "payout:acme:2026-W50", NOW, "weekly payout")
    assert made.kind == "payout" and sum(line.amount for line in made.lines) == 0
    assert {line.account: line.amount for line in made.lines} == {ACME: -25, "external": 25}
    with pytest.raises(ValueError):
        payout_entry("acme", 0, "k", NOW, "")


# --- properties -------------------------------------------------------------------------------------------------------

moves = st.lists(st.tuples(st.floats(min_value=0, max_value=30 * DAY), st.integers(-1000, 1000)), max_size=30)


@given(moves, st.floats(min_value=0, max_value=14 * DAY))
def test_matured_is_never_negative_nor_more_than_the_balance(history, window_s):
    entries = [entry(NOW - age, amount) for age, amount in history if amount]
    balance = sum(amount for _, amount in history)
    payable = matured(entries, ACME, balance, NOW, window_s)
    assert 0 <= payable <= max(0, balance)


@given(moves, st.floats(min_value=0, max_value=14 * DAY), st.floats(min_value=0, max_value=30 * DAY))
def test_with_no_new_entry_what_matured_only_grows_with_time(history, window_s, later):
    entries = [entry(NOW - age, amount) for age, amount in history if amount]
    balance = sum(amount for _, amount in history)
    assert matured(entries, ACME, balance, NOW, window_s) <= matured(entries, ACME, balance, NOW + later, window_s)


@given(moves, st.floats(min_value=0, max_value=14 * DAY))
def test_paying_what_matured_leaves_exactly_the_recent_earnings_payable_later(history, window_s):
    """After a payout of everything matured, what the window then releases is at most what was earned in it: a payout
    of the matured balance never pays what is still inside the window."""
    entries = [entry(NOW - age, amount) for age, amount in history if amount]
    balance = sum(amount for _, amount in history)
    payable = matured(entries, ACME, balance, NOW, window_s)
    after = [*entries, payout_entry("acme", payable, "p", NOW, "")] if payable else entries
    left = balance - payable
    assert matured(after, ACME, left, NOW, window_s) == 0 or payable == 0
    assert matured(after, ACME, left, NOW + window_s + 1, window_s) <= max(0, left)


def transfer(key: str, amount: int, reference: str = "", destination: str = "acct_acme") -> TransferRecord:
    return TransferRecord(
        reference=reference or f"tr_{key}", key=key, destination=destination, amount=amount, currency="USD", created=NOW
    )


def test_a_ledger_and_provider_that_agree_reconcile_with_no_difference():
    entries = [payout_entry("acme", 25, "payout:acme:2026-W49", NOW, ""), entry(NOW, 5)]
    assert reconcile(entries, [transfer("payout:acme:2026-W49", 25)], {"acct_acme": "acme"}) == []


def test_every_kind_of_difference_is_found():
    entries = [
        payout_entry("acme", 25, "payout:acme:2026-W48", NOW, ""),  # the transfer is missing
        payout_entry("acme", 30, "payout:acme:2026-W49", NOW, ""),  # another amount was sent
    ]
    transfers = [
        transfer("payout:acme:2026-W49", 31),
        transfer("payout:acme:2026-W50", 12),  # no ledger entry
        transfer("", 7, "tr_by_hand"),  # made on the dashboard to the grid's connected account
        transfer("", 9, "tr_other", destination="acct_not_ours"),  # not the grid's business
    ]

    assert reconcile(entries, transfers, {"acct_acme": "acme"}) == [
        Difference(kind="unknown_transfer", key="", ledger=0, provider=7, reference="tr_by_hand"),
        Difference(kind="missing_transfer", key="payout:acme:2026-W48", ledger=25, provider=0),
        Difference(kind="amount", key="payout:acme:2026-W49", ledger=30, provider=31, reference="tr_payout:acme:2026-W49"),
        Difference(kind="missing_entry", key="payout:acme:2026-W50", ledger=0, provider=12, reference="tr_payout:acme:2026-W50"),
    ]


def test_two_transfers_under_one_key_are_a_difference():
    entries = [payout_entry("acme", 25, "payout:acme:2026-W49", NOW, "")]
    found = reconcile(entries, [transfer("payout:acme:2026-W49", 25, "tr_1"), transfer("payout:acme:2026-W49", 25, "tr_2")], {})
    assert [(d.kind, d.provider, d.reference) for d in found] == [("amount", 50, "tr_1,tr_2")]


@given(st.dictionaries(st.integers(40, 52), st.integers(1, 10**9), max_size=10))
def test_the_ledger_reconciles_with_the_transfers_it_made(paid):
    entries = [payout_entry("acme", amount, payout_key("acme", f"2026-W{w}"), NOW, "") for w, amount in paid.items()]
    transfers = [transfer(payout_key("acme", f"2026-W{w}"), amount) for w, amount in paid.items()]
    assert reconcile(entries, transfers, {"acct_acme": "acme"}) == []

"""The façade's reads for the console's renter pages: spend over time and the billing page, on a real Master's ledger
(SQLite in the test's tmp_path)."""

from __future__ import annotations

import time

import pytest

from common.errors import NotFound
from management.app import compose
from management.market.ledger import FEES, provider_account, renter_account
from master.records import AccountRecord, LedgerEntry, LedgerLine

HOUR = 3600.0


def charge(key: str, ts: float, amount: int, kind: str = "charge") -> LedgerEntry:
    """``amount`` micro-units from rita to acme (a tenth as the platform's fee); a refund with a negative amount."""
    fee = amount // 10
    lines = [
        LedgerLine(account=renter_account("rita"), amount=-amount),
        LedgerLine(account=provider_account("acme"), amount=amount - fee),
        LedgerLine(account=FEES, amount=fee),
    ]
    return LedgerEntry(key=key, ts=ts, kind=kind, memo=key, lines=lines)


@pytest.fixture
async def rita(api):
    composition = compose(api.master)
    operations = composition.services
    await api.master.accounts.create(AccountRecord(id="rita", role="renter"))
    await api.master.accounts.create(AccountRecord(id="acme", role="provider"))
    await composition.load()
    await operations.market.market.ledger.credit("rita", 10_000_000, "welcome", key="welcome")
    return operations


async def test_spend_is_charges_less_refunds_per_hour_from_the_first_charge_to_now_and_credits_are_not_spending(rita):
    ledger = rita.market.market.ledger
    this_hour = time.time() // HOUR * HOUR
    await ledger.post(charge("two hours ago", this_hour - 2 * HOUR + 60, 1_500_000))
    await ledger.post(charge("this hour", this_hour + 1, 700_000))
    await ledger.post(charge("refunded", this_hour + 2, -200_000, kind="refund"))
    spend = await rita.billing.spend_over_time("rita", owner="rita")
    assert [(p.start, p.spent) for p in spend.points] == [
        (this_hour - 2 * HOUR, 1_500_000),
        (this_hour - HOUR, 0),
        (this_hour, 500_000),
    ]
    assert (spend.total, spend.currency, spend.bucket_s) == (2_000_000, "USD", HOUR)


async def test_nothing_spent_has_no_points(rita):
    assert (await rita.billing.spend_over_time("rita", owner=None)).points == []


async def test_billing_is_the_accounts_own_and_another_account_answers_not_found(rita):
    await rita.market.market.ledger.post(charge("a charge", time.time(), 1_000_000))
    billing = await rita.billing.billing_overview("rita", owner="rita", after_seq=0, limit=1)
    assert (billing.funds.available, billing.spend.total) == (9_000_000, 1_000_000)
    assert [line.kind for line in billing.statement.lines] == ["credit"] and billing.statement.more
    with pytest.raises(NotFound):
        await rita.billing.billing_overview("rita", owner="acme", after_seq=0, limit=10)

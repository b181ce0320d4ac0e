"""Renters' billing settings (management/store/billing.py), on both backends: put, read, replaced, listed in account
order page by page, kept across a restart, and an undecodable record skipped and quarantined."""

from __future__ import annotations

from management.payments.records import AutoTopup, BillingRecord, SpendCap
from management.store import BILLING, billing_repo
from master.store import open_store
from master.store.base import Store
from tests.master.test_store_contract import NOW, assert_same
from tests.support.poison import poison


def billing(account: str) -> BillingRecord:
    return BillingRecord(
        id=account,
        customer=f"cus_{account}",
        payment_method="pm_1",
        payment_method_label="visa ending 4242",
        auto_topup=AutoTopup(threshold=5_000_000, amount=25_000_000),
        caps=[
            SpendCap(window="hour", limit=2_000_000),
            SpendCap(scope="project", project="train", window="month", limit=90_000_000, hard=True),
        ],
        updated_at=NOW,
    )


async def test_settings_are_put_read_replaced_and_listed_in_account_order(store: Store) -> None:
    repo = billing_repo(store)
    for account in ["bo", "ana", "cy"]:
        await repo.put(billing(account))
    assert_same(await repo.get("ana"), billing("ana"))
    assert await repo.get("dee") is None
    assert [b.id for b in await repo.list()] == ["ana", "bo", "cy"]
    assert [b.id for b in await repo.list(after="ana", limit=1)] == ["bo"]
    assert await repo.list(limit=0) == []
    changed = billing("ana")
    changed.auto_topup, changed.caps, changed.last_auto_topup_at, changed.version = None, [], NOW + 5, 2
    await repo.put(changed)
    assert_same(await repo.get("ana"), changed)


async def test_settings_survive_a_restart(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await billing_repo(first).put(billing("ana"))
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await billing_repo(second).get("ana"), billing("ana"))
    finally:
        await second.close()


async def test_an_undecodable_record_is_skipped_and_quarantined(store: Store) -> None:
    await poison(store, BILLING.name, "bad")
    await billing_repo(store).put(billing("cy"))
    assert [b.id for b in await billing_repo(store).list()] == ["cy"]
    assert ("billing", "bad") in {(q.aggregate, q.key) for q in store.quarantine.records}

"""Money out in the store (management/store/payouts.py), on both backends: payout accounts put, read and listed in
account order; payouts put, replaced as their state moves on, listed newest first by account and unfinished ones
alone; both kept across a restart."""

from __future__ import annotations

from management.payments.records import PayoutAccountRecord, PayoutRecord
from management.store import PAYOUTS, payout_account_repo, payout_repo
from master.store import open_store
from master.store.base import Store
from tests.master.test_store_contract import NOW, assert_same
from tests.support.poison import poison


def payout_account(account: str) -> PayoutAccountRecord:
    return PayoutAccountRecord(id=account, provider="stripe", reference=f"acct_{account}", created_at=NOW, updated_at=NOW)


def payout(account: str, period: str, at: float, state: str = "pending") -> PayoutRecord:
    return PayoutRecord(
        id=f"payout:{account}:{period}", account=account, period=period, amount=30_000_000, currency="USD",
        destination=f"acct_{account}", created_at=at, state=state,  # type: ignore[arg-type]
    )  # fmt: skip


async def test_payout_accounts_are_put_read_replaced_and_listed_in_account_order(store: Store) -> None:
    repo = payout_account_repo(store)
    for account in ["bo", "ana", "cy"]:
        await repo.put(payout_account(account))
    assert_same(await repo.get("ana"), payout_account("ana"))
    assert await repo.get("dee") is None
    assert [a.id for a in await repo.list()] == ["ana", "bo", "cy"]
    assert [a.id for a in await repo.list(after="ana", limit=1)] == ["bo"]
    changed = payout_account("ana")
    changed.payouts_enabled = changed.details_submitted = True
    await repo.put(changed)
    assert_same(await repo.get("ana"), changed)


async def test_payouts_are_listed_newest_first_by_account_and_unfinished_alone(store: Store) -> None:
    repo = payout_repo(store)
    await repo.put(payout("ana", "2026-W48", NOW))
    await repo.put(payout("ana", "2026-W49", NOW + 10, "transferred"))
    await repo.put(payout("bo", "2026-W49", NOW + 20))
    done = payout("ana", "2026-W48", NOW)
    done.state, done.transfer, done.paid_at = "paid", "tr_1", NOW + 30
    await repo.put(done)

    assert_same(await repo.get("payout:ana:2026-W48"), done)
    assert [p.id for p in await repo.list()] == ["payout:bo:2026-W49", "payout:ana:2026-W49", "payout:ana:2026-W48"]
    assert [p.id for p in await repo.list(account="ana")] == ["payout:ana:2026-W49", "payout:ana:2026-W48"]
    assert [p.id for p in await repo.list(unfinished=True)] == ["payout:bo:2026-W49", "payout:ana:2026-W49"]
    assert [p.id for p in await repo.list(account="ana", unfinished=True, limit=1)] == ["payout:ana:2026-W49"]
    assert await repo.list(limit=0) == []


async def test_payouts_survive_a_restart(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await payout_repo(first).put(payout("ana", "2026-W49", NOW))
    await payout_account_repo(first).put(payout_account("ana"))
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await payout_repo(second).get("payout:ana:2026-W49"), payout("ana", "2026-W49", NOW))
        assert_same(await payout_account_repo(second).get("ana"), payout_account("ana"))
    finally:
        await second.close()


async def test_an_undecodable_payout_is_skipped_and_quarantined(store: Store) -> None:
    await poison(store, PAYOUTS.name, "bad")
    await payout_repo(store).put(payout("cy", "2026-W49", NOW))
    assert [p.id for p in await payout_repo(store).list()] == ["payout:cy:2026-W49"]

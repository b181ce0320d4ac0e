"""Top-ups and the payment provider's events (management/store/payments.py), on both backends: a top-up is put, read,
listed newest first per account and replaced as its state changes; an event is inserted once, even by two stores at
once; all of it is kept across a restart."""

from __future__ import annotations

import asyncio

from management.payments.records import PaymentEventRecord, TopupRecord, event_key
from management.store import PAYMENT_EVENTS, TOPUPS, payment_event_repo, topup_repo
from master.store import open_store
from master.store.base import Store
from tests.master.conftest import OpenStore
from tests.master.test_store_contract import NOW, assert_same
from tests.support.poison import poison


def topup(topup_id: str, account: str, created_at: float) -> TopupRecord:
    return TopupRecord(
        id=topup_id,
        account=account,
        amount=25_000_000,
        currency="USD",
        provider="stripe",
        reference=f"pi_{topup_id}",
        created_at=created_at,
    )


def event(event_id: str, outcome: str = "credited") -> PaymentEventRecord:
    return PaymentEventRecord(
        id=event_key("stripe", event_id),
        provider="stripe",
        event_id=event_id,
        kind="payment_intent.succeeded",
        received_at=NOW,
        outcome="credited" if outcome == "credited" else "ignored",
        topup_id="tu-1",
    )


async def test_topups_list_newest_first_per_account_and_a_put_replaces(store: Store) -> None:
    repo = topup_repo(store)
    for rec in [topup("tu-1", "ana", NOW), topup("tu-2", "bo", NOW + 1), topup("tu-3", "ana", NOW + 2)]:
        await repo.put(rec)
    assert [t.id for t in await repo.list()] == ["tu-3", "tu-2", "tu-1"]
    assert [t.id for t in await repo.list(account="ana")] == ["tu-3", "tu-1"]
    assert [t.id for t in await repo.list(account="ana", limit=1)] == ["tu-3"]
    assert await repo.list(limit=0) == []
    credited = topup("tu-1", "ana", NOW)
    credited.state, credited.credited, credited.ledger_key, credited.settled_at = "credited", 25_000_000, "topup:tu-1", NOW + 5
    await repo.put(credited)
    assert_same(await repo.get("tu-1"), credited)
    assert await repo.get("tu-9") is None


async def test_an_event_is_inserted_once_even_by_two_stores_at_once(open_stores: OpenStore) -> None:
    first, second = await open_stores(), await open_stores()
    results = await asyncio.gather(*(payment_event_repo(s).insert(event("evt_1")) for s in (first, second, first)))
    assert sorted(results) == [False, False, True]
    assert await payment_event_repo(second).insert(event("evt_1", "ignored")) is False
    assert_same(await payment_event_repo(first).get(event_key("stripe", "evt_1")), event("evt_1"))  # the first kept
    assert await payment_event_repo(first).get(event_key("stripe", "evt_2")) is None


async def test_topups_and_events_survive_a_restart(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await topup_repo(first).put(topup("tu-1", "ana", NOW))
    await payment_event_repo(first).insert(event("evt_1"))
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await topup_repo(second).get("tu-1"), topup("tu-1", "ana", NOW))
        assert await payment_event_repo(second).insert(event("evt_1")) is False  # a replay after the restart
    finally:
        await second.close()


async def test_an_undecodable_topup_or_event_is_skipped_and_quarantined(store: Store) -> None:
    await poison(store, TOPUPS.name, "tu-bad")
    await poison(store, PAYMENT_EVENTS.name, "stripe:evt_bad")
    await topup_repo(store).put(topup("tu-1", "alice", NOW + 1))
    assert [t.id for t in await topup_repo(store).list(account="alice")] == ["tu-1"]
    assert await payment_event_repo(store).get("stripe:evt_bad") is None
    quarantined = {(q.aggregate, q.key) for q in store.quarantine.records}
    assert {("topups", "tu-bad"), ("payment_events", "stripe:evt_bad")} <= quarantined

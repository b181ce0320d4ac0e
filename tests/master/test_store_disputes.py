"""Renters' disputes (management/store/disputes.py), on both backends: put, read, replaced when answered or resolved,
listed newest first by renter, provider and rental, kept across a restart, and an undecodable record skipped."""

from __future__ import annotations

from management.payments.disputes import ChargeEvidence, DisputeRecord, DisputeState, EventEvidence, Evidence
from management.store import DISPUTES, dispute_repo
from master.store import open_store
from master.store.base import Store
from tests.master.test_store_contract import NOW, assert_same
from tests.support.poison import poison


def dispute(n: int, *, account: str = "lab", provider: str = "acme", rental: str = "wl-1-a1") -> DisputeRecord:
    evidence = Evidence(
        started_at=NOW - 600,
        ended_at=NOW - 60,
        seconds=540,
        host_failure="agt-1: went offline",
        charges=[ChargeEvidence(key=f"charge:{rental}:1", kind="charge", ts=NOW - 540, memo="period 1", amount=-25_000)],
        faults=[EventEvidence(ts=NOW - 70, kind="agent.transition", subject="agt-1", data={"to": "offline"})],
    )
    return DisputeRecord(
        id=f"dsp-{n}",
        rental_id=rental,
        workload_id=rental.rsplit("-", 1)[0],
        account=account,
        agent_id="agt-1",
        provider=provider,
        reason="it stopped",
        created_at=NOW + n,
        disputable=22_500,
        held=22_500,
        fee=2_500,
        evidence=evidence,
        version=1,
    )


async def test_disputes_are_put_read_replaced_and_listed_newest_first_by_renter_provider_and_rental(store: Store) -> None:
    repo = dispute_repo(store)
    await repo.put(dispute(1))
    await repo.put(dispute(2, account="zoo", rental="wl-2-a1"))
    await repo.put(dispute(3, provider="bolt", rental="wl-3-a1"))
    assert_same(await repo.get("dsp-1"), dispute(1))
    assert await repo.get("dsp-9") is None
    assert [d.id for d in await repo.list()] == ["dsp-3", "dsp-2", "dsp-1"]
    assert [d.id for d in await repo.list(account="lab")] == ["dsp-3", "dsp-1"]
    assert [d.id for d in await repo.list(provider="acme")] == ["dsp-2", "dsp-1"]
    assert [d.id for d in await repo.list(rental_id="wl-2-a1")] == ["dsp-2"]
    assert [d.id for d in await repo.list(account="lab", provider="acme", limit=5)] == ["dsp-1"]
    assert await repo.list(limit=0) == []
    resolved = dispute(1)
    resolved.state, resolved.resolution, resolved.refunded, resolved.released, resolved.version = (
        "resolved",
        "partial",
        10_000,
        12_500,
        3,
    )
    await repo.put(resolved)
    assert_same(await repo.get("dsp-1"), resolved)


async def test_disputes_page_newest_first_after_a_key_even_when_they_share_a_creation_time(store: Store) -> None:
    repo = dispute_repo(store)
    for n in (1, 2, 3):
        await repo.put(dispute(n))
    tied = [dispute(4), dispute(5)]  # both created at the same instant: the id orders them
    for rec in tied:
        rec.id, rec.created_at = f"dsp-4{rec.id[-1]}", NOW + 4
        await repo.put(rec)
    await repo.put(dispute(6, account="zoo"))
    first = await repo.list(account="lab", limit=2)
    assert [d.id for d in first] == ["dsp-45", "dsp-44"]
    second = await repo.list(account="lab", before=(first[-1].created_at, first[-1].id), limit=2)
    assert [d.id for d in second] == ["dsp-3", "dsp-2"]
    last = await repo.list(account="lab", before=(second[-1].created_at, second[-1].id), limit=2)
    assert [d.id for d in last] == ["dsp-1"]
    assert await repo.list(account="lab", before=(last[-1].created_at, last[-1].id)) == []


async def test_disputes_survive_a_restart(store_url: str) -> None:
    first = open_store(store_url)
    await first.open()
    await dispute_repo(first).put(dispute(1))
    await first.close()
    second = open_store(store_url)
    await second.open()
    try:
        assert_same(await dispute_repo(second).get("dsp-1"), dispute(1))
    finally:
        await second.close()


async def test_an_undecodable_record_is_skipped_and_quarantined(store: Store) -> None:
    await poison(store, DISPUTES.name, "bad")
    await dispute_repo(store).put(dispute(1))
    assert [d.id for d in await dispute_repo(store).list()] == ["dsp-1"]


async def test_disputes_list_only_the_states_asked_and_page_within_them(store: Store) -> None:
    repo = dispute_repo(store)
    states: dict[int, DisputeState] = {1: "open", 2: "resolved", 3: "answered", 4: "resolved", 5: "open"}
    for n, state in states.items():
        rec = dispute(n)
        rec.state = state
        await repo.put(rec)
    assert [d.id for d in await repo.list(states=("open", "answered"))] == ["dsp-5", "dsp-3", "dsp-1"]
    assert [d.id for d in await repo.list(states=("resolved",), account="lab")] == ["dsp-4", "dsp-2"]
    assert await repo.list(states=("resolved",), account="zoo") == []
    assert await repo.list(states=()) == []  # no state asked: none listed, not every one
    first = await repo.list(states=("open", "answered"), limit=2)
    after = (first[-1].created_at, first[-1].id)
    assert [d.id for d in await repo.list(states=("open", "answered"), before=after)] == ["dsp-1"]

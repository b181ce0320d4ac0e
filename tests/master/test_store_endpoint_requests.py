"""Endpoint requests, management's aggregate (management/store/endpoint_requests.py), on every backend, as the contract
tests run the others: read back as written, version-checked, listed in FIFO order, bounded, and still there for a
store opened again (a Master that restarted)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from management.endpoints.queue import EndpointRequestRecord, Partial, RequestState
from management.store import ENDPOINT_REQUESTS, endpoint_request_repo
from management.store.endpoint_requests import MAX_RECORD_BYTES, DuplicateEndpointRequest, StaleEndpointRequest
from master.port import WorkerError
from master.store.base import Store
from master.store.errors import UnstorableRecord
from master.store.migrations import migrate_sqlite
from master.store.sqlite import SqliteStore
from tests.master.conftest import OpenStore
from tests.master.test_store_contract import NOW, assert_same
from tests.support.poison import poison


def request(request_id: str, endpoint_id: str, order: int, state: RequestState = RequestState.QUEUED) -> EndpointRequestRecord:
    return EndpointRequestRecord(
        id=request_id,
        endpoint_id=endpoint_id,
        account="ana",
        input='{"prompt":"hello","$odd.key":[1,2.5,true,null]}',
        state=state.value,
        order=order,
        submitted_at=NOW,
        ttl_s=60.0,
    )


async def test_a_request_reads_back_as_written_and_is_inserted_once(store: Store) -> None:
    repo = endpoint_request_repo(store)
    rec = msgspec.structs.replace(
        request("req-1", "ep-a", 1, RequestState.IN_PROGRESS),
        worker_id="w1",
        agent_id="agent-1",
        started_at=NOW + 1,
        partials=(Partial(0, '"a"'), Partial(1, '{"b":2}')),
        partial_bytes=10,
        progress='{"step":3}',
        attempt=2,
        lost=1,
    )
    await repo.insert(rec)
    assert_same(await repo.get("req-1"), rec)
    assert await repo.get("req-2") is None
    with pytest.raises(DuplicateEndpointRequest):
        await repo.insert(request("req-1", "ep-b", 9))
    assert_same(await repo.get("req-1"), rec)


async def test_an_update_names_the_version_it_read(store: Store) -> None:
    repo = endpoint_request_repo(store)
    rec = request("req-1", "ep-a", 1)
    await repo.insert(rec)
    failed = msgspec.structs.replace(
        rec, state="failed", version=2, ended_at=NOW + 5, error=WorkerError("ValueError", "bad", "Traceback..."), reason="error"
    )
    await repo.update(failed, expected_version=1)
    assert_same(await repo.get("req-1"), failed)
    with pytest.raises(StaleEndpointRequest):
        await repo.update(msgspec.structs.replace(rec, version=2), expected_version=1)
    with pytest.raises(StaleEndpointRequest):
        await repo.update(request("req-9", "ep-a", 9), expected_version=0)
    assert_same(await repo.get("req-1"), failed)


async def test_requests_list_in_fifo_order_by_endpoint_and_state_and_page(store: Store) -> None:
    repo = endpoint_request_repo(store)
    for rec in [
        request("req-c", "ep-a", 3),
        request("req-a", "ep-a", 1, RequestState.IN_PROGRESS),
        request("req-b", "ep-b", 2),
        request("req-d", "ep-a", 4, RequestState.COMPLETED),
    ]:
        await repo.insert(rec)
    assert [r.id for r in await repo.list()] == ["req-a", "req-b", "req-c", "req-d"]
    assert [r.id for r in await repo.list(endpoint_id="ep-a")] == ["req-a", "req-c", "req-d"]
    open_states = [RequestState.QUEUED.value, RequestState.IN_PROGRESS.value]
    assert [r.id for r in await repo.list(states=open_states)] == ["req-a", "req-b", "req-c"]
    assert [r.id for r in await repo.list(endpoint_id="ep-a", states=["queued"])] == ["req-c"]
    assert await repo.list(states=[]) == []
    assert [r.id for r in await repo.list(after_order=1, limit=2)] == ["req-b", "req-c"]
    assert await repo.list(limit=0) == []


async def test_an_oversized_request_is_refused_and_nothing_is_written(store: Store) -> None:
    repo = endpoint_request_repo(store)
    with pytest.raises(UnstorableRecord):
        await repo.insert(msgspec.structs.replace(request("req-1", "ep-a", 1), input='"' + "x" * MAX_RECORD_BYTES + '"'))
    assert await repo.get("req-1") is None
    rec = request("req-2", "ep-a", 2)
    await repo.insert(rec)
    huge = tuple(Partial(i, '"' + "y" * (MAX_RECORD_BYTES // 4) + '"') for i in range(5))
    with pytest.raises(UnstorableRecord):
        await repo.update(msgspec.structs.replace(rec, version=2, partials=huge), expected_version=1)
    assert_same(await repo.get("req-2"), rec)


async def test_requests_survive_the_store_being_opened_again(open_stores: OpenStore) -> None:
    first = await open_stores()
    rec = request("req-1", "ep-a", 1)
    await endpoint_request_repo(first).insert(rec)
    await first.close()
    again = await open_stores()
    assert_same(await endpoint_request_repo(again).list(states=["queued"]), [rec])


async def test_an_undecodable_request_is_skipped_and_quarantined(store: Store) -> None:
    repo = endpoint_request_repo(store)
    await poison(store, ENDPOINT_REQUESTS.name, "req-bad")
    rec = request("req-1", "ep-1", 2)
    await repo.insert(rec)
    assert_same(await repo.list(states=["queued"]), [rec])
    assert await repo.get("req-bad") is None
    assert ("endpoint_requests", "req-bad") in {(q.aggregate, q.key) for q in store.quarantine.records}


async def test_ended_requests_are_deleted_oldest_end_first_a_page_at_a_time_and_open_ones_never(store: Store) -> None:
    repo = endpoint_request_repo(store)
    for n, end in enumerate((NOW + 30, NOW + 10, NOW + 20, None, NOW + 50)):
        rec = request(f"req-{n}", "ep-a", n + 1)
        await repo.insert(rec)
        if end is not None:  # ended by an update, as the book ends them
            ended = msgspec.structs.replace(rec, state="completed", ended_at=end, output='"x"', version=2)
            await repo.update(ended, expected_version=1)
    assert await repo.delete_ended(NOW + 40, limit=2) == ["req-1", "req-2"]
    assert await repo.delete_ended(NOW + 40, limit=0) == []
    assert await repo.delete_ended(NOW + 40) == ["req-0"]
    assert await repo.delete_ended(NOW + 40) == []
    assert sorted(r.id for r in await repo.list()) == ["req-3", "req-4"]  # the open one, and the one that ended later


async def test_a_version_16_sqlite_store_finds_its_ended_requests_by_their_end_once_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    ended = msgspec.structs.replace(request("req-old", "ep-a", 1), state="failed", ended_at=NOW + 5, version=2)
    still_open = request("req-open", "ep-a", 2)
    with sqlite3.connect(path, isolation_level=None) as conn:  # what an idlegrid of schema version 16 wrote
        assert migrate_sqlite(conn, up_to=16) == 16
        for rec in (ended, still_open):
            row = (rec.id, rec.endpoint_id, rec.state, rec.order, rec.version, msgspec.json.encode(rec).decode())
            conn.execute(
                "INSERT INTO endpoint_requests (id, endpoint_id, state, ord, version, doc) VALUES (?, ?, ?, ?, ?, ?)", row
            )
    conn.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        assert await endpoint_request_repo(store).delete_ended(NOW + 10) == ["req-old"]
        assert [r.id for r in await endpoint_request_repo(store).list()] == ["req-open"]
    finally:
        await store.close()


async def test_an_endpoints_requests_are_counted_by_state(store: Store) -> None:
    repo = endpoint_request_repo(store)
    made = [("ep-a", RequestState.QUEUED), ("ep-a", RequestState.COMPLETED), ("ep-a", RequestState.COMPLETED)]
    for i, (endpoint, state) in enumerate([*made, ("ep-b", RequestState.FAILED)]):
        await repo.insert(request(f"req-{i}", endpoint, i + 1, state))
    assert await repo.count_by_state("ep-a") == {"queued": 1, "completed": 2}
    assert await repo.count_by_state("ep-b") == {"failed": 1}
    assert await repo.count_by_state("ep-none") == {}


async def test_an_endpoints_latest_requests_come_newest_first_and_only_its_own(store: Store) -> None:
    repo = endpoint_request_repo(store)
    for n, endpoint in enumerate(("ep-a", "ep-b", "ep-a", "ep-a")):
        await repo.insert(request(f"req-{n}", endpoint, n + 1))
    assert [r.id for r in await repo.latest("ep-a", limit=2)] == ["req-3", "req-2"]
    assert [r.id for r in await repo.latest("ep-a")] == ["req-3", "req-2", "req-0"]
    assert await repo.latest("ep-a", limit=0) == [] and await repo.latest("ep-c") == []

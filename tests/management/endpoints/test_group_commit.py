"""The request book's group commit (management/endpoints/requests.py, ``GroupWriter``) over a real SQLite store: the
requests handed over while a write is under way share the next one, nothing is acknowledged before it is stored, and a
Master SIGKILLed in the middle of a stream of requests has stored every one it acknowledged."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from common.errors import Conflict
from management.endpoints.queue import EndpointRequestRecord, QueueLimits
from management.endpoints.requests import RequestBook
from management.store import endpoint_request_repo
from management.store.endpoint_requests import EndpointRequestRepo
from master.port import CallOutcome, WorkerRef
from master.store import open_store
from master.store.base import Store

REPO = Path(__file__).resolve().parents[3]
LIMITS = QueueLimits(concurrency=64, ttl_s=600.0, execution_timeout_s=300.0)
W1 = WorkerRef("ep-a", "w1", "agent-1")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'master.db'}")
    await opened.open()
    yield opened
    await opened.close()


class CountingRepo:
    """The real repository, its group writes counted and, while ``held`` is clear, kept waiting."""

    def __init__(self, repo: EndpointRequestRepo) -> None:
        self.repo = repo
        self.writes: list[int] = []  # records per write_many
        self.held = asyncio.Event()
        self.held.set()
        self.failing: OSError | None = None
        self.reads: list[str] = []  # ids read one at a time

    def __getattr__(self, name: str) -> object:
        return getattr(self.repo, name)

    async def get(self, request_id: str) -> EndpointRequestRecord | None:
        self.reads.append(request_id)
        return await self.repo.get(request_id)

    async def write_many(self, recs: Sequence[EndpointRequestRecord]) -> list[bool]:
        await self.held.wait()
        if self.failing is not None:
            raise self.failing
        self.writes.append(len(recs))
        return await self.repo.write_many(recs)


async def test_requests_handed_over_during_a_write_share_the_next_one_and_none_is_answered_before_it(store: Store) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    first = asyncio.create_task(book.submit("ep-a", 0))
    for _ in range(5):
        await asyncio.sleep(0)
    repo.held.clear()  # the first write is under way; the next waits until let go
    rest = [asyncio.create_task(book.submit("ep-a", n)) for n in range(1, 41)]
    await first
    for _ in range(20):
        await asyncio.sleep(0)
    assert not any(t.done() for t in rest)  # not stored yet: nobody is answered
    for rec in book.open_of("ep-a")[1:]:  # in memory, not in the store
        assert await endpoint_request_repo(store).get(rec.id) is None
    repo.held.set()
    submitted = await asyncio.gather(*rest)
    assert repo.writes == [1, 40]  # the 40 handed over meanwhile went in one write
    for rec in submitted:
        assert await endpoint_request_repo(store).get(rec.id) is not None


async def test_a_take_result_and_status_see_only_what_is_stored(store: Store) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    rec = await book.submit("ep-a", "x")
    taken = await book.take(W1, 0)
    assert taken is not None
    repo.held.clear()
    result = asyncio.create_task(book.result(W1, rec.id, "done"))
    status = asyncio.create_task(book.status(rec.id))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not result.done() and not status.done()  # the end is being written: neither is told of it before
    repo.held.set()
    assert await result == CallOutcome.OK
    seen = await status
    assert seen is not None and seen.state == "completed"


async def test_a_failed_write_fails_its_callers_and_memory_is_read_again_from_the_store(store: Store) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    kept = await book.submit("ep-a", "kept")
    repo.failing = OSError("disk gone")
    with pytest.raises(OSError):
        await book.submit("ep-a", "lost")
    assert [r.input for r in book.open_of("ep-a")] == ['"kept"', '"lost"']  # memory ran ahead of the failed write
    repo.failing = None
    taken = await book.take(W1, 0)  # the next step reads the store first: only the stored request is there
    assert taken is not None and taken.id == kept.id
    assert [r.id for r in book.open_of("ep-a")] == [kept.id]
    with pytest.raises(Conflict):
        await book.retry(kept.id)  # open: the book still answers as it did


# A Master's book under 32 clients that submit as fast as they can, printing each id once its submit is answered.
CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from management.endpoints.queue import QueueLimits
    from management.endpoints.requests import RequestBook
    from management.store import endpoint_request_repo
    from master.store import open_store

    async def main() -> None:
        store = open_store("sqlite:///" + sys.argv[1])
        await store.open()
        book = RequestBook(endpoint_request_repo(store), limits_of=lambda _: QueueLimits())
        await book.load()

        async def client(n: int) -> None:
            i = 0
            while True:
                rec = await book.submit("ep-a", {"client": n, "i": i})
                sys.stdout.write(rec.id + "\\n")
                sys.stdout.flush()
                i += 1

        await asyncio.gather(*(client(n) for n in range(32)))

    asyncio.run(main())
    """
)


async def test_every_request_acknowledged_before_a_sigkill_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "master.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert child.stdout is not None
    acknowledged: list[str] = []
    try:
        while len(acknowledged) < 500:
            line = await asyncio.to_thread(child.stdout.readline)
            assert line, f"the child ended early: {child.wait()}"
            acknowledged.append(line.decode().strip())
    finally:
        child.send_signal(signal.SIGKILL)  # mid-stream: writes under way, answers not yet read
        child.wait()
    acknowledged += [line.decode().strip() for line in child.stdout.readlines() if line.endswith(b"\n")]
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        repo = endpoint_request_repo(store)
        missing = [i for i in acknowledged if await repo.get(i) is None]
        assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged requests were lost"
        assert len(await repo.list(limit=100_000)) >= len(acknowledged)
    finally:
        await store.close()


async def test_a_request_that_ended_is_read_from_memory_until_it_is_purged(store: Store) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    reads = repo.reads
    now = [1_000.0]
    book = RequestBook(repo, limits_of=lambda _: LIMITS, clock=lambda: now[0], retention_s=60.0)  # type: ignore[arg-type]
    await book.load()
    rec = await book.submit("ep-a", "x")
    assert await book.take(W1, 0) is not None
    assert await book.result(W1, rec.id, "done") == CallOutcome.OK
    ended = await book.status(rec.id)
    assert ended is not None and ended.state == "completed" and reads == []  # as stored, without reading the store
    now[0] += 61
    assert await book.purge() == 1
    assert await book.status(rec.id) is None and reads == [rec.id]  # purged: gone from memory too


def counting_looks(book: RequestBook) -> list[WorkerRef]:
    """The workers whose takes looked at the queue (a step each), in order."""
    looks: list[WorkerRef] = []
    real_take = book._queue.take

    def counted(worker: WorkerRef, concurrency: int, now: float) -> object:
        looks.append(worker)
        return real_take(worker, concurrency, now)

    book._queue.take = counted  # type: ignore[method-assign,assignment]
    return looks


async def test_a_request_submitted_while_takes_wait_goes_straight_to_the_first_without_waking_the_others(
    store: Store,
) -> None:
    book = RequestBook(endpoint_request_repo(store), limits_of=lambda _: LIMITS)
    await book.load()
    looks = counting_looks(book)
    workers = [WorkerRef("ep-a", f"w{n}", "agent-1") for n in range(20)]
    waiting = [asyncio.create_task(book.take(w, 25)) for w in workers]
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(looks) == 20 and not any(t.done() for t in waiting)  # each take's first look is a step
    writes = book._writer.batches
    rec = await book.submit("ep-a", "one")
    assert (rec.state, rec.worker_id) == ("in_progress", "w0")  # the take waiting longest, in the submit's own step
    assert book._writer.batches == writes + 1  # one write: the request stored as w0's
    taken = await waiting[0]
    assert taken is not None and (taken.id, taken.input) == (rec.id, "one")
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(looks) == 20 and not any(t.done() for t in waiting[1:])  # no look at the queue, no other take woken
    stored = await endpoint_request_repo(store).get(rec.id)
    assert stored is not None and (stored.state, stored.worker_id, stored.version) == ("in_progress", "w0", 1)
    second = await book.submit("ep-a", "two")
    assert second.worker_id == "w1"  # the next waiting take
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_request_back_in_the_queue_wakes_every_waiting_take_but_only_the_one_that_can_take_it_makes_a_step(
    store: Store,
) -> None:
    book = RequestBook(endpoint_request_repo(store), limits_of=lambda _: LIMITS)
    await book.load()
    looks = counting_looks(book)
    holder = WorkerRef("ep-a", "holder", "agent-2")
    rec = await book.submit("ep-a", "one")  # no take waits: queued
    assert await book.take(holder, 0) is not None
    workers = [WorkerRef("ep-a", f"w{n}", "agent-1") for n in range(20)]
    waiting = [asyncio.create_task(book.take(w, 25)) for w in workers]
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(looks) == 21 and not any(t.done() for t in waiting)  # the holder's take, then each take's first look
    assert await book.release(holder, rec.id) == CallOutcome.OK  # back in the queue: an arrival
    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    for _ in range(20):
        await asyncio.sleep(0)
    [first] = done
    taken = first.result()
    assert taken is not None and taken.id == rec.id
    assert len(looks) == 22  # the one that took it; the 19 others saw the queue empty (a step each, before: 41)
    assert sum(t.done() for t in waiting) == 1
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_take_handed_a_request_answers_before_its_write_and_the_submit_only_after(store: Store) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    waiting = asyncio.create_task(book.take(W1, 25))
    for _ in range(5):
        await asyncio.sleep(0)
    repo.held.clear()  # the write of the request handed over waits until let go
    submit = asyncio.create_task(book.submit("ep-a", "now"))
    taken = await waiting  # the worker has it while its write waits: no one else has heard of the request
    assert taken is not None and taken.input == "now"
    for _ in range(20):
        await asyncio.sleep(0)
    assert not submit.done() and await endpoint_request_repo(store).get(taken.id) is None  # its caller waits for it
    repo.held.set()
    rec = await submit
    stored = await endpoint_request_repo(store).get(rec.id)
    assert stored is not None and (stored.id, stored.state, stored.worker_id) == (taken.id, "in_progress", "w1")


async def test_a_handed_request_whose_write_failed_is_refused_to_its_caller_and_its_worker_s_result_is_gone(
    store: Store,
) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    waiting = asyncio.create_task(book.take(W1, 25))
    for _ in range(5):
        await asyncio.sleep(0)
    repo.failing = OSError("disk gone")
    with pytest.raises(OSError):
        await book.submit("ep-a", "lost")  # never acknowledged: nothing accepted is lost
    taken = await waiting
    assert taken is not None
    repo.failing = None
    assert await book.result(W1, taken.id, "ran anyway") == CallOutcome.GONE  # the store never had it
    assert await book.status(taken.id) is None and await endpoint_request_repo(store).list() == []


async def test_a_busy_worker_s_take_answers_after_the_handed_request_s_write_with_what_came_meanwhile(
    store: Store,
) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    await book.submit("ep-a", "queued first")
    assert await book.take(W1, 0) is not None  # W1 is at work
    waiting = asyncio.create_task(book.take_many(W1, 25, 8))
    for _ in range(5):
        await asyncio.sleep(0)
    repo.held.clear()
    submits = [asyncio.create_task(book.submit("ep-a", n)) for n in range(3)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()  # a busy worker's take waits for the first one's write, gathering the others
    repo.held.set()
    taken = await waiting
    assert [t.input for t in taken] == [0, 1, 2]  # one answer for the three
    assert [r.worker_id for r in await asyncio.gather(*submits)] == ["w1"] * 3


async def test_a_status_waiting_for_a_write_waits_for_the_change_staged_meanwhile_and_reads_no_store(store: Store) -> None:
    repo = CountingRepo(endpoint_request_repo(store))
    book = RequestBook(repo, limits_of=lambda _: LIMITS)  # type: ignore[arg-type]
    await book.load()
    rec = await book.submit("ep-a", "x")
    assert await book.take(W1, 0) is not None
    repo.held.clear()
    progress = asyncio.create_task(book.progress(W1, rec.id, {"at": 1}))  # its write under way, held
    status = asyncio.create_task(book.status(rec.id))  # waits for that write
    for _ in range(5):
        await asyncio.sleep(0)
    result = asyncio.create_task(book.result(W1, rec.id, "done"))  # staged meanwhile: written after it
    for _ in range(5):
        await asyncio.sleep(0)
    assert not status.done()
    repo.held.set()
    assert await progress == CallOutcome.OK and await result == CallOutcome.OK
    seen = await status
    # Memory ran ahead again when the first write ended: the status waited for the second, not read the store (which
    # answered the version in progress, one write behind).
    assert seen is not None and seen.state == "completed" and repo.reads == []

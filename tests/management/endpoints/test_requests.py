"""The request book (management/endpoints/requests.py) over a real SQLite store: each call stored before it counts, the
long poll woken by an arrival, renters' calls, and a Master restart (a new book over the same store)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.errors import Conflict, NotFound
from management.endpoints.queue import EndpointRequestRecord, QueueLimits
from management.endpoints.requests import TAKE_MANY_INPUT_CHARS, RequestBook, RequestTooLarge
from management.store import endpoint_request_repo
from master.port import CallOutcome, WorkerError, WorkerRef
from master.store import open_store
from master.store.base import Store

W1 = WorkerRef("ep-a", "w1", "agent-1")
W2 = WorkerRef("ep-a", "w2", "agent-2")
OTHER = WorkerRef("ep-b", "w1", "agent-1")
LIMITS = QueueLimits(concurrency=1, max_retries=1, ttl_s=600.0, execution_timeout_s=300.0, max_output_bytes=100)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'master.db'}")
    await opened.open()
    yield opened
    await opened.close()


async def book_over(store: Store, clock: Clock) -> RequestBook:
    book = RequestBook(endpoint_request_repo(store), limits_of=lambda _: LIMITS, heartbeat_timeout_s=30.0, clock=clock)
    await book.load()
    return book


async def test_a_request_goes_through_take_partials_and_result_and_every_step_is_stored(store: Store) -> None:
    book = await book_over(store, Clock())
    submitted = await book.submit("ep-a", {"prompt": "hi"}, account="ana")
    assert await book.take(OTHER, 0) is None  # another endpoint's worker
    taken = await book.take(W1, 0)
    assert taken is not None and (taken.id, taken.input, taken.attempt) == (submitted.id, {"prompt": "hi"}, 1)
    for _ in range(2):  # a resend of seq 0 is taken once
        assert await book.partial(W1, taken.id, 0, "a") == CallOutcome.OK
    assert await book.partial(W1, taken.id, 1, ["b"]) == CallOutcome.OK
    assert await book.progress(W1, taken.id, {"step": 2}) == CallOutcome.OK
    assert await book.partial(W2, taken.id, 2, "not W2's") == CallOutcome.GONE
    streamed = await book.stream(taken.id, 0)
    assert [(p.seq, p.value()) for p in streamed.partials] == [(1, ["b"])] and not streamed.done
    assert await book.result(W1, taken.id, "x" * 200) == CallOutcome.TOO_LARGE
    assert await book.result(W1, taken.id, {"answer": 42}) == CallOutcome.OK
    assert await book.result(W1, taken.id, {"answer": 43}) == CallOutcome.GONE
    stored = await endpoint_request_repo(store).get(taken.id)
    assert stored is not None and (stored.state, stored.output, stored.account) == ("completed", '{"answer":42}', "ana")
    assert (await book.stream(taken.id, 1)).done


async def test_a_waiting_take_is_woken_by_the_request_that_arrives(store: Store) -> None:
    book = await book_over(store, Clock())
    waiting = asyncio.create_task(book.take(W1, 25))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    submitted = await book.submit("ep-a", "hello")
    taken = await waiting  # without the wake it would wait the 25 s out and answer None
    assert taken is not None and taken.id == submitted.id


async def test_a_worker_takes_no_more_than_its_concurrency(store: Store) -> None:
    book = await book_over(store, Clock())
    first, second = await book.submit("ep-a", 1), await book.submit("ep-a", 2)
    taken = await book.take(W1, 0)
    assert taken is not None and taken.id == first.id
    assert await book.take(W1, 0) is None
    assert await book.release(W1, first.id) == CallOutcome.OK
    again = await book.take(W2, 0)
    assert again is not None and (again.id, again.attempt) == (first.id, 1)  # released: same attempt, first in line
    assert (await book.take(W1, 0)) is not None and second.id in {r.id for r in await endpoint_request_repo(store).list()}


async def test_a_take_of_several_takes_the_oldest_queued_within_the_concurrency_in_one_write(store: Store) -> None:
    book = RequestBook(
        endpoint_request_repo(store), limits_of=lambda _: QueueLimits(concurrency=3), heartbeat_timeout_s=30.0, clock=Clock()
    )
    await book.load()
    submitted = [await book.submit("ep-a", n) for n in range(5)]
    writes = book._writer.batches
    taken = await book.take_many(W1, 0, 10)
    assert [(t.id, t.input) for t in taken] == [(r.id, n) for n, r in enumerate(submitted[:3])]  # its concurrency
    assert book._writer.batches == writes + 1  # the three takes stored together
    stored = {r.id: r.state for r in await endpoint_request_repo(store).list()}
    assert [stored[r.id] for r in submitted] == ["in_progress"] * 3 + ["queued"] * 2
    assert await book.take_many(W1, 0, 10) == []  # it holds its concurrency
    assert [t.id for t in await book.take_many(W2, 0, 1)] == [submitted[3].id]


async def test_several_results_are_stored_in_one_write_and_each_answers_as_its_own_result(store: Store) -> None:
    book = RequestBook(
        endpoint_request_repo(store), limits_of=lambda _: QueueLimits(concurrency=3), heartbeat_timeout_s=30.0, clock=Clock()
    )
    await book.load()
    submitted = [await book.submit("ep-a", n) for n in range(3)]
    taken = await book.take_many(W1, 0, 2)
    writes = book._writer.batches
    outcomes = await book.results(W1, [(taken[0].id, "a"), (submitted[2].id, "not held"), (taken[1].id, "b")])
    assert outcomes == [CallOutcome.OK, CallOutcome.GONE, CallOutcome.OK]
    assert book._writer.batches == writes + 1
    stored = {r.id: (r.state, r.output) for r in await endpoint_request_repo(store).list()}
    assert stored[taken[0].id] == ("completed", '"a"') and stored[taken[1].id] == ("completed", '"b"')
    assert stored[submitted[2].id] == ("queued", "")


async def test_a_take_of_several_waits_for_the_first_and_stops_at_the_inputs_bound(store: Store) -> None:
    book = RequestBook(
        endpoint_request_repo(store), limits_of=lambda _: QueueLimits(concurrency=8), heartbeat_timeout_s=30.0, clock=Clock()
    )
    await book.load()
    waiting = asyncio.create_task(book.take_many(W1, 25, 8))
    for _ in range(5):
        await asyncio.sleep(0)
    first = await book.submit("ep-a", "x" * (TAKE_MANY_INPUT_CHARS // 2))
    assert [t.id for t in await waiting] == [first.id]  # the first to arrive, without waiting the 25 s out
    big = [await book.submit("ep-a", "y" * (TAKE_MANY_INPUT_CHARS // 2)) for _ in range(4)]
    taken = await book.take_many(W1, 0, 8)
    assert [t.id for t in taken] == [r.id for r in big[:2]]  # the second took it past the bound: the rest wait


async def test_cancel_reaches_the_worker_at_its_heartbeat_and_retry_queues_a_new_attempt(store: Store) -> None:
    book = await book_over(store, Clock())
    rec = await book.submit("ep-a", "work")
    assert (await book.take(W1, 0)) is not None
    assert (await book.cancel(rec.id)).state == "cancelled"
    assert await book.heartbeat(W1, [rec.id]) == [rec.id]
    assert await book.result(W1, rec.id, "late") == CallOutcome.GONE
    with pytest.raises(Conflict):
        await book.cancel(rec.id)
    retried = await book.retry(rec.id)
    assert (retried.state, retried.attempt) == ("queued", 2)
    with pytest.raises(Conflict):
        await book.retry(rec.id)  # open: not retried
    with pytest.raises(NotFound):
        await book.retry("req-nobody")
    with pytest.raises(NotFound):
        await book.cancel("req-nobody")
    with pytest.raises(RequestTooLarge):
        await book.submit("ep-a", "x" * (LIMITS.max_input_bytes + 1))


async def test_errors_and_lost_workers_follow_the_queue_s_rules(store: Store) -> None:
    book = await book_over(store, Clock())
    failing, lost = await book.submit("ep-a", "a"), await book.submit("ep-a", "b")
    assert (await book.take(W1, 0)) is not None
    assert await book.error(W1, failing.id, WorkerError("ValueError", "bad input", "Traceback ...")) == CallOutcome.OK
    assert (await book.take(W1, 0)) is not None
    await book.worker_gone(W1)
    again = await book.take(W2, 0)
    assert again is not None and (again.id, again.attempt) == (lost.id, 2)
    await book.worker_gone(W2)  # the second loss, past max_retries 1: it fails
    ended = await book.status(lost.id)
    assert ended is not None and (ended.state, ended.reason) == ("failed", "worker_lost")
    errored = await book.status(failing.id)
    assert errored is not None and errored.error is not None and errored.error.message == "bad input"


async def test_a_restarted_master_sees_the_same_requests_and_requeues_a_silent_worker_s(store: Store) -> None:
    clock = Clock()
    before = await book_over(store, clock)
    first = await before.submit("ep-a", "first")
    second = await before.submit("ep-a", "second")
    third = await before.submit("ep-a", "third")
    assert (await before.take(W1, 0)) is not None  # first, by W1
    assert (await before.take(W2, 0)) is not None  # second, by W2
    clock.now += 100.0  # the Master restarts, long after its workers were last heard from
    after = await book_over(store, clock)
    for rec in (first, second, third):
        assert await after.status(rec.id) == await before.status(rec.id)
    assert after.health("ep-a").requests == {"queued": 1, "in_progress": 2}
    clock.now += 20.0
    assert await after.heartbeat(W2, [second.id]) == []  # W2 is heard from after the restart
    clock.now += 10.0  # 30 s since the restart: W1 has been silent for the heartbeat timeout
    await after.sweep()
    requeued, kept = await after.status(first.id), await after.status(second.id)
    assert requeued is not None and (requeued.state, requeued.attempt) == ("queued", 2)
    assert kept is not None and kept.state == "in_progress"
    taken = await after.take(WorkerRef("ep-a", "w3", "agent-3"), 0)
    assert taken is not None and taken.id == first.id  # back at its place, ahead of the third
    stored = await endpoint_request_repo(store).get(first.id)
    assert stored is not None and stored.worker_id == "w3"


async def test_a_request_handed_to_a_waiting_take_is_stored_as_its_worker_s_and_a_restart_keeps_it_there(
    store: Store,
) -> None:
    clock = Clock()
    before = await book_over(store, clock)
    waiting = asyncio.create_task(before.take(W1, 25))
    for _ in range(5):
        await asyncio.sleep(0)
    rec = await before.submit("ep-a", {"prompt": "hi"})
    taken = await waiting
    assert taken is not None and (taken.id, taken.input, taken.attempt) == (rec.id, {"prompt": "hi"}, 1)
    assert (rec.state, rec.worker_id, rec.version) == ("in_progress", "w1", 1)  # one write: no queued version first
    after = await book_over(store, clock)  # the Master restarts
    held = await after.status(rec.id)
    assert held is not None and held.holder == W1 and after.health("ep-a").requests == {"queued": 0, "in_progress": 1}
    assert await after.take(W2, 0) is None  # never handed to a second worker
    assert await after.result(W1, rec.id, "done") == CallOutcome.OK
    done = await endpoint_request_repo(store).get(rec.id)
    assert done is not None and done.state == "completed"


async def test_a_submit_is_queued_when_the_waiting_take_s_worker_holds_its_concurrency(store: Store) -> None:
    book = await book_over(store, Clock())  # concurrency 1
    first = await book.submit("ep-a", 1)
    assert await book.take(W1, 0) is not None
    waiting = asyncio.create_task(book.take(W1, 0.5))  # an old library's second take: W1 has no room
    for _ in range(5):
        await asyncio.sleep(0)
    second = await book.submit("ep-a", 2)
    assert second.state == "queued" and await waiting is None
    assert (await book.status(first.id)).worker_id == "w1"  # type: ignore[union-attr]


async def test_a_book_that_lost_a_race_reads_the_request_back_and_answers_gone(store: Store) -> None:
    clock = Clock()
    first = await book_over(store, clock)
    rec = await first.submit("ep-a", "contested")
    stale = await book_over(store, clock)  # a second Master that loaded the same queue
    assert (await first.take(W1, 0)) is not None
    assert await stale.take(W2, 0) is None  # its write names the old version: refused, read back
    now_held = await stale.status(rec.id)
    assert now_held is not None and now_held.worker_id == "w1"
    assert await stale.result(W1, rec.id, "done") == CallOutcome.OK  # it knows W1 holds it now


async def test_ttl_and_execution_timeout_end_requests_at_the_sweep(store: Store) -> None:
    clock = Clock()
    book = await book_over(store, clock)
    running, waiting = await book.submit("ep-a", "r"), await book.submit("ep-b", "w")
    assert (await book.take(W1, 0)) is not None
    clock.now += LIMITS.execution_timeout_s
    await book.heartbeat(W1, [running.id])
    await book.sweep()
    ran = await book.status(running.id)
    assert ran is not None and (ran.state, ran.reason) == ("timed_out", "execution_timeout")
    clock.now += LIMITS.ttl_s
    await book.sweep()
    queued = await book.status(waiting.id)
    assert queued is not None and (queued.state, queued.reason) == ("timed_out", "ttl")


async def test_a_stream_waits_for_the_next_partial(store: Store) -> None:
    book = await book_over(store, Clock())
    rec = await book.submit("ep-a", "stream me")
    assert (await book.take(W1, 0)) is not None
    reading = asyncio.create_task(book.stream(rec.id, -1, wait_s=25))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not reading.done()
    assert await book.partial(W1, rec.id, 0, {"token": "a"}) == CallOutcome.OK
    streamed = await reading  # without the wake it would wait the 25 s out and answer no partials
    assert [p.value() for p in streamed.partials] == [{"token": "a"}]
    with pytest.raises(NotFound):
        await book.stream("req-nobody")


async def test_ended_requests_are_kept_for_the_retention_then_deleted_and_open_ones_never(store: Store) -> None:
    clock = Clock()
    book = RequestBook(endpoint_request_repo(store), limits_of=lambda _: LIMITS, clock=clock, retention_s=3_600.0)
    await book.load()
    done = await book.submit("ep-a", {"n": 1})
    taken = await book.take(W1, 0)
    assert taken is not None and await book.result(W1, taken.id, "out") == CallOutcome.OK
    cancelled = await book.cancel((await book.submit("ep-a", {"n": 2})).id)
    waiting = await book.submit("ep-a", {"n": 3}, account="ana")
    clock.now += 3_599.0
    assert await book.purge() == 0  # within the retention: its status still reads the output
    assert (await book.status(done.id)) is not None
    clock.now += 2.0
    assert await book.purge() == 2
    for gone in (done.id, cancelled.id):
        assert await book.status(gone) is None
        with pytest.raises(NotFound):
            await book.stream(gone)
    still = await book.status(waiting.id)  # open for over an hour (its TTL is the sweep's to apply), never purged
    assert still is not None and still.state == "queued"


async def test_each_end_is_told_once_per_run_after_it_is_stored_and_open_requests_are_listed(store: Store) -> None:
    clock = Clock()
    ended: list[tuple[str, str, int]] = []
    repo = endpoint_request_repo(store)

    def told(rec: EndpointRequestRecord) -> None:
        ended.append((rec.id, rec.state, rec.attempt))

    book = RequestBook(repo, limits_of=lambda _: LIMITS, clock=clock, on_end=told)
    await book.load()
    first = await book.submit("ep-a", 1, webhook="https://hooks.example/a")
    second = await book.submit("ep-a", 2)
    await book.submit("ep-b", 3)
    assert [r.id for r in book.open_of("ep-a")] == [first.id, second.id]
    assert first.webhook == "https://hooks.example/a"
    taken = await book.take(W1, 0)
    assert taken is not None and taken.id == first.id
    assert [r.state for r in book.open_of("ep-a")] == ["in_progress", "queued"]
    assert ended == []  # taking, reports and progress are no end
    assert await book.result(W1, first.id, "done") == CallOutcome.OK
    await book.cancel(second.id)
    assert ended == [(first.id, "completed", 1), (second.id, "cancelled", 1)]
    again = await book.retry(second.id)
    assert again.webhook == "" and ended[-1] == (second.id, "cancelled", 1)  # a retry is a new run, no end yet
    clock.now += LIMITS.ttl_s + 1
    await book.sweep()
    assert ended[-1] == (second.id, "timed_out", 2) and len(ended) == 4  # ep-b's request timed out too
    assert book.open_of("ep-a") == []
    stored = await repo.get(first.id)
    assert stored is not None and stored.webhook == "https://hooks.example/a"


async def test_the_autoscalers_reads_each_workers_last_call_what_it_holds_and_when_its_work_last_changed(store: Store) -> None:
    clock = Clock()
    book = await book_over(store, clock)
    arrivals: list[str] = []
    book.on_arrival(arrivals.append)
    submitted = await book.submit("ep-a", 1)
    assert arrivals == ["ep-a"] and book.workers_of("ep-a") == []  # no worker heard from yet
    clock.now = 1_010.0
    taken = await book.take(W1, 0)
    assert taken is not None and taken.id == submitted.id
    await book.heartbeat(W2, [])
    clock.now = 1_020.0
    await book.heartbeat(W1, [taken.id])  # heard from, no change to its work
    found = {a.ref: (a.last_seen, a.in_flight, a.last_work) for a in book.workers_of("ep-a")}
    assert found == {W1: (1_020.0, 1, 1_010.0), W2: (1_010.0, 0, None)}
    assert book.workers_of("ep-b") == []
    clock.now = 1_030.0
    assert await book.release(W1, taken.id) == CallOutcome.OK  # handed back: queued again, an arrival
    assert arrivals == ["ep-a", "ep-a"]
    assert {a.ref: (a.in_flight, a.last_work) for a in book.workers_of("ep-a")}[W1] == (0, 1_030.0)
    await book.worker_gone(W1)
    assert [a.ref for a in book.workers_of("ep-a")] == [W2]


async def test_the_book_tells_whether_a_take_of_each_worker_is_under_way_and_since_when_none_is(store: Store) -> None:
    clock = Clock()
    book = await book_over(store, clock)
    await book.heartbeat(W1, [])  # first heard at 1000: no take since
    assert [a.not_taking_since for a in book.workers_of("ep-a")] == [1_000.0]
    clock.now = 1_010.0
    polling = asyncio.create_task(book.take(W1, 25))  # a long poll
    for _ in range(5):
        await asyncio.sleep(0)
    assert [a.not_taking_since for a in book.workers_of("ep-a")] == [None]  # under way
    clock.now = 1_020.0
    await book.submit("ep-a", "wakes it")
    assert await polling is not None
    assert [a.not_taking_since for a in book.workers_of("ep-a")] == [1_020.0]  # its last take ended at 1020


async def test_a_gone_workers_waiting_take_ends_and_never_takes_the_next_request(store: Store) -> None:
    """A worker stopped (or its container ended) while its long poll waits at the book: the take ends at once with
    nothing, and a take of it that arrives later gets nothing either, so the next request waits for a live worker
    instead of being held by a gone one until its heartbeat timeout (a cold start on a warm host waited 30 s so)."""
    book = await book_over(store, Clock())
    waiting = asyncio.create_task(book.take(W1, 25))
    for _ in range(5):
        await asyncio.sleep(0)
    await book.worker_gone(W1)
    assert await asyncio.wait_for(waiting, 1) is None
    submitted = await book.submit("ep-a", "for a live worker")
    assert await book.take(W1, 0) is None  # a late call of the gone worker
    assert await book.take(W2, 0) is not None and (await book.status(submitted.id)).holder == W2  # type: ignore[union-attr]

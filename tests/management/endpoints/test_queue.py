"""The request queue (management/endpoints/queue.py): each invariant of its docstring is a hypothesis property here, by
the same name, over random sequences of operations; a few worked examples read as the rules do."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from management.endpoints.queue import (
    EndpointRequestRecord,
    EndReason,
    Outcome,
    QueueLimits,
    RequestQueue,
    RequestState,
    Step,
)
from master.port import WorkerError, WorkerRef

ENDPOINTS = ("ep-a", "ep-b")
WORKERS = tuple(WorkerRef(ep, f"w{i}", f"agent-{i % 2}") for ep in ENDPOINTS for i in range(2))
CONCURRENCY = {"ep-a": 1, "ep-b": 2}
LIMITS = QueueLimits(max_retries=1, ttl_s=100.0, execution_timeout_s=50.0, max_partial_bytes=40, max_output_bytes=30)
HEARTBEAT_TIMEOUT_S = 30.0
REPORTS = ("partial", "progress", "result", "error", "release")

workers = st.sampled_from(WORKERS)
request_numbers = st.integers(0, 4)
submits = st.tuples(st.just("submit"), st.sampled_from(ENDPOINTS), st.sampled_from(["x", "a much longer input" * 2]))
takes = st.tuples(st.just("take"), workers)
# a submit while a take of the worker waits: handed to it in the same step when a take would get it
handed_submits = st.tuples(st.just("submit_to"), workers, st.sampled_from(["x", "a much longer input" * 2]))
reports = st.tuples(st.sampled_from(REPORTS), workers, request_numbers, st.integers(0, 3))
losses = st.tuples(st.just("worker_gone"), workers)
holder_reports = st.tuples(st.just("holder"), st.sampled_from(REPORTS), request_numbers, st.integers(0, 3))
sibling_reports = st.tuples(st.just("sibling"), st.sampled_from(REPORTS), request_numbers, st.integers(0, 3))
holder_lost = st.tuples(st.just("holder_gone"), request_numbers)
# Weighted towards what moves requests: submits, takes, reports from holders and lost holders (so bounds are reached).
operations = st.sampled_from(
    [
        submits,
        takes,
        holder_reports,
        submits,
        takes,
        holder_reports,
        holder_lost,
        handed_submits,
        takes,
        reports,
        sibling_reports,
        losses,
        st.tuples(st.just("heartbeat"), workers, st.lists(request_numbers, max_size=3)),
        st.tuples(st.just("retry"), request_numbers),
        st.tuples(st.just("retry"), request_numbers),
        st.tuples(st.just("cancel"), request_numbers),
        st.tuples(st.just("expire")),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 10.0, 29.0, 31.0, 60.0])),
    ]
).flatmap(lambda operation: operation)
sequences = st.lists(operations, min_size=10, max_size=80)


def rid(n: int) -> str:
    return f"req-{n}"


@dataclass
class Move:
    op: tuple[object, ...]
    before: RequestQueue  # a copy, as it was before the step
    known: dict[str, EndpointRequestRecord]  # every request ever, as it was before the step
    step: Step


class Run:
    """Carries out a sequence of operations on a queue, keeping every request (the queue keeps open ones only)."""

    def __init__(self) -> None:
        self.queue = RequestQueue()
        self.known: dict[str, EndpointRequestRecord] = {}
        self.now = 1_000.0
        self.submitted = 0
        self.resolved: tuple[object, ...] = ()

    def step(self, op: tuple[object, ...]) -> Step | None:
        q, now = self.queue, self.now
        self.resolved = op  # a report by a holder or a sibling is the plain report it resolves to
        match op:
            case ("submit", str(endpoint), input):
                step = q.submit(rid(self.submitted), endpoint, input, LIMITS, now)
                self.submitted += 1
            case ("submit_to", WorkerRef() as w, input):
                limits = dataclasses.replace(LIMITS, concurrency=CONCURRENCY[w.endpoint_id])
                step = q.submit(rid(self.submitted), w.endpoint_id, input, limits, now, to=w)
                self.submitted += 1
            case ("take", WorkerRef() as w):
                step = q.take(w, CONCURRENCY[w.endpoint_id], now)
            case ("heartbeat", WorkerRef() as w, list(ns)):
                step = q.heartbeat(w, [rid(n) for n in ns], now)
            case ("holder", str(kind), int(n), int(k)):  # a report on the n-th request in progress, from its holder
                if (held := self.in_progress(n)) is None or (holder := held.holder) is None:
                    return None
                return self.step((kind, holder, int(held.id.removeprefix("req-")), k))
            case ("partial", WorkerRef() as w, int(n), int(seq)):
                step = q.partial(w, rid(n), seq, "p" * (seq * 5), LIMITS, now)
            case ("progress", WorkerRef() as w, int(n), int(k)):
                step = q.progress(w, rid(n), {"k": k}, LIMITS, now)
            case ("result", WorkerRef() as w, int(n), int(k)):
                step = q.result(w, rid(n), "o" * (k * 12), LIMITS, now)
            case ("error", WorkerRef() as w, int(n), _):
                step = q.error(w, rid(n), WorkerError("ValueError", "bad"), now)
            case ("release", WorkerRef() as w, int(n), _):
                step = q.release(w, rid(n), now)
            case ("worker_gone", WorkerRef() as w):
                step = q.worker_gone(w, now)
            case ("sibling", str(kind), int(n), int(k)):  # ... from another worker of its endpoint (refused)
                if (held := self.in_progress(n)) is None or (holder := held.holder) is None:
                    return None
                sibling = next(w for w in WORKERS if w.endpoint_id == holder.endpoint_id and w != holder)
                return self.step((kind, sibling, int(held.id.removeprefix("req-")), k))
            case ("holder_gone", int(n)):  # the holder of the n-th request in progress is lost
                if (held := self.in_progress(n)) is None or (holder := held.holder) is None:
                    return None
                step = q.worker_gone(holder, now)
            case ("cancel", int(n)):
                step = q.cancel(rid(n), now)
            case ("retry", int(n)):  # of the n-th ended request (completed ones included: the queue refuses them)
                ended = sorted((r for r in self.known.values() if not r.is_open), key=lambda r: r.id)
                if not ended:
                    return None
                step = q.retry(ended[n % len(ended)], now)
            case ("expire",):
                step = q.expire(now, HEARTBEAT_TIMEOUT_S)
            case ("wait", float(s)):
                self.now += s
                return None
            case _:
                raise AssertionError(op)
        self.apply(step)
        return step

    def in_progress(self, n: int) -> EndpointRequestRecord | None:
        running = sorted((r for r in self.queue.requests.values() if r.holder is not None), key=lambda r: r.id)
        return running[n % len(running)] if running else None

    def apply(self, step: Step) -> None:
        for rec in step.changed:
            old = self.known.get(rec.id)
            assert rec.version == (1 if old is None else old.version + 1)
            self.known[rec.id] = rec
        self.queue.apply(step)

    def moves(self, ops: list[tuple[object, ...]]) -> Iterator[Move]:
        for op in ops:
            before, known = copy.deepcopy(self.queue), dict(self.known)
            step = self.step(op)
            if step is not None:
                yield Move(self.resolved, before, known, step)


def check_held(queue: RequestQueue) -> None:
    holders: dict[str, WorkerRef] = {}
    for worker in WORKERS:
        for request_id in queue.held_by(worker):
            assert request_id not in holders, "held by two workers"
            holders[request_id] = worker
    for rec in queue.requests.values():
        assert (rec.state == RequestState.IN_PROGRESS) == (rec.id in holders)
        assert rec.holder == holders.get(rec.id)
        assert (rec.worker_id == "") == (rec.state != RequestState.IN_PROGRESS)
    for endpoint in ENDPOINTS:
        mine = [rec for rec in queue.requests.values() if rec.endpoint_id == endpoint]
        assert queue.open_load(endpoint) == (len(mine), sum(len(rec.input) for rec in mine))


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_never_held_twice(ops: list[tuple[object, ...]]) -> None:
    run = Run()
    for _ in run.moves(ops):
        check_held(run.queue)
    for rec in run.known.values():
        if not rec.is_open:
            assert rec.worker_id == "" and rec.id not in run.queue.requests


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_never_taken_across_endpoints(ops: list[tuple[object, ...]]) -> None:
    for move in Run().moves(ops):
        if move.op[0] in ("take", "submit_to") and move.step.taken is not None:
            worker = move.op[1]
            assert isinstance(worker, WorkerRef)
            assert move.step.taken.endpoint_id == worker.endpoint_id
            assert move.step.taken.holder == worker


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_reports_from_non_holders_change_nothing(ops: list[tuple[object, ...]]) -> None:
    for move in Run().moves(ops):
        if move.op[0] in REPORTS:
            worker, n = move.op[1], move.op[2]
            assert isinstance(worker, WorkerRef) and isinstance(n, int)
            if rid(n) not in move.before.held_by(worker):
                assert move.step.outcome == Outcome.GONE
                assert move.step.changed == ()


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_retries_bounded(ops: list[tuple[object, ...]]) -> None:
    for move in Run().moves(ops):
        for rec in move.step.changed:
            old = move.known.get(rec.id)
            assert 0 <= rec.lost <= rec.max_retries
            if old is None:
                assert rec.attempt == 1
                continue
            assert rec.attempt in (old.attempt, old.attempt + 1)
            if rec.lost > old.lost:  # a requeue after a lost worker
                assert rec.lost == old.lost + 1 and rec.attempt == old.attempt + 1
            if rec.state == RequestState.FAILED and rec.reason == EndReason.WORKER_LOST:
                assert old.lost == old.max_retries


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_completed_never_change(ops: list[tuple[object, ...]]) -> None:
    for move in Run().moves(ops):
        for rec in move.step.changed:
            old = move.known.get(rec.id)
            assert old is None or old.state != RequestState.COMPLETED


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_fifo_per_endpoint(ops: list[tuple[object, ...]]) -> None:
    for move in Run().moves(ops):
        taken = move.step.taken
        if taken is None:
            continue
        waiting = move.before.queued(taken.endpoint_id)
        if move.op[0] == "submit_to":  # handed at its submit only when a take would have got it: none queued
            assert waiting == [] and taken.id not in move.known
            continue
        assert taken.id == waiting[0].id
        assert all(taken.order <= r.order for r in waiting if r.attempt == taken.attempt)


@settings(max_examples=300, deadline=None)
@given(sequences)
def test_concurrency_respected(ops: list[tuple[object, ...]]) -> None:
    run = Run()
    for _ in run.moves(ops):
        for worker in WORKERS:
            assert len(run.queue.held_by(worker)) <= CONCURRENCY[worker.endpoint_id]


@settings(max_examples=300, deadline=None)
@given(sequences, st.booleans())
def test_every_request_ends(ops: list[tuple[object, ...]], answering: bool) -> None:
    run = Run()
    for _ in run.moves(ops):
        pass
    if answering:  # every worker answers what it holds, then takes and answers until nothing is left
        for _ in range(100):
            for worker in WORKERS:
                for request_id in sorted(run.queue.held_by(worker)):
                    run.apply(run.queue.result(worker, request_id, "done", LIMITS, run.now))
                run.apply(run.queue.take(worker, CONCURRENCY[worker.endpoint_id], run.now))
            if not run.queue.requests:
                break
    else:  # no one answers: one expire past every deadline ends them all
        far = run.now + LIMITS.ttl_s + LIMITS.execution_timeout_s + HEARTBEAT_TIMEOUT_S
        run.apply(run.queue.expire(far, HEARTBEAT_TIMEOUT_S))
    assert run.queue.requests == {}
    assert all(not rec.is_open for rec in run.known.values())


# --- worked examples ---

A1, A2, B1 = WorkerRef("ep-a", "w1", "h1"), WorkerRef("ep-a", "w2", "h2"), WorkerRef("ep-b", "w1", "h1")


def submitted(queue: RequestQueue, *ids: str, endpoint: str = "ep-a", now: float = 0.0) -> None:
    for request_id in ids:
        step = queue.submit(request_id, endpoint, {"n": request_id}, LIMITS, now)
        assert step.outcome == Outcome.OK
        queue.apply(step)


def taken(queue: RequestQueue, worker: WorkerRef, now: float = 0.0, concurrency: int = 1) -> str | None:
    step = queue.take(worker, concurrency, now)
    queue.apply(step)
    return None if step.taken is None else step.taken.id


def test_a_lost_worker_s_request_goes_back_first_and_fails_after_max_retries() -> None:
    queue = RequestQueue()
    submitted(queue, "r1", "r2")
    for attempt in range(1, LIMITS.max_retries + 2):
        assert taken(queue, A1) == "r1"  # requeued at its place: ahead of r2
        assert queue.get("r1") is not None and queue.get("r1").attempt == attempt  # type: ignore[union-attr]
        step = queue.worker_gone(A1, 1.0)
        queue.apply(step)
    (failed,) = step.changed
    assert (failed.state, failed.reason, failed.attempt) == ("failed", "worker_lost", LIMITS.max_retries + 1)
    assert taken(queue, A1) == "r2"


def test_release_keeps_the_attempt_and_a_partial_resend_is_taken_once() -> None:
    queue = RequestQueue()
    submitted(queue, "r1")
    assert taken(queue, A1) == "r1"
    for _ in range(2):
        step = queue.partial(A1, "r1", 0, "abc", LIMITS, 1.0)
        assert step.outcome == Outcome.OK
        queue.apply(step)
    assert [p.seq for p in queue.requests["r1"].partials] == [0]
    assert queue.partial(A1, "r1", 1, "x" * 50, LIMITS, 1.0).outcome == Outcome.TOO_LARGE
    queue.apply(queue.release(A1, "r1", 2.0))
    rec = queue.requests["r1"]
    assert (rec.state, rec.attempt, rec.partials) == ("queued", 1, ())
    assert taken(queue, A2) == "r1"
    assert queue.result(A1, "r1", "late", LIMITS, 3.0).outcome == Outcome.GONE


def test_heartbeat_names_what_the_worker_no_longer_holds_and_silence_loses_the_requests() -> None:
    queue = RequestQueue()
    submitted(queue, "r1", "r2")
    assert taken(queue, A1, now=10.0) == "r1"  # its execution timeout is at 60
    queue.apply(queue.cancel("r2", 1.0))
    assert queue.heartbeat(A1, ["r1", "r2", "nope"], 1.0).cancel == ("r2", "nope")
    queue.apply(queue.heartbeat(A1, ["r1"], 20.0))
    queue.apply(queue.expire(49.0, HEARTBEAT_TIMEOUT_S))
    assert queue.requests["r1"].state == "in_progress"  # heard from at 20
    queue.apply(queue.expire(50.0, HEARTBEAT_TIMEOUT_S))
    assert (queue.requests["r1"].state, queue.requests["r1"].attempt) == ("queued", 2)
    assert A1 not in queue.workers


def test_a_request_whose_take_answer_never_reached_its_worker_goes_back_once_heartbeats_leave_it_out() -> None:
    queue = RequestQueue()
    submitted(queue, "r1", "r2", "r3")
    assert taken(queue, A1, now=10.0) == "r1"  # the answer was lost: the worker never lists r1
    assert taken(queue, A2, now=30.0) == "r2"
    step = queue.heartbeat(A1, [], 39.0)  # within UNCLAIMED_AFTER_S of the take: the answer may still be travelling
    assert step.changed == ()
    step = queue.heartbeat(A1, [], 40.0)
    assert [(r.id, r.state, r.attempt, r.order) for r in step.changed] == [("r1", "queued", 1, 1)]
    queue.apply(step)
    assert queue.held_by(A1) == frozenset()
    assert taken(queue, A2, now=41.0, concurrency=2) == "r1"  # first in line again, at its old place
    queue.apply(queue.heartbeat(A2, ["r2", "r1"], 75.0))  # a worker that lists what it holds keeps it
    assert queue.held_by(A2) == frozenset({"r1", "r2"})


def test_ttl_and_execution_timeout_end_requests_timed_out_and_retry_starts_a_new_run() -> None:
    queue = RequestQueue()
    submitted(queue, "r1", "r2")
    assert taken(queue, A1, now=10.0) == "r1"
    queue.apply(queue.heartbeat(A1, ["r1"], 59.0))
    step = queue.expire(60.0, HEARTBEAT_TIMEOUT_S)
    assert [(r.id, r.state, r.reason) for r in step.changed] == [("r1", "timed_out", "execution_timeout")]
    queue.apply(step)
    step = queue.expire(100.0, HEARTBEAT_TIMEOUT_S)
    assert [(r.id, r.state, r.reason) for r in step.changed] == [("r2", "timed_out", "ttl")]
    queue.apply(step)
    (ended,) = step.changed
    retry = queue.retry(ended, 200.0)
    assert retry.outcome == Outcome.OK
    queue.apply(retry)
    rec = queue.requests["r2"]
    assert (rec.state, rec.attempt, rec.expires_at, rec.reason) == ("queued", 2, 300.0, "")


def test_a_completed_request_is_not_retried_and_inputs_are_bounded() -> None:
    queue = RequestQueue()
    submitted(queue, "r1")
    assert taken(queue, A1) == "r1"
    step = queue.result(A1, "r1", "ok", LIMITS, 1.0)
    queue.apply(step)
    assert queue.retry(step.changed[0], 2.0).outcome == Outcome.GONE
    assert queue.submit("big", "ep-a", "x" * (1 << 20), LIMITS, 0.0).outcome == Outcome.TOO_LARGE
    assert taken(queue, B1) is None

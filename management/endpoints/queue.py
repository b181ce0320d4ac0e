"""An endpoint's request queue as a pure state machine: the open requests and the workers heard from in, steps out.

``RequestQueue`` holds the open requests (queued or in progress) of every endpoint and when each worker was last
heard from. Each operation reads it and answers a ``Step``: its outcome and the requests it changes (new versions,
``version`` one higher), and changes nothing; ``apply(step)`` makes the step so. The shell (requests.py) stores a
step's requests first (version-checked) and applies it after, so memory never runs ahead of the store. No I/O, no
clock: ``now`` is passed in; ids are given by the caller. The model is management/workloads/lifecycle.py.

A request's states (``RequestState``) and what moves it (docs/endpoints.md, "The request queue"):

- ``submit``: a new request, ``queued``, attempt 1; refused (``TOO_LARGE``) past ``max_input_bytes``. Given a worker
  whose take waits (``to``), it is ``in_progress``, held by that worker, in the same step, when a take would have
  given it that request (none queued at the endpoint, the worker below its concurrency);
- ``take``: the oldest queued request of the worker's endpoint (FIFO by ``order``, kept through requeues), for a
  worker holding fewer than the endpoint's concurrency: ``in_progress``, held by that worker;
- ``heartbeat``: the worker is heard from; answers the ids it lists that it no longer holds (cancel them). A request
  it holds but does not list, taken ``unclaimed_after_s`` or more before, goes back to the queue at its place, same
  attempt: the take's answer never reached the worker (a link cut while it travelled);
- ``partial`` (idempotent by (id, seq), bounded in total), ``progress`` (replaces), ``result`` (``completed``),
  ``error`` (``failed``), ``release`` (back to the queue, same attempt): each only from the worker holding the request,
  else ``GONE`` and nothing changes;
- ``worker_gone``: the worker's requests go back to the queue with attempt + 1, or fail (``worker_lost``) once a
  request has been lost ``max_retries`` times in this run;
- ``cancel``: an open request ends ``cancelled``;
- ``retry``: a failed, timed-out or cancelled request is queued again as a new attempt (a new run: its losses count
  from 0, its TTL from now, its place at the back);
- ``expire(now, heartbeat_timeout_s)``: running past ``execution_timeout_s`` ends ``timed_out``; the requests of a
  worker not heard from for ``heartbeat_timeout_s`` are lost as by ``worker_gone``; queued past the TTL (counted from
  the run's submission) ends ``timed_out``.

Invariants (tests/management/endpoints/test_queue.py states each as a hypothesis property of the same name over
random sequences of operations):

1. ``never_held_twice``: an in-progress request is held by exactly one worker, a queued or ended one by none.
2. ``never_taken_across_endpoints``: a worker takes only its own endpoint's requests.
3. ``reports_from_non_holders_change_nothing``: a report from a worker that does not hold the request answers
   ``GONE`` and changes nothing.
4. ``retries_bounded``: a run's requeues after lost workers never exceed ``max_retries``; attempts rise by one each.
5. ``completed_never_change``: no step changes a completed request.
6. ``fifo_per_endpoint``: a take answers the endpoint's queued request of lowest ``order``: of two queued with
   equal attempts, the one submitted first; a submit is handed to a waiting take only when none is queued there.
7. ``concurrency_respected``: no worker holds more than its endpoint's concurrency.
8. ``every_request_ends``: with workers answering, every request ends; with no one answering, one ``expire`` past
   every deadline ends all.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from master.port import WorkerError, WorkerRef

JSON = Any


class RequestState(enum.StrEnum):
    QUEUED = "queued"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


OPEN_STATES = frozenset({RequestState.QUEUED, RequestState.IN_PROGRESS})
FINAL_STATES = frozenset(set(RequestState) - OPEN_STATES)
RETRYABLE_STATES = frozenset({RequestState.FAILED, RequestState.CANCELLED, RequestState.TIMED_OUT})


class EndReason(enum.StrEnum):
    """Why a request ended other than by its result."""

    ERROR = "error"  # the handler failed (the worker's error report)
    CANCELLED = "cancelled"
    TTL = "ttl"  # queued past its TTL
    EXECUTION_TIMEOUT = "execution_timeout"  # in progress past execution_timeout_s
    WORKER_LOST = "worker_lost"  # its worker was lost more than max_retries times


class Outcome(enum.StrEnum):
    OK = "ok"
    GONE = "gone"  # the request is not this caller's to report on (or no longer in a state that takes the call)
    TOO_LARGE = "too_large"  # past a size bound: nothing changed
    NOT_FOUND = "not_found"


class Partial(msgspec.Struct, frozen=True):
    seq: int
    output: str  # JSON text

    def value(self) -> JSON:
        return msgspec.json.decode(self.output)


class EndpointRequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One request to an endpoint: the stored record (management/store/endpoint_requests.py)."""

    id: str
    endpoint_id: str
    account: str = ""
    input: str = "null"  # the payloads are kept as JSON text: their size is what is bounded, and any keys are safe
    state: str = RequestState.QUEUED.value
    order: int = 0  # FIFO place among the endpoint's queued requests; kept through requeues, new on retry
    attempt: int = 1  # 1 the first time; +1 after each lost worker and each retry
    lost: int = 0  # requeues after a lost worker in this run (bounded by max_retries)
    submitted_at: float = 0.0  # this run's submission (a retry starts a new run)
    ttl_s: float = 86_400.0
    execution_timeout_s: float = 600.0
    max_retries: int = 3
    worker_id: str = ""  # who holds it while in progress ("" otherwise)
    agent_id: str = ""
    started_at: float | None = None  # taken by its holder
    ended_at: float | None = None
    output: str = ""  # JSON text of a completed request's output
    partials: tuple[Partial, ...] = ()  # this attempt's, by seq
    partial_bytes: int = 0
    progress: str = ""  # JSON text of the latest progress
    error: WorkerError | None = None
    reason: str = ""  # EndReason of a failed, cancelled or timed-out request
    webhook: str = ""  # where its end is POSTed (checked against the egress rule when it was submitted); "" for none
    version: int = 1

    @property
    def holder(self) -> WorkerRef | None:
        if self.state != RequestState.IN_PROGRESS:
            return None
        return WorkerRef(self.endpoint_id, self.worker_id, self.agent_id)

    @property
    def is_open(self) -> bool:
        return self.state in OPEN_STATES

    @property
    def expires_at(self) -> float:
        return self.submitted_at + self.ttl_s


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """An endpoint's request bounds (its policy's, from the endpoint resource)."""

    concurrency: int = 1
    max_retries: int = 3
    ttl_s: float = 86_400.0
    execution_timeout_s: float = 600.0
    max_input_bytes: int = 1 << 20
    max_output_bytes: int = 1 << 20
    max_partial_bytes: int = 1 << 20  # all of one attempt's partials together
    max_progress_bytes: int = 64 << 10


# A request its worker's heartbeats have not listed this long after its take was answered is taken to have never
# reached the worker (the answer was lost on the way: the agent gives up on it within the take's wait plus 15 s), and
# goes back to the queue. The handler library lists a request from the take's answer until its report is delivered.
UNCLAIMED_AFTER_S = 30.0
MAX_ERROR_CHARS = 8_000  # each of an error's message and traceback is cut to this (the library sends at most it)


def as_json(value: JSON) -> str | None:
    """A JSON value as the text stored; None for a value that is not JSON (refused as too large: nothing takes it)."""
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, ValueError, OverflowError):
        return None


def fits(text: str | None, limit: int) -> bool:
    return text is not None and len(text.encode()) <= limit


def value_of(text: str) -> JSON:
    """The JSON value of a stored text ("": none)."""
    return None if not text else msgspec.json.decode(text)


@dataclass(frozen=True, slots=True)
class Step:
    outcome: Outcome
    changed: tuple[EndpointRequestRecord, ...] = ()  # new versions, to store then apply
    taken: EndpointRequestRecord | None = None  # take's answer
    cancel: tuple[str, ...] = ()  # heartbeat's answer
    seen: tuple[tuple[WorkerRef, float], ...] = ()  # workers heard from, and when
    forgotten: tuple[WorkerRef, ...] = ()  # workers gone


def _next(rec: EndpointRequestRecord, **changes: Any) -> EndpointRequestRecord:
    return msgspec.structs.replace(rec, version=rec.version + 1, **changes)


def _requeued(rec: EndpointRequestRecord, *, attempt: int, lost: int) -> EndpointRequestRecord:
    return _next(
        rec,
        state=RequestState.QUEUED.value,
        attempt=attempt,
        lost=lost,
        worker_id="",
        agent_id="",
        started_at=None,
        partials=(),
        partial_bytes=0,
        progress="",
    )


def _ended(rec: EndpointRequestRecord, state: RequestState, now: float, **changes: Any) -> EndpointRequestRecord:
    return _next(rec, state=state.value, worker_id="", agent_id="", ended_at=now, **changes)


@dataclass
class RequestQueue:
    """The open requests of every endpoint, indexed for takes; changed only by ``apply``."""

    requests: dict[str, EndpointRequestRecord] = field(default_factory=dict)
    workers: dict[WorkerRef, float] = field(default_factory=dict)  # last heard from
    next_order: int = 1
    _waiting: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # per endpoint: heap of (order, id)
    _held: dict[WorkerRef, set[str]] = field(default_factory=dict)
    _load: dict[str, tuple[int, int]] = field(default_factory=dict)  # per endpoint: open requests, their input chars

    @classmethod
    def loaded(cls, records: Iterable[EndpointRequestRecord], now: float) -> RequestQueue:
        """The queue of a (re)started Master: its stored open requests; each holder counts as heard from ``now``, so
        one that stays silent loses its requests after the heartbeat timeout."""
        queue = cls()
        recs = [r for r in records if r.is_open]
        queue.apply(Step(Outcome.OK, changed=tuple(recs), seen=tuple((h, now) for r in recs if (h := r.holder))))
        return queue

    # --- reading ---

    def get(self, request_id: str) -> EndpointRequestRecord | None:
        return self.requests.get(request_id)

    def open_load(self, endpoint_id: str) -> tuple[int, int]:
        """The endpoint's open requests: how many, and the characters of their inputs together."""
        return self._load.get(endpoint_id, (0, 0))

    def held_by(self, worker: WorkerRef) -> frozenset[str]:
        return frozenset(self._held.get(worker, ()))

    def holding(self, worker: WorkerRef) -> int:
        """How many requests the worker holds (at no cost)."""
        return len(self._held.get(worker, ()))

    def has_queued(self, endpoint_id: str) -> bool:
        """Whether the endpoint has a queued request (at no cost: the head of its heap is always a queued one)."""
        return bool(self._waiting.get(endpoint_id))

    def queued(self, endpoint_id: str) -> list[EndpointRequestRecord]:
        """The endpoint's queued requests, in the order takes answer them."""
        recs = [r for r in self.requests.values() if r.endpoint_id == endpoint_id and r.state == RequestState.QUEUED]
        return sorted(recs, key=lambda r: r.order)

    def _holding(self, worker: WorkerRef, request_id: str) -> EndpointRequestRecord | None:
        rec = self.requests.get(request_id)
        return rec if rec is not None and rec.holder == worker else None

    # --- operations: each answers a Step and changes nothing ---

    def submit(
        self,
        request_id: str,
        endpoint_id: str,
        input: JSON,
        limits: QueueLimits,
        now: float,
        *,
        account: str = "",
        webhook: str = "",
        to: WorkerRef | None = None,
    ) -> Step:
        """A new request, queued; or, with ``to`` (a worker of the endpoint whose take waits now), taken by that worker
        in the same step, when a take would give it this request: the endpoint has none queued (it would be the head)
        and the worker holds fewer than ``limits.concurrency``. Else it is queued as without ``to``."""
        if request_id in self.requests:
            return Step(Outcome.GONE)
        text = as_json(input)
        if text is None or not fits(text, limits.max_input_bytes):
            return Step(Outcome.TOO_LARGE)
        rec = EndpointRequestRecord(
            id=request_id,
            endpoint_id=endpoint_id,
            account=account,
            input=text,
            order=self.next_order,
            submitted_at=now,
            ttl_s=limits.ttl_s,
            execution_timeout_s=limits.execution_timeout_s,
            max_retries=limits.max_retries,
            webhook=webhook,
        )
        if to is not None and self.may_hand(to, limits.concurrency):
            held = msgspec.structs.replace(
                rec, state=RequestState.IN_PROGRESS.value, worker_id=to.worker_id, agent_id=to.agent_id, started_at=now
            )
            return Step(Outcome.OK, changed=(held,), taken=held, seen=((to, now),))
        return Step(Outcome.OK, changed=(rec,))

    def may_hand(self, worker: WorkerRef, concurrency: int) -> bool:
        """Whether a request submitted now at the worker's endpoint may go straight to it: a take of it would get that
        request (none queued ahead of it) and it holds fewer than ``concurrency``."""
        return not self._waiting.get(worker.endpoint_id) and len(self._held.get(worker, ())) < concurrency

    def take(self, worker: WorkerRef, concurrency: int, now: float) -> Step:
        """The oldest queued request of the worker's endpoint, if it holds fewer than ``concurrency``; else none
        (outcome ``GONE``), the worker heard from either way."""
        seen = ((worker, now),)
        if len(self._held.get(worker, ())) >= concurrency:
            return Step(Outcome.GONE, seen=seen)
        heap = self._waiting.get(worker.endpoint_id)
        if heap:  # apply keeps each heap's top a queued request at its place
            rec = self.requests[heap[0][1]]
            taken = _next(
                rec, state=RequestState.IN_PROGRESS.value, worker_id=worker.worker_id, agent_id=worker.agent_id, started_at=now
            )
            return Step(Outcome.OK, changed=(taken,), taken=taken, seen=seen)
        return Step(Outcome.GONE, seen=seen)

    def heartbeat(
        self, worker: WorkerRef, in_flight: Iterable[str], now: float, *, unclaimed_after_s: float = UNCLAIMED_AFTER_S
    ) -> Step:
        held = self._held.get(worker, set())
        listed = dict.fromkeys(in_flight)
        unclaimed = tuple(
            _requeued(rec, attempt=rec.attempt, lost=rec.lost)
            for i in sorted(held - listed.keys())
            if (rec := self.requests[i]).started_at is not None and now - rec.started_at >= unclaimed_after_s
        )
        return Step(Outcome.OK, changed=unclaimed, cancel=tuple(i for i in listed if i not in held), seen=((worker, now),))

    def partial(self, worker: WorkerRef, request_id: str, seq: int, output: JSON, limits: QueueLimits, now: float) -> Step:
        seen = ((worker, now),)
        rec = self._holding(worker, request_id)
        if rec is None or seq < 0:
            return Step(Outcome.GONE, seen=seen)
        if any(p.seq == seq for p in rec.partials):
            return Step(Outcome.OK, seen=seen)  # a resend: taken once
        text = as_json(output)
        if text is None or not fits(text, limits.max_partial_bytes - rec.partial_bytes):
            return Step(Outcome.TOO_LARGE, seen=seen)
        size = len(text.encode())
        partials = tuple(sorted((*rec.partials, Partial(seq, text)), key=lambda p: p.seq))
        return Step(Outcome.OK, changed=(_next(rec, partials=partials, partial_bytes=rec.partial_bytes + size),), seen=seen)

    def progress(self, worker: WorkerRef, request_id: str, progress: JSON, limits: QueueLimits, now: float) -> Step:
        seen = ((worker, now),)
        rec = self._holding(worker, request_id)
        if rec is None:
            return Step(Outcome.GONE, seen=seen)
        text = as_json(progress)
        if text is None or not fits(text, limits.max_progress_bytes):
            return Step(Outcome.TOO_LARGE, seen=seen)
        return Step(Outcome.OK, changed=(_next(rec, progress=text),), seen=seen)

    def result(self, worker: WorkerRef, request_id: str, output: JSON, limits: QueueLimits, now: float) -> Step:
        seen = ((worker, now),)
        rec = self._holding(worker, request_id)
        if rec is None:
            return Step(Outcome.GONE, seen=seen)
        text = as_json(output)
        if text is None or not fits(text, limits.max_output_bytes):
            return Step(Outcome.TOO_LARGE, seen=seen)
        return Step(Outcome.OK, changed=(_ended(rec, RequestState.COMPLETED, now, output=text),), seen=seen)

    def error(self, worker: WorkerRef, request_id: str, error: WorkerError, now: float) -> Step:
        seen = ((worker, now),)
        rec = self._holding(worker, request_id)
        if rec is None:
            return Step(Outcome.GONE, seen=seen)
        cut = WorkerError(
            type=error.type[:200], message=error.message[:MAX_ERROR_CHARS], traceback=error.traceback[-MAX_ERROR_CHARS:]
        )
        failed = _ended(rec, RequestState.FAILED, now, error=cut, reason=EndReason.ERROR.value)
        return Step(Outcome.OK, changed=(failed,), seen=seen)

    def release(self, worker: WorkerRef, request_id: str, now: float) -> Step:
        seen = ((worker, now),)
        rec = self._holding(worker, request_id)
        if rec is None:
            return Step(Outcome.GONE, seen=seen)
        return Step(Outcome.OK, changed=(_requeued(rec, attempt=rec.attempt, lost=rec.lost),), seen=seen)

    def worker_gone(self, worker: WorkerRef, now: float) -> Step:
        changed = tuple(self._lost(self.requests[i], now) for i in sorted(self._held.get(worker, ())))
        return Step(Outcome.OK, changed=changed, forgotten=(worker,))

    def _lost(self, rec: EndpointRequestRecord, now: float) -> EndpointRequestRecord:
        if rec.lost >= rec.max_retries:
            return _ended(rec, RequestState.FAILED, now, reason=EndReason.WORKER_LOST.value)
        return _requeued(rec, attempt=rec.attempt + 1, lost=rec.lost + 1)

    def cancel(self, request_id: str, now: float) -> Step:
        rec = self.requests.get(request_id)
        if rec is None:
            return Step(Outcome.NOT_FOUND)  # not open here: the shell tells unknown from ended by the store
        return Step(Outcome.OK, changed=(_ended(rec, RequestState.CANCELLED, now, reason=EndReason.CANCELLED.value),))

    def retry(self, rec: EndpointRequestRecord, now: float) -> Step:
        """A new run of an ended request (given: the queue keeps open ones only). A completed one is never retried."""
        if rec.state not in RETRYABLE_STATES or rec.id in self.requests:
            return Step(Outcome.GONE)
        run = _next(
            rec,
            state=RequestState.QUEUED.value,
            order=self.next_order,
            attempt=rec.attempt + 1,
            lost=0,
            submitted_at=now,
            worker_id="",
            agent_id="",
            started_at=None,
            ended_at=None,
            output="",
            partials=(),
            partial_bytes=0,
            progress="",
            error=None,
            reason="",
        )
        return Step(Outcome.OK, changed=(run,))

    def expire(self, now: float, heartbeat_timeout_s: float) -> Step:
        changed: dict[str, EndpointRequestRecord] = {}
        silent = tuple(w for w, seen in self.workers.items() if now - seen >= heartbeat_timeout_s)
        silent_set = set(silent)
        for stored in sorted(self.requests.values(), key=lambda r: r.order):
            rec, holder = stored, stored.holder
            if holder is not None:
                assert rec.started_at is not None
                if now - rec.started_at >= rec.execution_timeout_s:
                    rec = _ended(rec, RequestState.TIMED_OUT, now, reason=EndReason.EXECUTION_TIMEOUT.value)
                elif holder in silent_set:
                    rec = self._lost(rec, now)
                else:
                    continue
                changed[rec.id] = rec
            if rec.state == RequestState.QUEUED and now >= rec.expires_at:
                ended = _ended(rec, RequestState.TIMED_OUT, now, reason=EndReason.TTL.value)
                changed[rec.id] = msgspec.structs.replace(ended, version=stored.version + 1)  # one step, one version
        return Step(Outcome.OK, changed=tuple(changed.values()), forgotten=silent)

    # --- the one mutation ---

    def apply(self, step: Step) -> None:
        for rec in step.changed:
            old = self.requests.pop(rec.id, None)
            if old is not None:
                self._count(old, -1)
            if old is not None and (holder := old.holder) is not None:
                held = self._held.get(holder)
                if held is not None:
                    held.discard(rec.id)
                    if not held:
                        del self._held[holder]
            if not rec.is_open:
                continue
            self.requests[rec.id] = rec
            self._count(rec, 1)
            self.next_order = max(self.next_order, rec.order + 1)
            if (holder := rec.holder) is not None:
                self._held.setdefault(holder, set()).add(rec.id)
            else:
                heapq.heappush(self._waiting.setdefault(rec.endpoint_id, []), (rec.order, rec.id))
        for worker, when in step.seen:
            self.workers[worker] = max(when, self.workers.get(worker, when))
        for worker in step.forgotten:
            self.workers.pop(worker, None)
        for heap in self._waiting.values():  # drop entries no longer queued at that place
            while heap and not self._waits(heap[0]):
                heapq.heappop(heap)

    def _count(self, rec: EndpointRequestRecord, sign: int) -> None:
        count, chars = self._load.get(rec.endpoint_id, (0, 0))
        count, chars = count + sign, chars + sign * len(rec.input)
        if count:
            self._load[rec.endpoint_id] = (count, chars)
        else:
            self._load.pop(rec.endpoint_id, None)

    def _waits(self, entry: tuple[int, str]) -> bool:
        rec = self.requests.get(entry[1])
        return rec is not None and rec.state == RequestState.QUEUED and rec.order == entry[0]

    def counts(self) -> Mapping[str, Mapping[str, int]]:
        """Per endpoint: its open requests by state and its workers heard from (``workers``)."""
        out: dict[str, dict[str, int]] = {}
        for rec in self.requests.values():
            by = out.setdefault(rec.endpoint_id, {})
            by[rec.state] = by.get(rec.state, 0) + 1
        for worker in self.workers:
            by = out.setdefault(worker.endpoint_id, {})
            by["workers"] = by.get("workers", 0) + 1
        return out

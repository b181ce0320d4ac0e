"""The request queue's shell: the book of endpoint requests, on the Master.

``RequestBook`` loads the open requests from the store at start (``load``), and from then on does each operation the
same way: under one lock, without suspending, it asks the pure queue (queue.py) for the step, applies it to memory and
hands the step's requests to the group commit (``GroupWriter``: an insert for a new one, else an update over the
version before; every request handed over while a write is under way goes in the next one, one transaction). Only
once they are stored is anyone told: the caller's answer, the takes and waits woken, the end hook. A request someone
else wrote meanwhile is read back and the call answers as if it had lost the race; after a store failure every open
request is read again before the next step. So memory runs ahead of the store by at most the writes under way, no
caller hears of a change before it is durable (a status or stream of a request being written waits for it), and a
Master that restarts, or is killed, finds every acknowledged request where the last one left it; a holder it has not
heard from since is treated as lost after ``heartbeat_timeout_s`` (the queue counts each loaded holder as heard from at
load).

Two sides call it:

- the workers, through their agents (``WorkerCalls``, docs/endpoints.md "The worker API"): ``take`` is a long poll,
  bounded by ``MAX_TAKE_WAIT_S``, that sleeps until a request becomes queued at its endpoint (every release, retry and
  requeue, and a submit no waiting take could have) and never spins; a request submitted while it waits is handed
  to it in the submit's own step (stored once, as its worker's; the take answers without waiting for that write, since
  no one else has heard of the request yet). The reports answer ``Outcome`` (ok, gone: 404/409, too_large: 413);
- the renters' routes (a later slice): ``submit``, ``status``, ``stream`` (partial outputs after a seq, optionally
  waiting for the next change), ``cancel``, ``retry``, ``health``.

``sweep`` applies the clock (TTL, execution timeout, silent workers); the Master's composition runs it every few
seconds. No timing here is a test's assertion: tests drive the clock (``clock``) and call ``sweep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from common.errors import Conflict, IdlegridError, NotFound
from management.endpoints.queue import (
    OPEN_STATES,
    EndpointRequestRecord,
    Outcome,
    Partial,
    QueueLimits,
    RequestQueue,
    RequestState,
    Step,
    value_of,
)
from management.store.endpoint_requests import EndpointRequestRepo, refuse_unstorable
from master.port import CallOutcome, Loop, TakenRequest, WorkerCalls, WorkerError, WorkerRef, stop_loop

log = logging.getLogger(__name__)

JSON = Any
MAX_TAKE_WAIT_S = 30.0  # a take waits at most this long, whatever the worker asks (the library asks 20 s)
MAX_IN_FLIGHT_LISTED = 1_000  # a heartbeat's in-flight list is read up to this many ids
MAX_GONE_KEPT = 100_000  # workers remembered as gone (their late takes get nothing)
# A take of several answers more than its first request only while their inputs together stay under this many
# characters: its answer is one frame to the agent (common/wire.py MAX_FRAME_BYTES), the rest wait for the next take.
TAKE_MANY_INPUT_CHARS = 64 * 1024
LOAD_PAGE = 1_000
SWEEP_PERIOD_S = 2.0  # how often the clock is applied: a TTL or a timeout ends at most this late
# How long an ended request (its output, its error) is kept for its status and stream to read, from its end. RunPod
# keeps an asynchronous request's result for 30 minutes, which its users find short; a day covers a client that
# comes back the next morning.
RESULT_RETENTION_S = 86_400.0
PURGE_EVERY_S = 60.0  # how often the ended requests past the retention are deleted, a page at a time
PURGE_PAGE = 1_000
# Requests that ended lately, kept as stored for their status (a runsync's answer, a client's last poll) so that it
# reads no store; the oldest end forgotten first. An ended request changes only by a retry, through this book.
ENDED_KEPT = 10_000
# A status waits for at most this many writes of its request, one after another, before it reads the store instead (a
# request changed at every write, a stream of partials, does not hold its reader back).
STATUS_WRITES_AWAITED = 4


class RequestTooLarge(IdlegridError):
    """A request's input past its endpoint's bound."""

    code = "request_too_large"


@dataclass(frozen=True, slots=True)
class Streamed:
    """A stream's answer: the partial outputs after the seq asked for, and the request as it is."""

    request: EndpointRequestRecord
    partials: tuple[Partial, ...]

    @property
    def done(self) -> bool:
        return self.request.state not in OPEN_STATES


@dataclass(frozen=True, slots=True)
class WorkerActivity:
    """One worker as the book knows it (the autoscaler's shell reads it): when it was last heard from, the requests it
    holds, and when its work last changed (a request taken, reported on or handed back)."""

    ref: WorkerRef
    last_seen: float
    in_flight: int
    last_work: float | None  # None: no request taken since the book knew it
    # None while a take of it is under way (a healthy worker with room for more always has one in its long poll); else
    # since when none has been: the end of its last take, or when the book first heard from it
    not_taking_since: float | None = None
    first_seen: float | None = None  # when the book first heard from it (its cold start ends there)


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    workers: int  # heard from and not gone
    busy_workers: int  # holding at least one request
    requests: dict[str, int]  # open requests by state


# What a worker's report answers (the worker API's 204, 404, 413): a request that is not the caller's, or no longer
# open, is gone to it whether or not it exists.
CALL_OUTCOMES = {
    Outcome.OK: CallOutcome.OK,
    Outcome.GONE: CallOutcome.GONE,
    Outcome.NOT_FOUND: CallOutcome.GONE,
    Outcome.TOO_LARGE: CallOutcome.TOO_LARGE,
}


def _taken(rec: EndpointRequestRecord) -> TakenRequest:
    return TakenRequest(rec.id, value_of(rec.input), rec.attempt)


def new_request_id() -> str:
    return f"req-{secrets.token_hex(10)}"


class GroupWriter:
    """The book's group commit: the requests handed to ``write`` while a write is under way are written together by
    the next one (``write_many``: one transaction on SQLite), in the order they were handed over. ``write`` answers
    a future of the records' stored flags, resolved once they are durable (or failed with the store's error); an empty
    hand-over waits for every write before it (None when nothing is under way)."""

    def __init__(self, write_many: Callable[[Sequence[EndpointRequestRecord]], Awaitable[list[bool]]]) -> None:
        self._write_many = write_many
        self._pending: list[tuple[tuple[EndpointRequestRecord, ...], asyncio.Future[list[bool]]]] = []
        self._task: asyncio.Task[None] | None = None
        self.batches = 0  # writes made (the tests' and the bench's count)

    def write(self, recs: tuple[EndpointRequestRecord, ...]) -> asyncio.Future[list[bool]] | None:
        if not recs and self._task is None:
            return None
        future: asyncio.Future[list[bool]] = asyncio.get_running_loop().create_future()
        self._pending.append((recs, future))
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="endpoint requests' group commit")
        return future

    async def drained(self) -> None:
        """Once every write handed over so far is done."""
        while (task := self._task) is not None:
            await asyncio.shield(task)

    async def _run(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                recs = [rec for part, _ in batch for rec in part]
                try:
                    stored = await self._write_many(recs) if recs else []
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.batches += 1 if recs else 0
                at = 0
                for part, future in batch:
                    if not future.done():
                        future.set_result(stored[at : at + len(part)])
                    at += len(part)
        finally:
            self._task = None
            for _, future in self._pending:  # cancelled mid-way (the loop closing): no caller waits forever
                if not future.done():
                    future.set_exception(RuntimeError("the endpoint requests' writer stopped"))
            self._pending = []


@dataclass(eq=False, slots=True)
class _TakeWaiter:
    """A take in its long poll. Registered at its endpoint before it looks at the queue, so an arrival meanwhile wakes it
    (``woken``); ``open`` once it has looked and found nothing, when a submit may hand it its request straight
    (``handed``: up to ``most``, and more than one only while their inputs stay under TAKE_MANY_INPUT_CHARS)."""

    worker: WorkerRef
    most: int
    woken: asyncio.Future[None]
    open: bool = False
    handed: list[EndpointRequestRecord] = field(default_factory=list)
    chars: int = 0  # of the inputs handed
    # Its worker held other requests when the first was handed: the answer waits for that request's write (which its
    # submit waits for anyway), and what is submitted meanwhile goes in the same answer. An idle worker's take answers
    # at once: nothing would come to share its answer, and the write would only add a trip to the store's thread.
    busy: bool = False

    def has_room(self) -> bool:
        return self.open and not self.woken.cancelled() and len(self.handed) < self.most and self.chars <= TAKE_MANY_INPUT_CHARS


@dataclass(frozen=True, slots=True)
class _Staged:
    step: Step
    written: asyncio.Future[list[bool]] | None  # None: nothing to wait for


class RequestBook:
    """Endpoint requests: the open ones in memory (the pure queue), every change stored first. It is the ``WorkerCalls``
    the Master hands its endpoint workers' calls to (master/worker_calls.py)."""

    def __init__(
        self,
        repo: EndpointRequestRepo,
        *,
        limits_of: Callable[[str], QueueLimits] = lambda _endpoint: QueueLimits(),
        heartbeat_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = new_request_id,
        serve: Callable[[WorkerCalls | None], None] = lambda _calls: None,
        sweep_period_s: float = SWEEP_PERIOD_S,
        retention_s: float = RESULT_RETENTION_S,
        on_end: Callable[[EndpointRequestRecord], None] = lambda _rec: None,
    ) -> None:
        """``limits_of``: an endpoint's bounds (read synchronously, at each call); ``serve``: how the book is made
        the Master's handler of workers' calls while it runs (``MasterPort.serve_worker_calls``); ``on_end``: told of
        each request once it has ended and been stored (once per run: a retry's run is told again at its own end). It
        is called from the event loop once the end is stored, so it must not block: it hands the record over and returns."""
        self._repo = repo
        self._limits_of = limits_of
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._clock = clock
        self._new_id = new_id
        self._queue = RequestQueue()
        self._lock = asyncio.Lock()
        # Per endpoint: its takes waiting, oldest first; all woken when a request becomes queued there, the first with
        # room handed a request submitted while it waits.
        self._waiters: dict[str, dict[_TakeWaiter, None]] = {}
        self._changes: dict[str, asyncio.Event] = {}  # per request someone streams: set when it changes
        self._serve = serve
        self._sweep_period_s = sweep_period_s
        self._sweeper: asyncio.Task[None] | None = None
        self._retention_s = retention_s
        self._purged_at = float("-inf")
        self._on_end = on_end
        self.loaded = False  # read from the store (the composition's check)
        self._last_work: dict[WorkerRef, float] = {}  # per worker: when a request it held (or took) last changed
        self._taking: dict[WorkerRef, int] = {}  # per worker: its takes under way
        self._take_ended: dict[WorkerRef, float] = {}  # per worker: when its last take ended (or it was first heard)
        self._first_seen: dict[WorkerRef, float] = {}  # per worker: when it was first heard from
        self._arrival_listeners: list[Callable[[str], None]] = []
        # Workers told gone (their container ended, the autoscaler stopped them, their host was lost), oldest first: a
        # take of theirs still waiting here ends with nothing, and a late one takes nothing. A worker id is new at each
        # start, so a gone worker never comes back; at most MAX_GONE_KEPT are remembered.
        self._gone: dict[WorkerRef, None] = {}
        self._writer = GroupWriter(repo.write_many)
        # Requests changed in memory whose change is not yet stored, and the write that stores it: a status (or stream)
        # of one waits for that write, so no caller reads a version the store does not hold.
        self._unsettled: dict[str, asyncio.Future[list[bool]]] = {}
        self._resync = False  # a write failed: memory is read again from the store before the next step
        self._to_reread: set[str] = set()  # requests whose write lost to another writer's, to read back
        self._ended: OrderedDict[str, EndpointRequestRecord] = OrderedDict()  # ENDED_KEPT, as stored

    def on_arrival(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(endpoint_id)`` whenever a request becomes queued there (submitted, handed back, requeued,
        retried): the autoscaler's shell wakes at once for an endpoint with no worker. It must not block."""
        self._arrival_listeners.append(listener)

    async def load(self) -> None:
        """Read the open requests from the store (at start)."""
        found = await self._read_open()
        async with self._lock:
            self._queue = RequestQueue.loaded(found, self._clock())
        self.loaded = True

    async def _read_open(self) -> list[EndpointRequestRecord]:
        found: list[EndpointRequestRecord] = []
        after: int | None = None
        while page := await self._repo.list(states=list(OPEN_STATES), after_order=after, limit=LOAD_PAGE):
            found.extend(page)
            after = page[-1].order
        return found

    def start(self) -> None:
        """Take the workers' calls (once loaded) and apply the clock every ``sweep_period_s``."""
        self._serve(self)
        self._sweeper = Loop("endpoint requests", self._sweep_period_s, self._sweep_once, restart_s=self._sweep_period_s).start()

    async def stop(self) -> None:
        """Workers' calls are answered 503 from now on (they retry, on this Master or the next); the sweeps stop."""
        self._serve(None)
        await stop_loop(self._sweeper)
        self._sweeper = None
        await self._writer.drained()

    async def _sweep_once(self) -> None:
        await self.sweep()
        now = self._clock()
        if now - self._purged_at >= PURGE_EVERY_S:
            await self.purge()
            self._purged_at = now

    # --- carrying out a step ---

    def _stage(self, step: Step) -> _Staged:
        """Apply the step to memory and hand its requests to the writer, without suspending (called under the lock):
        UnstorableRecord, before anything changes, for a record the store would refuse. What waits on the requests
        (takes, runsync, streams, the end hook) is told once they are stored, whether or not the caller still waits."""
        for rec in step.changed:
            refuse_unstorable(rec)
        self._note_work(step)
        self._queue.apply(step)
        written = self._writer.write(step.changed)
        if written is not None:
            for rec in step.changed:  # changed in memory, not yet in the store: a status of it waits for the write
                self._unsettled[rec.id] = written
            written.add_done_callback(lambda done: self._written(step.changed, done))
        return _Staged(step, written)

    def _written(self, changed: tuple[EndpointRequestRecord, ...], written: asyncio.Future[list[bool]]) -> None:
        for rec in changed:
            if self._unsettled.get(rec.id) is written:
                del self._unsettled[rec.id]
        if written.cancelled() or written.exception() is not None:
            self._resync = True  # memory may hold what was never stored: read again before the next step
            return
        for rec, ok in zip(changed, written.result(), strict=True):
            if not ok:  # lost to another writer: read back before the next step (or by the caller's settle)
                self._to_reread.add(rec.id)
                continue
            self._keep_ended(rec)
            if rec.state == RequestState.QUEUED:
                self._wake_takes(rec.endpoint_id)
                for listener in self._arrival_listeners:
                    listener(rec.endpoint_id)
            self._wake(self._changes, rec.id)
            if not rec.is_open:
                self._tell_end(rec)

    async def _settle(self, staged: _Staged) -> Step:
        """Wait until the step's requests are stored (a store failure raises here), then answer the step as stored: a
        request lost to a concurrent writer is read back instead, and turns an OK into GONE."""
        step = staged.step
        if staged.written is None:
            return step
        stored_flags = await asyncio.shield(staged.written)
        stored = tuple(rec for rec, ok in zip(step.changed, stored_flags, strict=True) if ok)
        if len(stored) < len(step.changed):
            async with self._lock:
                await self._resync_if_needed()
        lost_race = len(stored) < len(step.changed)
        taken = step.taken if step.taken in stored else None
        outcome = Outcome.GONE if lost_race and len(step.changed) == 1 else step.outcome
        return Step(outcome, stored, taken, step.cancel, step.seen, step.forgotten)

    async def _resync_if_needed(self) -> None:
        """Memory made right where it ran ahead of the store (called under the lock): the requests lost to another
        writer are read back; after a store failure, once the writes under way are done, every open request is."""
        if self._resync:
            await self._writer.drained()
            found = await self._read_open()
            self._queue = RequestQueue.loaded(found, self._clock())
            self._resync = False
            self._to_reread.clear()
            self._ended.clear()
        while self._to_reread:
            request_id = next(iter(self._to_reread))
            await self._reread(request_id)
            self._to_reread.discard(request_id)

    def _keep_ended(self, rec: EndpointRequestRecord) -> None:
        if rec.is_open:
            self._ended.pop(rec.id, None)
            return
        self._ended[rec.id] = rec
        self._ended.move_to_end(rec.id)
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _tell_end(self, rec: EndpointRequestRecord) -> None:
        try:
            self._on_end(rec)
        except Exception:  # the request has ended and is stored whatever a listener does
            log.exception("endpoint request %s: the end hook failed", rec.id)

    def _note_work(self, step: Step) -> None:
        """Each worker whose requests the step changes (the holder before, the holder after) worked now."""
        now = self._clock()
        for rec in step.changed:
            held = self._queue.get(rec.id)
            for holder in (held.holder if held is not None else None, rec.holder):
                if holder is not None:
                    self._last_work[holder] = now
        for worker, when in step.seen:
            self._take_ended.setdefault(worker, when)
            self._first_seen.setdefault(worker, when)
        for worker in step.forgotten:
            self._last_work.pop(worker, None)
            self._take_ended.pop(worker, None)
            self._first_seen.pop(worker, None)

    async def _reread(self, request_id: str) -> None:
        self._ended.pop(request_id, None)
        fresh = await self._repo.get(request_id)
        held = self._queue.get(request_id)
        if fresh is not None:
            self._queue.apply(Step(Outcome.OK, changed=(fresh,)))
        elif held is not None:  # gone from the store (by hand): no longer open here either
            self._queue.apply(Step(Outcome.OK, changed=(msgspec.structs.replace(held, state=RequestState.FAILED.value),)))

    def _wake_takes(self, endpoint_id: str) -> None:
        """Every take waiting at the endpoint looks at the queue again."""
        for waiter in self._waiters.pop(endpoint_id, {}):
            if not waiter.woken.done():
                waiter.woken.set_result(None)

    def _waiting_take(self, worker: WorkerRef, most: int) -> _TakeWaiter:
        waiter = _TakeWaiter(worker, most, asyncio.get_running_loop().create_future())
        self._waiters.setdefault(worker.endpoint_id, {})[waiter] = None
        return waiter

    def _stop_waiting(self, waiter: _TakeWaiter) -> None:
        waiting = self._waiters.get(waiter.worker.endpoint_id)
        if waiting is not None and waiting.pop(waiter, 0) is None and not waiting:
            del self._waiters[waiter.worker.endpoint_id]

    def _take_to_hand(self, endpoint_id: str, concurrency: int) -> _TakeWaiter | None:
        """The first take waiting at the endpoint that a request submitted now may be handed to (called under the lock):
        one with room, of a worker not gone and below its concurrency."""
        for waiter in self._waiters.get(endpoint_id, ()):
            if waiter.has_room() and waiter.worker not in self._gone and self._queue.may_hand(waiter.worker, concurrency):
                return waiter
        return None

    def _hand(self, waiter: _TakeWaiter, rec: EndpointRequestRecord) -> None:
        if not waiter.handed:
            waiter.busy = self._queue.holding(waiter.worker) > 1  # others than this one
        waiter.handed.append(rec)
        waiter.chars += len(rec.input)
        if not waiter.woken.done():
            waiter.woken.set_result(None)
        waiting = self._waiters.get(waiter.worker.endpoint_id, {})
        if waiting.pop(waiter, 0) is None:  # the next submit goes to the next take waiting with room (then this one again)
            waiting[waiter] = None

    @staticmethod
    def _wake(events: dict[str, asyncio.Event], key: str) -> None:
        event = events.pop(key, None)
        if event is not None:
            event.set()

    @staticmethod
    def _event(events: dict[str, asyncio.Event], key: str) -> asyncio.Event:
        if (event := events.get(key)) is None:  # not an Event made and thrown away at every look
            event = events[key] = asyncio.Event()
        return event

    async def _step(self, make: Callable[[RequestQueue, float], Step]) -> Step:
        async with self._lock:
            await self._resync_if_needed()
            staged = self._stage(make(self._queue, self._clock()))
        return await self._settle(staged)

    # --- the workers' side (WorkerCalls) ---

    async def _report(self, make: Callable[[RequestQueue, float], Step]) -> CallOutcome:
        return CALL_OUTCOMES[(await self._step(make)).outcome]

    async def take(self, worker: WorkerRef, wait_s: float) -> TakenRequest | None:
        """The oldest queued request of the worker's endpoint, waiting up to ``wait_s`` (at most MAX_TAKE_WAIT_S) for
        one to arrive; None when none came (or the worker holds its concurrency already)."""
        taken = await self.take_many(worker, wait_s, 1)
        return taken[0] if taken else None

    async def take_many(self, worker: WorkerRef, wait_s: float, most: int) -> list[TakenRequest]:
        """Up to ``most`` of the worker's endpoint's oldest queued requests (within its concurrency, and while their
        inputs stay under TAKE_MANY_INPUT_CHARS after the first), waiting up to ``wait_s`` (at most MAX_TAKE_WAIT_S)
        for one to arrive; none when none came. One call carries what ``most`` takes would: the steps are made
        together and stored in one write."""
        self._taking[worker] = self._taking.get(worker, 0) + 1
        try:
            return await self._take(worker, wait_s, max(1, most))
        finally:
            left = self._taking.pop(worker, 1) - 1
            if left:
                self._taking[worker] = left
            if worker in self._queue.workers:
                self._take_ended[worker] = self._clock()

    async def _take(self, worker: WorkerRef, wait_s: float, most: int) -> list[TakenRequest]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, min(wait_s, MAX_TAKE_WAIT_S))
        concurrency = self._limits_of(worker.endpoint_id).concurrency
        woken = False
        while True:
            if worker in self._gone:  # its container is gone: a request taken now would wait out a heartbeat timeout
                return []
            waiter = self._waiting_take(worker, most)  # before looking: no arrival slips between
            try:
                # An arrival wakes every take waiting at the endpoint, and one of them gets it: the others see the
                # queue empty again and go back to waiting without a step (a step each cost the Master about 50 us a
                # waiting take per request: 3 ms a request with 64 takes waiting). The first look is always a step: it
                # is the worker's call heard from.
                if not woken or self._queue.has_queued(worker.endpoint_id):
                    taken = await self._take_now(worker, concurrency, most)
                    if taken:
                        return [_taken(rec) for rec in taken]
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return []
                if not waiter.woken.done():
                    waiter.open = True  # a request submitted from now on may come straight here
                    try:
                        async with asyncio.timeout(remaining):  # no task of its own, as wait_for makes one
                            await waiter.woken
                    except TimeoutError:
                        if not waiter.handed:
                            return []
                # Handed at its submit, in the step that stored it as this worker's: answered without waiting for its
                # write (but a busy worker's, ``busy``). No one else was told of it, so a Master that dies before the
                # write leaves no trace of it, and its worker's reports are answered gone; the submit's caller hears
                # only once it is stored.
                if waiter.handed:
                    if waiter.busy and (written := self._unsettled.get(waiter.handed[0].id)) is not None:
                        with contextlib.suppress(Exception):  # a failed write: its worker's reports are answered gone
                            await asyncio.shield(written)
                    return [_taken(rec) for rec in waiter.handed]
            finally:
                self._stop_waiting(waiter)
            woken = True

    async def _take_now(self, worker: WorkerRef, concurrency: int, most: int) -> list[EndpointRequestRecord]:
        """Up to ``most`` takes at once, under one hold of the lock (so their writes go together): the requests taken
        and stored. The first take is made whatever the queue holds: it is the worker's call heard from."""
        staged: list[_Staged] = []
        async with self._lock:
            await self._resync_if_needed()
            chars = 0
            while len(staged) < most and chars <= TAKE_MANY_INPUT_CHARS:
                if staged and not self._queue.has_queued(worker.endpoint_id):
                    break
                step = self._queue.take(worker, concurrency, self._clock())
                if step.taken is None and staged:
                    break
                staged.append(self._stage(step))
                if step.taken is None:
                    break
                chars += len(step.taken.input)
        # Staged without suspending, they are in one write: stored together, or failed together (raised here).
        settled = [await self._settle(one) for one in staged]
        return [step.taken for step in settled if step.taken is not None]

    async def heartbeat(self, worker: WorkerRef, in_flight: list[str]) -> list[str]:
        """The worker is heard from; answers the ids it lists that are no longer its own (to cancel)."""
        listed = in_flight[:MAX_IN_FLIGHT_LISTED]
        return list((await self._step(lambda q, now: q.heartbeat(worker, listed, now))).cancel)

    async def partial(self, worker: WorkerRef, request_id: str, seq: int, output: JSON) -> CallOutcome:
        limits = self._limits_of(worker.endpoint_id)
        return await self._report(lambda q, now: q.partial(worker, request_id, seq, output, limits, now))

    async def progress(self, worker: WorkerRef, request_id: str, progress: JSON) -> CallOutcome:
        limits = self._limits_of(worker.endpoint_id)
        return await self._report(lambda q, now: q.progress(worker, request_id, progress, limits, now))

    async def result(self, worker: WorkerRef, request_id: str, output: JSON) -> CallOutcome:
        limits = self._limits_of(worker.endpoint_id)
        return await self._report(lambda q, now: q.result(worker, request_id, output, limits, now))

    async def results(self, worker: WorkerRef, results: list[tuple[str, JSON]]) -> list[CallOutcome]:
        """Several results of one worker in one call: their steps made under one hold of the lock, so they are stored
        in one write; each answers as its own ``result`` would."""
        limits = self._limits_of(worker.endpoint_id)
        async with self._lock:
            await self._resync_if_needed()
            staged = [
                self._stage(self._queue.result(worker, request_id, output, limits, self._clock()))
                for request_id, output in results
            ]
        return [CALL_OUTCOMES[(await self._settle(one)).outcome] for one in staged]

    async def error(self, worker: WorkerRef, request_id: str, error: WorkerError) -> CallOutcome:
        return await self._report(lambda q, now: q.error(worker, request_id, error, now))

    async def release(self, worker: WorkerRef, request_id: str) -> CallOutcome:
        return await self._report(lambda q, now: q.release(worker, request_id, now))

    async def worker_gone(self, worker: WorkerRef) -> None:
        """The worker's container ended or its agent was lost: its requests go back to the queue (or fail), and its
        takes still waiting end with nothing."""
        self._gone[worker] = None
        while len(self._gone) > MAX_GONE_KEPT:
            del self._gone[next(iter(self._gone))]
        await self._step(lambda q, now: q.worker_gone(worker, now))
        self._wake_takes(worker.endpoint_id)  # its waiting takes look again, and see it gone

    # --- the renters' side ---

    async def submit(
        self,
        endpoint_id: str,
        input: JSON,
        *,
        account: str = "",
        webhook: str = "",
        execution_timeout_s: float | None = None,
        ttl_s: float | None = None,
    ) -> EndpointRequestRecord:
        """A new queued request (``webhook``: where its end is POSTed, already judged by the caller; the bounds, the
        request's own where its caller gave them: never past the endpoint's)."""
        limits = self._limits_of(endpoint_id)
        if execution_timeout_s is not None or ttl_s is not None:
            limits = dataclasses.replace(
                limits,
                execution_timeout_s=min(limits.execution_timeout_s, execution_timeout_s or limits.execution_timeout_s),
                ttl_s=min(limits.ttl_s, ttl_s or limits.ttl_s),
            )
        request_id = self._new_id()
        async with self._lock:
            await self._resync_if_needed()
            # A take waiting now gets it in this step: one write (the request stored as that worker's), no wake and
            # no look at the queue after it.
            waiter = self._take_to_hand(endpoint_id, limits.concurrency)
            to = None if waiter is None else waiter.worker
            made = self._queue.submit(
                request_id, endpoint_id, input, limits, self._clock(), account=account, webhook=webhook, to=to
            )
            staged = self._stage(made)
            if waiter is not None and made.taken is not None:
                self._hand(waiter, made.taken)
        step = await self._settle(staged)
        if step.outcome == Outcome.TOO_LARGE:
            raise RequestTooLarge(f"the request's input is over the endpoint's {limits.max_input_bytes} bytes (or not JSON)")
        if step.outcome != Outcome.OK or not step.changed:
            raise Conflict(f"request {request_id!r} was not stored")
        return step.changed[0]

    async def status(self, request_id: str) -> EndpointRequestRecord | None:
        """The request as stored: memory's version once no write of it is under way, else the store's."""
        for _ in range(STATUS_WRITES_AWAITED):
            if (written := self._unsettled.get(request_id)) is None:
                return self._queue.get(request_id) or self._ended.get(request_id) or await self._repo.get(request_id)
            # Its next change may be staged while this write ends (a worker's result after its take's write): memory
            # is then ahead of the store again, and the request, ended in memory, is in neither the queue nor the
            # ended ones yet, so the write after is awaited too, not the store read (under 64 clients, half a store
            # read a runsync).
            with contextlib.suppress(Exception):  # a failed write: the store's version is the one to read
                await asyncio.shield(written)
        return await self._repo.get(request_id)  # changed at every write it waited for: the store's version

    async def stream(self, request_id: str, after_seq: int = -1, *, wait_s: float = 0.0) -> Streamed:
        """The request's partial outputs after ``after_seq``; with ``wait_s``, waits that long for one (or the
        request's end) when there is none yet. NotFound for an unknown request."""
        change = self._event(self._changes, request_id)  # before looking (a read may suspend): no change slips by
        found = await self._streamed(request_id, after_seq)
        if found.done:  # an ended request leaves no event behind (whoever else waits on it looks again, and sees it)
            self._wake(self._changes, request_id)
        if found.partials or found.done or wait_s <= 0:
            return found
        try:
            async with asyncio.timeout(min(wait_s, MAX_TAKE_WAIT_S)):  # no task of its own, as wait_for makes one
                await change.wait()
        except TimeoutError:
            return found
        return await self._streamed(request_id, after_seq)

    async def _streamed(self, request_id: str, after_seq: int) -> Streamed:
        rec = await self.status(request_id)
        if rec is None:
            self._changes.pop(request_id, None)
            raise NotFound(f"no request {request_id!r}")
        return Streamed(rec, tuple(p for p in rec.partials if p.seq > after_seq))

    async def cancel(self, request_id: str) -> EndpointRequestRecord:
        """End an open request ``cancelled`` (its worker learns it at its next heartbeat). NotFound for an unknown
        request, Conflict for one that has ended."""
        step = await self._step(lambda q, now: q.cancel(request_id, now))
        if step.outcome == Outcome.OK and step.changed:
            return step.changed[0]
        rec = await self.status(request_id)
        if rec is None:
            raise NotFound(f"no request {request_id!r}")
        raise Conflict(f"request {request_id!r} is {rec.state}: only a queued or running request is cancelled")

    async def retry(self, request_id: str) -> EndpointRequestRecord:
        """Queue a failed, timed-out or cancelled request again, as a new attempt. NotFound for an unknown request,
        Conflict for a completed or open one."""
        async with self._lock:
            await self._resync_if_needed()
            rec = await self.status(request_id)
            if rec is None:
                raise NotFound(f"no request {request_id!r}")
            staged = self._stage(self._queue.retry(rec, self._clock()))
        step = await self._settle(staged)
        if step.outcome != Outcome.OK or not step.changed:
            raise Conflict(f"request {request_id!r} is {rec.state}: only a failed, timed-out or cancelled request is retried")
        return step.changed[0]

    def health(self, endpoint_id: str) -> EndpointHealth:
        """The endpoint's workers heard from and its open requests by state (ended ones are the store's to count)."""
        workers = [w for w in self._queue.workers if w.endpoint_id == endpoint_id]
        by_state = {s.value: 0 for s in OPEN_STATES}
        for state, n in self._queue.counts().get(endpoint_id, {}).items():
            if state in by_state:
                by_state[state] = n
        busy = sum(1 for w in workers if self._queue.held_by(w))
        return EndpointHealth(workers=len(workers), busy_workers=busy, requests=by_state)

    def open_load(self, endpoint_id: str) -> tuple[int, int]:
        """How many requests the endpoint holds open, and the characters of their inputs together (at no cost)."""
        return self._queue.open_load(endpoint_id)

    def open_of(self, endpoint_id: str) -> list[EndpointRequestRecord]:
        """The endpoint's open requests (queued and in progress), by their place in the queue."""
        return sorted((r for r in self._queue.requests.values() if r.endpoint_id == endpoint_id), key=lambda r: r.order)

    def workers_of(self, endpoint_id: str | None = None) -> list[WorkerActivity]:
        """The endpoint's workers (None: every endpoint's) heard from and not gone: when each was last heard from, what
        it holds, when its work last changed, since when no take of it is under way (the autoscaler's shell reads them
        all once a tick)."""
        return [
            WorkerActivity(
                ref,
                seen,
                len(self._queue.held_by(ref)),
                self._last_work.get(ref),
                None if self._taking.get(ref) else self._take_ended.get(ref, seen),
                self._first_seen.get(ref, seen),
            )
            for ref, seen in self._queue.workers.items()
            if endpoint_id is None or ref.endpoint_id == endpoint_id
        ]

    def queued(self, endpoint_id: str) -> list[EndpointRequestRecord]:
        """The endpoint's queued requests, oldest first (the autoscaler's view of its queue)."""
        return self._queue.queued(endpoint_id)

    # --- the clock ---

    async def purge(self) -> int:
        """Delete the requests that ended more than the retention ago (a status of one answers NotFound after); how
        many. Open requests are never touched: only an ended one has an end."""
        before, deleted = self._clock() - self._retention_s, 0
        while ids := await self._repo.delete_ended(before, limit=PURGE_PAGE):
            deleted += len(ids)
            for request_id in ids:
                self._changes.pop(request_id, None)
                self._ended.pop(request_id, None)
            if len(ids) < PURGE_PAGE:
                break
        return deleted

    async def sweep(self) -> Step:
        """TTLs, execution timeouts and silent workers, as of now."""
        return await self._step(lambda q, now: q.expire(now, self._heartbeat_timeout_s))

"""The autoscaler's shell: a loop on the Master that runs each endpoint's pure autoscaler (autoscaler.py ``decide``)
and carries out its decisions with ordinary workloads (docs/endpoints.md, "The autoscaler's shell").

Each tick (every ``period_s``, and at once when a request arrives at an endpoint with no healthy worker, so a burst
from zero does not wait for the period), for every endpoint:

1. **Reads the facts.** The policy (``spec.scaling.policy()``); the queue (``RequestBook.queued``: how many wait, and
   since when the oldest); the workers, which are the open workloads whose record names the endpoint
   (``WorkloadRecord.endpoint_worker``, set only here, at submit), each in the autoscaler's phase:

   - queued: ``starting``, its clock not running (waiting for a GPU is the scheduler's to explain, not a stuck start);
   - scheduled, starting, preempted: ``starting`` since it was placed;
   - running: ``ready`` once the request book has heard from its worker (a heartbeat or any call), else still
     ``starting`` (its handler is loading) since it was placed. A worker heard from once stays ``ready`` with its
     last call's time, so one that falls silent is found ``silent`` after ``heartbeat_timeout_s``; one heard from,
     with room for more requests and no take under way for longer than that, is ``unhealthy`` (its takers are stuck,
     while its heartbeat thread goes on).

   And what the workers spent in the last 24 hours (their rentals, ``spent``) against the endpoint's
   ``daily_spend_cap``: at the cap ``may_scale_up`` is False.
2. **Decides** (``decide``).
3. **Carries it out.** A start submits a worker workload as the endpoint's account (the workload book's submit, with
   the endpoint's worker spec and a new worker id); the scheduler places it like any workload, and the runner gives
   its container an ``endpoint_worker`` spec with a token minted for that create. A stop ends the workload
   (``cancel``, with the autoscaler's reason) and sends its requests back to the queue (``RequestBook.worker_gone``;
   the agent says so too when the container ends, and a second time changes nothing). A stuck worker is ended at the
   tick that found it, so its rental (and the renter's charge) ends there (management/market/metering_loop.py ends a
   rental at its workload's ``finished_at``).

A **load-balanced** endpoint (docs/endpoints.md, "Load-balanced mode") is read from its pool (pool.py) instead of the
request book: its queue is the requests held for a ready worker (a request held wakes the loop, as one queued does),
and a running worker is ``starting`` until its readiness path first answers 200, then ``ready`` with its outstanding
requests in flight, its last 200 as its last call (one that stops answering is ``silent`` after
``heartbeat_timeout_s``, and replaced), and idle since its last request ended; its cold start ends at that first 200.

Besides: the workers of an endpoint that is gone are stopped; a worker workload that ended, or moved to another host,
without its agent saying so, has its requests sent back by this loop (``worker_gone`` for each of its places the book
still knows); a worker that failed without ever running holds the endpoint's starts back for a doubling while
(``START_BACKOFF_S``), so one that cannot start is not asked for again every second. Every decision and its reason is
kept per endpoint (``status``) for the endpoint's answer.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from common.errors import IdlegridError, InvalidTransition, NotFound
from management.endpoints.autoscaler import Decision, QueueView, Worker, WorkerPhase, decide
from management.endpoints.pool import BalancedPool
from management.endpoints.requests import RequestBook, WorkerActivity
from management.endpoints.spec import EndpointRecord
from management.market.charges import cost_until
from management.market.money import parse_amount
from management.store.rentals import RentalRepo, rental_order
from management.workloads.book import WorkloadBook
from management.workloads.states import WorkloadState
from master.port import EndpointWorkerRef, RentalRecord, WorkloadRecord, WorkloadSpec

log = logging.getLogger(__name__)

W = WorkloadState
PERIOD_S = 1.0  # a tick at least this often
SPEND_WINDOW_S = 86_400.0  # the spend cap's window: any 24 hours
COLD_STARTS_KEPT = 20  # an endpoint's latest cold starts shown (its page, its answer's scale)
COLD_COUNTED_REMEMBERED = 10_000  # worker workloads whose cold start was counted, remembered so it is counted once
STOP_GRACE_S = 30.0  # a stopped worker's container: SIGTERM, this long to finish its requests' reports, SIGKILL
RENTAL_PAGE = 1000
START_BACKOFF_S = 5.0  # after a worker failed to start (never ran): no start for this long, doubled each time ...
MAX_START_BACKOFF_S = 300.0  # ... up to this; a worker that becomes ready ends it
MAX_REMEMBERED = 100_000  # workloads whose endpoint (or none) this loop remembers for the spend sums
_PLACED = frozenset({W.SCHEDULED, W.STARTING, W.PREEMPTED})


@dataclass(frozen=True, slots=True)
class EndpointScale:
    """What the last tick found and decided for one endpoint (shown in its answer)."""

    at: float
    workers: dict[str, int]  # by the autoscaler's phase (starting, ready), as the tick found them
    waiting: int  # requests queued
    started: int
    stopped: int
    desired: int
    why: str  # the decision's line
    may_scale_up: bool
    spent: int  # micro-units its workers cost in the last 24 hours (0 when it has no cap: not summed)
    daily_spend_cap: int | None  # micro-units, None: no cap
    # Its latest workers' cold starts (s), oldest first: from the worker asked for (its workload made) to its first
    # call to the Master (its handler up and taking requests), as this Master saw them.
    cold_starts: tuple[float, ...] = ()


Activity = dict[tuple[str, str], list[WorkerActivity]]  # (endpoint, worker id) -> its places the request book knows


class Endpoints(Protocol):
    """What the shell reads of the endpoints (management/services/endpoints.py ``EndpointsService``)."""

    async def list(self) -> builtins.list[EndpointRecord]: ...
    def worker_spec(self, record: EndpointRecord) -> WorkloadSpec: ...


def worker_of(rec: WorkloadRecord) -> EndpointWorkerRef:
    """The endpoint and worker a worker workload is (the shell reads only workloads that have one)."""
    if rec.endpoint_worker is None:
        raise ValueError(f"workload {rec.id} is not an endpoint's worker")
    return rec.endpoint_worker


def new_worker_id() -> str:
    return "wk-" + secrets.token_hex(8)


def spent(rentals: Iterable[RentalRecord], since: float, now: float) -> int:
    """What ``rentals`` cost between ``since`` and ``now`` (micro-units): each from its start (or ``since``) to its end
    (or ``now``), per second at its hosts' prices, as metering charges it (management/market/charges.py)."""
    total = 0
    for rental in rentals:
        end = now if rental.ended_at is None else min(rental.ended_at, now)
        if end > since:
            total += cost_until(rental, end) - cost_until(rental, max(since, rental.started_at))
    return total


class EndpointScaler:
    def __init__(
        self,
        book: WorkloadBook,
        requests: RequestBook,
        endpoints: Endpoints,
        rentals: RentalRepo,
        *,
        clock: Callable[[], float] = time.time,
        period_s: float = PERIOD_S,
        grace_s: float = STOP_GRACE_S,
        restart_s: float = 1.0,
        pool: BalancedPool | None = None,
    ) -> None:
        self._book = book
        self._pool = pool  # load-balanced endpoints' workers and held requests
        self._requests = requests
        self._endpoints = endpoints
        self._rentals = rentals
        self._clock = clock
        self.period_s = period_s
        self.grace_s = grace_s
        self.restart_s = restart_s
        self._status: dict[str, EndpointScale] = {}
        self._heard: dict[str, float] = {}  # worker workload id -> its worker's last call, once heard from
        self._cold: dict[str, deque[float]] = {}  # endpoint -> its latest workers' cold starts (s)
        self._cold_counted: OrderedDict[str, None] = OrderedDict()  # worker workload ids whose cold start is counted
        self._places: dict[str, tuple[str, str]] = {}  # worker workload id -> (endpoint, worker id), while open
        self._endpoint_of: dict[str, str | None] = {}  # workload id -> the endpoint it served (None: not a worker)
        self._backoff: dict[str, tuple[int, float, str]] = {}  # endpoint -> (workers failed to start, no start until, why)
        self._since: float | None = None  # the first tick's time: no worker's start clock runs from before it
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        requests.on_arrival(self._on_arrival)
        if pool is not None:
            pool.on_hold(self._on_arrival)

    # --- running (every fact is read again at each tick: the workloads, the request book, the endpoints, rentals) ---

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="endpoint scaler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    def wake(self) -> None:
        self._wake.set()

    def _on_arrival(self, endpoint_id: str) -> None:
        """A request queued: with no healthy worker there, nothing else will take it, so tick now."""
        last = self._status.get(endpoint_id)
        if last is None or not (last.workers.get("starting", 0) + last.workers.get("ready", 0)):
            self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.period_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("endpoint scaler tick failed; the next one runs in %.1f s", self.restart_s)
                await asyncio.sleep(self.restart_s)

    def status(self, endpoint_id: str) -> EndpointScale | None:
        """What the last tick found and decided for the endpoint; None before its first tick."""
        return self._status.get(endpoint_id)

    # --- one tick ---

    async def tick(self, now: float | None = None) -> dict[str, Decision]:
        """Decide and act for every endpoint at ``now`` (the clock's by default); answers each endpoint's decision."""
        now = self._clock() if now is None else now
        endpoints = {e.id: e for e in await self._endpoints.list()}
        workers: dict[str, list[WorkloadRecord]] = {}
        for rec in self._book.open_workloads():
            if rec.endpoint_worker is not None:
                workers.setdefault(rec.endpoint_worker.endpoint_id, []).append(rec)
        if self._since is None:
            self._since = now
        activity = self._activity()
        await self._send_back_the_lost(workers, activity, now)
        decisions: dict[str, Decision] = {}
        for endpoint_id, recs in workers.items():
            if endpoint_id not in endpoints:  # deleted: its workers stop
                for rec in recs:
                    await self._stop(rec, "its endpoint was deleted", now, activity)
                self._status.pop(endpoint_id, None)
        for endpoint_id, endpoint in endpoints.items():
            try:
                decisions[endpoint_id] = await self._scale(endpoint, workers.get(endpoint_id, []), activity, now)
            except (IdlegridError, ValueError) as exc:
                log.warning("endpoint %s not scaled: %s", endpoint_id, exc)
        for endpoint_id in [e for e in self._status if e not in endpoints]:
            del self._status[endpoint_id]
        for endpoint_id in [e for e in self._backoff if e not in endpoints]:
            del self._backoff[endpoint_id]
        return decisions

    def _activity(self) -> Activity:
        """Every worker the request book knows, by (endpoint, worker id): one pass a tick."""
        found: Activity = {}
        for activity in self._requests.workers_of():
            found.setdefault((activity.ref.endpoint_id, activity.ref.worker_id), []).append(activity)
        return found

    async def _scale(self, endpoint: EndpointRecord, recs: Sequence[WorkloadRecord], activity: Activity, now: float) -> Decision:
        policy = endpoint.spec.scaling.policy()
        pool = self._pool if endpoint.spec.load_balanced else None
        if pool is not None:
            holds = pool.held(endpoint.id)
            queue = QueueView(waiting=holds.count, oldest_waiting_since=holds.oldest_since)
            seen = [self._balanced_worker(rec, pool, now) for rec in recs]
        else:
            queued = self._requests.queued(endpoint.id)
            queue = QueueView(waiting=len(queued), oldest_waiting_since=min((r.submitted_at for r in queued), default=None))
            seen = [
                self._worker(rec, activity.get((endpoint.id, worker_of(rec).worker_id), []), policy.heartbeat_timeout_s, now)
                for rec in recs
            ]
        cap = parse_amount(endpoint.spec.daily_spend_cap) if endpoint.spec.daily_spend_cap is not None else None
        cost = await self._spent(endpoint, now) if cap is not None else 0
        may_scale_up = cap is None or cost < cap
        if any(w.phase is WorkerPhase.READY for w in seen):
            self._backoff.pop(endpoint.id, None)  # its workers start: the failures are behind it
        failed, until, failure = self._backoff.get(endpoint.id, (0, now, ""))
        held = now < until  # workers failed to start just now: a new one would most likely fail the same way
        decision = decide(policy, queue, seen, now, may_scale_up=may_scale_up and not held)
        by_worker = {worker_of(rec).worker_id: rec for rec in recs}
        for stop in decision.stop:
            rec = by_worker.get(stop.worker)
            if rec is not None:
                await self._stop(rec, f"stopped by its endpoint's autoscaler: {stop.reason.value}", now, activity)
        for _ in range(decision.start):
            await self._start(endpoint, now)
        phases = {"starting": 0, "ready": 0}
        for worker in seen:
            phases[worker.phase.value] = phases.get(worker.phase.value, 0) + 1
        why = decision.why
        if not may_scale_up:
            why = f"{why}; daily_spend_cap reached"
        elif held:
            why = f"{why}; no start for {until - now:.0f} s: {failed} worker(s) failed to start ({failure})"
        self._status[endpoint.id] = EndpointScale(
            at=now,
            workers=phases,
            waiting=queue.waiting,
            started=decision.start,
            stopped=len(decision.stop),
            desired=decision.desired,
            why=why,
            may_scale_up=may_scale_up,
            spent=cost,
            daily_spend_cap=cap,
            cold_starts=tuple(self._cold.get(endpoint.id, ())),
        )
        return decision

    def _worker(self, rec: WorkloadRecord, mine: Sequence[WorkerActivity], timeout_s: float, now: float) -> Worker:
        """The autoscaler's view of one worker workload (the module's text gives the phases); ``mine``: its places the
        request book knows; ``timeout_s``: the policy's ``heartbeat_timeout_s``."""
        ref = worker_of(rec)
        placed_at = self._placed_at(rec, now)
        if rec.state != W.RUNNING:
            self._heard.pop(rec.id, None)  # a new run's worker is heard from anew
        if rec.state == W.QUEUED:
            return Worker(id=ref.worker_id, phase=WorkerPhase.STARTING, since=now)
        if rec.state in _PLACED:
            return Worker(id=ref.worker_id, phase=WorkerPhase.STARTING, since=placed_at)
        if mine:
            self._heard[rec.id] = max(a.last_seen for a in mine)
            self._count_cold_start(rec, min((a.first_seen for a in mine if a.first_seen is not None), default=None))
        last_seen = self._heard.get(rec.id)
        if last_seen is None:  # running, its handler not heard from yet
            return Worker(id=ref.worker_id, phase=WorkerPhase.STARTING, since=placed_at)
        in_flight = sum(a.in_flight for a in mine)
        worked = [a.last_work for a in mine if a.last_work is not None]
        not_taking = [a.not_taking_since for a in mine]
        if mine and in_flight < ref.concurrency and now - last_seen <= timeout_s and None not in not_taking:
            # Heard from, with room for more, and no take under way for longer than the timeout: its takers are
            # stuck (the handler library always has one in a long poll while it has room). Replaced, as one silent.
            since = max(t for t in not_taking if t is not None)
            if now - since > timeout_s:
                return Worker(id=ref.worker_id, phase=WorkerPhase.UNHEALTHY, since=since, last_seen=last_seen)
        return Worker(
            id=ref.worker_id,
            phase=WorkerPhase.READY,
            since=rec.started_at if rec.started_at is not None else placed_at,
            in_flight=in_flight,
            last_seen=last_seen,
            idle_since=max(worked) if worked else None,
        )

    def _placed_at(self, rec: WorkloadRecord, now: float) -> float:
        # Its start clock runs from its placement, but never from before this loop's first tick: after a Master restart
        # or a takeover, a worker that ran before is not stuck for want of calls this Master has not had time to hear.
        return max(rec.scheduled_at if rec.scheduled_at is not None else rec.queued_at, self._since or now)

    def _balanced_worker(self, rec: WorkloadRecord, pool: BalancedPool, now: float) -> Worker:
        """A load-balanced endpoint's worker as the autoscaler sees it: its readiness and outstanding requests are the
        pool's (the module's text)."""
        ref = worker_of(rec)
        placed_at = self._placed_at(rec, now)
        if rec.state == W.QUEUED:
            return Worker(id=ref.worker_id, phase=WorkerPhase.STARTING, since=now)
        seen = pool.worker(ref.endpoint_id, rec.id) if rec.state == W.RUNNING else None
        if seen is None or seen.ok_at is None or seen.first_ready_at is None:
            return Worker(id=ref.worker_id, phase=WorkerPhase.STARTING, since=placed_at)
        self._count_cold_start(rec, seen.first_ready_at)
        return Worker(
            id=ref.worker_id,
            phase=WorkerPhase.READY,
            since=seen.first_ready_at,
            in_flight=seen.outstanding,
            last_seen=seen.ok_at,
            idle_since=seen.idle_since if seen.idle_since is not None else seen.first_ready_at,
        )

    def _count_cold_start(self, rec: WorkloadRecord, first: float | None) -> None:
        """The worker's cold start, once: from its workload made to its first call (``first``; in load-balanced mode
        its readiness path's first 200). Only for a worker made since this loop's first tick (a worker that ran before
        a restart or a takeover is heard from again, not started)."""
        if rec.id in self._cold_counted or self._since is None or rec.created_at < self._since:
            return
        if first is None:
            return
        self._cold_counted[rec.id] = None
        while len(self._cold_counted) > COLD_COUNTED_REMEMBERED:
            self._cold_counted.popitem(last=False)
        ref = worker_of(rec)
        self._cold.setdefault(ref.endpoint_id, deque(maxlen=COLD_STARTS_KEPT)).append(round(max(0.0, first - rec.created_at), 3))

    # --- acting ---

    async def _start(self, endpoint: EndpointRecord, now: float) -> WorkloadRecord:
        worker = EndpointWorkerRef(
            endpoint_id=endpoint.id, worker_id=new_worker_id(), concurrency=endpoint.spec.scaling.concurrency
        )
        rec = await self._book.submit(endpoint.account, self._endpoints.worker_spec(endpoint), now, endpoint_worker=worker)
        self._places[rec.id] = (endpoint.id, worker.worker_id)
        self._endpoint_of[rec.id] = endpoint.id
        log.info("endpoint worker asked for", extra={"endpoint": endpoint.id, "worker": worker.worker_id, "workload": rec.id})
        return rec

    async def _stop(self, rec: WorkloadRecord, reason: str, now: float, activity: Activity) -> None:
        """End the worker's workload at ``now`` (its rental ends there) and send its requests back to the queue."""
        ref = worker_of(rec)
        if self._pool is not None:
            self._pool.drop(ref.endpoint_id, rec.id)  # a load-balanced endpoint sends it nothing more
        try:
            await self._book.end(rec.id, "cancel", reason, now, grace_s=self.grace_s)
        except (InvalidTransition, NotFound) as exc:  # it ended meanwhile: its end is what counts
            log.info("endpoint worker %s not stopped: %s", rec.id, exc)
        for place in activity.pop((ref.endpoint_id, ref.worker_id), []):
            await self._requests.worker_gone(place.ref)
        self._forget(rec.id)

    def _forget(self, workload_id: str) -> None:
        self._heard.pop(workload_id, None)
        self._places.pop(workload_id, None)

    async def _send_back_the_lost(self, workers: dict[str, list[WorkloadRecord]], activity: Activity, now: float) -> None:
        """Workers whose workload ended, or whose container is no longer where the book last heard from it (moved to
        another host, or back in the queue): their requests go back to the queue now, without waiting for the book's
        silence rule. A worker that ended failed without ever running (never placed, or its container never started)
        holds the endpoint's starts back for a while (``START_BACKOFF_S``, doubled at each such failure), so a worker
        that cannot start is not asked for again every second."""
        open_now: dict[str, WorkloadRecord] = {rec.id: rec for recs in workers.values() for rec in recs}
        for workload_id, (endpoint_id, worker_id) in list(self._places.items()):
            rec = open_now.get(workload_id)
            hosts = {a.agent_id for a in rec.assignments} if rec is not None and rec.state != W.QUEUED else set()
            places = activity.get((endpoint_id, worker_id), [])
            for place in [p for p in places if p.ref.agent_id not in hosts]:
                await self._requests.worker_gone(place.ref)
                places.remove(place)
            if rec is None:
                self._forget(workload_id)
                await self._note_end(workload_id, endpoint_id, now)
        for workload_id, rec in open_now.items():
            ref = rec.endpoint_worker
            if ref is not None and workload_id not in self._places:  # a worker from before a restart
                self._places[workload_id] = (ref.endpoint_id, ref.worker_id)
                self._endpoint_of[workload_id] = ref.endpoint_id

    async def _note_end(self, workload_id: str, endpoint_id: str, now: float) -> None:
        try:
            ended = await self._book.get(workload_id)
        except NotFound:
            return
        if ended.state != W.FAILED or ended.started_at is not None:
            return
        failed = self._backoff.get(endpoint_id, (0, now, ""))[0] + 1
        wait_s = min(MAX_START_BACKOFF_S, START_BACKOFF_S * 2 ** (failed - 1))
        self._backoff[endpoint_id] = (failed, now + wait_s, ended.state_reason)
        log.warning(
            "an endpoint's worker failed to start; no start for %.0f s",
            wait_s,
            extra={"endpoint": endpoint_id, "workload": workload_id, "reason": ended.state_reason},
        )

    # --- the spend cap ---

    async def spent_24h(self, endpoint: EndpointRecord, now: float | None = None) -> int:
        """What the endpoint's workers cost in the last 24 hours (micro-units), as the spend cap counts it."""
        return await self._spent(endpoint, self._clock() if now is None else now)

    async def _spent(self, endpoint: EndpointRecord, now: float) -> int:
        """What the endpoint's workers cost in the last 24 hours: its account's rentals open or ended in that window
        whose workload was one of the endpoint's workers."""
        since = now - SPEND_WINDOW_S
        mine: list[RentalRecord] = []
        after: str | None = None
        while True:
            page = await self._rentals.list(account=endpoint.account, ended_since=since, after=after, limit=RENTAL_PAGE)
            for rental in page:
                if await self._served(rental.workload_id) == endpoint.id:
                    mine.append(rental)
            if len(page) < RENTAL_PAGE:
                break
            after = rental_order(page[-1].started_at, page[-1].id)
        return spent(mine, since, now)

    async def _served(self, workload_id: str) -> str | None:
        """The endpoint a workload was a worker of (None: an ordinary workload), read once per workload."""
        if workload_id not in self._endpoint_of:
            if len(self._endpoint_of) > MAX_REMEMBERED:
                self._endpoint_of.clear()
            try:
                rec = await self._book.get(workload_id)
            except NotFound:
                self._endpoint_of[workload_id] = None
            else:
                self._endpoint_of[workload_id] = rec.endpoint_worker.endpoint_id if rec.endpoint_worker is not None else None
        return self._endpoint_of[workload_id]

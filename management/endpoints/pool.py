"""Load-balanced endpoints' workers as the Master's proxy sees them (docs/endpoints.md, "Load-balanced mode"): which
workers are ready, how many requests each has outstanding, and the requests held while none is ready.

The choices are balancer.py's (pure): ``pick`` the ready worker with the fewest outstanding requests, ``admit`` or
refuse a request to hold, ``expired``. This is their shell:

- **Workers.** Every ``probe_period_s`` the pool reads the load-balanced endpoints and their running worker workloads
  (the autoscaler's, ``WorkloadRecord.endpoint_worker``), and asks each worker's ``readiness_path`` through the
  Master's tunnel to its ``http_port`` (``probe``, the links' shell: hosts never listen), each ask bounded by
  ``probe_timeout_s``. A worker is **ready** from its first 200 until ``unready_after`` asks in a row fail (any other
  status, no answer in time, no tunnel): then it leaves the pool (no request is sent to it) until it answers 200
  again. A ready worker is asked every ``ready_probe_s``; one not ready yet at every period, so a cold start is seen
  within a period of its server answering. A worker whose workload is no longer running leaves at once.
- **Requests.** ``acquire`` picks a ready worker and counts the request on it (a ``Lease``, given back by
  ``release``, once, whatever ended the request: its answer, an error, the client gone). With no ready worker it holds
  the request (``admit``): it waits, in arrival order, until a worker becomes ready, for at most the endpoint's
  ``max_hold_s`` (``HoldExpired``); past ``max_held`` waiting, a new one is refused at once (``HoldsFull``). A held
  request whose client goes away (its task cancelled) leaves the hold.
- **The autoscaler's view.** ``held(endpoint)`` is the endpoint's queue (how many are held, since when the oldest),
  and ``worker(workload)`` each worker's readiness and outstanding requests; a request held wakes the autoscaler at
  once (``on_hold``), so a burst from zero starts workers without waiting for its period.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from common.errors import IdlegridError
from management.endpoints.balancer import Admission, Backend, HoldLimits, admit, pick
from management.endpoints.spec import EndpointRecord
from management.workloads.states import WorkloadState
from master.port import Loop, WorkloadRecord, stop_loop

log = logging.getLogger(__name__)

PROBE_PERIOD_S = 0.5  # a worker not ready yet is asked this often
READY_PROBE_S = 2.0  # a ready one this often
PROBE_TIMEOUT_S = 3.0  # one ask, the tunnel's opening included
UNREADY_AFTER = 2  # failed asks in a row that take a ready worker out of the pool
RETRY_AFTER_S = 5  # what a refused request is told to wait (Retry-After)

# Asks ``path`` of the worker workload's ``port`` within ``timeout_s``; True for a 200. Never raises for the worker's
# fault (no tunnel, no answer, another status): False.
Probe = Callable[[str, int, str, float], Awaitable[bool]]


class HeldTooLong(IdlegridError):
    """Base of the two ways a request that found no ready worker is answered 503."""

    code = "no_ready_worker"
    retry_after_s = RETRY_AFTER_S


class HoldsFull(HeldTooLong):
    """As many requests are held as the endpoint's ``max_held``: this one is refused at once."""


class HoldExpired(HeldTooLong):
    """A held request waited the endpoint's ``max_hold_s`` and no worker became ready."""


class Endpoints(Protocol):
    async def list(self) -> builtins.list[EndpointRecord]: ...


@dataclass(slots=True)
class PoolWorker:
    """One running worker of a load-balanced endpoint."""

    workload_id: str
    endpoint_id: str
    port: int
    ready: bool = False
    first_ready_at: float | None = None  # its first 200 (its cold start ends there)
    ok_at: float | None = None  # its last 200
    asked_at: float | None = None
    failures: int = 0  # asks failed in a row
    outstanding: int = 0
    idle_since: float | None = None  # nothing outstanding since (None: never had a request)


@dataclass(slots=True)
class Lease:
    """One request counted on one worker until ``BalancedPool.release``."""

    endpoint_id: str
    workload_id: str
    port: int
    released: bool = False


@dataclass(slots=True)
class _Hold:
    since: float
    future: asyncio.Future[Lease]


@dataclass(slots=True)
class _Endpoint:
    workers: dict[str, PoolWorker] = field(default_factory=dict)  # by workload id
    held: collections.deque[_Hold] = field(default_factory=collections.deque)
    last_pick: str = ""


@dataclass(frozen=True, slots=True)
class HeldView:
    count: int
    oldest_since: float | None


class BalancedPool:
    """The load-balanced endpoints' workers and held requests (``Services.balancer``)."""

    def __init__(
        self,
        workloads: Callable[[], Iterable[WorkloadRecord]],
        endpoints: Endpoints,
        probe: Probe,
        *,
        clock: Callable[[], float] = time.time,
        probe_period_s: float = PROBE_PERIOD_S,
        ready_probe_s: float = READY_PROBE_S,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        unready_after: int = UNREADY_AFTER,
        restart_s: float = 1.0,
    ) -> None:
        self._workloads = workloads  # the workload book's open workloads
        self._endpoints = endpoints
        self._probe = probe
        self._clock = clock
        self._ready_probe_s = ready_probe_s
        self._probe_timeout_s = probe_timeout_s
        self._unready_after = unready_after
        self._state: dict[str, _Endpoint] = {}
        self._on_hold: list[Callable[[str], None]] = []
        self._loop = Loop("endpoint readiness", probe_period_s, self.refresh, restart_s)
        self._task: asyncio.Task[None] | None = None

    # --- requests ----------------------------------------------------------------------------------------------

    def on_hold(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(endpoint id)`` when a request is held (the autoscaler ticks at once)."""
        self._on_hold.append(listener)

    async def acquire(self, endpoint: EndpointRecord) -> Lease:
        """A ready worker for one request of ``endpoint``, counted on it until ``release``; held while none is ready
        (HoldsFull, HoldExpired: the caller answers 503)."""
        state = self._state.setdefault(endpoint.id, _Endpoint())
        lease = self._take(endpoint.id, state)
        if lease is not None:
            return lease
        limits = endpoint.spec.hold_limits()
        if admit(len(state.held), limits) is Admission.REFUSE:
            raise HoldsFull(
                f"endpoint {endpoint.id} has no ready worker and already holds {len(state.held)} requests "
                f"(its max_held); try again shortly"
            )
        hold = _Hold(self._clock(), asyncio.get_running_loop().create_future())
        state.held.append(hold)
        for listener in self._on_hold:
            listener(endpoint.id)
        return await self._wait(endpoint.id, state, hold, limits)

    async def _wait(self, endpoint_id: str, state: _Endpoint, hold: _Hold, limits: HoldLimits) -> Lease:
        handed = False
        try:
            async with asyncio.timeout(limits.max_hold_s):
                lease = await asyncio.shield(hold.future)
            handed = True
            return lease
        except TimeoutError:
            raise HoldExpired(
                f"endpoint {endpoint_id} had no ready worker within {limits.max_hold_s:g} s (its max_hold_s): "
                "its workers may still be starting; try again shortly"
            ) from None
        finally:
            with contextlib.suppress(ValueError):
                state.held.remove(hold)
            if not handed:  # timed out, ended or the client went away: a worker handed meanwhile is given back
                future = hold.future
                if not future.done():
                    future.cancel()
                elif not future.cancelled() and future.exception() is None:
                    self.release(future.result())

    def _take(self, endpoint_id: str, state: _Endpoint) -> Lease | None:
        backends = [Backend(w.workload_id, w.ready, w.outstanding) for w in state.workers.values()]
        chosen = pick(backends, state.last_pick)
        if chosen is None:
            return None
        state.last_pick = chosen
        worker = state.workers[chosen]
        worker.outstanding += 1
        return Lease(endpoint_id, chosen, worker.port)

    def release(self, lease: Lease) -> None:
        """The request ended (answered, failed or its client gone): it no longer counts on its worker. Once."""
        if lease.released:
            return
        lease.released = True
        state = self._state.get(lease.endpoint_id)
        worker = state.workers.get(lease.workload_id) if state is not None else None
        if worker is not None and worker.outstanding > 0:
            worker.outstanding -= 1
            if worker.outstanding == 0:
                worker.idle_since = self._clock()

    def failed(self, lease: Lease) -> None:
        """Its worker could not be reached for the request (no tunnel, no connection): out of the pool until its
        readiness path answers 200 again."""
        state = self._state.get(lease.endpoint_id)
        worker = state.workers.get(lease.workload_id) if state is not None else None
        if worker is not None:
            worker.ready = False
            worker.failures = max(worker.failures, self._unready_after)

    def _serve_holds(self, endpoint_id: str, state: _Endpoint) -> None:
        """Held requests, oldest first, each to a ready worker by the balancer's pick."""
        while state.held:
            hold = state.held[0]
            if hold.future.done():
                state.held.popleft()
                continue
            lease = self._take(endpoint_id, state)
            if lease is None:
                return
            state.held.popleft()
            hold.future.set_result(lease)

    # --- what the autoscaler reads -----------------------------------------------------------------------------

    def held(self, endpoint_id: str) -> HeldView:
        state = self._state.get(endpoint_id)
        if state is None or not state.held:
            return HeldView(0, None)
        return HeldView(len(state.held), min(h.since for h in state.held))

    def worker(self, endpoint_id: str, workload_id: str) -> PoolWorker | None:
        state = self._state.get(endpoint_id)
        return state.workers.get(workload_id) if state is not None else None

    def drop(self, endpoint_id: str, workload_id: str) -> None:
        """A worker being stopped: no request is sent to it from now on."""
        state = self._state.get(endpoint_id)
        if state is not None:
            state.workers.pop(workload_id, None)

    # --- readiness ----------------------------------------------------------------------------------------------

    async def refresh(self) -> None:
        """One pass: the workers running now, each asked its readiness path when due, held requests served."""
        candidates = [r for r in self._workloads() if r.endpoint_worker is not None and r.state == WorkloadState.RUNNING]
        if not candidates and not self._state:
            return  # no endpoint's worker runs and nothing is held: the endpoints need not be read (twice a second)
        balanced = {e.id: e for e in await self._endpoints.list() if e.spec.load_balanced}
        running: dict[str, set[str]] = {endpoint_id: set() for endpoint_id in balanced}
        for rec in candidates:
            ref = rec.endpoint_worker
            if ref is None or ref.endpoint_id not in balanced:
                continue
            running[ref.endpoint_id].add(rec.id)
            state = self._state.setdefault(ref.endpoint_id, _Endpoint())
            if rec.id not in state.workers:
                state.workers[rec.id] = PoolWorker(rec.id, ref.endpoint_id, balanced[ref.endpoint_id].spec.http_port)
        for endpoint_id, state in list(self._state.items()):
            for workload_id in [w for w in state.workers if w not in running.get(endpoint_id, ())]:
                del state.workers[workload_id]
            if endpoint_id not in balanced:
                why = f"endpoint {endpoint_id} was deleted, or is no longer load-balanced"
                _end_holds(state, why)  # its held requests end
            if not state.workers and not state.held:
                del self._state[endpoint_id]  # nothing to keep (but whom it picked last, which a new pick can forget)
        now = self._clock()
        due = [
            (balanced[w.endpoint_id], w)
            for state in self._state.values()
            for w in state.workers.values()
            if w.endpoint_id in balanced and (not w.ready or w.asked_at is None or now - w.asked_at >= self._ready_probe_s)
        ]
        if due:
            await asyncio.gather(*(self._ask(endpoint, worker) for endpoint, worker in due))
        for endpoint_id, state in self._state.items():
            self._serve_holds(endpoint_id, state)

    async def _ask(self, endpoint: EndpointRecord, worker: PoolWorker) -> None:
        try:
            async with asyncio.timeout(self._probe_timeout_s):
                ok = await self._probe(worker.workload_id, worker.port, endpoint.spec.readiness_path, self._probe_timeout_s)
        except TimeoutError:
            ok = False
        now = self._clock()
        worker.asked_at = now
        if ok:
            if not worker.ready:
                log.info("endpoint worker ready", extra={"endpoint": endpoint.id, "workload": worker.workload_id})
            worker.ready, worker.failures, worker.ok_at = True, 0, now
            if worker.first_ready_at is None:
                worker.first_ready_at = now
            return
        worker.failures += 1
        if worker.ready and worker.failures >= self._unready_after:
            worker.ready = False
            log.warning(
                "endpoint worker left the pool: its readiness path did not answer 200",
                extra={"endpoint": endpoint.id, "workload": worker.workload_id, "failures": worker.failures},
            )

    def start(self) -> None:
        if self._task is None:
            self._task = self._loop.start()

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_loop(task)
        for state in self._state.values():
            _end_holds(state, "the Master is stopping")


def _end_holds(state: _Endpoint, why: str) -> None:
    while state.held:
        future = state.held.popleft().future
        if not future.done():
            future.set_exception(HoldExpired(why))

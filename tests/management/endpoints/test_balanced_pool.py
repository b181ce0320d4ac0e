"""Load-balanced endpoints' pool and the autoscaler reading it (management/endpoints/pool.py, scaler.py;
docs/endpoints.md "Load-balanced mode"), on the same real Master as test_scaler.py: the composition's parts over
SQLite, hosts played by frames, every loop driven by hand at the test's times. The pool's readiness probe (through the
Master's tunnels in the composition) is the one thing played here: a table of which workers answer 200, as the
tunnel's end-to-end test (tests/e2e/test_endpoint_balanced.py) runs it for real.

Rules shown: a request at zero workers is held and wakes the autoscaler, which counts it as waiting and starts a
worker; it is served by the first worker whose readiness path answers, and the cold start ends there; requests go to
the least outstanding ready worker, ties rotating, never to one not ready; a ready worker that stops answering leaves
the pool at once and is replaced once silent; holds are bounded in number and time; a client gone from a held request
leaves the hold; leases are given back once; idle workers go back to zero.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from management.endpoints.pool import BalancedPool, HoldExpired, HoldsFull, PoolWorker
from management.endpoints.spec import EndpointRecord, EndpointScaling, EndpointSpec
from master.port import ReplicaSpec
from tests.management.endpoints.test_scaler import IMAGE, Grid, grid, running, workers  # noqa: F401  (grid: the fixture)


def pool_of(g: Grid) -> BalancedPool:
    pool = dict(g.composition.loops)["endpoint readiness"]
    assert isinstance(pool, BalancedPool)
    return pool


class Readiness:
    """The probe's answers: a worker workload answers 200 while it is in ``ready``."""

    def __init__(self) -> None:
        self.ready: set[str] = set()
        self.asked: list[tuple[str, int, str]] = []

    async def __call__(self, workload_id: str, port: int, path: str, timeout_s: float) -> bool:
        self.asked.append((workload_id, port, path))
        return workload_id in self.ready


@pytest.fixture
def probe(grid: Grid) -> Readiness:  # noqa: F811
    readiness = Readiness()
    pool = pool_of(grid)
    pool._probe = readiness  # noqa: SLF001  (the tunnel's probe, played)
    pool._clock = lambda: grid.clock[0]  # noqa: SLF001  (the test's time, as the scaler's)
    pool._ready_probe_s = 0.0  # noqa: SLF001  (every refresh asks every worker: the test's refreshes are its clock)
    return readiness


async def balanced(g: Grid, **fields: Any) -> EndpointRecord:
    scaling = fields.pop("scaling", {})
    spec = EndpointSpec(
        name="llm",
        image=IMAGE,
        command=["python", "-m", "server"],
        replica=ReplicaSpec(gpus=1),
        scaling=EndpointScaling(**scaling),
        mode="load_balanced",
        http_port=8000,
        readiness_path="/health",
        **fields,
    )
    return await g.composition.services.endpoints.create("alice", spec)


def worker_in(pool: BalancedPool, ep: EndpointRecord, workload_id: str) -> PoolWorker:
    found = pool.worker(ep.id, workload_id)
    assert found is not None
    return found


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_request_at_zero_workers_is_held_counted_as_waiting_and_served_by_the_first_ready_worker(grid, probe):  # noqa: F811
    g, pool = grid, pool_of(grid)
    ep = await balanced(g, scaling={"max_workers": 2, "idle_timeout_s": 30.0})
    woken: list[str] = []
    pool.on_hold(woken.append)
    t0 = g.at(g.now)
    held = asyncio.ensure_future(pool.acquire(ep))
    await settle()
    assert not held.done() and woken == [ep.id]  # held, and the autoscaler woken at once
    assert pool.held(ep.id).count == 1 and pool.held(ep.id).oldest_since == t0

    decision = (await g.scaler.tick(g.at(t0 + 1)))[ep.id]
    assert decision.start == 1 and g.scaler.status(ep.id).waiting == 1  # the held request is the queue
    [rec] = workers(g, ep.id)
    assert rec.spec.ports == [8000]
    [ran] = await running(g, [rec])
    await pool.refresh()  # running, its server not answering yet: still starting, the request still held
    assert probe.asked == [(ran.id, 8000, "/health")] and not held.done()
    await g.scaler.tick(g.at(t0 + 2))
    assert g.scaler.status(ep.id).workers == {"starting": 1, "ready": 0}

    probe.ready.add(ran.id)
    g.at(t0 + 3)
    await pool.refresh()
    lease = await asyncio.wait_for(held, 5.0)  # a hang guard, not a timing
    assert (lease.workload_id, lease.port) == (ran.id, 8000) and pool.held(ep.id).count == 0
    await g.scaler.tick(g.at(t0 + 4))
    status = g.scaler.status(ep.id)
    assert status.workers == {"starting": 0, "ready": 1} and status.waiting == 0
    assert status.cold_starts == (round(t0 + 3 - ran.created_at, 3),)  # to its first 200
    assert worker_in(pool, ep, ran.id).outstanding == 1

    # Busy (its request outstanding) it is never idle; done, it goes after idle_timeout_s, counted from then. Each
    # tick follows a refresh, as the pool asks its readiness every 2 s (its last 200 is its last call).
    g.at(t0 + 100)
    await pool.refresh()
    assert (await g.scaler.tick(t0 + 100))[ep.id].stop == ()
    pool.release(lease)
    pool.release(lease)  # once: a second release changes nothing
    assert worker_in(pool, ep, ran.id).outstanding == 0
    for t in (t0 + 110, t0 + 129):
        g.at(t)
        await pool.refresh()
        assert (await g.scaler.tick(t))[ep.id].stop == ()
    g.at(t0 + 131)
    await pool.refresh()
    decision = (await g.scaler.tick(t0 + 131))[ep.id]
    assert [s.reason.value for s in decision.stop] == ["idle"] and workers(g, ep.id) == []
    assert pool.worker(ep.id, ran.id) is None  # dropped at the stop: sent nothing more


async def test_requests_go_to_the_least_outstanding_ready_worker_never_to_one_not_ready(grid, probe):  # noqa: F811
    g, pool = grid, pool_of(grid)
    ep = await balanced(g, scaling={"min_workers": 3, "max_workers": 3})
    await g.scaler.tick(g.at(g.now + 1))
    ran = await running(g, workers(g, ep.id))
    a, b, c = sorted(w.id for w in ran)
    probe.ready |= {a, b}  # c's server never answers its readiness path
    await pool.refresh()
    leases = [await pool.acquire(ep) for _ in range(6)]
    assert [lease.workload_id for lease in leases] == [a, b, a, b, a, b]  # ties rotate; c gets nothing
    pool.release(leases[0])
    pool.release(leases[2])  # a holds 1 now, b 3: the next two go to a
    assert [(await pool.acquire(ep)).workload_id for _ in range(2)] == [a, a]
    probe.ready.add(c)
    await pool.refresh()
    assert (await pool.acquire(ep)).workload_id == c  # ready now, and the least busy


async def test_a_ready_worker_that_stops_answering_leaves_the_pool_and_is_replaced_once_silent(grid, probe):  # noqa: F811
    g, pool = grid, pool_of(grid)
    ep = await balanced(g, scaling={"min_workers": 1, "max_workers": 1})
    await g.scaler.tick(g.at(g.now + 1))
    [ran] = await running(g, workers(g, ep.id))
    probe.ready.add(ran.id)
    t0 = g.at(g.now + 1)
    await pool.refresh()
    assert (await pool.acquire(ep)).workload_id == ran.id
    probe.ready.clear()
    await pool.refresh()  # one failure: still in the pool (a blip)
    assert worker_in(pool, ep, ran.id).ready
    await pool.refresh()  # two in a row: out
    assert not worker_in(pool, ep, ran.id).ready
    with pytest.raises(HoldsFull):
        await pool.acquire(msgspec_replace(ep, max_held=0))  # nothing ready: held, or here refused at once
    assert (await g.scaler.tick(g.at(t0 + 29)))[ep.id].stop == ()
    decision = (await g.scaler.tick(g.at(t0 + 31)))[ep.id]  # its last 200 over heartbeat_timeout_s (30 s) ago
    assert [s.reason.value for s in decision.stop] == ["silent"] and decision.start == 1


async def test_holds_are_bounded_in_number_and_time_and_a_client_gone_leaves_the_hold(grid, probe):  # noqa: F811
    g, pool = grid, pool_of(grid)
    ep = await balanced(g, max_held=2, max_hold_s=0.0, scaling={"max_workers": 0})
    with pytest.raises(HoldExpired, match="max_hold_s"):
        await pool.acquire(ep)  # a zero hold expires at once
    assert pool.held(ep.id).count == 0
    ep = msgspec_replace(ep, max_hold_s=600.0)
    first, second = asyncio.ensure_future(pool.acquire(ep)), asyncio.ensure_future(pool.acquire(ep))
    await settle()
    assert pool.held(ep.id).count == 2
    with pytest.raises(HoldsFull, match="max_held"):
        await pool.acquire(ep)
    first.cancel()  # its client went away
    await settle()
    assert pool.held(ep.id).count == 1
    third = asyncio.ensure_future(pool.acquire(ep))  # room again
    await settle()
    assert pool.held(ep.id).count == 2
    await g.composition.services.endpoints.delete(ep.id, account="alice")
    await pool.refresh()  # a deleted endpoint's held requests end, saying so
    for task in (second, third):
        with pytest.raises(HoldExpired, match="deleted"):
            await task


async def test_a_held_request_handed_a_worker_as_its_client_leaves_gives_it_back(grid, probe):  # noqa: F811
    g, pool = grid, pool_of(grid)
    ep = await balanced(g, scaling={"max_workers": 1})
    held = asyncio.ensure_future(pool.acquire(ep))
    await settle()
    await g.scaler.tick(g.at(g.now + 1))
    [ran] = await running(g, workers(g, ep.id))
    probe.ready.add(ran.id)
    await pool.refresh()  # the worker is handed to the held request ...
    held.cancel()  # ... whose client leaves before it resumes
    with pytest.raises(asyncio.CancelledError):
        await held
    assert worker_in(pool, ep, ran.id).outstanding == 0


def msgspec_replace(ep: EndpointRecord, **fields: Any) -> EndpointRecord:
    """The endpoint with other spec fields, as the pool reads it (the pool reads the record it is given)."""
    return msgspec.structs.replace(ep, spec=msgspec.structs.replace(ep.spec, **fields))

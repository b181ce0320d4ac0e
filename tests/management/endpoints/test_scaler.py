"""The autoscaler's shell on a real Master (management/endpoints/scaler.py, docs/endpoints.md "The autoscaler's
shell"): the composition's parts over a Master on SQLite, its hosts played by frames on a relay link
(tests/master/linked.py). The test drives every loop by hand (the scaler's tick, the scheduler's cycle, the meter's
tick) at times it chooses, earlier than the wall clock so that the hosts' real heartbeats never cut a charge short;
no assertion waits on time.

Rules shown: a burst from zero starts the workers ``decide`` asks for, each a workload whose container gets its own
token, placed on a host that holds the image; the workers' calls reach the book through the Master; idle workers go
to zero after ``idle_timeout_s``; a deleted endpoint's workers stop; a silent worker is replaced and its rental ends at
the tick that found it; the daily spend cap stops scale-up (and says so in the endpoint's answer); a renter cannot
submit a workload posing as a worker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from common.wire import Command, CommandResult, WorkerCall, WorkerOp
from management.app import Composition, compose
from management.endpoints.requests import RequestBook
from management.endpoints.scaler import EndpointScaler
from management.endpoints.spec import EndpointRecord, EndpointScaling, EndpointSpec
from management.market.charges import cost_until
from management.market.market import Market
from management.market.money import parse_amount
from management.store import rental_repo
from management.views.endpoints import endpoint_view
from management.workloads.runner import SchedulerLoop
from master.accounts import AccountRole
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.port import EndpointWorkerRef, ReplicaSpec, WorkerRef, WorkloadRecord, WorkloadSpec
from tests.management.hosts import api_key
from tests.master.linked import connect, gpus, relay, relay_link, to_agent
from tests.master.test_worker_calls import _answer

IMAGE = "ghcr.io/acme/echo:1"
PRICE = "3.6"  # per GPU-hour: 1,000 micro-units a second


@dataclass
class Grid:
    master: Master
    link: AccessLink
    composition: Composition
    scaler: EndpointScaler
    scheduler: SchedulerLoop
    requests: RequestBook
    market: Market
    clock: list[float]  # the book's and the loops' time, set by the test

    @property
    def now(self) -> float:
        return self.clock[0]

    def at(self, t: float) -> float:
        self.clock[0] = t
        return t


@pytest.fixture
async def grid(tmp_path: Path) -> AsyncIterator[Grid]:
    master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0, default_price=PRICE))
    await master.start()
    await master.accounts.ensure("alice", AccountRole.RENTER)
    link = relay_link()
    await connect(master, link, "agt-cold", gpus(4, prefix="GPU-cold"), runtime="docker", isolation="container")
    await connect(master, link, "agt-warm", gpus(2, prefix="GPU-warm"), runtime="docker", isolation="container", images=[IMAGE])
    composition = compose(master)
    await composition.load()
    loops, state = dict(composition.loops), dict(composition.state)
    scaler, scheduler, market, requests = (
        loops["endpoint scaler"],
        loops["scheduler"],
        loops["market"],
        state["endpoint requests"],
    )
    assert isinstance(scaler, EndpointScaler) and isinstance(scheduler, SchedulerLoop)
    assert isinstance(market, Market) and isinstance(requests, RequestBook)
    clock = [time.time() - 3600.0]  # an hour behind the wall clock: the hosts' real heartbeats are all "later"
    requests._clock = lambda: clock[0]  # noqa: SLF001  (the book's clock, as the tests of the book drive it)
    scheduler._clock = lambda: clock[0]  # noqa: SLF001
    await composition.services.market.credit("alice", parse_amount("100"), "top-up", key="top-up-1")
    yield Grid(master, link, composition, scaler, scheduler, requests, market, clock)
    await composition.stop()
    await master.stop()


async def endpoint(g: Grid, **scaling: Any) -> EndpointRecord:
    cap = scaling.pop("daily_spend_cap", None)
    spec = EndpointSpec(
        name="echo",
        image=IMAGE,
        command=["python", "handler.py"],
        replica=ReplicaSpec(gpus=1),
        scaling=EndpointScaling(**scaling),
        daily_spend_cap=cap,
    )
    return await g.composition.services.endpoints.create("alice", spec)


def workers(g: Grid, endpoint_id: str) -> list[WorkloadRecord]:
    return [
        w
        for w in g.scheduler.book.open_workloads()
        if w.endpoint_worker is not None and w.endpoint_worker.endpoint_id == endpoint_id
    ]


def creates(g: Grid) -> list[Command]:
    return [
        f
        for agent in ("agt-cold", "agt-warm")
        for f in to_agent(g.link, agent)
        if isinstance(f, Command) and f.body.kind == "create_container"
    ]


async def running(g: Grid, recs: list[WorkloadRecord]) -> list[WorkloadRecord]:
    """Place the workers, their hosts report the creates done, and they run (the meter opens their rentals)."""
    await g.scheduler.cycle()
    placed = [await g.scheduler.book.get(w.id) for w in recs]
    for rec in placed:
        for a in rec.assignments:
            await relay(g.master, g.link, a.agent_id, CommandResult(id=a.command_id, ok=True, result={"id": a.container}))
    await g.scheduler.cycle()
    ran = [await g.scheduler.book.get(w.id) for w in recs]
    assert {w.state for w in ran} == {"running"}, [(w.id, w.state, w.state_reason) for w in ran]
    await g.market.meter.tick(g.now)
    return ran


def worker_of(rec: WorkloadRecord) -> EndpointWorkerRef:
    assert rec.endpoint_worker is not None
    return rec.endpoint_worker


def ref(rec: WorkloadRecord) -> WorkerRef:
    assert rec.endpoint_worker is not None
    return WorkerRef(rec.endpoint_worker.endpoint_id, rec.endpoint_worker.worker_id, rec.assignments[0].agent_id)


async def poll(g: Grid, rec: WorkloadRecord) -> None:
    """What a worker with nothing to do does (its library's heartbeat and long poll), at the test's time: here a take
    that answers at once."""
    await g.requests.heartbeat(ref(rec), [])
    assert await g.requests.take(ref(rec), 0.0) is None


async def call(g: Grid, rec: WorkloadRecord, op: WorkerOp, call_id: str, **fields: Any) -> Any:
    """The worker's call through its host's link and the Master (which knows the worker from its create)."""
    assert rec.endpoint_worker is not None
    a = rec.assignments[0]
    frame = WorkerCall(
        call_id=call_id,
        container=a.container,
        endpoint_id=rec.endpoint_worker.endpoint_id,
        worker_id=rec.endpoint_worker.worker_id,
        op=op,
        **fields,
    )
    await relay(g.master, g.link, a.agent_id, frame)
    return await _answer(g.link, a.agent_id, call_id)


async def test_a_burst_from_zero_starts_the_workers_decide_asks_for_each_with_its_own_token_on_the_warm_host_first(grid):
    g = grid
    ep = await endpoint(g, max_workers=3, concurrency=2)
    assert await g.scaler.tick(g.at(g.now)) and workers(g, ep.id) == []  # nothing waits: nothing starts
    for i in range(5):
        await g.requests.submit(ep.id, {"n": i}, account="alice")
    decision = (await g.scaler.tick(g.at(g.now + 1)))[ep.id]
    assert decision.start == 3  # ceil(5 / 2)
    started = workers(g, ep.id)
    assert len(started) == 3 and {w.account for w in started} == {"alice"}
    assert {w.spec.image for w in started} == {IMAGE} and {worker_of(w).concurrency for w in started} == {2}
    assert (await g.scaler.tick(g.at(g.now + 1)))[ep.id].start == 0  # starting workers count: no second round

    ran = await running(g, started)
    bodies = [msgspec.to_builtins(c.body.spec)["endpoint_worker"] for c in creates(g)]
    assert sorted(b["worker_id"] for b in bodies) == sorted(worker_of(w).worker_id for w in started)
    assert {b["endpoint_id"] for b in bodies} == {ep.id} and len({b["token"] for b in bodies}) == 3
    hosts = sorted(w.assignments[0].agent_id for w in ran)
    assert hosts == ["agt-cold", "agt-warm", "agt-warm"]  # the warm host's two GPUs first, at the same price

    # A worker's calls reach the book through the Master: it takes a request and finishes it.
    g.master.serve_worker_calls(g.requests)
    taken = await call(g, ran[0], WorkerOp.TAKE, "take-1", wait_s=0.0)
    assert taken.status == 200 and taken.body["attempt"] == 1
    done = await call(g, ran[0], WorkerOp.RESULT, "result-1", request_id=taken.body["id"], payload={"ok": True})
    assert done.status == 204
    status = g.scaler.status(ep.id)
    assert status is not None and status.workers == {"starting": 3, "ready": 0}
    await g.scaler.tick(g.at(g.now + 1))
    assert g.scaler.status(ep.id).workers == {"starting": 2, "ready": 1}  # heard from: ready


async def test_a_request_at_an_endpoint_with_no_worker_wakes_the_scaler_at_once(grid):
    g = grid
    ep = await endpoint(g, max_workers=1)
    g.scaler.period_s = 3600.0  # only the arrival can wake it within the test
    await g.scaler.tick()
    submitted = asyncio.Event()
    g.scheduler.book.subscribe(lambda what, rec: submitted.set() if what == "submitted" else None)
    g.scaler.start()
    await g.requests.submit(ep.id, {"n": 1}, account="alice")
    await asyncio.wait_for(submitted.wait(), 10.0)  # a hang guard, not a timing: the period is an hour
    assert len(workers(g, ep.id)) == 1


async def test_idle_workers_go_to_zero_after_idle_timeout_counted_from_their_last_work(grid):
    g = grid
    ep = await endpoint(g, max_workers=2, idle_timeout_s=60.0)
    for i in range(2):
        await g.requests.submit(ep.id, {"n": i}, account="alice")
    await g.scaler.tick(g.at(g.now + 1))
    ran = await running(g, workers(g, ep.id))
    t0 = g.now
    taken = [await g.requests.take(ref(w), 0.0) for w in ran]
    g.at(t0 + 30)
    for w, request in zip(ran, taken, strict=True):  # each answers its request 30 s after it started
        assert request is not None
        await g.requests.result(ref(w), request.id, {"ok": True})
    for t in (t0 + 50, t0 + 70, t0 + 89):  # they poll every 20 s: never silent; idle for less than 60 s
        g.at(t)
        for w in ran:
            await poll(g, w)
        decision = (await g.scaler.tick(t))[ep.id]
        assert decision.stop == () and len(workers(g, ep.id)) == 2, t - t0
    g.at(t0 + 90)
    for w in ran:
        await poll(g, w)
    decision = (await g.scaler.tick(t0 + 90))[ep.id]
    assert sorted(s.reason.value for s in decision.stop) == ["idle", "idle"] and decision.start == 0
    assert workers(g, ep.id) == []
    ended = [await g.scheduler.book.get(w.id) for w in ran]
    assert {(w.state, w.state_reason) for w in ended} == {("cancelled", "stopped by its endpoint's autoscaler: idle")}
    assert {w.finished_at for w in ended} == {t0 + 90}


async def test_a_deleted_endpoints_workers_stop(grid):
    g = grid
    ep = await endpoint(g, min_workers=2, max_workers=2)
    await g.scaler.tick(g.at(g.now + 1))
    ran = await running(g, workers(g, ep.id))
    await g.composition.services.endpoints.delete(ep.id, account="alice")
    assert (await g.scaler.tick(g.at(g.now + 1))) == {}
    ended = [await g.scheduler.book.get(w.id) for w in ran]
    assert {(w.state, w.state_reason) for w in ended} == {("cancelled", "its endpoint was deleted")}
    assert g.scaler.status(ep.id) is None


async def test_a_silent_worker_is_replaced_and_its_charge_ends_at_the_tick_that_found_it(grid):
    g = grid
    ep = await endpoint(g, min_workers=1, max_workers=1)
    await g.scaler.tick(g.at(g.now + 1))
    (worker,) = await running(g, workers(g, ep.id))
    taken_at = g.now
    await g.requests.submit(ep.id, {"n": 1}, account="alice")
    held = await g.requests.take(ref(worker), 0.0)  # it takes a request, then falls silent
    assert held is not None
    assert (await g.scaler.tick(g.at(taken_at + 30)))[ep.id].stop == ()  # 30 s: within heartbeat_timeout_s

    detected = g.at(taken_at + 31)
    decision = (await g.scaler.tick(detected))[ep.id]
    assert [s.reason.value for s in decision.stop] == ["silent"] and decision.start == 1
    stuck = await g.scheduler.book.get(worker.id)
    assert (stuck.state, stuck.finished_at) == ("cancelled", detected)
    (replacement,) = workers(g, ep.id)
    assert replacement.id != worker.id
    back = await g.requests.status(held.id)
    assert back is not None and (back.state, back.attempt) == ("queued", 2)  # its request went back to the queue

    await g.market.meter.tick(g.at(detected + 600))  # metered long after: the charge still ends at the detection
    (rental,) = await rental_repo(g.master.store).list(workload_id=worker.id)
    assert rental.ended_at == detected
    charged = await g.market.ledger.rental_entries(rental.id)
    paid = -sum(line.amount for entry in charged for line in entry.lines if line.account == "renter:alice")
    assert paid == cost_until(rental, detected) == 1_000 * int(detected - rental.started_at)


async def test_the_daily_spend_cap_stops_scale_up_and_the_endpoint_says_so(grid):
    g = grid
    ep = await endpoint(g, max_workers=4, target_queue_delay_s=1.0, daily_spend_cap="0.1")  # 100 worker-seconds
    await g.requests.submit(ep.id, {"n": 0}, account="alice")
    await g.scaler.tick(g.at(g.now + 1))
    (first,) = await running(g, workers(g, ep.id))
    taken = await g.requests.take(ref(first), 0.0)
    assert taken is not None
    t0 = g.now
    for i in range(3):  # more work waits past the delay target: the scaler would add three workers
        await g.requests.submit(ep.id, {"n": i + 1}, account="alice")
    g.at(t0 + 150)
    await g.requests.heartbeat(ref(first), [taken.id])
    decision = (await g.scaler.tick(t0 + 150))[ep.id]
    assert decision.start == 0 and decision.stop == ()  # 150 s spent, over the cap: none starts, the running one goes on
    status = g.scaler.status(ep.id)
    assert status is not None and not status.may_scale_up and status.spent == 150_000
    shown = endpoint_view(ep, status).scale
    assert shown is not None and (shown.may_scale_up, shown.spent_24h, shown.daily_spend_cap) == (False, "0.15", "0.10")
    assert "daily_spend_cap reached" in shown.why

    await g.composition.services.endpoints.update(ep.id, {"daily_spend_cap": "10"}, account="alice")
    await g.requests.heartbeat(ref(first), [taken.id])
    assert (await g.scaler.tick(g.at(t0 + 151)))[ep.id].start == 3  # a higher cap: the three start
    assert g.scaler.status(ep.id).may_scale_up


async def test_a_renter_cannot_submit_a_workload_posing_as_a_worker(api):
    spec = {"name": "forged", "image": IMAGE, "replica": {"gpus": 1}}
    forged = {"endpoint_id": "ep-someone-else", "worker_id": "wk-1", "concurrency": 1}
    with pytest.raises(msgspec.ValidationError, match="endpoint_worker"):
        msgspec.convert(spec | {"endpoint_worker": forged}, WorkloadSpec)
    key = await api_key(api.master, "renter", "mallory")
    answer = await api.post("/api/v1/workloads", json=spec | {"endpoint_worker": forged}, headers=key)  # the body is a spec
    assert answer.status == 400 and "endpoint_worker" in await answer.text(), await answer.text()
    listed = await (await api.get("/api/v1/workloads", headers=key)).json()
    assert listed["items"] == []


async def test_after_a_master_restart_the_workers_that_ran_before_are_not_stuck_for_want_of_calls_not_yet_heard(grid):
    g = grid
    ep = await endpoint(g, min_workers=1, max_workers=1)
    await g.scaler.tick(g.at(g.now + 1))
    (worker,) = await running(g, workers(g, ep.id))
    await g.requests.heartbeat(ref(worker), [])
    restarted = g.now + 3600  # long past start_timeout_s and heartbeat_timeout_s of the worker's placement
    again = compose(g.master)  # a new composition over the same store: nothing of the old one's memory
    await again.load()
    scaler, requests = dict(again.loops)["endpoint scaler"], dict(again.state)["endpoint requests"]
    assert isinstance(scaler, EndpointScaler) and isinstance(requests, RequestBook)
    requests._clock = lambda: restarted  # noqa: SLF001
    decision = (await scaler.tick(restarted))[ep.id]
    assert (decision.start, decision.stop) == (0, ())  # not heard from by this Master yet: starting, not stuck
    await requests.heartbeat(ref(worker), [])
    await scaler.tick(restarted + 1)
    status = scaler.status(ep.id)
    assert status is not None and status.workers == {"starting": 0, "ready": 1}
    decision = (await scaler.tick(restarted + 40))[ep.id]  # then silent past heartbeat_timeout_s: replaced
    assert [s.reason.value for s in decision.stop] == ["silent"] and decision.start == 1


async def test_a_worker_that_fails_to_start_holds_the_next_start_back_for_a_doubling_while(grid):
    g = grid
    ep = await endpoint(g, min_workers=1, max_workers=1)
    t0 = g.at(g.now + 1)
    await g.scaler.tick(t0)
    (first,) = workers(g, ep.id)
    await g.scheduler.book.transition(first.id, "reject", "it can never fit here", t0)  # failed, never ran
    assert (await g.scaler.tick(t0 + 1))[ep.id].start == 0  # not asked for again every second
    status = g.scaler.status(ep.id)
    assert status is not None and "1 worker(s) failed to start (it can never fit here)" in status.why
    assert (await g.scaler.tick(t0 + 5.9))[ep.id].start == 0
    assert (await g.scaler.tick(t0 + 6))[ep.id].start == 1  # 5 s after the failure
    (second,) = workers(g, ep.id)
    await g.scheduler.book.transition(second.id, "reject", "it can never fit here", t0 + 6)
    assert (await g.scaler.tick(t0 + 7))[ep.id].start == 0
    assert (await g.scaler.tick(t0 + 16.9))[ep.id].start == 0  # twice as long the second time
    assert (await g.scaler.tick(t0 + 17))[ep.id].start == 1
    (third,) = await running(g, workers(g, ep.id))
    await g.requests.heartbeat(ref(third), [])
    await g.scaler.tick(g.now + 1)  # ready: the failures are behind it
    await g.scheduler.book.end(third.id, "cancel", "by hand", g.now + 2, grace_s=0)
    assert (await g.scaler.tick(g.now + 3))[ep.id].start == 1  # a worker that ran and ended is replaced at once


async def test_a_worker_heard_from_that_stops_taking_requests_is_replaced(grid):
    """Its heartbeats go on (the library's own thread), but no take of it is under way while it has room and requests
    wait: its takers are stuck. It is stopped as unhealthy and replaced; a worker busy at its concurrency is not."""
    g = grid
    ep = await endpoint(g, min_workers=2, max_workers=2)
    await g.scaler.tick(g.at(g.now + 1))
    stuck, busy = await running(g, workers(g, ep.id))
    t0 = g.now
    await g.requests.heartbeat(ref(stuck), [])  # heard from at t0, and never takes after
    await g.requests.submit(ep.id, {"n": 1}, account="alice")
    held = await g.requests.take(ref(busy), 0.0)  # the busy one holds its one request, and takes no more
    assert held is not None
    await g.requests.submit(ep.id, {"n": 2}, account="alice")  # waits: the stuck one should have taken it
    for t in (t0 + 15, t0 + 30):
        g.at(t)
        await g.requests.heartbeat(ref(stuck), [])
        await g.requests.heartbeat(ref(busy), [held.id])
        assert (await g.scaler.tick(t))[ep.id].stop == ()  # within heartbeat_timeout_s of its last take
    g.at(t0 + 31)
    await g.requests.heartbeat(ref(stuck), [])
    await g.requests.heartbeat(ref(busy), [held.id])
    decision = (await g.scaler.tick(t0 + 31))[ep.id]
    assert [(s.worker, s.reason.value) for s in decision.stop] == [(worker_of(stuck).worker_id, "unhealthy")]
    assert decision.start == 1
    assert (await g.scheduler.book.get(busy.id)).state == "running"


async def test_each_workers_cold_start_is_counted_once_from_its_making_to_its_first_call_and_shown(grid):
    g = grid
    ep = await endpoint(g, max_workers=2)
    for i in range(2):
        await g.requests.submit(ep.id, {"n": i}, account="alice")
    made_at = g.at(g.now + 1)
    await g.scaler.tick(made_at)
    first, second = await running(g, workers(g, ep.id))
    assert {first.created_at, second.created_at} == {made_at}
    g.at(made_at + 2.5)
    assert await g.requests.take(ref(first), 0.0) is not None  # its first call: its handler is up
    g.at(made_at + 4.0)
    await g.requests.heartbeat(ref(second), [])
    await g.scaler.tick(made_at + 4.0)
    status = g.scaler.status(ep.id)
    assert status is not None and sorted(status.cold_starts) == [2.5, 4.0]
    for t in (made_at + 10, made_at + 20):  # heard from again: counted once
        g.at(t)
        await g.requests.heartbeat(ref(second), [])
        await g.scaler.tick(t)
    status = g.scaler.status(ep.id)
    assert status is not None and sorted(status.cold_starts) == [2.5, 4.0]
    shown = endpoint_view(ep, status).scale
    assert shown is not None and sorted(shown.cold_starts_s) == [2.5, 4.0]

    again = compose(g.master)  # a restarted Master hears the same workers again: no cold start of its own
    await again.load()
    scaler, requests = dict(again.loops)["endpoint scaler"], dict(again.state)["endpoint requests"]
    assert isinstance(scaler, EndpointScaler) and isinstance(requests, RequestBook)
    requests._clock = lambda: made_at + 100  # noqa: SLF001
    await scaler.tick(made_at + 100)
    await requests.heartbeat(ref(second), [])
    await scaler.tick(made_at + 101)
    restarted = scaler.status(ep.id)
    assert restarted is not None and restarted.cold_starts == () and restarted.workers["ready"] >= 1

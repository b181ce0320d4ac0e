"""The scheduling loop and the market: a run that ends through a host is noted on the workload (``host_failure``, the
market refunds and penalises from it) and forgotten when it is placed again; prices and renters' funds, given to the
loop, steer placement. A real Master (SQLite in tmp_path) driven through its relay-link handlers (no sockets); the
agents report simulated H100s, no GPU is needed."""

from __future__ import annotations

import time

from common.wire import AgentEvent, AgentEventKind
from management.market.money import parse_amount
from management.market.prices import HostPrice
from management.workloads.book import WorkloadBook
from management.workloads.runner import SchedulerLoop, SchedulerSettings
from master.master import Master
from master.records import RentalTerms, WorkloadRecord
from tests.management.workloads.test_runner import GRACE_S, creates_sent, host, relay, scheduler, spec, started
from tests.master.linked import disconnect
from tests.support.stored import stored_workload


def transitions(loop: SchedulerLoop) -> list[WorkloadRecord]:
    """Every workload record the book hands its listeners on a transition, in order."""
    seen: list[WorkloadRecord] = []
    loop.book.subscribe(lambda what, rec: seen.append(rec) if what == "transition" else None)
    return seen


async def running_on_one_host(master: Master, link, loop: SchedulerLoop, **fields) -> WorkloadRecord:
    wl = await loop.book.submit("alice", spec(**fields), time.time())
    await loop.cycle()
    await started(master, link, await loop.book.get(wl.id))
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    assert rec.state == "running"
    return rec


async def test_a_faulty_gpu_notes_the_host_on_the_requeue_and_placing_it_again_clears_it(master, link):
    await host(master, link, "agt-a")
    await host(master, link, "agt-b")
    loop = scheduler(master)
    await loop.book.load()
    seen = transitions(loop)
    rec = await running_on_one_host(master, link, loop)
    (first,) = rec.assignments
    assert rec.host_failure == ""

    fault = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=first.units[0], code=79)
    await relay(master, link, first.agent_id, fault)
    await loop.cycle()  # the core's Requeue

    requeued = await loop.book.get(rec.id)
    assert requeued.state == "queued"
    assert requeued.host_failure == f"{first.agent_id}: unit {first.units[0]} on host {first.agent_id} is unhealthy"
    assert (await stored_workload(master.store, rec.id)).host_failure == requeued.host_failure  # stored with the transition

    await loop.cycle()  # placed on the other host
    placed = await loop.book.get(rec.id)
    assert placed.state == "scheduled" and placed.host_failure == ""
    assert [r.host_failure != "" for r in seen if r.id == rec.id][-2:] == [True, False]


async def test_a_host_gone_offline_past_the_grace_is_noted_as_the_host_failure_of_the_requeue(master, link):
    await host(master, link, "agt-a")
    loop = scheduler(master)
    await loop.book.load()
    rec = await running_on_one_host(master, link, loop)

    await disconnect(master, link, "agt-a", "relay lost")
    await loop.cycle()
    assert (await loop.book.get(rec.id)).state == "running"  # within the offline grace: nothing moves
    loop._clock = lambda: time.time() + 6.0  # noqa: SLF001  (past offline_grace_s = 5 s)
    await loop.cycle()

    requeued = await loop.book.get(rec.id)
    assert requeued.state == "queued" and requeued.host_failure == "agt-a: host agt-a went offline"


# --- prices and funds, given to the loop --------------------------------------------------------------------------


def priced_loop(
    master: Master, prices: dict[str, HostPrice], funded: set[str] | None = None, budget: dict[str, int] | None = None
) -> SchedulerLoop:
    book = WorkloadBook(master.store, master, policy=master.policy)
    free = HostPrice(on_demand=0, min_bid=0)
    return SchedulerLoop(
        master,
        book,
        SchedulerSettings(grace_s=GRACE_S, offline_grace_s=5.0, stray_sweep_s=0.0),
        prices=lambda _provider, agent_id: prices.get(agent_id, free),
        funded=None if funded is None else funded.__contains__,
        budget=None if budget is None else (lambda account: budget.get(account, 0)),
        period_s=60.0,
    )


async def test_the_loop_places_by_the_prices_and_funds_it_is_given(master, link):
    await host(master, link, "agt-dear")
    await host(master, link, "agt-cheap")
    loop = priced_loop(
        master, {"agt-dear": HostPrice(on_demand=parse_amount("4")), "agt-cheap": HostPrice(on_demand=parse_amount("1"))}
    )
    await loop.book.load()
    first = await loop.book.submit("alice", spec("first"), time.time())
    await loop.cycle()
    assert [a.agent_id for a in (await loop.book.get(first.id)).assignments] == ["agt-cheap"]  # cheapest first
    capped = await loop.book.submit("alice", spec("capped", rental=RentalTerms(max_price="2")), time.time())
    await loop.cycle()
    assert (await loop.book.get(capped.id)).state == "queued" and creates_sent(link, "agt-dear") == []
    e = await loop.explain(capped.id)
    assert "price: 1 host list more than your max_price 2.00" in e.summary


async def test_a_renter_without_money_waits_for_a_free_host(master, link):
    await host(master, link, "agt-paid")
    loop = priced_loop(master, {"agt-paid": HostPrice(on_demand=parse_amount("1"))}, funded={"bob"})
    await loop.book.load()
    broke = await loop.book.submit("alice", spec("broke"), time.time())
    await loop.cycle()
    assert (await loop.book.get(broke.id)).state == "queued"
    assert "no available balance" in (await loop.explain(broke.id)).summary
    paying = await loop.book.submit("bob", spec("paying"), time.time())
    await loop.cycle()
    assert (await loop.book.get(paying.id)).state == "scheduled"


async def test_a_dust_balance_starts_no_paid_work_only_one_that_pays_a_metering_period_does(master, link):
    """D14: 0.000001 once started 28 GPUs; now a queued job is placed only where its renter's available balance pays
    one metering period of its GPUs (1.00 a GPU-hour for 60 s on 2 GPUs: 0.033334, rounded up)."""
    await host(master, link, "agt-paid", 2)
    needed = 33_334
    budget = {"dust": 1, "short": needed - 1, "enough": needed}
    loop = priced_loop(master, {"agt-paid": HostPrice(on_demand=parse_amount("1"))}, funded=set(budget), budget=budget)
    await loop.book.load()
    submitted = {who: await loop.book.submit(who, spec(who, gpus=2), time.time()) for who in ("dust", "short")}
    await loop.cycle()
    for who, rec in submitted.items():
        assert (await loop.book.get(rec.id)).state == "queued", who
        said = (await loop.explain(rec.id)).summary
        assert "balance pays for one metering period of this workload" in said, said
    assert creates_sent(link, "agt-paid") == []
    enough = await loop.book.submit("enough", spec("enough", gpus=2), time.time())
    await loop.cycle()
    assert (await loop.book.get(enough.id)).state == "scheduled"


async def test_a_balance_that_pays_one_jobs_first_period_starts_one_job_not_all_of_them(master, link):
    """D14: the balance is shared by the renter's work: a cycle takes off the first period of what it places, and the
    next cycles count the work placed but not running yet (no rental holds money for it). 1.00 a GPU-hour, 60 s: one
    GPU's period is 0.016667; a balance of 0.02 starts one of three one-GPU jobs."""
    await host(master, link, "agt-paid", 4)
    budget = {"ann": 20_000}
    loop = priced_loop(master, {"agt-paid": HostPrice(on_demand=parse_amount("1"))}, funded=set(budget), budget=budget)
    await loop.book.load()
    jobs = [await loop.book.submit("ann", spec(f"job-{n}"), time.time()) for n in range(3)]
    for _ in range(2):  # the second cycle sees the first job placed (scheduled), not yet running
        await loop.cycle()
        states = [(await loop.book.get(j.id)).state for j in jobs]
        assert sorted(states) == ["queued", "queued", "scheduled"], states
    assert len(creates_sent(link, "agt-paid")) == 1

"""The spend cap watch (management/services/spend_caps.py) on a real Master (SQLite), its workload book, ledger and
metering loop, the clock driven by hand: a soft cap raises one alert per crossing; a hard cap on a project sends that
project's running work back to the queue with its grace and keeps it from paid hosts while it holds, other projects
untouched; the rolling hour lets it go again; a cap reached is an alert its renter and the operator see. (The hosts
are simulated GPUs: no GPU here.)"""

from __future__ import annotations

from management.monitoring.alert_loop import AlertLoop
from management.monitoring.billing_signals import spend_cap_readings
from management.monitoring.evaluator import FIRING, RESOLVED
from management.monitoring.observe import FleetObserver
from management.monitoring.visibility import Viewer, visible
from management.payments.caps import CapBlocks
from management.payments.records import BillingRecord, SpendCap
from management.services.spend_caps import CAP_REACHED_EVENT, SpendCapWatch
from management.store import billing_repo, rental_repo
from management.workloads.spec import container_name
from master.records import Assignment, ReplicaSpec, WorkloadRecord, WorkloadSpec
from tests.management.hosts import add_agent
from tests.management.market.test_metering_loop import Market, StartMarket, start_market, t0  # noqa: F401
from tests.management.monitoring.test_observe import shipped


async def run(m: Market, name: str, project: str, unit: int, at: float, *, agent: str = "agt-1") -> WorkloadRecord:
    """A workload of one GPU (unit ``unit`` of ``agent``) in ``project``, running from ``at``."""
    spec = WorkloadSpec(name=name, image="busybox", replica=ReplicaSpec(gpus=1), project=project)
    wl = await m.book.submit("alice", spec, at - 3)
    units = [m.master.gpus(agent)[unit].uuid]
    placed = [Assignment(replica=0, agent_id=agent, units=units, container=container_name(wl.id, 0, 1))]
    await m.book.transition(wl.id, "schedule", "placed", at - 2, assignments=placed)
    await m.book.transition(wl.id, "start", "acknowledged", at - 1)
    m.clock[0] = at
    return await m.book.transition(wl.id, "run", "containers started", at)


async def test_a_soft_cap_alerts_once_and_a_hard_project_cap_stops_only_its_project_until_the_hour_rolls_on(
    start_market: StartMarket,  # noqa: F811
) -> None:
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 100_000_000, "credit", key="c1")
    caps = [
        SpendCap(window="hour", limit=100_000),  # soft, the account: 100 GPU-seconds at 1000 a second
        SpendCap(scope="project", project="train", window="hour", limit=50_000, hard=True),
    ]
    await billing_repo(m.master.store).put(BillingRecord(id="alice", caps=caps))
    blocks = CapBlocks()
    watch = SpendCapWatch(
        m.master, billing_repo(m.master.store), rental_repo(m.master.store), m.meter, m.book, blocks, currency="USD",
        grace_s=5.0, clock=lambda: m.clock[0],
    )  # fmt: skip
    train = await run(m, "train", "train", 0, T)
    serve = await run(m, "serve", "serve", 1, T)
    await m.tick(T + 1)

    async def alerts() -> list[dict]:
        return [e.data for e in await m.master.store.events.list(subject="alice", kind_prefix=CAP_REACHED_EVENT)]

    await m.tick(T + 40)
    await watch.check(T + 40)  # train 40_000, the account 80_000: nothing reached
    assert [r.spent for r in watch.readings("alice")] == [80_000, 40_000] and await alerts() == []

    await m.tick(T + 60)
    await watch.check(T + 60)  # train 60_000 (hard, reached), the account 120_000 (soft, reached)
    stopped = await m.book.get(train.id)
    assert stopped.state == "queued" and "the hard cap of 0.05 USD per hour on project train" in stopped.state_reason
    assert (await m.book.get(serve.id)).state == "running"  # another project: untouched
    assert blocks.reason("alice", "train") and blocks.reason("alice", "serve") == ""
    said = await alerts()
    assert sorted((a["hard"], a["scope"]) for a in said) == [(False, "account"), (True, "project")]
    await m.tick(T + 61)
    await watch.check(T + 61)
    assert len(await alerts()) == 2  # once per crossing, not at every reading

    await m.tick(T + 3700)
    await watch.check(T + 3700)  # train ran its last second an hour ago: free again; serve keeps the account's cap
    assert blocks.reason("alice", "train") == ""
    assert [r.reached for r in watch.readings("alice")] == [True, False]
    assert len(await alerts()) == 2


async def test_a_hard_cap_leaves_work_on_a_free_host_running(start_market: StartMarket) -> None:  # noqa: F811
    """Free work spends nothing: stopping it would only have the scheduler place it on the free host again."""
    T = t0()
    m = await start_market(t0=T)
    await add_agent(m.master, "agt-free", "h100:1", provider="someone")  # no price set: the grid's default, 0
    await m.ledger.credit("alice", 100_000_000, "credit", key="c1")
    caps = [SpendCap(window="hour", limit=10_000, hard=True)]
    await billing_repo(m.master.store).put(BillingRecord(id="alice", caps=caps))
    blocks = CapBlocks()
    watch = SpendCapWatch(
        m.master, billing_repo(m.master.store), rental_repo(m.master.store), m.meter, m.book, blocks, currency="USD",
        grace_s=5.0, clock=lambda: m.clock[0],
    )  # fmt: skip
    paid = await run(m, "paid", "default", 0, T)
    free = await run(m, "free", "default", 0, T, agent="agt-free")
    await m.tick(T + 20)
    await watch.check(T + 20)  # 20_000 spent on the paid host: the cap is reached
    assert blocks.reason("alice", "default")
    assert (await m.book.get(paid.id)).state == "queued"
    assert (await m.book.get(free.id)).state == "running"


async def test_a_cap_counts_a_running_rental_up_to_its_hosts_last_heartbeat_not_to_now(start_market: StartMarket) -> None:  # noqa: F811
    """The seconds a cap counts are the ones the rental would be charged if it stopped now: a host not heard from for a
    while (a loaded machine, a late heartbeat) has not yet earned them. Counting to now stopped work on seconds the meter
    then did not charge (CI: a 3-second hard cap stopped a job charged 2), and the cap no longer held."""
    T = t0()
    m = await start_market(t0=T)
    m.master.started_at = T - 10
    await m.ledger.credit("alice", 100_000_000, "credit", key="c1")
    await billing_repo(m.master.store).put(BillingRecord(id="alice", caps=[SpendCap(window="hour", limit=10_000, hard=True)]))
    blocks = CapBlocks()
    watch = SpendCapWatch(
        m.master, billing_repo(m.master.store), rental_repo(m.master.store), m.meter, m.book, blocks, currency="USD",
        grace_s=5.0, clock=lambda: m.clock[0],
    )  # fmt: skip
    job = await run(m, "job", "default", 0, T)
    await m.tick(T + 6)  # heard at T + 6
    await m.tick(T + 30, beat=False)  # nothing heard since
    await watch.check(T + 30)
    assert [r.spent for r in watch.readings("alice")] == [6_000] and not blocks.reason("alice", "default")
    assert (await m.book.get(job.id)).state == "running"
    await m.tick(T + 31)  # heard again: 31 seconds ran
    await watch.check(T + 31)
    assert [r.spent for r in watch.readings("alice")] == [31_000] and blocks.reason("alice", "default")
    assert (await m.book.get(job.id)).state == "queued"


async def test_a_cap_reached_is_an_alert_its_renter_and_the_operator_see_and_it_resolves_when_the_hour_rolls_on(
    start_market: StartMarket,  # noqa: F811
) -> None:
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 100_000_000, "credit", key="c1")
    caps = [SpendCap(window="hour", limit=50_000), SpendCap(scope="project", project="train", window="month", limit=10**9)]
    await billing_repo(m.master.store).put(BillingRecord(id="alice", caps=caps))
    watch = SpendCapWatch(
        m.master, billing_repo(m.master.store), rental_repo(m.master.store), m.meter, m.book, CapBlocks(), currency="USD",
        clock=lambda: m.clock[0],
    )  # fmt: skip
    observer = FleetObserver(m.master, spend_caps=lambda now: spend_cap_readings(watch.all_readings(), "USD"))
    now = [T]
    loop = AlertLoop(observer, [shipped("spend_cap_reached")], clock=lambda: now[0])
    train = await run(m, "train", "train", 0, T)
    await m.tick(T + 30)
    await watch.check(T + 30)  # 30_000 of 50_000 an hour
    assert await loop.step() == []

    await m.tick(T + 60)
    await watch.check(T + 60)  # 60_000: the hourly cap reached; the monthly one far from it
    now[0] = T + 60
    [fired] = await loop.step()
    assert (fired.rule, fired.subject, fired.phase) == ("spend_cap_reached", "alice/account/hour/soft", FIRING)
    assert fired.labels["renter"] == "alice" and fired.labels["cap"] == "the soft cap of 0.05 USD per hour on the account"
    assert fired.value == 120.0  # percent of the limit
    assert visible(fired.labels, Viewer("alice", "renter")) and visible(fired.labels, Viewer("root", "operator"))
    assert not visible(fired.labels, Viewer("bob", "renter"))
    now[0] = T + 90
    assert await loop.step() == []  # firing, told once

    await m.book.transition(train.id, "succeed", "exited 0", T + 100, exit_codes=[0])
    await m.tick(T + 100)
    await m.tick(T + 3700)
    await watch.check(T + 3700)  # the hour rolled on: nothing spent in it
    now[0] = T + 3700
    [resolved] = await loop.step()
    assert (resolved.subject, resolved.phase) == ("alice/account/hour/soft", RESOLVED)

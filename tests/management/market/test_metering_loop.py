"""The metering loop on a real Master (SQLite in tmp_path), its workload book and the ledger book on the Master's
store, the clock driven by hand: rentals open when a workload runs and end when it stops, every period is charged
once, a silent host stops the charges at its last heartbeat, a run that ended through its host is refunded, the money
running out stops the workload, a low balance is announced once per crossing, a bid change prices the rest of the
run, and a restarted Master carries on without charging twice. (The hosts are simulated GPUs: no GPU here.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.errors import InvalidTransition, NotFound
from management.market.ledger import FEES, LedgerBook, hold_account, provider_account, renter_account
from management.market.metering_loop import LOW_BALANCE_EVENT, RAN_OUT_REASON, MeterLoop, MeterSettings
from management.market.prices import HostPrice, PriceTable
from management.store import ledger_repo, rental_repo
from management.workloads.book import WorkloadBook
from management.workloads.spec import container_name
from master.accounts import AccountRole
from master.config import MasterConfig
from master.master import Master
from master.records import (
    Assignment,
    LedgerEntry,
    LedgerLine,
    PriceRecord,
    RentalTerms,
    ReplicaSpec,
    WorkloadRecord,
    WorkloadSpec,
)
from tests.management.hosts import add_agent

PRICES = [PriceRecord(provider="prov", on_demand=3_600_000, min_bid=1_000_000, reserved_discount=0.5)]  # 1000 /GPU-s


@dataclass
class Market:
    master: Master
    book: WorkloadBook
    ledger: LedgerBook
    meter: MeterLoop
    clock: list[float]

    async def run(self, name: str, gpus: int, at: float, rental: RentalTerms | None = None) -> WorkloadRecord:
        """A workload of one replica on agt-1, running from ``at``."""
        spec = WorkloadSpec(name=name, image="busybox", replica=ReplicaSpec(gpus=gpus), rental=rental)
        wl = await self.book.submit("alice", spec, at - 3)
        units = [g.uuid for g in self.master.gpus("agt-1")][:gpus]
        placed = [Assignment(replica=0, agent_id="agt-1", units=units, container=container_name(wl.id, 0, 1))]
        await self.book.transition(wl.id, "schedule", "placed", at - 2, assignments=placed)
        await self.book.transition(wl.id, "start", "acknowledged", at - 1)
        self.clock[0] = at
        return await self.book.transition(wl.id, "run", "containers started", at)

    def beat(self, t: float) -> None:
        """agt-1 heartbeats at ``t``."""
        self.master.registry.on_heartbeat(self.master.registry.agents["agt-1"], t, max_gap_s=15.0)

    async def tick(self, t: float, *, beat: bool = True) -> None:
        self.clock[0] = t
        if beat:
            self.beat(t)
        await self.meter.tick(t)

    async def keys(self, rental_id: str) -> list[str]:
        return [e.key for e in await self.ledger.rental_entries(rental_id)]


StartMarket = Callable[..., Awaitable[Market]]


@pytest.fixture
async def start_market(tmp_path: Path) -> AsyncIterator[StartMarket]:
    """Starts a Master with its books and metering loop on tmp_path (again on the same store: a restart, after
    ``stop_master``); stops those still running at the end."""
    started: list[Master] = []
    stopped: list[Master] = []

    async def stop_master(master: Master) -> None:
        await master.stop()
        stopped.append(master)

    async def start(*, t0: float, warning_s: float = 3600.0, first: bool = True, hold_s: float = 3600.0) -> Market:
        master = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
        await master.start()
        started.append(master)
        if first:
            await master.accounts.ensure("alice", AccountRole.RENTER)
            await add_agent(master, "agt-1", "h100:4")
        book = WorkloadBook(master.store, master, policy=master.policy)
        await book.load()
        ledger = LedgerBook(ledger_repo(master.store))
        await ledger.load()
        clock = [t0]
        table = PriceTable(PRICES, grid_default=HostPrice(on_demand=0))
        settings = MeterSettings(period_s=60.0, low_balance_warning_s=warning_s, grace_s=5.0, hold_s=hold_s)
        meter = MeterLoop(master, book, ledger, rental_repo(master.store), table.price, settings, clock=lambda: clock[0])
        await meter.load()
        return Market(master=master, book=book, ledger=ledger, meter=meter, clock=clock)

    start.stop_master = stop_master  # type: ignore[attr-defined]
    yield start
    for master in started:
        if master not in stopped:
            await master.stop()


def t0() -> float:
    return float(int(time.time()) + 100)  # after the simulated host's hello


async def test_a_running_workload_is_held_charged_each_period_and_settled_at_its_end(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    wl = await m.run("train", 2, T)  # 2 GPUs at 3.60: 2000 a second
    await m.tick(T + 1)
    rental = await rental_repo(m.master.store).get(f"{wl.id}-a1")
    assert rental is not None and rental.started_at == T and rental.kind == "on_demand"
    assert [(h.agent_id, h.provider, h.gpus, h.price) for h in rental.hosts] == [("agt-1", "prov", 2, 3_600_000)]
    assert m.ledger.funds("alice").held == 3600 * 2000  # an hour of it held (the default rental_hold_s)

    await m.tick(T + 130)
    assert await m.keys(rental.id) == ["hold:" + rental.id + ":0", f"charge:{rental.id}:2"]
    charge = (await m.ledger.rental_entries(rental.id))[-1]
    assert "fee 10% (platform fee: reliability" in charge.memo
    await m.tick(T + 130)  # again at the same moment: nothing more
    assert len(await m.keys(rental.id)) == 2

    m.clock[0] = T + 150
    await m.book.transition(wl.id, "succeed", "exited 0", T + 150, exit_codes=[0])
    await m.tick(T + 151)
    ended = await rental_repo(m.master.store).get(rental.id)
    assert ended is not None and ended.ended_at == T + 150 and "succeeded" in ended.end_reason
    assert await m.keys(rental.id) == [f"hold:{rental.id}:0", f"charge:{rental.id}:2", f"charge:{rental.id}:end"]
    assert m.ledger.balance(provider_account("prov")) + m.ledger.balance(FEES) == 150 * 2000
    assert m.ledger.balance(FEES) == 30_000
    assert m.ledger.funds("alice").held == 0 and m.ledger.funds("alice").available == 10_000_000 - 300_000
    assert m.meter.open_rentals() == []
    agent = m.master.registry.agents["agt-1"]
    assert (agent.rentals_completed, agent.rentals_failed) == (1, 0)  # counted in the host's reputation


async def test_charges_stop_at_a_silent_hosts_last_heartbeat_and_a_run_ended_through_it_is_refunded(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    wl = await m.run("train", 1, T)
    await m.tick(T + 61)
    await m.tick(T + 70)
    await m.tick(T + 200, beat=False)  # agt-1 was last heard at T + 70: period 2 is not charged
    assert await m.keys(f"{wl.id}-a1") == [f"hold:{wl.id}-a1:0", f"charge:{wl.id}-a1:1"]

    m.clock[0] = T + 200
    await m.book.end(wl.id, "requeue", "agt-1 went offline", T + 200, grace_s=5.0, host_failure="agt-1: went offline")
    await m.tick(T + 201, beat=False)
    ended = await rental_repo(m.master.store).get(f"{wl.id}-a1")
    assert ended is not None and ended.ended_at == T + 70 and ended.host_failure == "agt-1: went offline"
    entries = await m.ledger.rental_entries(ended.id)
    assert [e.key for e in entries][-2:] == [f"charge:{ended.id}:end", f"refund:{ended.id}"]
    assert sum(ln.amount for ln in entries[-2].lines if ln.account == provider_account("prov")) >= 0
    assert m.ledger.funds("alice").available == 10_000_000  # every charge came back
    assert m.ledger.balance(provider_account("prov")) == m.ledger.balance(FEES) == 0
    events = await m.master.store.events.list(subject="agt-1", kind_prefix="agent.reputation")
    assert [e.data["reason"] for e in events] == [f"rental {ended.id} ended through the host: agt-1: went offline"]
    assert m.master.registry.agents["agt-1"].rentals_failed == 1


async def test_when_the_money_runs_out_the_workload_fails_while_the_hold_still_pays_every_second_it_ran(start_market):
    T = t0()
    m = await start_market(t0=T)
    assert m.meter.settings.reserve_s == 10.0  # two ticks of 5 s
    await m.ledger.credit("alice", 100_000, "credit", key="c1")
    wl = await m.run("train", 2, T)  # 2000 a second: 50 s of money, all of it held
    await m.tick(T + 1)
    assert m.ledger.funds("alice").held == 100_000
    await m.tick(T + 39)
    assert (await m.book.get(wl.id)).state == "running"
    await m.tick(T + 41)  # 82_000 owed, and 10 s more would pass what there is
    stopped = await m.book.get(wl.id)
    assert (stopped.state, stopped.state_reason) == ("failed", RAN_OUT_REASON)
    ended = await rental_repo(m.master.store).get(f"{wl.id}-a1")
    assert ended is not None and ended.ended_at == T + 41
    assert m.ledger.balance(provider_account("prov")) + m.ledger.balance(FEES) == 41 * 2000  # every second
    assert m.ledger.funds("alice").available == 100_000 - 82_000 and m.ledger.funds("alice").held == 0


async def test_a_low_balance_is_announced_once_per_crossing(start_market):
    T = t0()
    m = await start_market(t0=T, warning_s=600.0, hold_s=60.0)  # each rental holds one period: both run on 2.00
    await m.ledger.credit("alice", 2_000_000, "credit", key="c1")

    async def warnings() -> list[dict]:
        return [e.data for e in await m.master.store.events.list(subject="alice", kind_prefix=LOW_BALANCE_EVENT)]

    await m.run("one", 1, T)  # 1000 a second: 600 s need 0.60, and 2.00 are there
    await m.tick(T + 1)
    assert await warnings() == []
    await m.run("big", 3, T + 3)  # 4000 a second in all: 600 s need 2.40
    await m.tick(T + 4)
    await m.tick(T + 5)
    first = await warnings()
    assert len(first) == 1 and first[0]["needed"] == "2.40" and "less than 600 s" in first[0]["reason"]

    await m.ledger.credit("alice", 1_000_000, "credit", key="c2")  # 3.00: covered again
    await m.tick(T + 7)
    await m.tick(T + 123)  # two periods each charged: 3.00 - 0.48 = 2.52, still covered
    assert len(await warnings()) == 1
    await m.tick(T + 183)  # three periods: 3.00 - 0.72 = 2.28, below 2.40 again: a second crossing
    assert len(await warnings()) == 2
    assert await ledger_repo(m.master.store).balances() == m.ledger.balances()


async def test_the_balance_cover_is_how_long_each_renters_funds_last_at_its_running_rentals_prices(start_market):
    T = t0()
    m = await start_market(t0=T, hold_s=60.0)  # each rental holds one period: both run on 2.00
    await m.ledger.credit("alice", 2_000_000, "credit", key="c1")
    await m.ledger.credit("bob", 5_000_000, "credit", key="c2")  # nothing running: not listed
    assert m.meter.balance_cover_s(T) == {}
    await m.run("one", 1, T)  # 1000 a second: 2.00 last about 2000 s
    await m.tick(T + 1)
    assert m.meter.balance_cover_s(T + 1)["alice"] == pytest.approx(2000.0, abs=5.0)
    await m.run("big", 3, T + 3)  # 4000 a second in all
    await m.tick(T + 4)
    cover = m.meter.balance_cover_s(T + 4)
    assert set(cover) == {"alice"} and cover["alice"] == pytest.approx(500.0, abs=5.0)


async def test_a_bid_change_prices_the_rest_of_an_interruptible_run(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    wl = await m.run("cheap", 1, T, RentalTerms(kind="interruptible", bid="1.80"))  # 500 a second
    await m.tick(T + 1)
    changed = await m.meter.change_bid(wl.id, 3_600_000, T + 30)  # 1000 a second from T + 30
    stored = await rental_repo(m.master.store).get(changed.id)
    assert stored is not None and [(c.at, c.price) for c in stored.bid_changes] == [(T + 30, 3_600_000)]
    m.clock[0] = T + 60
    await m.book.transition(wl.id, "succeed", "exited 0", T + 60, exit_codes=[0])
    await m.tick(T + 60)
    assert m.ledger.balance(provider_account("prov")) + m.ledger.balance(FEES) == 30 * 500 + 30 * 1000

    with pytest.raises(NotFound):
        await m.meter.change_bid(wl.id, 1, T + 61)
    other = await m.run("steady", 1, T + 70)
    with pytest.raises(InvalidTransition):
        await m.meter.change_bid(other.id, 1, T + 71)


async def test_a_reserved_rental_prepays_and_its_provider_keeps_the_unused_time_when_the_renter_stops_it(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    wl = await m.run("booked", 1, T, RentalTerms(kind="reserved", reserved_s=3600))  # 1.80 an hour reserved
    await m.tick(T + 1)
    rid = f"{wl.id}-a1"
    assert (await m.keys(rid))[0] == f"prepay:{rid}" and m.ledger.funds("alice").held == 1_800_000
    m.clock[0] = T + 100
    await m.book.cancel(wl.id, "alice", T + 100)
    await m.tick(T + 101)
    assert m.ledger.balance(provider_account("prov")) + m.ledger.balance(FEES) == 1_800_000
    assert m.ledger.funds("alice").held == 0 and m.ledger.funds("alice").available == 8_200_000


async def test_after_a_restart_open_rentals_continue_without_a_double_charge_and_a_running_workload_gets_its_rental(
    start_market,
):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    a = await m.run("a", 1, T)
    await m.tick(T + 61)  # period 1 charged
    b = await m.run("b", 1, T + 70)  # the Master dies before the loop sees it run: no rental for b
    await start_market.stop_master(m.master)

    again = await start_market(t0=T + 200, first=False)
    assert {r.id for r in again.meter.open_rentals()} == {f"{a.id}-a1", f"{b.id}-a1"}
    b_rental = await rental_repo(again.master.store).get(f"{b.id}-a1")
    assert b_rental is not None and b_rental.started_at == T + 70
    await again.tick(T + 200)
    assert await again.keys(f"{a.id}-a1") == [f"hold:{a.id}-a1:0", f"charge:{a.id}-a1:1", f"charge:{a.id}-a1:3"]
    await again.tick(T + 200)
    again.clock[0] = T + 210
    for wl in (a, b):
        await again.book.transition(wl.id, "succeed", "exited 0", T + 210, exit_codes=[0])
    await again.tick(T + 211)
    assert again.ledger.balance(provider_account("prov")) + again.ledger.balance(FEES) == 210 * 1000 + 140 * 1000
    assert again.ledger.funds("alice").held == 0
    assert sum(again.ledger.balances().values()) == 0
    assert renter_account("alice") in again.ledger.balances() and hold_account("alice") in again.ledger.balances()


async def test_a_workload_that_never_ran_is_not_charged_and_the_host_it_failed_through_is_penalised(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    spec = WorkloadSpec(name="broken", image="busybox", replica=ReplicaSpec(gpus=1))
    wl = await m.book.submit("alice", spec, T)
    units = [m.master.gpus("agt-1")[0].uuid]
    placed = [Assignment(replica=0, agent_id="agt-1", units=units, container=container_name(wl.id, 0, 1))]
    await m.book.transition(wl.id, "schedule", "placed", T + 1, assignments=placed)
    await m.book.transition(wl.id, "start", "acknowledged", T + 2)
    why = "agt-1: container did not start (image not found)"
    await m.book.end(wl.id, "start_failed", "a container did not start", T + 3, grace_s=5.0, host_failure=why)
    await m.tick(T + 4)
    await m.tick(T + 5)
    assert await rental_repo(m.master.store).get(f"{wl.id}-a1") is None
    assert m.ledger.funds("alice").available == 10_000_000
    events = await m.master.store.events.list(subject="agt-1", kind_prefix="agent.reputation")
    assert [e.data["reason"] for e in events] == [f"rental {wl.id}-a1 did not start through the host: {why}"]


async def earned(m: Market, amount: int) -> None:
    """Provider prov has ``amount`` of earlier earnings on its ledger account (what an SLA credit is taken from)."""
    lines = [LedgerLine(account="external", amount=-amount), LedgerLine(account=provider_account("prov"), amount=amount)]
    assert await m.ledger.post(LedgerEntry(key="earlier", ts=0.0, kind="adjust", memo="earlier earnings", lines=lines))


async def test_a_run_lost_through_its_host_credits_the_renter_its_downtime_from_the_provider_once(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    await earned(m, 50_000_000)
    wl = await m.run("train", 1, T)
    await m.tick(T + 61)
    await m.tick(T + 70)
    m.clock[0] = T + 1000
    await m.book.end(wl.id, "requeue", "agt-1 went offline", T + 1000, grace_s=5.0, host_failure="agt-1: went offline")
    await m.tick(T + 1001, beat=False)
    rid = f"{wl.id}-a1"
    assert (await m.keys(rid))[-2:] == [f"refund:{rid}", f"sla:{rid}"]
    credit = 3_600_000 * 1 * (930 * 2) // 3600  # down from the last heartbeat (T + 70) to the end seen (T + 1000), x 200%
    assert m.ledger.funds("alice").available == 10_000_000 + credit  # every charge back, and the credit on top
    assert m.ledger.balance(provider_account("prov")) == 50_000_000 - credit
    assert sum(m.ledger.balances().values()) == 0
    await m.meter.load()  # a restart finds nothing more to credit
    await m.tick(T + 1100, beat=False)
    assert m.ledger.funds("alice").available == 10_000_000 + credit


async def test_a_start_the_host_failed_credits_the_minimum_downtime(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    await earned(m, 50_000_000)
    spec = WorkloadSpec(name="broken", image="busybox", replica=ReplicaSpec(gpus=2))
    wl = await m.book.submit("alice", spec, T)
    units = [g.uuid for g in m.master.gpus("agt-1")][:2]
    placed = [Assignment(replica=0, agent_id="agt-1", units=units, container=container_name(wl.id, 0, 1))]
    await m.book.transition(wl.id, "schedule", "placed", T + 1, assignments=placed)
    await m.book.transition(wl.id, "start", "acknowledged", T + 2)
    why = "agt-1: container did not start (the GPU fell off the bus)"
    await m.book.end(wl.id, "start_failed", "a container did not start", T + 3, grace_s=5.0, host_failure=why)
    await m.tick(T + 4)
    credit = 3_600_000 * 2 * (600 * 2) // 3600  # the minimum 600 s x 200%, 2 GPUs at the host's price
    assert m.ledger.funds("alice").available == 10_000_000 + credit
    assert m.ledger.balance(provider_account("prov")) == 50_000_000 - credit
    assert [e.key for e in await m.ledger.rental_entries(f"{wl.id}-a1")] == [f"sla:{wl.id}-a1"]


async def test_started_the_loop_meters_on_its_own_every_quarter_period_and_stops(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    m.meter.settings = MeterSettings(period_s=0.2)  # ticks every 0.05 s
    assert m.meter.settings.tick_s == 0.05 and MeterSettings(period_s=60).tick_s == 5.0
    wl = await m.run("train", 1, T)
    m.meter.start()
    try:
        deadline = asyncio.get_running_loop().time() + 5.0
        while await rental_repo(m.master.store).get(f"{wl.id}-a1") is None:
            assert asyncio.get_running_loop().time() < deadline, "the loop never metered the rental"
            await asyncio.sleep(0.01)
    finally:
        await m.meter.stop()
    assert [r.id for r in m.meter.open_rentals()] == [f"{wl.id}-a1"]


async def test_after_a_restart_a_host_not_known_offline_counts_as_heard_when_the_master_began_listening(start_market):
    """The Master's own downtime is not the host's silence: its rentals ran on. A restarted Master has only the stored
    last_seen (older, by the flush lag and the outage), so charges up to its start are not held back by it."""
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    wl = await m.run("a", 1, T)
    await m.tick(T + 61)
    await start_market.stop_master(m.master)

    again = await start_market(t0=T + 200, first=False)
    agent = again.master.registry.agents["agt-1"]
    assert agent.state != "offline" and agent.last_seen < T + 100  # nothing heard since the restart
    again.master.started_at = T + 190  # the restarted Master began listening then
    await again.tick(T + 200, beat=False)
    keys = await again.keys(f"{wl.id}-a1")
    assert keys[-1] == f"charge:{wl.id}-a1:3", keys  # periods 2 and 3 (up to T + 180) charged at once
    agent.state = "offline"  # found silent: only its own last heartbeat counts
    await again.tick(T + 400, beat=False)
    assert (await again.keys(f"{wl.id}-a1"))[-1] == f"charge:{wl.id}-a1:3"

    # It ends while its host is still unheard: the rental's end is not put before the periods it was charged for
    # (the stored last_seen is older than them), so the renter reads an end that matches the charge.
    again.clock[0] = T + 400
    await again.book.transition(wl.id, "succeed", "exited 0", T + 400, exit_codes=[0])
    await again.tick(T + 401, beat=False)
    ended = await rental_repo(again.master.store).get(f"{wl.id}-a1")
    assert ended is not None and ended.ended_at == T + 180, ended
    assert again.ledger.balance(provider_account("prov")) + again.ledger.balance(FEES) == 180 * 1000


async def test_a_rental_does_not_start_under_its_hosts_minimum_bid_whatever_changed_the_bid_after_placement(start_market):
    """D2: the terms are checked when the rental starts: a bid lowered between placement and the run (here straight
    on the book, as no API path may any more) opens no rental, charges nothing and sends the workload back to wait."""
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    spec = WorkloadSpec(
        name="low", image="busybox", replica=ReplicaSpec(gpus=1), rental=RentalTerms(kind="interruptible", bid="1.80")
    )
    wl = await m.book.submit("alice", spec, T - 3)
    units = [m.master.gpus("agt-1")[0].uuid]
    placed = [Assignment(replica=0, agent_id="agt-1", units=units, container=container_name(wl.id, 0, 1))]
    await m.book.transition(wl.id, "schedule", "placed", T - 2, assignments=placed)
    await m.book.change_bid(wl.id, "0.000001", T - 2)
    await m.book.transition(wl.id, "start", "acknowledged", T - 1)
    await m.book.transition(wl.id, "run", "containers started", T)
    await m.tick(T + 1)
    assert m.meter.rental_of(wl.id) is None
    assert await rental_repo(m.master.store).get(f"{wl.id}-a1") is None
    now = await m.book.get(wl.id)
    assert now.state == "queued" and "under host agt-1's minimum bid 1.00" in now.state_reason, now.state_reason
    assert m.ledger.balance(renter_account("alice")) == 10_000_000


async def test_a_rental_holds_an_hour_and_the_runway_counts_what_ran_since_the_last_charge(start_market):
    T = t0()
    m = await start_market(t0=T)
    await m.ledger.credit("alice", 10_000_000, "credit", key="c1")
    wl = await m.run("train", 1, T)  # 1000 a second: an hour is 3.60
    await m.tick(T + 1)
    assert m.ledger.funds("alice").held == 3_600_000 and m.ledger.funds("alice").available == 6_400_000
    await m.tick(T + 90)  # period 1 charged (60_000), the hold an hour again; 30 s ran since
    assert m.ledger.funds("alice").held == 3_600_000
    assert m.meter.unbilled("alice", T + 90) == 30_000
    assert m.meter.balance_cover_s(T + 90)["alice"] == pytest.approx((10_000_000 - 90_000) / 1000)
    m.clock[0] = T + 100
    await m.book.transition(wl.id, "succeed", "exited 0", T + 100, exit_codes=[0])
    await m.tick(T + 101)
    assert m.ledger.funds("alice").held == 0 and m.ledger.funds("alice").available == 10_000_000 - 100_000
    assert m.meter.unbilled("alice", T + 101) == 0

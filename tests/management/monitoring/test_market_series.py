"""The market's Prometheus series (management/monitoring/market_series.py) over a real Master (SQLite in tmp_path),
its workload book, ledger book and metering loop, the clock driven by hand: open workloads by state, running
rentals by kind and the ledger's balances by kind of account, as they change; no workload, rental or account id
in any label. (The host's GPUs are simulated: no GPU here.)"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from management.market.ledger import LedgerBook
from management.market.metering_loop import MeterLoop, MeterSettings
from management.market.prices import HostPrice, PriceTable
from management.monitoring.market_series import MarketSeries
from management.store import ledger_repo, rental_repo
from management.workloads.book import WorkloadBook
from management.workloads.spec import container_name
from master.accounts import AccountRole
from master.config import MasterConfig
from master.master import Master
from master.records import Assignment, PriceRecord, ReplicaSpec, WorkloadSpec
from tests.management.hosts import add_agent
from tests.support.prometheus import check_metrics, sample, samples

PRICES = [PriceRecord(provider="prov", on_demand=3_600_000, min_bid=1_000_000, reserved_discount=0.5)]


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    running = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await running.start()
    await running.accounts.ensure("alice", AccountRole.RENTER)
    await add_agent(running, "agt-1", "h100:4")
    yield running
    await running.stop()


async def test_workloads_by_state_and_running_rentals_by_kind_follow_the_books(master: Master):
    now = float(int(time.time()) + 100)
    book = WorkloadBook(master.store, master, policy=master.policy)
    await book.load()
    ledger = LedgerBook(ledger_repo(master.store))
    await ledger.load()
    await ledger.credit("alice", 10_000_000, "credit", key="c1")
    clock = [now]
    table = PriceTable(PRICES, grid_default=HostPrice(on_demand=0))
    meter = MeterLoop(
        master, book, ledger, rental_repo(master.store), table.price, MeterSettings(period_s=60.0), clock=lambda: clock[0]
    )
    await meter.load()
    registry = CollectorRegistry()
    registry.register(MarketSeries(book.counts, meter.open_rentals, ledger.balances, currency="EUR"))

    def scrape() -> str:
        return generate_latest(registry).decode()

    assert sample(scrape(), "idlegrid_workloads", state="running") == 0
    assert sample(scrape(), "idlegrid_rentals_open", kind="on_demand") == 0

    await book.submit("alice", WorkloadSpec(name="waiting", image="busybox", replica=ReplicaSpec(gpus=8)), now - 5)
    running = await book.submit("alice", WorkloadSpec(name="train", image="busybox", replica=ReplicaSpec(gpus=2)), now - 3)
    units = [g.uuid for g in master.gpus("agt-1")][:2]
    placed = [Assignment(replica=0, agent_id="agt-1", units=units, container=container_name(running.id, 0, 1))]
    await book.transition(running.id, "schedule", "placed", now - 2, assignments=placed)
    await book.transition(running.id, "start", "acknowledged", now - 1)
    await book.transition(running.id, "run", "containers started", now)
    master.registry.on_heartbeat(master.registry.agents["agt-1"], now + 1, max_gap_s=15.0)
    clock[0] = now + 1
    await meter.tick(now + 1)

    text = scrape()
    assert sample(text, "idlegrid_workloads", state="queued") == 1
    assert sample(text, "idlegrid_workloads", state="running") == 1
    assert sample(text, "idlegrid_rentals_open", kind="on_demand") == 1
    assert sample(text, "idlegrid_rentals_open", kind="reserved") == 0
    assert running.id not in text and "alice" not in text
    assert sample(text, "idlegrid_ledger_balance", kind="external", currency="EUR") == -10.0  # credited from outside
    assert sample(text, "idlegrid_ledger_balance", kind="hold") == ledger.funds("alice").held / 1_000_000 > 0
    check = check_metrics(text)
    assert check.clean, check.findings

    clock[0] = now + 10
    master.registry.on_heartbeat(master.registry.agents["agt-1"], now + 10, max_gap_s=15.0)
    await book.transition(running.id, "succeed", "exited 0", now + 10, exit_codes=[0])
    await meter.tick(now + 11)
    text = scrape()
    assert sample(text, "idlegrid_workloads", state="running") == 0
    assert sample(text, "idlegrid_rentals_open", kind="on_demand") == 0
    # 10 s of 2 GPUs at 3.60 an hour: 0.02 paid, to the provider and the platform's fee; every entry balances
    provider, platform = (
        sample(text, "idlegrid_ledger_balance", kind="provider"),
        sample(text, "idlegrid_ledger_balance", kind="platform"),
    )
    assert provider is not None and platform is not None
    earned = provider + platform
    assert earned == pytest.approx(0.02)
    assert sum(value for _, value in samples(text, "idlegrid_ledger_balance")) == pytest.approx(0.0)

"""A host's reliability over the fee window (management/market/market.py ``HostReliability``) and the fee it earns: the
share of its rentals ended in the window that did not fail through it, at least three of them, capped by its uptime.
A real Master on SQLite; the hosts are simulated (no GPU here)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from management.market.market import HostReliability
from management.store import rental_repo
from master.config import MasterConfig
from master.master import Master
from master.records import RentalHost, RentalRecord
from tests.management.hosts import add_agent

DAY = 86400.0


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    m = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await m.start()
    await add_agent(m, "agt-1", "a10:1", provider="acme")
    await add_agent(m, "agt-2", "a10:1", provider="acme")
    yield m
    await m.stop()


async def rent(master: Master, n: int, agent_id: str, *, ended_days_ago: float | None, failed: bool = False) -> None:
    now = time.time()
    ended = None if ended_days_ago is None else now - ended_days_ago * DAY
    await rental_repo(master.store).insert(
        RentalRecord(
            id=f"wl-{agent_id}-{n}-a1",
            workload_id=f"wl-{agent_id}-{n}",
            account="lab",
            kind="on_demand",
            hosts=[RentalHost(agent_id=agent_id, provider="acme", gpus=1, price=1_000_000)],
            started_at=(ended or now) - 3600,
            ended_at=ended,
            host_failure=f"{agent_id}: went offline" if failed else "",
            version=1,
        )
    )


async def test_rentals_ended_in_the_window_without_failing_through_the_host_make_it_reliable(master):
    for n in range(3):
        await rent(master, n, "agt-1", ended_days_ago=n + 1)
    await rent(master, 9, "agt-1", ended_days_ago=40)  # before the window: not counted
    master.registry.agents["agt-1"].uptime_s, master.registry.agents["agt-1"].downtime_s = 99.0, 1.0
    reliability = HostReliability(master, rental_repo(master.store), window_s=30 * DAY)
    await reliability.refresh()
    assert reliability.evidence("agt-1") == (3, 0)
    assert reliability("agt-1") == pytest.approx(0.99)  # every rental fine: capped by its uptime


async def test_a_rental_failed_through_the_host_lowers_it_and_too_few_rentals_say_nothing(master):
    for n in range(3):
        await rent(master, n, "agt-1", ended_days_ago=1, failed=n == 0)
    await rent(master, 0, "agt-2", ended_days_ago=1)
    await rent(master, 1, "agt-2", ended_days_ago=None)  # still running: not counted
    reliability = HostReliability(master, rental_repo(master.store), window_s=30 * DAY)
    await reliability.refresh()
    assert reliability.evidence("agt-1") == (3, 1)
    assert reliability("agt-1") == pytest.approx(2 / 3)
    assert reliability("agt-2") is None  # one rental in the window: the standard fee applies

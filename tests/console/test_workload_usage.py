"""The renter's workload page charts its GPUs' utilization (per minute, as its hosts reported it) with the latest
figure in words; in Debian's Chromium against a real Master. The run is a rental put in the store and the minutes
are rollups put as the Master's telemetry writes them (no agent reports here)."""

from __future__ import annotations

import asyncio
import time

import pytest

from management.store import rental_repo
from master.port import RentalHost, RentalRecord, TelemetryRollup, WorkloadSpec
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def busy(console_master):
    """rita's workload has run ten minutes on one GPU of agt-a10, at 80 % then 95 %."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> str:
        await add_agent(master, "agt-a10", "a10:2", provider="acme", runtime="docker", isolation="container")
        record = await services.workloads.submit_workload("rita", WorkloadSpec(name="busy", image="python:3.12"))
        while not (record := await services.workloads.get_workload(record.id)).assignments:  # the scheduler places it
            await asyncio.sleep(0.05)
        [unit] = record.assignments[0].units
        now = time.time()
        host = RentalHost(agent_id="agt-a10", provider="acme", gpus=1, price=0, units=[unit])
        rental = RentalRecord(
            id=f"{record.id}-a1", workload_id=record.id, account="rita", kind="on_demand", hosts=[host], started_at=now - 600
        )
        assert await rental_repo(master.store).insert(rental)
        first = int((now - 600) // 60) + 1
        minutes = [
            TelemetryRollup(
                gpu_uuid=unit, agent_id="agt-a10", minute=m, samples=6, utilization_avg=80.0 if m < first + 5 else 95.0,
                utilization_max=99.0, memory_used_mib_max=1024,
            )
            for m in range(first, first + 9)
        ]  # fmt: skip
        await master.store.rollups.put_many(minutes)
        return record.id

    console_master.workload_id = console_master.run(seed())
    return console_master


def test_the_workload_page_charts_its_gpus_utilization_and_says_the_latest(busy, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{busy.url}/console/workloads/{busy.workload_id}")
    assert "agt-a10" in page.locator("#usage-now").inner_text() and ": 95 %" in page.locator("#usage-now").inner_text()
    chart = page.locator("#usage-chart")
    assert "95 %" in chart.get_attribute("aria-label")
    chart.locator("canvas").wait_for()  # uPlot drew it
    shot(page, "workload-utilization")

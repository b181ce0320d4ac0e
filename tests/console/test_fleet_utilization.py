"""The fleet page's utilization is true for simulated GPUs: cards no container holds read about 0 %, a held one is
busy. In Debian's Chromium against a real Master; the samples are the agent's own simulated collector's
(agent/simulate.py), told which cards containers hold as the agent's telemetry loop tells it, and fed to the Master's
telemetry as a report would (no agent process runs here)."""

from __future__ import annotations

import time

import pytest

from agent.simulate import SimulatedCollector
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def host(console_master):
    console_master.run(add_agent(console_master.server.master, "agt-sim", "a10:4", provider="acme"))
    return SimulatedCollector("a10:4", host_key="agt-sim", seed=1)  # the same cards the host said hello with


def report(console_master, collector: SimulatedCollector) -> None:
    async def ingest() -> None:
        console_master.server.master.telemetry.ingest("agt-sim", collector.sample())

    console_master.run(ingest())


def shown_utilization(page) -> float:
    return float(page.locator("#units-utilization").inner_text().rstrip(" %"))


def test_idle_simulated_gpus_read_about_zero_and_a_held_one_raises_the_mean(console_master, host, page, sign_in, shot):
    report(console_master, host)
    sign_in(page, "operator")
    page.goto(f"{console_master.url}/console/fleet")
    assert shown_utilization(page) <= 1.0, "no container holds a card: the fleet is idle"
    shot(page, "fleet-idle")

    first = host.inventory()[0]
    host.hold([first.uuid])  # a workload's container starts on one of the four
    time.sleep(0.01)  # the next report is newer than the last (the Master keeps the latest sample per GPU)
    report(console_master, host)
    page.reload()
    assert 15.0 <= shown_utilization(page) <= 26.0, "one busy card of four (60 to 100 %), three idle"
    shot(page, "fleet-one-busy")

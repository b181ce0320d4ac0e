"""The provider's journey on a running grid (a Master, a relay and an agent, each its own process): a provider signs
in, sees its host's live charts per GPU and its earnings from a renter's running rental, and drains the host.
A screenshot of each step. The agent's GPU is simulated (none exists here): its telemetry is the simulator's."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.console.journeys import give_password, sign_in
from tests.e2e.test_market import MASTER_SETTINGS, PRICES
from tests.e2e.test_scheduler import SANDBOXED, renter, wait_workload, workload
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for

PASSWORD = "provider-journey-1"


@pytest.fixture
def grid(tmp_path: Path):
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def earned(grid: Grid) -> Decimal:
    return sum((Decimal(e["net"]) for e in grid.client.statement(TEST_PROVIDER, "earnings")["items"]), Decimal(0))


def test_a_provider_sees_a_hosts_live_charts_and_earnings_and_drains_it(grid, page, shot):
    agent_id, _ = grid.run_agent("host-0", simulate="a10:2", env=SANDBOXED)
    grid.client.set_default_price(PRICES, provider=TEST_PROVIDER)
    alice = renter(grid, "alice")
    grid.client.credit("alice", "10", memo="journey")
    running = alice.submit_workload(workload("train", "sleep 300"))
    wait_workload(alice, running["id"], "runs", lambda w: w["state"] == "running")
    wait_for(lambda: earned(grid) > 0, 20, "the rental's first charge")
    give_password(grid, TEST_PROVIDER, PASSWORD)

    sign_in(page, grid, TEST_PROVIDER, PASSWORD, shot)
    hosts = page.locator("table#hosts")
    expect(hosts).to_contain_text(agent_id)
    shot(page, "my-hosts")

    hosts.get_by_role("link", name=agent_id).click()
    page.wait_for_url(f"**/console/hosts/{agent_id}")
    charts = page.locator("[data-gpu]")
    expect(charts).to_have_count(2)
    page.locator("[data-gpu] .uplot canvas").first.wait_for()
    utilization = page.locator("[data-gpu] [data-metric=utilization_pct]").first
    # live: the page polls, and the agent reports every half second; the chart's label counts what it draws
    expect(utilization).to_have_attribute("aria-label", re.compile(r"over the last ([4-9]|\d\d+) samples"), timeout=20_000)
    expect(page.locator("[data-gpu] [data-now=temperature]").first).to_have_text(re.compile(r"\d+ °C"))
    shot(page, "host-live-charts")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Earnings").click()
    total = page.locator("#earnings-total")
    assert Decimal(total.inner_text().split()[0]) > 0
    expect(page.locator("#statements tbody tr")).to_have_count(1)  # today
    page.locator("[data-earnings-series] .uplot canvas").wait_for()
    shot(page, "earnings")

    page.locator("table").filter(has_text="Per host").or_(page.locator("table[aria-labelledby=per-host]")).get_by_role(
        "link", name=agent_id
    ).click()
    page.get_by_role("button", name=re.compile("^Drain")).click()
    expect(page.locator(".flash")).to_contain_text("drained")
    expect(page.locator("#host-state")).to_have_text("maintenance")
    shot(page, "drained")
    assert grid.agent(agent_id)["drained"] is True
    assert alice.workload(running["id"])["state"] == "running"  # what runs there goes on

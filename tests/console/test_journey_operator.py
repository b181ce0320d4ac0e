"""The operator's journey on a running grid (a Master, a relay and an agent, each its own process): an Xid is injected
into one simulated GPU of the agent (as tests/e2e/test_gpu_faults.py does: no GPU exists here, the simulator reads
the fault file); the operator signs in, finds the faulty GPU from the fleet view and follows it to its host. Then the
page is checked on a 375 px wide screen. A screenshot of each step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import expect

from agent.fault_injection import FAULTS_FILE
from tests.console.journeys import give_password, sign_in
from tests.e2e.test_gpu_faults import FAST_TELEMETRY, gpu_of
from tests.support.grid import Grid, wait_for

PASSWORD = "operator-journey-1"


@pytest.fixture
def grid(tmp_path: Path):
    g = Grid(tmp_path)
    try:
        g.start_master(env=FAST_TELEMETRY)
        g.start_relay("relay-1", "eu-west")
        yield g
    finally:
        g.stop()


def test_an_operator_finds_a_faulty_gpu_from_the_fleet_view(grid, page, shot):
    grid.run_agent("healthy-host", simulate="h100:2")  # the fleet has more than the faulty host
    agent_id, daemon = grid.run_agent("faulty-host", simulate="a10:2")
    _, broken = [g["uuid"] for g in grid.agent(agent_id)["gpus"]]
    (grid.agent_dir("faulty-host") / FAULTS_FILE).write_text(json.dumps({broken: {"xid": 79}}))
    wait_for(lambda: gpu_of(grid, agent_id, broken)["state"] == "faulty", 10, f"{broken} faulty\n{daemon.tail()}")
    give_password(grid, "operator", PASSWORD)

    sign_in(page, grid, "operator", PASSWORD, shot)
    page.wait_for_url("**/console/fleet")  # the operator's first page
    expect(page.locator("#units-total")).to_have_text("4")
    expect(page.locator("#units-faulty")).to_have_text("1")
    faulty = page.locator("#faulty-gpus tbody tr")
    expect(faulty).to_have_count(1)
    expect(faulty).to_contain_text("Xid 79")
    expect(faulty).to_contain_text(broken)
    shot(page, "fleet")

    faulty.get_by_role("link", name=agent_id).click()
    page.wait_for_url(f"**/console/hosts/{agent_id}")
    row = page.locator("table[aria-labelledby=gpus-heading] tbody tr").filter(has_text=broken)
    expect(row).to_contain_text("faulty")
    expect(row).to_contain_text("Xid 79")
    shot(page, "faulty-gpus-host")

    page.set_viewport_size({"width": 375, "height": 800})  # a narrow screen: the page reflows, nothing is cut off
    page.reload()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375 + 1, f"the host page is {width} px wide on a 375 px screen"
    shot(page, "narrow-host")

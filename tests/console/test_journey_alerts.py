"""Alerts in the console on a running grid (a Master, a relay and two providers' agents, each its own process). The
GPUs are simulated (none exists here): one GPU of each provider's host is made to overheat through the simulator's
fault file, as tests/e2e/test_gpu_faults.py does, and the shipped ``gpu_overheating`` rule is put through the API
with a 1 s duration (the shipped 2 minutes would only slow the test). A screenshot of each step.

- The operator sees both alerts fire on the alerts page (with the firing count in the navigation), silences one from
  its row and finds the silence listed, then ends it early; the other GPU cools and its alert's resolution appears
  on the open page (it refreshes itself); the page reflows on a 375 px screen.
- A provider sees its own host's alert and not the other provider's, has no silences, and is refused (403) when it
  posts the silence form anyway.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from agent.fault_injection import FAULTS_FILE
from tests.console.journeys import give_password, sign_in
from tests.e2e.test_gpu_faults import FAST_TELEMETRY
from tests.support.grid import TEST_PROVIDER, Grid, wait_for

OTHER_PROVIDER = "prov-2"
PASSWORDS = {"operator": "operator-alerts-1", TEST_PROVIDER: "provider-alerts-1"}
FAST_RULE = {
    "metric": "gpu.temperature_c",
    "op": ">",
    "threshold": 85,
    "for_s": 1,
    "clear_threshold": 80,
    "clear_for_s": 1,
    "severity": "critical",
    "scope": "gpu",
    "fault": True,
    "summary": "GPU over 85 °C",
}


class HotGrid:
    def __init__(self, grid: Grid) -> None:
        self.grid = grid
        self.hot: dict[str, tuple[str, str]] = {}  # provider -> (agent id, hot GPU uuid)


def firing(grid: Grid) -> dict[str, dict[str, Any]]:
    """The operator's firing alerts by subject, through the API."""
    items = grid.get("/api/v1/alerts?phase=firing")["items"]
    return {a["subject"]: a for a in items if a["rule"] == "gpu_overheating"}


@pytest.fixture(scope="module")
def hot_grid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HotGrid]:
    grid = Grid(tmp_path_factory.mktemp("alerts-grid"))
    try:
        grid.start_master(env={**FAST_TELEMETRY, "IDLEGRID_MASTER_ALERT_PERIOD_S": "0.5"})
        grid.start_relay("relay-1", "eu-west")
        status, body = grid.call("PUT", "/api/v1/alert-rules/gpu_overheating", FAST_RULE)
        assert status == 200, body
        enrolled = grid.enroll("other-host", grid.relays["relay-1"], grid.join_token(OTHER_PROVIDER))
        assert enrolled.returncode == 0, enrolled.stderr
        hot = HotGrid(grid)
        for provider, name in ((TEST_PROVIDER, "own-host"), (OTHER_PROVIDER, "other-host")):
            agent_id, _ = grid.run_agent(name, simulate="a10:2")
            uuid = grid.agent(agent_id)["gpus"][0]["uuid"]
            (grid.agent_dir(name) / FAULTS_FILE).write_text(json.dumps({uuid: {"temperature_c": 97}}))
            hot.hot[provider] = (agent_id, uuid)
        wanted = {uuid for _, uuid in hot.hot.values()}
        wait_for(lambda: wanted <= set(firing(grid)), 20, f"both GPUs' overheating alerts to fire: {wanted}")
        for account, password in PASSWORDS.items():
            give_password(grid, account, password)
        yield hot
    finally:
        grid.stop()


def test_an_operator_sees_an_overheating_alert_fire_and_silences_it(hot_grid, page, shot):
    grid = hot_grid.grid
    own_agent, own_gpu = hot_grid.hot[TEST_PROVIDER]
    other_agent, other_gpu = hot_grid.hot[OTHER_PROVIDER]
    sign_in(page, grid, "operator", PASSWORDS["operator"], shot)
    nav = page.get_by_role("navigation", name="Main")
    expect(page.locator("#nav-alerts-count")).to_have_text(re.compile(r"^2"))  # both firing, counted in the nav
    nav.get_by_role("link", name=re.compile("^Alerts")).click()
    page.wait_for_url("**/console/alerts")
    rows = page.locator("#firing tbody tr")
    expect(rows).to_have_count(2)
    own = rows.filter(has_text=own_gpu)
    expect(own).to_contain_text("critical")
    expect(own).to_contain_text("gpu_overheating")
    expect(own).to_contain_text("97 °C")
    expect(own.get_by_role("link", name=own_gpu)).to_have_attribute("href", f"/console/hosts/{own_agent}")
    expect(rows.filter(has_text=other_gpu)).to_have_count(1)
    fired = page.locator("#recent tbody tr[data-phase=firing]")
    expect(fired).to_have_count(2)  # the transitions: both fired
    shot(page, "alerts-firing")

    page.get_by_label("Severity").select_option("warning")  # the filter: no warning is firing
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#firing tbody")).to_contain_text("No alert is firing at warning")
    shot(page, "alerts-filtered")
    page.goto(f"{grid.api_url}/console/alerts")

    page.locator("#firing tbody tr").filter(has_text=own_gpu).get_by_role("link", name="Silence…").click()
    page.wait_for_url("**/console/silences?*")
    expect(page.get_by_label("Rule")).to_have_value("gpu_overheating")  # filled in from the alert's row
    expect(page.get_by_label("Subject")).to_have_value(own_gpu)
    page.get_by_label("Duration", exact=True).fill("forever")  # not a duration: said beside the field, nothing made
    page.get_by_role("button", name="Silence", exact=True).click()
    expect(page.locator("#duration-error")).to_contain_text("how long, e.g. 30m, 2h or 1d (not 'forever')")
    expect(page.get_by_label("Duration", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Subject")).to_have_value(own_gpu)  # what was typed is kept
    shot(page, "silence-form-error")
    assert grid.get("/api/v1/silences")["items"] == []
    page.get_by_label("Duration", exact=True).fill("90m")
    page.get_by_label("Comment").fill("replacing the fan")
    shot(page, "silence-form")
    page.get_by_role("button", name="Silence", exact=True).click()
    page.locator(".flash").filter(has_text="holds back matching notifications").wait_for()
    listed = page.locator("#silences tbody tr")
    expect(listed).to_have_count(1)
    expect(listed).to_contain_text(f"rule gpu_overheating, subject {own_gpu}")
    expect(listed).to_contain_text("replacing the fan")
    expect(listed).to_contain_text(re.compile(r"in (1 h 29 min|1 h 30 min)"))
    shot(page, "silence-listed")
    (stored,) = grid.get("/api/v1/silences")["items"]
    assert (stored["rule"], stored["subject"], stored["comment"]) == ("gpu_overheating", own_gpu, "replacing the fan")

    page.get_by_role("button", name=re.compile("^End now")).click()  # ended early
    page.locator(".flash").filter(has_text="has ended").wait_for()
    expect(page.locator("#silences tbody")).to_contain_text("No silence is in force")
    assert grid.get("/api/v1/silences")["items"] == []
    shot(page, "silence-ended")

    # The other provider's GPU cools: its alert resolves, and the open alerts page shows it without a reload.
    page.goto(f"{grid.api_url}/console/alerts")
    (grid.agent_dir("other-host") / FAULTS_FILE).write_text(json.dumps({other_gpu: {"temperature_c": 60}}))
    resolved = page.locator("#recent tbody tr[data-phase=resolved]").filter(has_text=other_gpu)
    expect(resolved).to_have_count(1, timeout=20_000)
    expect(page.locator("#firing tbody tr")).to_have_count(1)
    expect(page.locator("#nav-alerts-count")).to_have_text(re.compile(r"^1"))  # the count refreshed with it
    shot(page, "alert-resolved-live")

    page.set_viewport_size({"width": 375, "height": 800})  # a narrow screen: the page reflows, nothing is cut off
    page.goto(f"{grid.api_url}/console/alerts")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375 + 1, f"the alerts page is {width} px wide on a 375 px screen"
    shot(page, "narrow-alerts")
    assert other_agent != own_agent


def test_a_provider_sees_only_its_own_hosts_alerts_and_may_not_silence(hot_grid, page, shot):
    grid = hot_grid.grid
    own_agent, own_gpu = hot_grid.hot[TEST_PROVIDER]
    _, other_gpu = hot_grid.hot[OTHER_PROVIDER]
    sign_in(page, grid, TEST_PROVIDER, PASSWORDS[TEST_PROVIDER], shot)
    nav = page.get_by_role("navigation", name="Main")
    expect(page.locator("#nav-alerts-count")).to_have_text(re.compile(r"^1"))  # its own alone
    expect(nav.get_by_role("link", name="Silences")).to_have_count(0)
    nav.get_by_role("link", name=re.compile("^Alerts")).click()
    rows = page.locator("#firing tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text(own_gpu)
    expect(rows.get_by_role("link", name=own_gpu)).to_have_attribute("href", f"/console/hosts/{own_agent}")
    assert other_gpu not in page.locator("main").inner_text()  # nor among the transitions
    expect(page.locator("#silence-form")).to_have_count(0)
    expect(page.get_by_role("link", name="Silence…")).to_have_count(0)
    shot(page, "provider-alerts")

    page.goto(f"{grid.api_url}/console/silences")
    expect(page.locator("main")).to_contain_text("may not read silences")
    shot(page, "provider-silences-refused")
    # The form posted anyway, with this session's own CSRF token: refused by the role, and nothing is made.
    status = page.evaluate(
        """async () => {
            const token = document.querySelector('meta[name=csrf-token]').content;
            const body = new URLSearchParams({rule: 'gpu_overheating', duration: '1h', csrf_token: token});
            const answer = await fetch('/console/silences', {method: 'POST', body});
            return answer.status;
        }"""
    )
    assert status == 403
    assert grid.get("/api/v1/silences")["items"] == []

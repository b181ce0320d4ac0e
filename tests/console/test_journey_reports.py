"""Reports in the console on a running grid (a Master, a relay and an agent, each its own process; the agent's GPUs
are simulated): a renter's workload runs on the provider's host, is charged, and is stopped (its rental's last charge
made, so the figures hold still between the page and the file); then the operator opens
the reports page, sees revenue by provider and day as a table with its total and a chart, downloads the CSV of the
same report and finds the table's rows in it; a report without a time dimension is drawn as bars; bad input is said
on the page (400), never a 500. A provider sees its own report, on a 375 px screen too. A screenshot of each step."""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.console.journeys import give_password, sign_in
from tests.e2e.test_market import MASTER_SETTINGS, PRICES, rentals_of
from tests.e2e.test_scheduler import SANDBOXED, renter, wait_workload, workload
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for

PASSWORDS = {"operator": "operator-reports-1", TEST_PROVIDER: "provider-reports-1"}


@pytest.fixture
def grid(tmp_path: Path):
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def table_rows(page) -> list[list[str]]:
    return [
        [cell.strip() for cell in row.locator("th, td").all_inner_texts()] for row in page.locator("table#report tbody tr").all()
    ]


def same_figure(shown: str, filed: str) -> bool:
    if shown == filed or (shown == "-" and filed == ""):
        return True
    try:
        return abs(Decimal(shown) - Decimal(filed)) <= Decimal("0.0001")
    except ArithmeticError:
        return False


def test_an_operator_reads_a_report_as_table_chart_and_csv(grid: Grid, page, shot):
    agent_id, _ = grid.run_agent("host-0", simulate="a10:2", env=SANDBOXED)
    grid.client.set_default_price(PRICES, provider=TEST_PROVIDER)
    alice = renter(grid, "alice")
    grid.client.credit("alice", "10", memo="reports journey")
    running = alice.submit_workload(workload("train", "sleep 300"))
    wait_workload(alice, running["id"], "runs", lambda w: w["state"] == "running")
    wait_for(
        lambda: any(Decimal(e["net"]) > 0 for e in grid.client.statement(TEST_PROVIDER, "earnings")["items"]),
        20,
        "the rental's first charge",
    )
    alice.cancel_workload(running["id"])  # its rental ends with a last charge: the figures stop moving
    wait_for(lambda: [r for r in rentals_of(alice, running["id"]) if r["ended_at"]], 20, "the rental to end")
    for account, password in PASSWORDS.items():
        give_password(grid, account, password)

    sign_in(page, grid, "operator", PASSWORDS["operator"], shot)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Reports").click()
    page.wait_for_url("**/console/reports")
    expect(page.locator("table#report")).to_be_visible()  # the default: usage by day over the last 7 days
    page.get_by_label("Report", exact=True).select_option("revenue")
    page.get_by_label(re.compile("^By")).fill("provider,day")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/console/reports?*kind=revenue*")
    rows = table_rows(page)
    assert len(rows) == 1, rows  # one provider, one day
    header = page.locator("table#report thead th").all_inner_texts()
    assert header[:3] == ["provider", "day", "gross"], header
    assert rows[0][0] == TEST_PROVIDER and re.fullmatch(r"\d{4}-\d\d-\d\d", rows[0][1])
    assert Decimal(rows[0][2]) > 0  # gross charged
    total = page.locator("table#report tfoot tr").locator("th, td").all_inner_texts()
    assert total[0] == "TOTAL" and total[2] == rows[0][2]  # the rows sum to the total
    chart = page.locator("#report-chart")
    chart.locator(".uplot canvas").wait_for()
    expect(chart).to_have_attribute("aria-label", f"gross over time: {rows[0][1]} {TEST_PROVIDER}: {rows[0][2]}")
    shot(page, "revenue-by-provider-day")

    with page.expect_download() as download:
        page.get_by_role("link", name="Download CSV").click()
    filed = list(csv.reader(io.StringIO(Path(download.value.path()).read_text())))
    assert filed[0] == header
    assert len(filed) - 1 == len(rows)
    for shown, saved in zip(rows, filed[1:], strict=True):
        assert all(same_figure(a, b) for a, b in zip(shown, saved, strict=True)), (shown, saved)

    page.get_by_label("Report", exact=True).select_option("reliability")  # no time dimension: one bar per host
    page.get_by_label(re.compile("^By")).fill("host")
    page.get_by_role("button", name="Show").click()
    page.get_by_label("Chart", exact=True).select_option("rentals_started")  # the reliability report's figures
    page.get_by_role("button", name="Show").click()
    rows = table_rows(page)
    assert [r[0] for r in rows] == [agent_id]
    assert rows[0][page.locator("table#report thead th").all_inner_texts().index("rentals_started")] == "1"
    chart.locator(".uplot canvas").wait_for()
    expect(chart).to_have_attribute("aria-label", f"rentals started: {agent_id}: 1")
    shot(page, "reliability-by-host")

    page.get_by_label(re.compile("^By")).fill("host,planet")  # an unknown dimension
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#report-errors")).to_contain_text("'planet' is not a dimension")
    expect(page.get_by_label(re.compile("^By"))).to_have_attribute("aria-invalid", "true")
    shot(page, "unknown-dimension")
    answer = page.request.get(f"{grid.api_url}/console/reports?kind=usage&by=day&from=2026-11-20&to=2026-11-10")
    assert answer.status == 400 and "must be before to" in answer.text()
    page.goto(f"{grid.api_url}/console/reports?kind=usage&by=day&from=2026-11-20&to=2026-11-10")
    expect(page.locator("#report-errors")).to_contain_text("from (2026-11-20T00:00:00Z) must be before to")
    shot(page, "from-after-to")

    page.get_by_role("button", name="Sign out").click()
    sign_in(page, grid, TEST_PROVIDER, PASSWORDS[TEST_PROVIDER], shot)
    page.goto(f"{grid.api_url}/console/reports?kind=revenue&by=host")
    assert [r[0] for r in table_rows(page)] == [agent_id]  # the provider's own host
    shot(page, "provider-revenue-by-host")

    page.set_viewport_size({"width": 375, "height": 800})  # a narrow screen: the table scrolls in its own box
    page.goto(f"{grid.api_url}/console/reports?kind=revenue&by=day")
    page.locator("#report-chart .uplot canvas").wait_for()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375 + 1, f"the reports page is {width} px wide on a 375 px screen"
    shot(page, "narrow-report")

"""The renter's journey on a running grid, in Debian's Chromium: sign in, search, rent, see it run with live logs,
open the terminal, stop it and see the charge — a screenshot of each step.

A real Master, relay and agent, each its own process (tests/support/grid.py); the host runs the process runtime
sandboxed as ``nobody`` and its GPU is simulated (there is none here). The console's logs and terminal go through the
Master to the relay and the agent as a renter's CLI does (docs/renter-access.md)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from management.client.api import ApiClient
from tests.console.conftest import ACCOUNTS
from tests.e2e.test_scheduler import MASTER_SETTINGS, sandboxed_hosts
from tests.support.grid import TEST_PROVIDER, Grid, write_toml

pytestmark = pytest.mark.e2e

# 3.60 per GPU-hour is 0.001 a second: a rental of a few seconds costs something a person can see.
PRICE = {"on_demand": "3.60", "min_bid": "1.00"}
JOB = "echo journey-started; i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done"


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    g = Grid(tmp_path)
    try:
        settings = {**MASTER_SETTINGS, "metering_period_s": 2}
        g.start_master("--config", str(write_toml(tmp_path / "master.toml", settings)))
        g.start_relay("relay-1", "eu-west")
        yield g
    finally:
        g.stop()


@pytest.fixture
def rita(grid: Grid) -> str:
    """The renter account with its console password and 10.00 to spend; one sandboxed A10 host, priced."""
    account = ACCOUNTS["renter"]
    grid.client.create_account(account.id, "renter", name=account.name)
    grid.client.set_password(account.id, account.password)
    grid.client.credit(account.id, "10.00", memo="journey credit")
    sandboxed_hosts(grid, 1)
    grid.client.set_default_price(PRICE, provider=TEST_PROVIDER)
    return account.id


def journey(grid: Grid, page, shot) -> None:
    account = ACCOUNTS["renter"]
    page.goto(f"{grid.api_url}/console/")
    assert "/console/signin" in page.url
    page.get_by_label("Account").fill(account.id)
    page.get_by_label("Password").fill(account.password)
    shot(page, "sign-in")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/offers$"))

    page.get_by_label("GPU model").select_option("a10")
    page.get_by_label("Max price per GPU-hour").fill("5")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table tbody tr")
    assert rows.count() == 1 and "3.60" in rows.first.inner_text()
    shot(page, "search")

    rows.first.get_by_role("link", name=re.compile("Rent offer")).click()
    page.get_by_label("Name", exact=True).fill("journey")
    page.get_by_label("Image", exact=True).fill("none")
    page.get_by_label("Command", exact=False).fill(f"sh -c '{JOB}'")
    assert page.get_by_label("May run as a sandboxed process", exact=False).is_checked()
    shot(page, "rent-form")
    page.get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))

    # The page follows the workload's state by itself (htmx polls it; a new state reloads the page).
    expect(page.locator("#workload-state")).to_have_text("running", timeout=30_000)
    shot(page, "running")
    # The host's simulated GPU works while the container holds it (its telemetry follows the container).
    assert wait_for_utilization(grid, lambda pct: pct >= 60.0), "the held GPU never read busy"

    live_logs_and_terminal(page, shot)
    # The meter charges a running rental every metering period: the charge shows on the page while it runs.
    expect(page.locator("#charged")).not_to_have_text("0.00 USD", timeout=30_000)
    stop_and_see_the_charge(page, shot)
    assert wait_for_utilization(grid, lambda pct: pct <= 1.0), "the GPU never read idle once the container was gone"


def wait_for_utilization(grid: Grid, wanted: Callable[[float], bool], *, within_s: float = 60.0) -> bool:
    """Whether the one host's GPU reports a utilization ``wanted`` accepts before ``within_s`` (its agent reports
    telemetry on the Master's period): a wait for a state, not a measure of time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        [agent] = grid.client.get("/api/v1/agents")["items"]
        [gpu] = agent["gpus"]
        if gpu.get("telemetry") and wanted(gpu["telemetry"]["utilization_pct"]):
            return True
        time.sleep(0.5)
    return False


def live_logs_and_terminal(page, shot) -> None:
    expect(page.locator("#logs")).to_contain_text("journey-started", timeout=20_000)
    expect(page.locator("#logs")).to_contain_text("tick 2", timeout=20_000)
    shot(page, "live-logs")

    page.get_by_role("button", name="Open a terminal").click()
    expect(page.locator("#terminal-status")).to_contain_text("Connected", timeout=20_000)
    # The shell's prompt: the console's socket is open ("Connected") before its tunnel reaches the agent and the
    # sandboxed shell starts; one loaded CI run saw no prompt within 20 s. A bound, not a measure.
    expect(page.locator(".xterm-rows")).to_contain_text("$", timeout=60_000)
    page.keyboard.type("echo from-the-terminal-$((6*7))\n")
    expect(page.locator(".xterm-rows")).to_contain_text("from-the-terminal-42", timeout=20_000)
    shot(page, "terminal")


def stop_and_see_the_charge(page, shot) -> None:
    page.get_by_role("button", name="Stop this workload").click()
    expect(page.locator("#workload-state")).to_have_text("cancelled", timeout=30_000)
    # The meter closes the rental with its last charge: the page keeps following until it has.
    expect(page.locator("#rentals")).to_contain_text("ended", timeout=30_000)
    charged = page.locator("#charged").inner_text()
    assert re.fullmatch(r"0\.[0-9]+ USD", charged) and charged != "0.00 USD", charged
    shot(page, "stopped-and-charged")

    page.get_by_role("link", name="Billing").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.locator("#available").inner_text() != "10.00 USD"
    assert "Running now costs\n0.00 USD per hour" in page.get_by_role("region", name="Balance").inner_text()
    assert "charge" in page.get_by_role("table").last.inner_text()
    shot(page, "billing")


def test_a_renter_signs_in_searches_rents_sees_logs_uses_the_terminal_stops_and_sees_the_charge(grid, rita, page, shot):
    journey(grid, page, shot)


FAILING = "echo loading; echo 'epoch 1 loss 0.93'; printf '\\033[31mTraceback: KeyError: lr\\033[0m\\n' >&2; exit 3"


def test_a_failed_workloads_page_says_why_with_its_last_lines_of_output(grid, rita, page, shot):
    """A workload that prints, then fails: its page gives the exit code and the last lines it printed (terminal colours
    taken out), once the host's kept output has been read."""
    account = ACCOUNTS["renter"]
    key = grid.client.create_api_key(account.id, "journey")["key"]
    workload_id = ApiClient(grid.api_url, key).submit_workload(
        {
            "name": "fails",
            "image": "none",
            "command": ["sh", "-c", FAILING],
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
        }
    )["id"]
    page.goto(f"{grid.api_url}/console/")
    page.get_by_label("Account").fill(account.id)
    page.get_by_label("Password").fill(account.password)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/console/offers$"))
    page.goto(f"{grid.api_url}/console/workloads/{workload_id}")
    expect(page.locator("#workload-state")).to_have_text("failed", timeout=30_000)
    reason = page.locator("#workload-reason")
    for _ in range(30):  # the last lines join the reason once the host's kept output is read (a few seconds)
        if "last lines" in reason.inner_text():
            break
        page.wait_for_timeout(1000)
        page.reload()
    shown = "a container exited with code 3\nlast lines of replica 0:\nloading\nepoch 1 loss 0.93\nTraceback: KeyError: lr"
    expect(reason).to_have_text(shown)
    assert reason.inner_text() == shown  # as rendered: one line each
    shot(page, "failed-with-its-last-lines")

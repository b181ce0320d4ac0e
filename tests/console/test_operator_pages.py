"""The operator's pages in a browser, on a real Master (in-process): the fleet at a glance with its faulty GPUs linked
to their hosts, accounts and their API keys (a new key shown once, revoked), join tokens (shown once), revocations and
events; the hosts list unscoped. The fleet's GPUs are simulated (no GPU here); a fault is marked as the Master's fault
detection would (tests/e2e/test_gpu_faults.py drives the real detection on a running grid)."""

from __future__ import annotations

import re
import time

import pytest

from master.records import GpuFault
from tests.management.hosts import add_agent

XID = GpuFault(kind="xid", reason="Xid 79: GPU has fallen off the bus", since=time.time(), code=79)


@pytest.fixture
def fleet(console_master):
    master = console_master.server.master

    async def seed() -> None:
        await add_agent(master, "agt-a", "h100:2", provider="acme", runtime="docker", isolation="container")
        await add_agent(master, "agt-b", "l4:4", provider="acme", runtime="docker", isolation="container")
        await master.registry.mark_faulty(master.registry.gpus_of("agt-b")[2], XID)

    console_master.run(seed())
    return master


def test_the_fleet_shows_unit_figures_by_group_and_links_each_faulty_gpu_to_its_host(console_master, fleet, page, sign_in, shot):
    sign_in(page, "operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Fleet").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.locator("#units-total").inner_text() == "6"
    assert page.locator("#units-faulty").inner_text() == "1"
    assert page.locator("#units-available").inner_text() == "5"
    by_model = page.locator("#fleet-by-model").inner_text()
    assert "h100-sxm" in by_model and "l4" in by_model
    faulty = page.locator("#faulty-gpus tbody tr")
    assert faulty.count() == 1 and "Xid 79" in faulty.inner_text()
    shot(page, "fleet")
    faulty.get_by_role("link", name="agt-b").click()
    page.wait_for_url("**/console/hosts/agt-b")
    assert "Xid 79" in page.locator("table[aria-labelledby=gpus-heading]").inner_text()
    shot(page, "faulty-host")
    page.get_by_role("button", name=re.compile("^Drain")).click()  # the operator drains any provider's host
    page.locator(".flash").filter(has_text="drained").wait_for()
    assert page.locator("#host-state").inner_text() == "maintenance"


def test_all_hosts_are_listed_for_the_operator_with_their_provider(console_master, fleet, page, sign_in):
    sign_in(page, "operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="All hosts").click()
    table = page.locator("table#hosts")
    assert table.locator("tbody tr").count() == 2 and "acme" in table.inner_text()


def test_an_api_key_is_shown_once_and_revoked(console_master, fleet, page, sign_in, shot):
    sign_in(page, "operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Accounts").click()
    page.locator("#accounts").get_by_role("link", name="rita").click()
    page.get_by_label("New key's name").fill("ci")
    page.get_by_role("button", name="Create a key").click()
    page.wait_for_load_state()  # the page the click brings, whole
    key = page.locator("#issued-key").inner_text()
    assert key.startswith("igak_")
    shot(page, "key-issued")
    page.goto(f"{console_master.url}/console/accounts/rita")  # shown once: not on the account's page again
    assert page.locator("#issued-key").count() == 0 and key not in page.content()
    row = page.locator("#keys tbody tr").filter(has_text="ci")
    row.get_by_role("button", name=re.compile("^Revoke key")).click()
    page.locator(".flash").filter(has_text="revoked").wait_for()
    revoked = page.locator("#keys tbody tr").filter(has_text="ci")
    assert revoked.locator("td").nth(3).inner_text().endswith("UTC")  # the revoked column has its time
    assert revoked.get_by_role("button").count() == 0
    shot(page, "key-revoked")


def test_a_join_token_is_shown_once_and_a_host_is_revoked_and_listed(console_master, fleet, page, sign_in, shot):
    sign_in(page, "operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Join tokens").click()
    page.get_by_label("Provider").select_option("acme")
    page.get_by_role("button", name="Create a join token").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert len(page.locator("#issued-token").inner_text()) > 20
    shot(page, "token")

    fleet.registry.get("agt-a").cert_serial = "0abc"  # as enrollment would have set it
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Revocations").click()
    page.get_by_label(re.compile("^Host to revoke")).fill("agt-a")
    page.get_by_role("button", name="Revoke its certificates").click()
    page.locator(".flash").filter(has_text="revoked").wait_for()
    assert "0abc" in page.locator("#revocations").inner_text()
    shot(page, "revocations")


def test_events_are_filtered_by_kind_prefix_and_subject(console_master, fleet, page, sign_in, shot):
    sign_in(page, "operator")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Events").click()
    page.get_by_label("Kind starts with").fill("gpu.fault")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("#events tbody tr")
    assert rows.count() == 1 and "Xid 79" in rows.inner_text()
    shot(page, "events-gpu-fault")
    page.get_by_label("Kind starts with").fill("")
    page.get_by_label(re.compile("^Subject")).fill("agt-a")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert all("agt-a" in r for r in rows.all_inner_texts()) and rows.count() >= 1


def test_the_operator_pages_are_refused_to_a_provider(console_master, fleet, page, sign_in):
    sign_in(page, "provider")
    for path in ("/console/fleet", "/console/accounts", "/console/tokens", "/console/revocations", "/console/events"):
        assert page.goto(f"{console_master.url}{path}").status == 403, path

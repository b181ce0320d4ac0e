"""The renter's pages in Debian's Chromium against a real Master: offers and their search, the launch and rent forms
with their errors, my workloads, a workload's page and Stop, billing; and one page on a 375 px wide screen.

The hosts are simulated (no GPU here): ``add_agent`` registers them as a hello would, so they are offered, but no
agent runs behind them (a workload placed there does not start; the journey on a real grid covers that)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from management.market.money import parse_amount
from management.market.prices import PriceSetting
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def market(console_master):
    """Provider acme's three hosts (an H100 x8, an A10 x2, an L4), priced 1.20 per GPU-hour (bids from 0.40); the
    renter has 25.00."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> None:
        for agent_id, gpus in (("agt-h100", "h100:8"), ("agt-a10", "a10:2"), ("agt-l4", "l4:1")):
            await add_agent(master, agent_id, gpus, provider="acme", runtime="docker", isolation="container")
        await services.prices.book.set_default("acme", PriceSetting(on_demand="1.20", min_bid="0.40"))
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")

    console_master.run(seed())
    return console_master


def offer_rows(page) -> list[str]:
    return page.locator("table tbody tr").all_inner_texts()


def test_offers_are_listed_and_a_filter_narrows_them(market, page, sign_in, shot):
    sign_in(page, "renter")
    assert page.url.endswith("/console/offers")  # a renter's home
    assert len(offer_rows(page)) == 3
    assert "3 offers match" in page.locator("caption").inner_text()
    shot(page, "all-offers")
    page.get_by_label("GPU model").select_option("a10")  # a menu of the models offered now
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"model=a10"))
    rows = offer_rows(page)
    assert len(rows) == 1 and "agt-a10" in rows[0] and "1.20" in rows[0]
    assert "model=a10" in page.locator("p.hint code").inner_text()  # the query the form built, shown
    shot(page, "filtered")


def test_a_query_language_error_is_shown_next_to_the_box_with_its_position(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_label("Query", exact=False).fill("gpu_ram>=40 colour=red")
    page.get_by_role("button", name="Search").click()
    error = page.locator("#q-error")
    assert "position 12" in error.inner_text() and "unknown field 'colour'" in error.inner_text()
    assert page.get_by_label("Query", exact=False).get_attribute("aria-invalid") == "true"
    assert page.locator("mark").inner_text() == "colour"  # the trouble, marked in the query as typed
    shot(page, "query-error")


def test_the_launch_form_shows_each_error_next_to_its_field_and_keeps_what_was_typed(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Launch").click()
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("GPUs", exact=True).fill("zero")
    page.get_by_role("radio", name="Interruptible", exact=False).check()
    page.get_by_label("Ports", exact=False).fill("8888, 70000")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "problems" in page.get_by_role("alert").inner_text()
    assert "give the workload a name" in page.locator("#name-error").inner_text()
    assert "a whole number" in page.locator("#gpus-error").inner_text()
    assert "needs a bid" in page.locator("#bid-error").inner_text()
    assert "70000" in page.locator("#ports-error").inner_text()
    assert page.get_by_label("Image", exact=True).input_value() == "python:3.12"
    shot(page, "launch-errors")


def test_a_launched_workload_has_its_page_and_stops_from_it(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/launch")
    page.get_by_label("Name", exact=True).fill("hello")
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("Command", exact=False).fill("python -c 'print(42)'")
    page.get_by_label("Ports", exact=False).fill("8888")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    workload_id = page.url.rsplit("/", 1)[1]
    assert "Submitted " + workload_id in page.locator(".flashes").inner_text()
    assert page.locator("h1").inner_text().startswith("hello")
    assert f"idlegrid workload port-forward {workload_id} 8888" in page.locator("#pf-8888").inner_text()
    assert "on demand" in page.get_by_role("region", name="Rental and charge").inner_text()
    shot(page, "launched")
    page.get_by_role("button", name="Stop this workload").click()
    page.wait_for_url(re.compile(workload_id + "$"))
    assert "Stopping " + workload_id in page.locator(".flashes").inner_text()
    assert page.locator("#workload-state").inner_text() == "cancelled"
    assert page.get_by_role("button", name="Stop this workload").count() == 0
    shot(page, "stopped")
    page.get_by_role("link", name="My workloads").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert workload_id in page.locator("table").inner_text()
    page.get_by_label("State").select_option("running")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**state=running*")
    expect(page.locator("main p.card")).to_contain_text("No workloads running yet")


def test_renting_an_offer_pins_the_workload_to_its_host(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Rent offer agt-a10", exact=False).click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "The offer" in page.locator("main").inner_text() and "agt-a10" in page.locator("main").inner_text()
    page.get_by_label("Name", exact=True).fill("on-a10")
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("GPUs", exact=True).fill("3")
    page.get_by_role("button", name="Rent").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "from 1 to 2" in page.locator("#gpus-error").inner_text()  # the offer has 2 free
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_role("button", name="Rent").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    assert "Rented agt-a10" in page.locator(".flashes").inner_text()
    assert "offer agt-a10" in page.get_by_role("region", name="Rental and charge").inner_text()
    shot(page, "rented")


def test_billing_shows_the_balance_the_ledger_and_its_csv(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Billing").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.locator("#available").inner_text() == "25.00 USD"
    ledger = page.get_by_role("table").last.inner_text()
    assert "credit" in ledger and "welcome" in ledger and "25.00" in ledger
    csv = page.request.get(f"{market.url}/console/billing/ledger.csv")
    assert csv.status == 200 and "welcome" in csv.text()
    shot(page, "billing")


def test_another_accounts_workload_answers_404(market, page, sign_in):
    workload = market.run(_someone_elses_workload(market))
    sign_in(page, "renter")
    response = page.goto(f"{market.url}/console/workloads/{workload}")
    assert response.status == 404 and "Not found" in page.locator("h1").inner_text()


async def _someone_elses_workload(market) -> str:
    from master.records import AccountRecord, WorkloadSpec

    await market.server.master.accounts.create(AccountRecord(id="zoe", role="renter"))
    await market.services.market.credit("zoe", parse_amount("1"), "theirs", key="zoe")  # work starts on money
    record = await market.services.workloads.submit_workload("zoe", WorkloadSpec(name="theirs", image="python:3.12"))
    return record.id


def test_the_offers_page_reflows_on_a_375_px_wide_screen(market, browser, sign_in, shot):
    context = browser.new_context(viewport={"width": 375, "height": 800})
    page = context.new_page()
    try:
        sign_in(page, "renter")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than the screen"
        assert page.get_by_label("GPU model").is_visible()
        shot(page, "offers-375px")
    finally:
        context.close()


def test_the_skip_link_is_the_first_stop_and_every_input_has_a_label(market, page, sign_in):
    sign_in(page, "renter")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    unlabelled = page.evaluate(
        """[...document.querySelectorAll('input:not([type=hidden]), select')]
             .filter(el => !(el.labels && el.labels.length) && !el.getAttribute('aria-label')).map(el => el.name)"""
    )
    assert unlabelled == []


def test_the_rent_and_launch_forms_show_the_total_per_hour_and_how_long_the_balance_lasts(market, page, sign_in, shot):
    """Money before work (issue 23): before renting, the renter reads what the work costs per hour and how long its
    balance lasts; what can never run here is refused on the form, saying what to change."""
    sign_in(page, "renter")
    page.get_by_role("link", name="Rent offer agt-a10", exact=False).click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.locator("#cost").inner_text() == (
        "Total 1.20 USD per hour for 1 GPU(s) at the offer's on-demand price; your balance of 25.00 USD lasts about "
        "20.8 h at that rate."
    )
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_role("button", name="Rent").click()  # no name: the form comes back, priced for 2 GPUs
    page.wait_for_load_state()  # the page the click brings, whole
    assert "Total 2.40 USD per hour for 2 GPU(s)" in page.locator("#cost").inner_text()
    assert "lasts about 10.4 h" in page.locator("#cost").inner_text()
    shot(page, "rent-cost")
    page.goto(f"{market.url}/console/launch")
    assert "at the cheapest host's price" in page.locator("#cost").inner_text()
    page.get_by_label("Name", exact=True).fill("nowhere")
    page.get_by_label("Image", exact=True).fill("python:3.12")
    page.get_by_label("GPU model", exact=False).fill("b200")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    alert = page.get_by_role("alert").inner_text()
    assert "can never run on this grid" in alert and "replica.models" in alert, alert
    shot(page, "launch-never-runs")


def test_launching_on_a_sandbox_only_grid_without_the_box_ticked_is_refused_naming_it(tmp_path, page):
    """Issue 23: the launch form's default (no process runtime) on a grid of sandboxed hosts was accepted and told to
    wait for ever; it is refused on the form, naming the box that fixes it."""
    import msgspec

    from tests.console.conftest import ConsoleMaster, console_config, sign_in_as

    master = ConsoleMaster(msgspec.structs.replace(console_config(tmp_path), offer_sandboxed_hosts=True))
    master.start()
    try:
        master.run(add_agent(master.server.master, "agt-proc", "a10:1", provider="acme", runtime="process", isolation="sandbox"))
        sign_in_as(page, master.url, "renter")
        page.goto(f"{master.url}/console/launch")
        page.get_by_label("Name", exact=True).fill("boxed")
        page.get_by_label("Image", exact=True).fill("python:3.12")  # the image none ticks the box (test_launch_fields)
        page.get_by_role("button", name="Launch").click()
        page.wait_for_load_state()  # the page the click brings, whole
        alert = page.get_by_role("alert").inner_text()
        assert "can never run on this grid" in alert and "May run as a sandboxed process" in alert, alert
    finally:
        master.stop()

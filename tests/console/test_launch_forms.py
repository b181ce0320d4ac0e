"""The launch and rent forms' environment variables, disk size and reserved option, with the total per hour and how long
the balance lasts before renting, in Debian's Chromium against a real Master. Hosts are registered as a hello would
(no agent runs behind them: what is checked is what the Master stores and refuses)."""

from __future__ import annotations

import re

import pytest

from management.market.money import parse_amount
from management.market.prices import PriceSetting
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def market(console_master):
    """acme's A10 x2 host (1500 GiB of free disk), 1.20 per GPU-hour on demand, 25% off reserved (0.90), bids from 0.40;
    the renter has 25.00."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> None:
        await add_agent(master, "agt-a10", "a10:2", provider="acme", runtime="docker", isolation="container")
        await services.prices.set_default_price("acme", PriceSetting(on_demand="1.20", min_bid="0.40", reserved_discount=0.25))
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")

    console_master.run(seed())
    return console_master


def stored_spec(market, workload_id: str):
    record = market.run(market.services.workloads.workload_overview(workload_id, account="rita"))
    return record.workload.spec


def fill_basics(page, name: str) -> None:
    page.get_by_label("Name", exact=True).fill(name)
    page.get_by_label("Image", exact=True).fill("python:3.12")


def test_a_launch_carries_its_environment_and_disk_size_into_the_workload(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/launch")
    fill_basics(page, "with-env")
    page.get_by_label("Environment variables", exact=False).fill("# training\nEPOCHS=3\nHF_HOME=/data/hf\n\nGREETING=a=b c")
    page.get_by_label("Disk, GiB", exact=False).fill("100")
    shot(page, "launch-filled")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    spec = stored_spec(market, page.url.rsplit("/", 1)[1])
    assert spec.env == {"EPOCHS": "3", "HF_HOME": "/data/hf", "GREETING": "a=b c"}
    assert spec.constraints.min_disk_gib == 100.0


def test_bad_environment_lines_and_disk_sizes_are_said_beside_their_fields_and_kept(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/launch")
    fill_basics(page, "bad-env")
    typed = "EPOCHS=3\n1BAD=x"
    page.get_by_label("Environment variables", exact=False).fill(typed)
    page.get_by_label("Disk, GiB", exact=False).fill("lots")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "environment, line 2: '1BAD' is not a variable name" in page.locator("#env-error").inner_text()
    assert page.get_by_label("Environment variables", exact=False).get_attribute("aria-invalid") == "true"
    assert page.get_by_label("Environment variables", exact=False).input_value() == typed
    assert "disk: a number, not 'lots'" in page.locator("#disk_gib-error").inner_text()
    shot(page, "env-and-disk-errors")
    page.get_by_label("Environment variables", exact=False).fill("A=1\nNO_EQUALS\nA=2")
    page.get_by_label("Disk, GiB", exact=False).fill("0")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "line 2: NAME=value, not 'NO_EQUALS'" in page.locator("#env-error").inner_text()
    assert "disk: from 1 to" in page.locator("#disk_gib-error").inner_text()
    page.get_by_label("Environment variables", exact=False).fill("A=1\nA=2")
    page.get_by_role("button", name="Launch").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert "line 2: A is set twice" in page.locator("#env-error").inner_text()
    assert market.run(market.services.workloads.list_workloads(owner="rita", states=None, after=None, limit=5)).items == []


def test_renting_more_disk_than_the_host_has_is_refused_on_the_form(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/offers/agt-a10/rent")
    fill_basics(page, "big-disk")
    page.get_by_label("Disk, GiB", exact=False).fill("2000")
    page.get_by_role("button", name="Rent", exact=True).click()
    page.wait_for_load_state()  # the page the click brings, whole
    alert = page.get_by_role("alert").inner_text()
    assert "offer agt-a10 has 1500 GiB of free disk; the workload asks for 2000 GiB" in alert, alert
    shot(page, "disk-refused")
    page.get_by_label("Disk, GiB", exact=False).fill("1000")
    page.get_by_role("button", name="Rent", exact=True).click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    assert stored_spec(market, page.url.rsplit("/", 1)[1]).constraints.min_disk_gib == 1000.0


def test_a_reserved_rental_shows_its_prepaid_total_is_refused_beyond_the_balance_and_rents_within_it(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/offers/agt-a10/rent")
    fill_basics(page, "reserved-1")
    page.get_by_role("radio", name="Reserved", exact=False).check()
    page.get_by_role("button", name="Rent", exact=True).click()  # no period: said beside its field
    page.wait_for_load_state()  # the page the click brings, whole
    assert "a reserved rental prepays a period" in page.locator("#reserved_hours-error").inner_text()
    page.get_by_label("Reserved period, hours", exact=False).fill("48")
    page.get_by_role("button", name="Update the total").click()  # priced, nothing rented
    page.wait_for_load_state()  # the page the click brings, whole
    cost = page.locator("#cost").inner_text()
    assert cost.startswith("Total 0.90 USD per hour for 1 GPU(s) at the offer's reserved price"), cost
    assert cost.endswith("the reserved period of 48 h is prepaid: 43.20 USD, more than your available balance of 25.00 USD.")
    assert page.get_by_role("alert").count() == 0
    shot(page, "reserved-priced")
    page.get_by_role("button", name="Rent", exact=True).click()
    page.wait_for_load_state()  # the page the click brings, whole
    alert = page.get_by_role("alert").inner_text()
    assert alert.startswith("Not rented: a reserved period of 48 h on 1 GPU(s) is prepaid: 43.20 USD"), alert
    assert "the balance available is 25.00 USD" in alert
    shot(page, "reserved-refused")
    page.get_by_label("Reserved period, hours", exact=False).fill("24")
    page.get_by_role("button", name="Rent", exact=True).click()
    page.wait_for_url(re.compile(r"/console/workloads/wl-"))
    rental = stored_spec(market, page.url.rsplit("/", 1)[1]).rental
    assert (rental.kind, rental.reserved_s, rental.offer) == ("reserved", 24 * 3600.0, "agt-a10")
    assert "reserved" in page.get_by_role("region", name="Rental and charge").inner_text()
    shot(page, "reserved-rented")


def test_update_the_total_prices_the_form_as_filled_in_without_launching(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/launch")
    assert "Total 1.20 USD per hour for 1 GPU(s) at the cheapest host's price" in page.locator("#cost").inner_text()
    page.get_by_label("GPUs", exact=True).fill("2")
    page.get_by_role("radio", name="Reserved", exact=False).check()
    page.get_by_label("Reserved period, hours", exact=False).fill("10")
    page.get_by_role("button", name="Update the total").click()
    page.wait_for_load_state()  # the page the click brings, whole
    cost = page.locator("#cost").inner_text()
    assert cost.startswith("Total 1.80 USD per hour for 2 GPU(s) at the cheapest host's reserved price"), cost
    assert "prepaid: 18.00 USD" in cost and "lasts about 13.9 h" in cost
    assert page.get_by_label("Reserved period, hours", exact=False).input_value() == "10"
    assert market.run(market.services.workloads.list_workloads(owner="rita", states=None, after=None, limit=5)).items == []
    shot(page, "launch-priced")

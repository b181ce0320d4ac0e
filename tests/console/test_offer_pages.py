"""The offers page's menus and sortable columns, and one offer's own page, in Debian's Chromium against a real Master.

Hosts are registered as a hello would (no agent runs behind them). The H100 host's GPUs are reported as real cards and
their verification is recorded as a passed run would record it: there is no GPU here to measure, so the record stands in
for the run (master/verifier.py is tested on its own); everything else (prices, drain and undrain, the offer index, the
events the history is read from) is the Master's own."""

from __future__ import annotations

import re
import time

import msgspec
import pytest

from agent.simulate import SimulatedCollector
from common.inventory import HostInfo, Inventory
from common.wire import BenchmarkFigures
from management.market.money import parse_amount
from management.market.prices import PriceSetting
from master.records import AgentRecord, GpuVerification
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

H100_HOST = HostInfo(
    hostname="gpu-box-7",
    cpu_model="AMD EPYC 9454",
    cpu_cores=96,
    ram_mib=1024 * 1024,
    disk_total_gib=7000,
    disk_free_gib=6400,
    os="Debian 12",
    kernel="6.1.0-18",
    bandwidth_mbps_down=940.0,
    bandwidth_mbps_up=410.0,
    latency_ms=12.0,
)


async def add_real_h100_host(master, agent_id: str) -> None:
    """A host whose two H100s are real cards (not simulated) with a passed verification run each."""
    agent = AgentRecord(id=agent_id, provider="acme", state="enrolled", enrolled_at=time.time())
    await master.store.agents.put(agent)
    await master.registry.add(agent)
    gpus = [msgspec.structs.replace(g, simulated=False) for g in SimulatedCollector("h100:2", host_key=agent_id).inventory()]
    inventory = Inventory(host=H100_HOST, gpus=gpus, simulated=False, runtime="docker", isolation="container")
    await master.registry.on_hello(agent, inventory, relay="relay-1", region="us-east", now=time.time())
    figures = BenchmarkFigures(bf16_tflops=812.5, fp16_tflops=805.0, fp32_tflops=61.2, memory_bandwidth_gbs=3010.0, h2d_gbs=52.5)
    for gpu in master.gpus(agent_id):
        await master.registry.set_verification(gpu.uuid, GpuVerification(status="verified", at=time.time(), figures=figures))


@pytest.fixture
def market(console_master):
    """acme's hosts: two real H100s (us-east, its own price 2.50 after a default of 1.20), an A10 x2 and an L4 (eu-west,
    the default 1.20, bids from 0.40), an L4 in ap-south at 0.90; the renter has 25.00."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> None:
        await services.prices.set_default_price("acme", PriceSetting(on_demand="1.20", min_bid="0.40"))
        await add_real_h100_host(master, "agt-h100")
        hosts = (("agt-a10", "a10:2", "eu-west"), ("agt-l4", "l4:1", "eu-west"), ("agt-l4b", "l4:1", "ap-south"))
        for agent_id, gpus, region in hosts:
            await add_agent(master, agent_id, gpus, provider="acme", runtime="docker", isolation="container", region=region)
        await services.prices.set_host_price("agt-h100", PriceSetting(on_demand="2.50", reserved_discount=0.2))
        await services.prices.set_host_price("agt-l4b", PriceSetting(on_demand="0.90"))
        await services.hosts.drain("agt-h100")  # a spell in maintenance: its availability shows it
        await services.hosts.undrain("agt-h100")
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")

    console_master.run(seed())
    return console_master


def offer_ids(page) -> list[str]:
    return [cell.strip() for cell in page.locator("table tbody tr td:first-child").all_inner_texts()]


def test_the_menus_list_what_is_offered_and_filter_by_it(market, page, sign_in, shot):
    sign_in(page, "renter")
    options = lambda name: page.get_by_label(name, exact=True).locator("option").all_inner_texts()  # noqa: E731
    assert options("GPU model") == ["any", "a10", "h100-sxm", "l4"]
    assert options("Region") == ["any", "ap-south", "eu-west", "us-east"]
    assert options("Tier")[0] == "any" and len(options("Tier")) >= 2
    page.get_by_label("Region", exact=True).select_option("eu-west")
    page.get_by_label("GPU model", exact=True).select_option("l4")
    page.get_by_role("button", name="Search").click()
    page.wait_for_url(re.compile(r"region=eu-west"))
    assert offer_ids(page) == ["agt-l4"]
    assert page.get_by_label("Region", exact=True).input_value() == "eu-west"  # the menu keeps the choice
    shot(page, "filtered-by-menus")


def test_a_column_heading_sorts_on_the_server_keeping_filters_and_flips_on_a_second_click(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/offers?gpus=1")
    page.get_by_role("link", name="Price / GPU-h: sort ascending").click()
    page.wait_for_url(re.compile(r"sort=price"))
    assert "gpus=1" in page.url and "cursor" not in page.url
    assert offer_ids(page)[0] == "agt-l4b" and offer_ids(page)[-1] == "agt-h100"
    assert page.locator("th[aria-sort=ascending]").inner_text().startswith("Price / GPU-h")
    assert "sorted by price, lowest first" in page.locator("caption").inner_text()
    shot(page, "sorted-by-price")
    page.get_by_role("link", name="Price / GPU-h: sort descending").click()
    page.wait_for_url(re.compile(r"sort=-price"))
    assert offer_ids(page)[0] == "agt-h100"
    assert page.locator("th[aria-sort=descending]").inner_text().startswith("Price / GPU-h")
    assert "sorted by price, highest first" in page.locator("caption").inner_text()
    page.get_by_role("link", name="Region: sort ascending").click()
    page.wait_for_url(re.compile(r"sort=region"))
    regions = page.locator("table tbody tr td:nth-child(9)").all_inner_texts()
    assert regions == sorted(regions) and "sorted by region, A to Z" in page.locator("caption").inner_text()
    shot(page, "sorted-by-region")


def test_an_unknown_sort_is_said_beside_the_sort_menu(market, page, sign_in, shot):
    sign_in(page, "renter")
    response = page.goto(f"{market.url}/console/offers?sort=colour")
    assert response.status == 400
    said = page.locator("#sort-error").inner_text()
    assert "sort: one of -score" in said and "'colour'" in said
    shot(page, "bad-sort")


def test_pages_keep_the_sort_a_column_chose(console_master, page, sign_in, shot):
    async def seed() -> None:
        master = console_master.server.master
        for n in range(30):
            await add_agent(master, f"agt-{n:02d}", "l4:1", provider="acme", runtime="docker", isolation="container")
            await console_master.services.prices.set_host_price(f"agt-{n:02d}", PriceSetting(on_demand=f"{1 + n / 100:.2f}"))

    console_master.run(seed())
    sign_in(page, "renter")
    page.get_by_role("link", name="Price / GPU-h: sort ascending").click()
    page.wait_for_url(re.compile(r"sort=price"))
    first = offer_ids(page)
    assert first == [f"agt-{n:02d}" for n in range(25)]
    page.get_by_role("link", name="Next page").click()
    page.wait_for_url(re.compile(r"cursor="))
    assert "sort=price" in page.url and offer_ids(page) == [f"agt-{n:02d}" for n in range(25, 30)]
    assert page.locator("th[aria-sort=ascending]").inner_text().startswith("Price / GPU-h")
    shot(page, "second-page-sorted")


def test_an_offer_page_shows_the_host_its_gpus_measured_figures_prices_and_availability(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Details of offer agt-h100", exact=False).click()
    page.wait_for_url(re.compile(r"/console/offers/agt-h100$"))
    assert page.locator("h1").inner_text() == "h100-sxm on gpu-box-7"
    host = page.locator("#host-facts").inner_text()
    for fact in ("AMD EPYC 9454, 96 cores", "1024 GiB", "6400 GiB free of 7000 GiB", "940 Mbps down, 410 Mbps up", "12 ms"):
        assert fact in host, (fact, host)
    gpus = page.locator("#gpus tbody tr").all_inner_texts()
    assert len(gpus) == 2
    for figure in ("550.54.15", "12.4", "Gen 5 x16", "verified", "812.5", "61.2", "3010", "52.5"):
        assert figure in gpus[0], (figure, gpus[0])
    assert page.locator("#verified").inner_text().startswith("yes, by measurement")
    assert page.locator("#completion").inner_text() == "too few rentals for a rate"  # docs/disputes.md
    assert page.locator("#price-now").inner_text().startswith("2.50 USD")
    assert "Reserved (prepaid): 2.00 USD" in page.locator("section.price").inner_text()
    history = page.locator("#price-history tbody tr").all_inner_texts()
    assert len(history) == 2 and "2.50" in history[0] and history[0].endswith("host")
    assert "1.20" in history[1] and "provider" in history[1] and "0.40" in history[1]
    states = page.locator("#state-spans tbody").inner_text()
    assert "maintenance" in states and "ready" in states
    availability = page.locator("#availability").inner_text()
    found = re.search(r"([0-9.]+)%", availability)
    assert found is not None, availability
    share = float(found.group(1))
    assert 0 < share < 100
    assert page.locator(".avail-bar").get_attribute("aria-label").startswith("Host state over time: ready from")
    shot(page, "offer-detail")
    page.get_by_role("link", name="Rent this offer").click()
    page.wait_for_url(re.compile(r"/console/offers/agt-h100/rent$"))
    assert "Total 2.50 USD per hour" in page.locator("#cost").inner_text()


def test_a_simulated_host_shows_no_measured_figures_and_no_history_said_plainly(market, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{market.url}/console/offers/agt-a10")
    gpus = page.locator("#gpus tbody tr").all_inner_texts()
    assert len(gpus) == 2 and all("simulated" in row for row in gpus)
    assert page.locator("#verified").inner_text() == "no"
    history = page.locator("#price-history tbody tr").all_inner_texts()
    assert len(history) == 1 and "1.20" in history[0] and "provider" in history[0]
    shot(page, "simulated-offer")


def test_an_offer_that_is_not_there_answers_404_saying_why(market, page, sign_in):
    sign_in(page, "renter")
    response = page.goto(f"{market.url}/console/offers/agt-nope")
    assert response.status == 404 and "no offer 'agt-nope': no such host" in page.locator("main").inner_text()
    market.run(market.services.hosts.drain("agt-l4"))
    response = page.goto(f"{market.url}/console/offers/agt-l4")
    assert response.status == 404 and "drained" in page.locator("main").inner_text()


def test_the_offer_page_reflows_on_a_375_px_wide_screen(market, browser, shot):
    from tests.console.conftest import sign_in_as

    context = browser.new_context(viewport={"width": 375, "height": 800})
    page = context.new_page()
    try:
        sign_in_as(page, market.url, "renter")
        page.goto(f"{market.url}/console/offers/agt-h100")
        shot(page, "offer-375px")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than the screen"
    finally:
        context.close()

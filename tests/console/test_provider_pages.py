"""The provider's pages in a browser, on a real Master (in-process) whose hosts are put in as a hello would: my hosts,
filtered and paged on the server; a host with its GPUs, reputation, live charts, drain/undrain and price; earnings.

The GPUs are simulated (no GPU here): their telemetry samples are made by the test and fed to the Master's telemetry
as an agent's frames would be; the charts draw them in Chromium with the vendored uPlot."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from common.inventory import GpuSample
from management.market.ledger import FEES, provider_account, renter_account
from master.records import LedgerEntry, LedgerLine
from tests.management.hosts import add_agent

HOSTS = [("agt-acme-a", "h100:2", "acme"), ("agt-acme-b", "l4:1", "acme"), ("agt-other-a", "h100:1", "other")]


@pytest.fixture
def hosts(console_master):
    master = console_master.server.master

    async def seed() -> None:
        for agent_id, simulate, provider in HOSTS:
            await add_agent(master, agent_id, simulate, provider=provider, runtime="docker", isolation="container")

    console_master.run(seed())
    return master


def samples(master, agent_id: str, ts: float, util: float) -> list[GpuSample]:
    return [
        GpuSample(
            uuid=g.uuid,
            ts=ts,
            utilization_pct=util,
            memory_used_mib=int(util * 100),
            temperature_c=40 + util / 4,
            power_w=100 + util,
        )
        for g in master.registry.gpus_of(agent_id)
    ]


def test_my_hosts_are_only_the_providers_own_and_are_filtered_on_the_server(console_master, hosts, page, sign_in, shot):
    sign_in(page, "provider")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="My hosts").click()
    table = page.locator("table#hosts")
    table.wait_for()
    assert table.locator("tbody tr").count() == 2
    assert "agt-acme-a" in table.inner_text() and "agt-other-a" not in table.inner_text()
    shot(page, "my-hosts")

    page.get_by_label("Model").select_option("l4")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(re.compile(r"model=l4"))
    rows = table.locator("tbody tr")
    assert rows.count() == 1 and "agt-acme-b" in rows.inner_text()
    shot(page, "filtered-by-model")

    response = page.goto(f"{console_master.url}/console/hosts/agt-other-a")  # another provider's host: as if missing
    assert response.status == 404
    response = page.goto(f"{console_master.url}/console/hosts?state=sideways")
    assert response.status == 400 and "state" in page.locator("main").inner_text()

    page.goto(f"{console_master.url}/console/hosts?limit=1")  # pages of one host: the cursor goes on to the next
    assert table.locator("tbody tr").inner_text().startswith("agt-acme-a")
    page.get_by_role("link", name="Next page").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert table.locator("tbody tr").inner_text().startswith("agt-acme-b") and "limit=1" in page.url
    found = re.search(r"cursor=([\w-]+)", page.url)
    assert found is not None, page.url
    cursor = found.group(1)
    response = page.goto(f"{console_master.url}/console/hosts?model=l4&cursor={cursor}")  # another filter: refused
    assert response.status == 400 and "cursor" in page.locator("main").inner_text()


def test_a_host_shows_its_gpus_reputation_live_charts_and_is_drained_and_priced(console_master, hosts, page, sign_in, shot):
    master = hosts
    now = time.time()
    console_master.run(_ingest(master, "agt-acme-a", now, 20.0))
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-a")
    assert page.locator("table[aria-labelledby=gpus-heading] tbody tr").count() == 2
    assert "uptime" in page.locator("table[aria-labelledby=rep-heading]").inner_text()
    assert page.locator("#host-completion").inner_text() == "0 rentals (too few for a rate)"  # docs/disputes.md
    page.locator("[data-gpu] .uplot canvas").first.wait_for()  # uPlot drew the charts
    utilization = page.locator("[data-gpu] [data-now=utilization]").first
    assert utilization.inner_text() == "20%"

    for step in range(1, 4):  # new samples arrive; the page's poll picks them up
        console_master.run(_ingest(master, "agt-acme-a", now + step, 20.0 + 20 * step))
    expect(utilization).to_have_text("80%")
    chart = page.locator("[data-gpu] [data-metric=utilization_pct]").first
    assert "now 80%" in chart.get_attribute("aria-label") and "4 samples" in chart.get_attribute("aria-label")
    shot(page, "host-live-charts")

    page.get_by_role("button", name=re.compile("^Drain")).click()
    page.locator(".flash").filter(has_text="drained").wait_for()
    assert page.locator("#host-state").inner_text() == "maintenance"
    shot(page, "drained")
    page.get_by_role("button", name=re.compile("^Undrain")).click()
    page.locator(".flash").filter(has_text="undrained").wait_for()
    assert page.locator("#host-state").inner_text() == "ready"

    page.get_by_label(re.compile("^On demand")).fill("3.25")
    page.get_by_role("button", name="Set this host's price").click()
    page.locator(".flash").filter(has_text="3.25").wait_for()
    assert "3.25" in page.locator("#price-on-demand").inner_text()
    shot(page, "priced")
    page.get_by_role("button", name="Use the default price again").click()
    page.locator(".flash").filter(has_text="no price of its own").wait_for()
    assert "the grid's default" in page.locator("#price-on-demand").inner_text()


async def _ingest(master, agent_id: str, ts: float, util: float) -> None:
    master.telemetry.ingest(agent_id, samples(master, agent_id, ts, util))


def test_earnings_show_net_per_period_as_a_chart_and_statements(console_master, hosts, page, sign_in, shot):
    master = hosts
    ledger = console_master.server.services.market.market

    async def charge() -> None:
        await ledger.load()
        for i, (host, gross) in enumerate((("agt-acme-a", 10_000_000), ("agt-acme-b", 4_000_000))):
            fee = gross // 10
            lines = [
                LedgerLine(account=renter_account("rita"), amount=-gross),
                LedgerLine(account=provider_account("acme"), amount=gross - fee, host=host),
                LedgerLine(account=FEES, amount=fee, host=host),
            ]
            entry = LedgerEntry(key=f"charge:test:{i}", ts=time.time() - 86400 * i, kind="charge", memo="test", lines=lines)
            await ledger.ledger.post(entry)

    console_master.run(charge())
    sign_in(page, "provider")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Earnings").click()
    page.locator("#statements").wait_for()
    assert page.locator("#earnings-total").inner_text() == "12.60 XX".replace("XX", master.config.currency)
    assert page.locator("#statements tbody tr").count() == 2  # two days
    page.locator("[data-earnings-series] .uplot canvas").wait_for()
    shot(page, "earnings")


def test_a_host_is_drained_with_the_keyboard_alone(console_master, hosts, page, sign_in, shot):
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-b")
    for _ in range(30):  # Tab through the page until the drain button has the focus
        page.keyboard.press("Tab")
        focused = page.evaluate("document.activeElement.textContent.trim()")
        if focused.startswith("Drain"):
            break
    else:
        pytest.fail("the drain button is not reached with Tab")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "the focused button shows no focus outline"
    shot(page, "drain-focused")
    page.keyboard.press("Enter")
    page.locator(".flash").filter(has_text="drained").wait_for()
    assert page.locator("#host-state").inner_text() == "maintenance"


def test_a_chart_of_a_single_sample_keeps_its_time_axis_to_about_a_minute(console_master, hosts, page, sign_in, shot):
    master = hosts
    console_master.run(_ingest(master, "agt-acme-b", time.time(), 30.0))
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-b")
    page.locator("[data-gpu] .uplot canvas").first.wait_for()
    chart = page.locator("[data-gpu] [data-metric=utilization_pct]").first
    expect(chart).to_have_attribute("data-span-s", re.compile(r"^\d+$"))  # the seconds its time axis spans
    assert 30 <= int(chart.get_attribute("data-span-s")) <= 120  # not 0: uPlot would then label the axis with years
    shot(page, "one-sample")


def test_a_host_page_shows_each_gpus_measured_verification_with_its_history(console_master, hosts, page, sign_in, shot):
    """Two runs on one GPU (a pass, then a late answer) and one pass on the other, recorded as the Master's verifier
    records them (master/verifier.py ``finish``); no GPU here, so the outcomes are written by the test."""
    from common.wire import BenchmarkFigures
    from master.verification import Outcome

    master = hosts
    first, second = (g.uuid for g in master.registry.gpus_of("agt-acme-a"))
    figures = BenchmarkFigures(
        fp32_tflops=66.7, fp16_tflops=800.0, bf16_tflops=800.0, memory_bandwidth_gbs=3000.0, h2d_gbs=50.0, d2h_gbs=50.0,
        allocatable_mib=79_000, duration_s=1.2, simulated=True,
    )  # fmt: skip
    now = time.time()

    def outcome(uuid: str, at: float, status: str, code: str, reason: str, *, answered: bool = True) -> Outcome:
        """A run as the verifier ends it: a late one has no commit, so neither its time nor figures."""
        return Outcome(
            challenge_id=f"vc-{uuid}-{at}", agent_id="agt-acme-a", gpu_uuid=uuid, model="h100-sxm", status=status, code=code,
            reason=reason, started_at=at - 1, finished_at=at, commit_s=0.61 if answered else None, challenge_tflops=None,
            figures=figures if answered else None,
        )  # fmt: skip

    async def record() -> None:
        await master.verifier.finish(outcome(first, now - 60, "verified", "", "answered a fresh challenge correctly in 0.61 s"))
        late = (
            "no answer by the deadline (3.93 s for a NVIDIA H100 SXM): slower than a NVIDIA H100 SXM computes it, "
            "or the host stalled"
        )
        await master.verifier.finish(outcome(first, now, "failed", "late", late, answered=False))
        await master.verifier.finish(outcome(second, now, "verified", "", "answered a fresh challenge correctly in 0.61 s"))

    console_master.run(record())
    sign_in(page, "provider")
    page.goto(f"{console_master.url}/console/hosts/agt-acme-a")
    gpu_row = page.locator("table[aria-labelledby=gpus-heading] tbody tr").filter(has_text=first)
    assert gpu_row.locator("td").nth(5).inner_text() == "no"  # flagged by its failed run: not offered
    failed = page.locator("section.verification").filter(has_text=first)
    expect(failed.locator(".verification-label")).to_have_text("simulated, failed: late")
    assert "Not offered as a h100-sxm" in failed.locator(".warning").inner_text()
    rows = failed.locator("table.verification-runs tbody tr")
    assert rows.count() == 2
    assert "failed: late" in rows.nth(0).inner_text() and "verified" in rows.nth(1).inner_text()  # newest first
    assert "0.61 s" not in rows.nth(0).inner_text()  # a late run committed nothing: no answer time, no figures
    assert "800.0" in rows.nth(1).inner_text() and "79,000" in rows.nth(1).inner_text()
    passed = page.locator("section.verification").filter(has_text=second)
    expect(passed.locator(".verification-label")).to_have_text("simulated")  # a simulated GPU is never "verified"
    page.locator("#verification-heading").scroll_into_view_if_needed()
    shot(page, "host-verification")

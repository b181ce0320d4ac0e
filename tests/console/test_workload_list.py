"""My workloads: each row says what the workload cost so far, on which host it ran and for how long, and a long
"why" stays inside its card; in Debian's Chromium against a real Master. The host is registered as a hello would
(no agent runs behind it); the run is a rental put in the store and a charge posted to the ledger as the metering
loop posts them (no container runs here to be metered)."""

from __future__ import annotations

import asyncio
import time

import pytest

from management.market.money import parse_amount
from management.market.prices import PriceSetting
from management.store import rental_repo
from master.port import LedgerEntry, LedgerLine, RentalHost, RentalRecord, WorkloadSpec
from master.records import ReplicaSpec
from tests.management.hosts import add_agent

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


LONG_REASON = (
    "create_container failed on agt-a10: image_not_found: pull access denied for registry.example.com/team/"
    "a-very-long-repository-name/with-nested-paths-and-more-nested-paths:2026-12-06-build-4471-cuda12.4-cudnn9, "
    "repository does not exist or may require 'docker login': denied: requested access to the resource is denied"
)


@pytest.fixture
def ran(console_master):
    """rita's workload "trained" ran 2 h 30 min on agt-a10 and was charged 3.00; "waiting" never started."""
    master, services = console_master.server.master, console_master.services

    async def seed() -> tuple[str, str]:
        await add_agent(master, "agt-a10", "a10:2", provider="acme", runtime="docker", isolation="container")
        await services.prices.set_default_price("acme", PriceSetting(on_demand="1.20"))
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")
        trained = await services.workloads.submit_workload("rita", WorkloadSpec(name="trained", image="python:3.12"))
        await services.workloads.cancel_workload(trained.id, account="rita")
        host = RentalHost(agent_id="agt-a10", provider="acme", gpus=1, price=parse_amount("1.20"))
        end = time.time() - 60
        rental = RentalRecord(
            id=f"{trained.id}-a1", workload_id=trained.id, account="rita", kind="on_demand", hosts=[host],
            started_at=end - 9000, ended_at=end,
        )  # fmt: skip
        assert await rental_repo(master.store).insert(rental)
        charge = LedgerEntry(
            key=f"charge:{rental.id}:0", ts=end, kind="charge", memo="charge", rental=rental.id,
            lines=[LedgerLine(account="renter:rita", amount=-3_000_000), LedgerLine(account="provider:acme", amount=3_000_000)],
        )  # fmt: skip
        assert await services.market.market.ledger.post(charge)
        waiting = await services.workloads.submit_workload(
            "rita", WorkloadSpec(name="waiting", image="python:3.12", replica=ReplicaSpec(gpus=2), max_duration_s=60)
        )
        while (await services.workloads.get_workload(waiting.id)).state == "queued":  # the scheduler places it
            await asyncio.sleep(0.05)
        # its host could not pull the image: the reason is the engine's whole message, as the runner records it
        await services.workloads.book.end(waiting.id, "start_failed", LONG_REASON, time.time(), grace_s=0.0)
        return trained.id, waiting.id

    console_master.ids = console_master.run(seed())
    return console_master


def test_each_workload_says_its_cost_so_far_its_host_and_how_long_it_ran(ran, page, sign_in, shot):
    trained, waiting = ran.ids
    sign_in(page, "renter")
    page.goto(f"{ran.url}/console/workloads")
    shot(page, "workloads")
    headings = page.locator("thead th").all_inner_texts()
    assert headings[4:7] == ["Host", "Ran for", "Cost so far (USD)"]
    row = page.locator("tr", has=page.locator(f"a[href='/console/workloads/{trained}']"))
    cells = row.locator("td").all_inner_texts()
    assert cells[4:7] == ["agt-a10", "2 h 30 min", "3.00"]
    other = page.locator("tr", has=page.locator(f"a[href='/console/workloads/{waiting}']"))
    assert other.locator("td").all_inner_texts()[5:7] == ["not started", "0.00"]


def test_a_long_reason_stays_inside_its_card_and_is_whole_in_its_title(ran, page, sign_in, shot):
    trained, waiting = ran.ids
    sign_in(page, "renter")
    page.goto(f"{ran.url}/console/workloads")
    why = page.locator("tr", has=page.locator(f"a[href='/console/workloads/{waiting}']")).locator("td.why .clamp")
    assert why.get_attribute("title") == LONG_REASON
    card, cell = page.locator(".table-wrap").bounding_box(), why.bounding_box()
    assert cell["x"] + cell["width"] <= card["x"] + card["width"], "the reason runs past the card's right edge"
    assert page.evaluate("document.querySelector('.table-wrap').scrollWidth <= document.querySelector('.table-wrap').clientWidth")
    shot(page, "long-reason-wrapped")

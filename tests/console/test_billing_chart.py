"""The billing page's spend chart starts at the first charge and draws each hour as a bar (no spend drawn before it
or between hours), and every console page has the idlegrid icon; in Debian's Chromium against a real Master. The
charges are posted to the ledger as the metering loop posts them (no rental runs here)."""

from __future__ import annotations

import json
import time

import pytest

from management.market.ledger import provider_account, renter_account
from management.market.money import parse_amount
from master.port import LedgerEntry, LedgerLine

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
HOUR = 3600


def charge(key: str, ts: float, amount: int) -> LedgerEntry:
    paid = LedgerLine(account=renter_account("rita"), amount=-amount)
    lines = [paid, LedgerLine(account=provider_account("acme"), amount=amount)]
    return LedgerEntry(key=key, ts=ts, kind="charge", memo=key, lines=lines)


@pytest.fixture
def charged(console_master):
    """rita was credited 25.00 three days ago, and charged 1.50 three hours ago and 0.70 this hour."""
    services = console_master.services
    this_hour = time.time() // HOUR * HOUR

    async def seed() -> None:
        ledger = services.market.market.ledger
        await services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome")
        await ledger.post(charge("three hours ago", this_hour - 3 * HOUR + 60, 1_500_000))
        await ledger.post(charge("this hour", this_hour + 1, 700_000))

    console_master.run(seed())
    console_master.first_hour = this_hour - 3 * HOUR
    return console_master


def test_the_spend_chart_starts_at_the_first_charge_with_a_bar_per_hour(charged, page, sign_in, shot):
    sign_in(page, "renter")
    page.goto(f"{charged.url}/console/billing")
    series = json.loads(page.locator("#spend-data").text_content())
    assert series["x"][0] == charged.first_hour + HOUR / 2 and series["y"][0] == 1.5  # nothing before the first charge
    assert series["y"] == [1.5, 0.0, 0.0, 0.7] and series["span"] == HOUR
    page.locator("#spend-chart canvas").wait_for()  # uPlot drew it
    rows = page.locator("table:has(caption:text('Spend per hour')) tbody tr")
    assert rows.count() == 2  # the table lists the hours that had spend
    shot(page, "billing-spend-bars")


def test_every_page_has_the_idlegrid_icon(charged, page, sign_in):
    page.goto(f"{charged.url}/console/signin")
    icon = page.locator("link[rel=icon]")
    assert icon.get_attribute("type") == "image/svg+xml"
    answer = page.request.get(f"{charged.url}{icon.get_attribute('href')}")
    assert answer.status == 200 and answer.headers["content-type"].startswith("image/svg+xml")
    assert "<svg" in answer.text()
    sign_in(page, "renter")
    assert page.locator("link[rel=icon]").get_attribute("href") == icon.get_attribute("href")

"""Statements and payouts on the console, in Debian's Chromium against a real Master paying providers through the fake
of Stripe's Connect calls (tests/support/fake_connect.py, on 127.0.0.1): a provider reads its statement of the month,
connects its payout account through the payment provider's hosted onboarding, and sees its payout once the run paid
it; a renter reads its own statement and downloads it as CSV."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from playwright.sync_api import expect

from management.market.ledger import provider_account
from management.market.money import parse_amount
from management.payments.payouts import period_label
from master.port import LedgerEntry, LedgerLine
from tests.console.conftest import ConsoleMaster, console_config
from tests.support.fake_connect import FakeConnect, fake_connect_server
from tests.support.grid import free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
DAY = 86400.0


@pytest.fixture
def console_master(tmp_path: Path) -> Iterator[ConsoleMaster]:
    port = free_port()
    config = msgspec.structs.replace(
        console_config(tmp_path),
        payment_provider="stripe",
        stripe_api_key="sk_test_console",
        stripe_webhook_secret="whsec_console",
        stripe_api_base=f"http://127.0.0.1:{port}",
        payout_window_s=2 * DAY,
        payout_min="5",
    )
    master = ConsoleMaster(config)
    serving = fake_connect_server(port=port)
    master.fake = master.run(serving.__aenter__())  # type: ignore[attr-defined]  # served on the Master's loop
    master.start()
    yield master
    master.run(serving.__aexit__(None, None, None))
    master.stop()


def earn(master: ConsoleMaster, provider: str, amount: str, age_s: float, key: str) -> None:
    """Earnings as a metering charge posts them, ``age_s`` ago."""
    micro = parse_amount(amount)
    lines = [LedgerLine(account="hold:rita", amount=-micro), LedgerLine(account=provider_account(provider), amount=micro)]
    entry = LedgerEntry(key=key, ts=time.time() - age_s, kind="charge", memo=f"earned {key}", lines=lines)
    assert master.run(master.services.market.market.ledger.post(entry))


def test_a_provider_reads_its_statement_connects_its_payout_account_and_sees_its_payout(console_master, page, sign_in, shot):
    fake: FakeConnect = console_master.fake
    earn(console_master, "acme", "30", 3 * DAY, "e-old")  # past the 2-day window
    earn(console_master, "acme", "20", 3600, "e-new")  # inside it: waits
    sign_in(page, "provider")
    page.get_by_role("link", name="Statements").click()
    expect(page.get_by_role("heading", name="Statements")).to_be_visible()
    expect(page.locator("#payable")).to_have_text("30.00 USD")
    expect(page.locator("#payout-status")).to_contain_text("No payout account connected yet")
    shot(page, "provider-statement-no-payout-account")

    page.get_by_role("button", name="Connect a payout account").click()
    expect(page.locator(".flashes")).to_contain_text("Payout account made")
    expect(page.locator("#payout-status")).to_have_text("onboarding not finished")
    shot(page, "onboarding-link")
    page.get_by_role("link", name="Continue to stripe's onboarding").click()
    expect(page.locator("body")).to_have_text("onboarded")  # Stripe's hosted onboarding (the fake's), finished
    assert len(fake.accounts) == 1
    page.goto(f"{console_master.url}/console/statements")
    expect(page.locator("#payout-status")).to_have_text("can take payouts")
    expect(page.get_by_role("button", name="Connect a payout account")).to_have_count(0)
    shot(page, "payout-account-connected")

    [paid] = console_master.run(console_master.services.payouts.run())  # the scheduled run
    page.reload()
    expect(page.locator("#payouts tbody tr")).to_have_count(1)
    expect(page.locator("#payouts tbody")).to_contain_text("30.00 USD")
    expect(page.locator("#payouts tbody")).to_contain_text("paid")
    expect(page.locator("#payable")).to_have_text("0.00 USD")
    month = period_label(time.time(), "month")
    page.get_by_label("Period (UTC)").fill(month)
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#statement tbody")).to_contain_text("payout")
    expect(page.locator("#closing")).to_have_text("20.00 USD")
    shot(page, "paid-out")
    assert [t["amount"] for t in fake.transfers] == [3000] and paid.amount == parse_amount("30")


def test_a_renter_reads_its_statement_of_a_period_and_downloads_it(console_master, page, sign_in, shot):
    ledger = console_master.services.market.market.ledger
    console_master.run(ledger.credit("rita", parse_amount("25.00"), "welcome", key="welcome"))
    sign_in(page, "renter")
    page.get_by_role("link", name="Statements").click()
    expect(page.locator("#statement tbody")).to_contain_text("welcome")
    expect(page.locator("#opening")).to_have_text("0.00 USD")
    expect(page.locator("#closing")).to_have_text("25.00 USD")
    expect(page.locator("#payouts")).to_have_count(0)  # a renter has no payouts
    shot(page, "renter-statement")

    page.get_by_label("Period (UTC)").fill("1999-01")
    page.get_by_role("button", name="Show").click()
    expect(page.locator("#statement tbody")).to_contain_text("No entries in 1999-01")
    shot(page, "renter-empty-period")

    href = page.locator("#statement-csv").get_attribute("href")
    assert href is not None and "period=1999-01" in href
    answer: Any = page.request.get(f"{console_master.url}/console/statements.csv?period={period_label(time.time(), 'month')}")
    rows = list(csv.reader(io.StringIO(answer.text())))
    assert [(r[2], r[6], r[7]) for r in rows[1:]] == [("credit", "welcome", "25.00")]

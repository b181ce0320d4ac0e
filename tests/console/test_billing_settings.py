"""The renter's billing settings on the console's billing page, in Debian's Chromium against a real Master taking
payments through localstripe (127.0.0.1): the runway and the hold, the saved payment method (by the provider's label;
the card itself is entered on the provider's element, never on the console), and auto top-up turned on, refused with
the reason, and off."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from playwright.sync_api import expect

from management.market.money import parse_amount
from tests.console.conftest import ConsoleMaster, console_config
from tests.support.localstripe import LocalStripe

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def console_master(tmp_path: Path, localstripe: LocalStripe) -> Iterator[ConsoleMaster]:
    config = msgspec.structs.replace(
        console_config(tmp_path),
        payment_provider="stripe",
        stripe_api_key=localstripe.api_key,
        stripe_webhook_secret="whsec_console",
        stripe_api_base=localstripe.url,
        topup_max="500",
    )
    master = ConsoleMaster(config)
    master.start()
    master.run(master.services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome"))
    yield master
    master.stop()


def expect_flash(page, text: str) -> None:
    """The page after the click shows ``text`` in its flashes: waits for it (the click returns before the next page
    loads, and the page before it may have a flash of its own)."""
    expect(page.locator(".flashes")).to_contain_text(text)


def test_a_renter_sets_auto_topup_on_the_billing_page(console_master, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Billing").click()
    page.wait_for_load_state()  # the page the click brings, whole
    assert page.locator("#payment-method").inner_text() == "none saved"
    assert page.locator("#runway").inner_text() == "as long as nothing runs"
    shot(page, "billing-no-method")

    page.get_by_label("Top up automatically").check()
    page.get_by_label("when the balance falls below", exact=False).fill("10")
    page.get_by_label("add (", exact=False).fill("20")
    page.get_by_role("button", name="Save auto top-up").click()
    expect_flash(page, "no saved payment method")
    shot(page, "refused-without-a-method")

    # The renter's browser saves a card on the provider's element, which hands the grid a token (Stripe's test one).
    console_master.run(console_master.services.billing_settings.save_method("rita", "pm_card_visa"))
    page.reload()
    assert page.locator("#payment-method").inner_text() != "none saved"
    page.get_by_label("Top up automatically").check()
    page.get_by_label("when the balance falls below", exact=False).fill("10")
    page.get_by_label("add (", exact=False).fill("-20")
    page.get_by_role("button", name="Save auto top-up").click()
    expect_flash(page, "Auto top-up not changed: Amount: '-20' is not an amount")
    page.get_by_label("Top up automatically").check()
    page.get_by_label("when the balance falls below", exact=False).fill("10")
    page.get_by_label("add (", exact=False).fill("20")
    page.get_by_role("button", name="Save auto top-up").click()
    expect_flash(page, "Auto top-up on: 20.00 USD when the balance falls below 10.00 USD")
    assert page.get_by_label("Top up automatically").is_checked()
    assert page.locator("#auto-amount").input_value() == "20.00"
    shot(page, "auto-topup-on")

    page.get_by_label("Top up automatically").uncheck()
    page.get_by_role("button", name="Save auto top-up").click()
    expect_flash(page, "Auto top-up off.")
    assert not page.get_by_label("Top up automatically").is_checked()


def test_a_renter_adds_and_removes_spend_caps_on_the_billing_page(console_master, page, sign_in, shot):
    sign_in(page, "renter")
    page.get_by_role("link", name="Billing").click()
    expect(page.locator("#no-caps")).to_be_visible()
    page.get_by_label("Cap (", exact=False).fill("-5")
    page.get_by_role("button", name="Add cap").click()
    expect_flash(page, "Cap not added: Limit: '-5' is not an amount")
    page.get_by_label("Cap (", exact=False).fill("5")
    page.get_by_role("button", name="Add cap").click()
    expect_flash(page, "Added the soft cap of 5.00 USD per hour on the account.")
    page.get_by_label("Cap (", exact=False).fill("100")
    page.get_by_label("per", exact=True).select_option("month")
    page.get_by_label("on project", exact=False).fill("train")
    page.get_by_label("Hard (stop work)").check()
    page.get_by_role("button", name="Add cap").click()
    expect_flash(page, "Added the hard cap of 100.00 USD per month on project train.")
    rows = page.locator("#caps tbody tr").all_inner_texts()
    assert len(rows) == 2 and "project train" in rows[1] and "hard: work stopped" in rows[1]
    page.get_by_label("Cap (", exact=False).fill("9")
    page.get_by_role("button", name="Add cap").click()
    expect_flash(page, "same scope, window and kind")  # a second soft hourly cap on the account
    shot(page, "caps")
    page.locator("#caps tbody tr").first.get_by_role("button", name="Remove").click()
    expect_flash(page, "Removed the soft cap of 5.00 USD per hour on the account.")
    assert len(page.locator("#caps tbody tr").all_inner_texts()) == 1
    shot(page, "caps-after-removal")

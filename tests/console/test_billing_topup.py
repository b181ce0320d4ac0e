"""A renter tops up on the console's billing page, in Debian's Chromium against a real Master taking payments through
localstripe (127.0.0.1): the card is typed into the provider's own element, drawn by the provider's script (localstripe
serves a stand-in of Stripe.js, js.stripe.com/v3/, on its own port), and the balance grows when localstripe's signed
webhook reaches the Master, exactly once. No request the browser sends to the grid carries the card."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from playwright.sync_api import expect

from management.market.money import parse_amount
from tests.console.conftest import ConsoleMaster, console_config
from tests.support.localstripe import LocalStripe

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

WEBHOOK_SECRET = "whsec_console_topup"
CARD = "4242424242424242"
DECLINED_CARD = "4000000000000002"  # Stripe's test card declined when saved
AUTHENTICATED_CARD = "4000002500003155"  # Stripe's test card that asks for 3D Secure


@pytest.fixture
def console_master(tmp_path: Path, localstripe: LocalStripe) -> Iterator[ConsoleMaster]:
    config = msgspec.structs.replace(
        console_config(tmp_path),
        payment_provider="stripe",
        stripe_api_key=localstripe.api_key,
        stripe_webhook_secret=WEBHOOK_SECRET,
        stripe_api_base=localstripe.url,
        stripe_publishable_key="pk_test_idlegrid",
        stripe_js_url=f"{localstripe.url}/js.stripe.com/v3/",
        topup_max="500",
    )
    master = ConsoleMaster(config)
    master.start()
    master.run(localstripe.send_webhooks_to(f"{master.url}/api/v1/billing/webhook", WEBHOOK_SECRET))
    master.run(master.services.market.credit("rita", parse_amount("25.00"), "welcome", key="welcome"))
    yield master
    master.stop()


def type_card(page: Any, number: str) -> None:
    """Into the provider's element (localstripe's stand-in draws plain fields named by placeholders)."""
    element = page.locator("#card-element")
    element.get_by_placeholder("number").fill(number)
    element.get_by_placeholder("exp_month").fill("12")
    element.get_by_placeholder("exp_year").fill("34")
    element.get_by_placeholder("cvc").fill("123")
    element.get_by_placeholder("postal_code").fill("75001")


def test_a_renter_tops_up_with_a_card_on_the_providers_element(console_master, localstripe, page, sign_in, shot):
    to_grid: list[str] = []  # every request the browser sends to the grid, with its body
    csp: list[str] = []  # the billing page's Content-Security-Policy, each time it is loaded

    def sent(request: Any) -> None:
        if request.url.startswith(console_master.url):
            to_grid.append(f"{request.url} {request.post_data or ''}")

    def answered(response: Any) -> None:
        if response.url.partition("?")[0] == f"{console_master.url}/console/billing":
            csp.append(response.headers.get("content-security-policy", ""))

    page.on("request", sent)
    page.on("response", answered)
    sign_in(page, "renter")
    page.get_by_role("link", name="Billing").click()
    expect(page.locator("#available")).to_have_text("25.00 USD")
    expect(page.locator("#card-element").get_by_placeholder("number")).to_be_visible()  # the provider's script drew it
    shot(page, "top-up-form")

    page.get_by_label("Amount (USD)", exact=True).fill("-5")
    page.get_by_role("button", name="Pay").click()
    expect(page.locator("#topup-status")).to_contain_text("Not paid: Amount: '-5' is not an amount")
    page.get_by_label("Amount (USD)", exact=True).fill("1000")
    page.get_by_role("button", name="Pay").click()
    expect(page.locator("#topup-status")).to_contain_text("Not paid:")
    expect(page.locator("#topup-status")).to_contain_text("500")  # over topup_max: the grid says its bound
    shot(page, "amount-refused")

    page.get_by_label("Amount (USD)", exact=True).fill("30")
    type_card(page, DECLINED_CARD)
    page.get_by_role("button", name="Pay").click()
    expect(page.locator("#topup-status")).to_contain_text("Not paid: Your card was declined.")
    shot(page, "card-declined")

    type_card(page, CARD)
    page.get_by_role("button", name="Pay").click()
    expect(page).to_have_url(re.compile(r"/console/billing\?topup=\S+$"))
    expect(page.locator("#available")).to_have_text("55.00 USD", timeout=30_000)  # after the webhook (page reloads)
    expect(page.locator("#topups tbody tr").first).to_contain_text("credited")
    expect(page.locator("#topup-waiting")).to_have_count(0)
    expect(page.locator("#payment-method")).to_have_text("visa ending 4242")
    shot(page, "credited")

    # Credited once: one top-up entry in the ledger, under the top-up's key, however often localstripe delivers.
    statement = console_master.run(console_master.services.market.ledger_statement("rita", owner="rita", after_seq=0, limit=100))
    topups = [line for line in statement.lines if line.kind == "topup"]
    assert [line.amount for line in topups] == [parse_amount("30.00")]
    assert not any(CARD in sent or DECLINED_CARD in sent for sent in to_grid), "card data reached the grid"
    # The billing page allowed the provider's script and API, and nothing more.
    assert csp and all(f"script-src 'self' {localstripe.url}" in c and f"connect-src 'self' {localstripe.url}" in c for c in csp)
    assert all("frame-src" not in c for c in csp)  # localstripe's stand-in draws no frame


def test_a_card_that_asks_its_holder_to_authenticate_is_confirmed_on_the_providers_step(console_master, page, sign_in, shot):
    """3D Secure: the provider asks the renter, on its own step, when the card is saved and again when it is charged
    on session; the grid only hands the provider's script the payment's client secret."""
    sign_in(page, "renter")
    page.get_by_role("link", name="Billing").click()
    page.get_by_label("Amount (USD)", exact=True).fill("12.50")
    type_card(page, AUTHENTICATED_CARD)
    page.get_by_role("button", name="Pay").click()
    expect(page.get_by_role("button", name="Complete authentication")).to_be_visible()  # saving the card
    shot(page, "provider-asks-on-saving")
    page.get_by_role("button", name="Complete authentication").click()
    expect(page.locator("#topup-status")).to_have_text("Your card asks you to confirm the payment…")
    shot(page, "provider-asks-on-charging")
    page.get_by_role("button", name="Complete authentication").click()
    expect(page.locator("#available")).to_have_text("37.50 USD", timeout=30_000)
    expect(page.locator("#topups tbody tr").first).to_contain_text("credited")
    shot(page, "credited")

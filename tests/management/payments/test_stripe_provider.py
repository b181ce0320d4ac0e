"""The Stripe adapter against a real Stripe-compatible server (localstripe on 127.0.0.1, tests/support/localstripe.py):
the SDK's own requests create the PaymentIntent, and the webhook deliveries it signs are what ``verify_event`` reads."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Mapping

import pytest
import stripe
from aiohttp import web

from management.payments.provider import (
    InvalidPaymentMethod,
    InvalidWebhook,
    PaymentDeclined,
    PaymentProviderError,
    TopupFailed,
    TopupPaid,
    TopupRequest,
)
from management.payments.stripe_provider import StripeProvider
from tests.support.grid import free_port
from tests.support.localstripe import LocalStripe, wait_for

SECRET = "whsec_grid_test"


class Deliveries:
    """An aiohttp server the test runs, standing for the grid's webhook route: it keeps each delivery as sent."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, str]] = []
        self.url = ""

    async def receive(self, request: web.Request) -> web.Response:
        self.received.append((await request.read(), request.headers.get("Stripe-Signature", "")))
        return web.Response(text="ok")


@pytest.fixture
async def deliveries(localstripe: LocalStripe) -> AsyncIterator[Deliveries]:
    sink = Deliveries()
    app = web.Application()
    app.router.add_post("/hook", sink.receive)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    sink.url = f"http://127.0.0.1:{port}/hook"
    await localstripe.send_webhooks_to(sink.url, SECRET)
    try:
        yield sink
    finally:
        await runner.cleanup()


def provider(localstripe: LocalStripe, secret: str = SECRET) -> StripeProvider:
    return StripeProvider(localstripe.api_key, secret, api_base=localstripe.url)


def request(topup_id: str = "tu-1", amount: int = 25_000_000) -> TopupRequest:
    return TopupRequest(topup_id=topup_id, account="renter-1", amount=amount, currency="USD")


async def retrieve(localstripe: LocalStripe, reference: str) -> stripe.PaymentIntent:
    http = stripe.AIOHTTPClient()
    try:
        return await localstripe.client(http).v1.payment_intents.retrieve_async(reference)
    finally:
        await http.close_async()


async def test_a_topup_is_a_payment_intent_in_minor_units_naming_the_topup(localstripe: LocalStripe) -> None:
    start = await provider(localstripe).create_topup(request("tu-abc", 25_500_000))
    intent = await retrieve(localstripe, start.reference)
    assert intent.amount == 2550 and intent.currency == "usd"
    assert intent.metadata.to_dict() == {"idlegrid_topup": "tu-abc", "idlegrid_account": "renter-1"}
    assert intent.status == "requires_payment_method"  # the renter pays on Stripe's element, with the client secret
    assert start.client_secret == intent.client_secret and start.client_secret.startswith(start.reference)


async def test_an_unreachable_provider_is_a_provider_error_without_the_key(localstripe: LocalStripe) -> None:
    gone = StripeProvider("sk_test_do_not_print", SECRET, api_base=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(PaymentProviderError) as caught:
        await gone.create_topup(request())
    assert "sk_test_do_not_print" not in str(caught.value) and "sk_test_do_not_print" not in repr(gone)


async def test_a_paid_topup_arrives_as_a_signed_event_that_verifies(localstripe: LocalStripe, deliveries: Deliveries) -> None:
    grid = provider(localstripe)
    start = await grid.create_topup(request("tu-paid", 12_340_000))
    await localstripe.pay(start.reference)
    await wait_for(lambda: any(b'"payment_intent.succeeded"' in body for body, _ in deliveries.received))
    body, signature = next((b, s) for b, s in deliveries.received if b'"payment_intent.succeeded"' in b)
    event = grid.verify_event(body, signature)
    assert isinstance(event, TopupPaid)
    assert (event.reference, event.topup_id, event.amount, event.currency) == (start.reference, "tu-paid", 12_340_000, "USD")
    assert event.event_id.startswith("evt_")


async def test_a_declined_card_arrives_as_a_failed_topup(localstripe: LocalStripe, deliveries: Deliveries) -> None:
    grid = provider(localstripe)
    start = await grid.create_topup(request("tu-declined"))
    # Stripe's test method whose charge is declined (localstripe declines pm_card_visa_chargeDeclined only when it is
    # attached to a customer, as Stripe did once); the confirm answers the decline as a CardError.
    with pytest.raises(stripe.CardError):
        await localstripe.pay(start.reference, "pm_card_chargeCustomerFail")
    await wait_for(lambda: any(b'"payment_intent.payment_failed"' in body for body, _ in deliveries.received))
    body, signature = next((b, s) for b, s in deliveries.received if b'"payment_intent.payment_failed"' in b)
    event = grid.verify_event(body, signature)
    assert isinstance(event, TopupFailed) and event.topup_id == "tu-declined" and event.reason


async def test_a_forged_or_unsigned_delivery_is_not_believed(localstripe: LocalStripe, deliveries: Deliveries) -> None:
    grid = provider(localstripe)
    start = await grid.create_topup(request("tu-forged"))
    await localstripe.pay(start.reference)
    await wait_for(lambda: any(b'"payment_intent.succeeded"' in body for body, _ in deliveries.received))
    body, signature = next((b, s) for b, s in deliveries.received if b'"payment_intent.succeeded"' in b)
    raised = body.replace(b'"amount": 2500', b'"amount": 9999999')
    assert raised != body
    with pytest.raises(InvalidWebhook):
        grid.verify_event(raised, signature)  # the amount changed after signing
    with pytest.raises(InvalidWebhook):
        grid.verify_event(body, "")  # no signature at all
    with pytest.raises(InvalidWebhook):
        provider(localstripe, "whsec_someone_else").verify_event(body, signature)  # signed with another secret
    grid.verify_event(body, signature)  # the delivery as sent still verifies


def signed(payload: Mapping[str, object], secret: str, at: float) -> tuple[bytes, str]:
    """A delivery signed as Stripe signs one (the scheme localstripe and Stripe share): t=<time>,v1=HMAC-SHA256."""
    body = json.dumps(payload).encode()
    mac = hmac.new(secret.encode(), f"{int(at)}.".encode() + body, hashlib.sha256).hexdigest()
    return body, f"t={int(at)},v1={mac}"


def test_a_delivery_signed_too_long_ago_is_refused() -> None:
    grid = StripeProvider("sk_test_x", SECRET, tolerance_s=300)
    event = {"id": "evt_old", "object": "event", "type": "customer.created", "data": {"object": {"id": "cus_1"}}}
    body, signature = signed(event, SECRET, time.time() - 3600)
    with pytest.raises(InvalidWebhook):
        grid.verify_event(body, signature)
    body, signature = signed(event, SECRET, time.time())
    assert grid.verify_event(body, signature).kind == "customer.created"  # other events: verified, not acted on


def test_a_signed_event_that_is_no_stripe_event_is_invalid() -> None:
    grid = StripeProvider("sk_test_x", SECRET)
    malformed = {"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {"id": 3}}}
    body, signature = signed(malformed, SECRET, time.time())
    with pytest.raises(InvalidWebhook):
        grid.verify_event(body, signature)


async def test_recent_topup_events_are_read_from_the_api(localstripe: LocalStripe) -> None:
    grid = provider(localstripe)
    since = time.time() - 5
    paid = await grid.create_topup(request("tu-a"))
    await localstripe.pay(paid.reference)
    declined = await grid.create_topup(request("tu-b"))
    with pytest.raises(stripe.CardError):
        await localstripe.pay(declined.reference, "pm_card_chargeCustomerFail")
    events = await grid.events_since(since)
    assert [(type(e).__name__, e.topup_id) for e in events if isinstance(e, TopupPaid | TopupFailed)] == [
        ("TopupPaid", "tu-a"),
        ("TopupFailed", "tu-b"),
    ]
    assert await grid.events_since(time.time() + 3600) == []


async def test_a_saved_method_is_charged_off_session_and_its_payment_arrives_as_a_signed_event(
    localstripe: LocalStripe, deliveries: Deliveries
) -> None:
    """Auto top-up: the renter's test token is attached to a new customer (its own id now: a token is used once),
    then charged with no renter present; the money is believed from the signed event, as for any top-up."""
    grid = provider(localstripe)
    saved = await grid.save_method("renter-1", "", "pm_card_visa")
    assert saved.customer.startswith("cus_") and saved.payment_method.startswith("pm_")
    again = await grid.save_method("renter-1", saved.customer, "pm_card_visa")  # another card, the same customer
    assert again.customer == saved.customer and again.payment_method != saved.payment_method
    start = await grid.charge_saved(request("tu-auto", 20_000_000), saved)
    intent = await retrieve(localstripe, start.reference)
    assert intent.customer == saved.customer and intent.amount == 2000
    await wait_for(lambda: any(b'"payment_intent.succeeded"' in body for body, _ in deliveries.received))
    body, signature = next((b, s) for b, s in deliveries.received if b'"payment_intent.succeeded"' in b)
    event = grid.verify_event(body, signature)
    assert isinstance(event, TopupPaid) and (event.topup_id, event.amount) == ("tu-auto", 20_000_000)


async def test_a_saved_method_whose_charge_is_declined_is_a_payment_declined(
    localstripe: LocalStripe, deliveries: Deliveries
) -> None:
    grid = provider(localstripe)
    saved = await grid.save_method("renter-1", "", "pm_card_chargeCustomerFail")  # attaches, then every charge fails
    with pytest.raises(PaymentDeclined) as caught:
        await grid.charge_saved(request("tu-auto-declined"), saved)
    assert "declined" in str(caught.value).lower() and caught.value.reference.startswith("pi_")
    await wait_for(lambda: any(b'"payment_intent.payment_failed"' in body for body, _ in deliveries.received))
    body, signature = next((b, s) for b, s in deliveries.received if b'"payment_intent.payment_failed"' in b)
    event = grid.verify_event(body, signature)
    assert isinstance(event, TopupFailed) and event.topup_id == "tu-auto-declined"
    assert event.reference == caught.value.reference  # the grid can match the event to its top-up


async def test_a_method_the_provider_does_not_know_is_refused(localstripe: LocalStripe) -> None:
    with pytest.raises(InvalidPaymentMethod) as caught:
        await provider(localstripe).save_method("renter-1", "", "pm_nonexistent")
    assert "pm_nonexistent" in str(caught.value)


async def confirm_setup(localstripe: LocalStripe, reference: str, payment_method: str = "pm_card_visa") -> None:
    """What Stripe.js's confirmCardSetup does in the renter's browser, with Stripe's test token for the card."""
    http = stripe.AIOHTTPClient()
    try:
        await localstripe.client(http).v1.setup_intents.confirm_async(reference, params={"payment_method": payment_method})
    finally:
        await http.close_async()


async def test_a_card_saved_by_the_browser_is_read_from_the_api_and_only_for_its_own_account(localstripe: LocalStripe) -> None:
    """The console's top-up: the grid opens a SetupIntent, the browser saves the card on it (Stripe.js, here the SDK
    with a test token), and the grid believes only what Stripe's API says of it: the account it was opened for, and
    whether it succeeded."""
    grid = StripeProvider(
        localstripe.api_key, SECRET, api_base=localstripe.url, publishable_key="pk_test_1", js_url=f"{localstripe.url}/js/"
    )
    step = grid.browser_step
    assert step is not None and step.connect_origins == (localstripe.url,) and step.frame_origins == ()
    assert StripeProvider("sk", SECRET).browser_step is None  # no publishable key: no card form
    stripes = StripeProvider("sk", SECRET, publishable_key="pk_live_1").browser_step
    assert stripes is not None and stripes.script_origins == ("https://js.stripe.com",)
    assert stripes.frame_origins == ("https://js.stripe.com", "https://hooks.stripe.com")

    setup = await grid.start_card_setup("renter-1", "")
    assert setup.customer.startswith("cus_") and setup.client_secret.startswith(setup.reference + "_secret_")
    with pytest.raises(InvalidPaymentMethod, match="did not succeed"):
        await grid.finish_card_setup("renter-1", setup.customer, setup.reference)  # no card given yet
    await confirm_setup(localstripe, setup.reference)
    with pytest.raises(InvalidPaymentMethod, match="not this account's"):
        await grid.finish_card_setup("renter-2", setup.customer, setup.reference)  # another renter names it
    with pytest.raises(InvalidPaymentMethod):
        await grid.finish_card_setup("renter-1", setup.customer, "seti_nonexistent")
    saved = await grid.finish_card_setup("renter-1", setup.customer, setup.reference)
    assert saved.customer == setup.customer and saved.payment_method.startswith("pm_") and saved.label == "visa ending 4242"
    start = await grid.charge_saved(request("tu-console"), saved, on_session=True)
    intent = await retrieve(localstripe, start.reference)
    assert intent.status == "succeeded" and intent.customer == saved.customer and start.client_secret == ""

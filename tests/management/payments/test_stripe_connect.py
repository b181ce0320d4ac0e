"""The Stripe adapter's money out (Connect) against a fake of exactly those calls (tests/support/fake_connect.py, on
127.0.0.1 behind the SDK's ``api_base``: localstripe has no Connect). The SDK's own request building is what the fake
reads: these tests check its paths, form fields and Idempotency-Key headers, then what the adapter makes of the
answers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from management.market.money import MICRO
from management.payments.provider import PaymentProviderError, TransferRequest
from management.payments.stripe_provider import StripeProvider
from tests.support.fake_connect import FakeConnect, fake_connect_server, form_of


@pytest.fixture
async def fake() -> AsyncIterator[FakeConnect]:
    async with fake_connect_server() as server:
        yield server


def adapter(fake: FakeConnect) -> StripeProvider:
    return StripeProvider("sk_test_connect", "whsec_unused", api_base=fake.url)


def request(key: str, destination: str, amount: int = 12 * MICRO) -> TransferRequest:
    return TransferRequest(key=key, account="acme", destination=destination, amount=amount, currency="USD")


async def onboarded(fake: FakeConnect, provider: StripeProvider) -> str:
    made = await provider.create_payout_account("acme")
    fake.complete_onboarding(made.reference)
    return made.reference


async def test_a_payout_account_is_an_express_account_made_once_per_provider(fake: FakeConnect) -> None:
    provider = adapter(fake)
    first = await provider.create_payout_account("acme")
    again = await provider.create_payout_account("acme")

    assert first == again  # the idempotency key names the account: one connected account
    assert len(fake.accounts) == 1
    sent = fake.posted("/v1/accounts")[0]
    assert sent.form["type"] == "express"
    assert sent.form["capabilities[transfers][requested]"] == "true"
    assert sent.form["metadata[idlegrid_account]"] == "acme"
    assert sent.headers["Idempotency-Key"] == "payout-account-acme"
    assert sent.headers["Authorization"] == "Bearer sk_test_connect"
    assert not first.details_submitted and not first.payouts_enabled


async def test_the_onboarding_link_leads_to_the_hosted_page_and_the_status_follows_it(fake: FakeConnect) -> None:
    provider = adapter(fake)
    made = await provider.create_payout_account("acme")
    link = await provider.onboarding_link(made.reference, return_url="https://grid/back", refresh_url="https://grid/again")

    sent = fake.posted("/v1/account_links")[0]
    assert sent.form == {
        "account": made.reference,
        "type": "account_onboarding",
        "return_url": "https://grid/back",
        "refresh_url": "https://grid/again",
    }
    async with aiohttp.ClientSession() as session, session.get(link.url) as resp:  # the owner's browser
        assert resp.status == 200
    status = await provider.payout_account(made.reference)
    assert status.reference == made.reference
    assert status.details_submitted and status.payouts_enabled
    assert [r.path for r in fake.requests if r.method == "GET"][-1] == f"/v1/accounts/{made.reference}"


async def test_a_transfer_sends_minor_units_its_key_as_idempotency_key_group_and_metadata(fake: FakeConnect) -> None:
    provider = adapter(fake)
    destination = await onboarded(fake, provider)

    made = await provider.transfer(request("payout:acme:2026-W49", destination, 12_340_000))

    sent = fake.posted("/v1/transfers")[0]
    assert sent.form == {
        "amount": "1234",
        "currency": "usd",
        "destination": destination,
        "transfer_group": "payout:acme:2026-W49",
        "metadata[idlegrid_payout]": "payout:acme:2026-W49",
        "metadata[idlegrid_account]": "acme",
    }
    assert sent.headers["Idempotency-Key"] == "payout:acme:2026-W49"
    looked = [r for r in fake.requests if r.method == "GET" and r.path == "/v1/transfers"][0]
    assert looked.form["transfer_group"] == "payout:acme:2026-W49"  # looked for before making it
    assert made.key == "payout:acme:2026-W49"
    assert (made.amount, made.currency, made.destination) == (12_340_000, "USD", destination)


async def test_a_transfer_asked_again_is_the_first_even_after_stripe_forgot_the_idempotency_key(fake: FakeConnect) -> None:
    provider = adapter(fake)
    destination = await onboarded(fake, provider)
    first = await provider.transfer(request("payout:acme:2026-W49", destination))
    again = await provider.transfer(request("payout:acme:2026-W49", destination))
    fake.forget_idempotency_keys()  # 24 hours later
    later = await provider.transfer(request("payout:acme:2026-W49", destination))

    assert first == again == later
    assert len(fake.transfers) == 1


async def test_a_transfer_whose_answer_was_lost_is_retried_under_its_key_and_made_once(fake: FakeConnect) -> None:
    provider = adapter(fake)
    destination = await onboarded(fake, provider)
    fake.lose_next_answers(1)

    made = await provider.transfer(request("payout:acme:2026-W49", destination))

    assert len(fake.posted("/v1/transfers")) == 2  # the SDK retried with the same key...
    assert {r.headers["Idempotency-Key"] for r in fake.posted("/v1/transfers")} == {"payout:acme:2026-W49"}
    assert [t["id"] for t in fake.transfers] == [made.reference]  # ...and Stripe answered the first transfer


async def test_a_transfer_to_an_account_not_onboarded_is_refused_and_nothing_moves(fake: FakeConnect) -> None:
    provider = adapter(fake)
    made = await provider.create_payout_account("acme")

    with pytest.raises(PaymentProviderError, match="cannot take transfers") as raised:
        await provider.transfer(request("payout:acme:2026-W49", made.reference))

    assert fake.transfers == []
    assert "sk_test_connect" not in str(raised.value)


async def test_transfers_since_reads_every_page_oldest_first(fake: FakeConnect) -> None:
    provider = adapter(fake)
    destination = await onboarded(fake, provider)
    fake.page_size = 2
    for week in range(45, 50):
        await provider.transfer(request(f"payout:acme:2026-W{week}", destination, (week - 40) * MICRO))
    fake.plant_transfer(destination, 700)  # one the grid did not make: no key

    listed = await provider.transfers_since(0)

    assert [t.key for t in listed] == [f"payout:acme:2026-W{w}" for w in range(45, 50)] + [""]
    assert [t.amount for t in listed] == [5 * MICRO, 6 * MICRO, 7 * MICRO, 8 * MICRO, 9 * MICRO, 7 * MICRO]
    pages = [r for r in fake.requests if r.method == "GET" and r.path == "/v1/transfers" and "created[gte]" in r.form]
    assert len(pages) == 3 and "starting_after" in pages[1].form
    assert form_of(pages[0])["created"] == {"gte": "0"}


async def test_an_unknown_payout_account_and_an_unreachable_provider_are_provider_errors(fake: FakeConnect) -> None:
    with pytest.raises(PaymentProviderError, match="No such account"):
        await adapter(fake).payout_account("acct_nope")
    gone = StripeProvider("sk_test_connect", "whsec_unused", api_base="http://127.0.0.1:9")
    with pytest.raises(PaymentProviderError) as raised:
        await gone.create_payout_account("acme")
    assert "sk_test_connect" not in str(raised.value)

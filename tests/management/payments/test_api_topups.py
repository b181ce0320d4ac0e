"""Top-ups end to end on a real Master (SQLite) and a real Stripe-compatible server (localstripe on 127.0.0.1): the
renter opens a top-up through the API, pays it with Stripe's test payment method as its browser would on Stripe's
element, and localstripe's signed webhook, delivered to the Master's public route, credits the balance once.

Every delivery passes through a recording relay the test runs (``Relay``), so the test can replay a genuine signed
delivery byte for byte, as Stripe re-sends one."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from management.http.keys import SERVICES_KEY
from master.config import MasterConfig
from tests.management.hosts import api_key
from tests.support.grid import free_port
from tests.support.localstripe import LocalStripe
from tests.support.operator_api import OperatorApi, operator_api

SECRET = "whsec_grid_e2e"
WEBHOOK = "/api/v1/billing/webhook"
WAIT_S = 20.0


@dataclass
class Relay:
    """Receives localstripe's deliveries, keeps each (body, signature), and forwards it unchanged to the Master."""

    target: str = ""
    deliveries: list[tuple[bytes, str]] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)

    async def forward(self, request: web.Request) -> web.Response:
        body, signature = await request.read(), request.headers.get("Stripe-Signature", "")
        self.deliveries.append((body, signature))
        async with aiohttp.ClientSession() as session:
            async with session.post(self.target, data=body, headers={"Stripe-Signature": signature}) as answer:
                self.answers.append(answer.status)
                return web.Response(status=answer.status, body=await answer.read())

    def of(self, kind: str) -> list[tuple[bytes, str]]:
        return [d for d in self.deliveries if f'"{kind}"'.encode() in d[0]]


def paying_config(state_dir: Path, localstripe: LocalStripe) -> MasterConfig:
    return MasterConfig(
        state_dir=str(state_dir),
        link_port=0,
        payment_provider="stripe",
        stripe_api_key=localstripe.api_key,
        stripe_webhook_secret=SECRET,
        stripe_api_base=localstripe.url,
        topup_min="5",
        topup_max="500",
    )


@contextlib.asynccontextmanager
async def relay_to(localstripe: LocalStripe) -> AsyncIterator[Relay]:
    relay = Relay()
    app = web.Application()
    app.router.add_post("/hook", relay.forward)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await localstripe.send_webhooks_to(f"http://127.0.0.1:{port}/hook", SECRET)
    try:
        yield relay
    finally:
        await runner.cleanup()


@pytest.fixture
async def relay(localstripe: LocalStripe) -> AsyncIterator[Relay]:
    async with relay_to(localstripe) as r:
        yield r


@contextlib.asynccontextmanager
async def paying_master(state_dir: Path, localstripe: LocalStripe, relay: Relay) -> AsyncIterator[OperatorApi]:
    async with operator_api(paying_config(state_dir, localstripe)) as api:
        relay.target = str(api.make_url(WEBHOOK))
        yield api


async def balance(api: OperatorApi, account: str) -> str:
    answer = await api.get(f"/api/v1/accounts/{account}/balance", headers=api.auth)
    assert answer.status == 200, await answer.text()
    available: str = (await answer.json())["available"]
    return available


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def top_up(api: OperatorApi, headers: dict[str, str], amount: str) -> dict[str, Any]:
    answer = await api.post("/api/v1/billing/topups", json={"amount": amount}, headers=headers)
    assert answer.status == 201, await answer.text()
    started: dict[str, Any] = await answer.json()
    return started


async def paid_and_credited(api: OperatorApi, localstripe: LocalStripe, relay: Relay, ann: dict[str, str]) -> dict[str, Any]:
    """A top-up of 25.00 by ann, paid, its webhook delivered and credited."""
    started = await top_up(api, ann, "25")
    await localstripe.pay(started["topup"]["reference"])
    await until(lambda: _is(balance(api, "ann"), "25.00"), "the top-up's credit")
    return started


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def test_a_paid_topup_is_credited_once_by_the_provider_s_signed_webhook(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with paying_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        started = await top_up(api, ann, "25")
        topup = started["topup"]
        assert topup["state"] == "pending" and topup["amount"] == "25.00" and topup["currency"] == "USD"
        assert started["client_secret"].startswith(topup["reference"])  # Stripe's element takes it; no card data here
        assert await balance(api, "ann") == "0.00"  # nothing before the provider says the money arrived

        await localstripe.pay(topup["reference"])
        await until(lambda: _is(balance(api, "ann"), "25.00"), "the top-up's credit")

        shown = await (await api.get(f"/api/v1/billing/topups/{topup['id']}", headers=ann)).json()
        assert shown["state"] == "credited" and shown["credited"] == "25.00" and shown["settled_at"]
        ledger = await (await api.get("/api/v1/accounts/ann/ledger", headers=ann)).json()
        assert [(line["kind"], line["key"], line["amount"]) for line in ledger["lines"]] == [
            ("topup", f"topup:{topup['id']}", "25.00")
        ]
        events = await (await api.get("/api/v1/events", params={"kind": "payments."}, headers=api.auth)).json()
        assert [(e["kind"], e["subject"]) for e in events["items"]] == [("payments.topup_credited", "ann")]
        listed = await (await api.get("/api/v1/billing/topups", headers=ann)).json()
        assert [t["id"] for t in listed["items"]] == [topup["id"]]


async def test_a_replayed_delivery_credits_nothing_even_after_a_restart(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    state = tmp_path / "master"
    async with paying_master(state, localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        await paid_and_credited(api, localstripe, relay, ann)
        (body, signature), *_ = relay.of("payment_intent.succeeded")
        again = await api.post(WEBHOOK, data=body, headers={"Stripe-Signature": signature})
        assert again.status == 200 and (await again.json())["replayed"] is True
        assert await balance(api, "ann") == "25.00"
    async with paying_master(state, localstripe, relay) as api:  # the dedupe is in the store, not in memory
        again = await api.post(WEBHOOK, data=body, headers={"Stripe-Signature": signature})
        assert again.status == 200 and (await again.json())["replayed"] is True
        assert await balance(api, "ann") == "25.00"

    # A Master that credited but died before it recorded the event: the delivery comes again, and the ledger's key
    # for the top-up keeps the money from moving twice.
    with sqlite3.connect(state / "master.db") as db:
        db.execute("DELETE FROM payment_events")
    async with paying_master(state, localstripe, relay) as api:
        again = await api.post(WEBHOOK, data=body, headers={"Stripe-Signature": signature})
        assert again.status == 200 and (await again.json()) | {"event": ""} == {
            "event": "",
            "kind": "payment_intent.succeeded",
            "outcome": "credited",
            "topup": (await (await api.get("/api/v1/billing/topups", headers=api.auth)).json())["items"][0]["id"],
            "replayed": False,
        }
        assert await balance(api, "ann") == "25.00"


async def test_a_forged_or_unsigned_webhook_is_400_and_changes_nothing(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with paying_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        started = await top_up(api, ann, "25")
        relay.target = f"http://127.0.0.1:{free_port()}/nowhere"  # hold the genuine delivery back
        await localstripe.pay(started["topup"]["reference"])
        await until(lambda: _has(relay, "payment_intent.succeeded"), "localstripe's delivery")
        (body, signature), *_ = relay.of("payment_intent.succeeded")
        forged = body.replace(b'"amount": 2500', b'"amount": 250000')
        assert forged != body
        for payload, headers in [
            (forged, {"Stripe-Signature": signature}),  # the amount raised after signing
            (body, {}),  # no signature
            (body, {"Stripe-Signature": signature.replace("v1=", "v1=0")}),  # a signature that is not Stripe's
            (b"not json", {"Stripe-Signature": signature}),
        ]:
            refused = await api.post(WEBHOOK, data=payload, headers=headers)
            assert refused.status == 400, await refused.text()
            assert (await refused.json())["error"]["code"] == "invalid_webhook"
        assert await balance(api, "ann") == "0.00"
        shown = await (await api.get(f"/api/v1/billing/topups/{started['topup']['id']}", headers=ann)).json()
        assert shown["state"] == "pending"
        # The genuine delivery still credits, once.
        accepted = await api.post(WEBHOOK, data=body, headers={"Stripe-Signature": signature})
        assert accepted.status == 200 and (await accepted.json())["outcome"] == "credited"
        assert await balance(api, "ann") == "25.00"


async def _has(relay: Relay, kind: str) -> bool:
    return bool(relay.of(kind))


@pytest.mark.parametrize(
    ("amount", "says"),
    [
        ("-5", "more than 0"),
        ("0", "more than 0"),
        ("4.99", "at least 5.00"),
        ("500.01", "at most 500.00"),
        ("99999999999999999999", "not an amount"),
        ("25.001", "smallest unit"),
        ("1e3", "not an amount"),
    ],
)
async def test_a_negative_tiny_huge_or_odd_amount_is_refused_with_a_clear_error(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay, amount: str, says: str
) -> None:
    async with paying_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        refused = await api.post("/api/v1/billing/topups", json={"amount": amount}, headers=ann)
        assert refused.status == 400
        error = (await refused.json())["error"]
        assert error["code"] == "invalid_topup" and says in error["message"], error
        assert (await (await api.get("/api/v1/billing/topups", headers=ann)).json())["items"] == []


async def test_who_may_top_up_whose_balance(tmp_path: Path, localstripe: LocalStripe, relay: Relay) -> None:
    async with paying_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        bob = await api_key(api.master, "renter", "bob")
        acme = await api_key(api.master, "provider", "acme")
        assert (await api.post("/api/v1/billing/topups", json={"amount": "10"}, headers=acme)).status == 403
        other = await api.post("/api/v1/billing/topups", json={"amount": "10", "account": "bob"}, headers=ann)
        assert other.status == 403
        for_ann = await api.post("/api/v1/billing/topups", json={"amount": "10", "account": "ann"}, headers=api.auth)
        assert for_ann.status == 201 and (await for_ann.json())["topup"]["account"] == "ann"
        provider = await api.post("/api/v1/billing/topups", json={"amount": "10", "account": "acme"}, headers=api.auth)
        assert provider.status == 409
        topup_id = (await for_ann.json())["topup"]["id"]
        assert (await api.get(f"/api/v1/billing/topups/{topup_id}", headers=bob)).status == 404
        assert (await (await api.get("/api/v1/billing/topups", headers=bob)).json())["items"] == []
        assert (await api.get(f"/api/v1/billing/topups/{topup_id}", headers=ann)).status == 200


async def test_a_declined_payment_marks_the_topup_failed_and_credits_nothing(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with paying_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        started = await top_up(api, ann, "25")
        with contextlib.suppress(Exception):  # the confirm answers the decline (a CardError)
            await localstripe.pay(started["topup"]["reference"], "pm_card_chargeCustomerFail")
        url = f"/api/v1/billing/topups/{started['topup']['id']}"

        async def failed() -> bool:
            return bool((await (await api.get(url, headers=ann)).json())["state"] == "failed")

        await until(failed, "the failed payment's event")
        assert await balance(api, "ann") == "0.00"


async def test_a_grid_without_a_payment_provider_says_so(api: OperatorApi) -> None:
    ann = await api_key(api.master, "renter", "ann")
    refused = await api.post("/api/v1/billing/topups", json={"amount": "25"}, headers=ann)
    assert refused.status == 503 and (await refused.json())["error"]["code"] == "payments_not_configured"
    assert (await api.post(WEBHOOK, data=b"{}", headers={"Stripe-Signature": "t=1,v1=00"})).status == 503


async def test_a_payment_no_webhook_brought_is_credited_by_the_catch_up_once(tmp_path: Path, localstripe: LocalStripe) -> None:
    """An outage: localstripe has nowhere to deliver (no webhook is set), so only the catch-up, which reads Stripe's
    events from its API, learns of the payments; each is credited once, however often the catch-up runs."""
    config = msgspec.structs.replace(paying_config(tmp_path / "master", localstripe), payment_catch_up_s=0.2)
    async with operator_api(config) as api:
        topups = api.app[SERVICES_KEY].topups
        ann = await api_key(api.master, "renter", "ann")
        first = await top_up(api, ann, "25")
        await localstripe.pay(first["topup"]["reference"])
        receipts = await topups.catch_up(time.time() - 3600)
        assert [(r.outcome, r.topup_id, r.replayed) for r in receipts] == [("credited", first["topup"]["id"], False)]
        assert await balance(api, "ann") == "25.00"
        again = await topups.catch_up(time.time() - 3600)
        assert [(r.outcome, r.replayed) for r in again] == [("credited", True)]
        assert await balance(api, "ann") == "25.00"

        # The loop a serving Master runs does the same on its own.
        second = await top_up(api, ann, "10")
        await localstripe.pay(second["topup"]["reference"])
        topups.start()
        try:
            await until(lambda: _is(balance(api, "ann"), "35.00"), "the catch-up loop's credit")
        finally:
            await topups.stop()
        shown = await (await api.get(f"/api/v1/billing/topups/{second['topup']['id']}", headers=ann)).json()
        assert shown["state"] == "credited"

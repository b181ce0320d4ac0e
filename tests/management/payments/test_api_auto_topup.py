"""Auto top-ups end to end on a real Master (SQLite) and a real Stripe-compatible server (localstripe on 127.0.0.1):
a renter saves a payment method (Stripe's test token, as its browser's payment element makes one: no card data in the
grid) and turns auto top-up on; the Master's loop charges it off session when the balance falls below the threshold,
and localstripe's signed webhook credits it once. A declined card is tried at most once an hour and the renter is
told. Hostile settings and other accounts' settings are refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from management.http.keys import SERVICES_KEY
from master.config import MasterConfig
from tests.management.hosts import api_key
from tests.management.payments.test_api_topups import WEBHOOK, Relay, balance, paying_config, relay_to, until
from tests.support.localstripe import LocalStripe
from tests.support.operator_api import OperatorApi, operator_api

SETTINGS = "/api/v1/billing/settings"


@pytest.fixture
async def relay(localstripe: LocalStripe) -> AsyncIterator[Relay]:
    async with relay_to(localstripe) as r:
        yield r


@contextlib.asynccontextmanager
async def auto_master(state_dir: Path, localstripe: LocalStripe, relay: Relay) -> AsyncIterator[OperatorApi]:
    """A paying Master whose auto top-up loop runs every 0.2 s (the test app runs no loop of its own)."""
    config = msgspec.structs.replace(paying_config(state_dir, localstripe), auto_topup_s=0.2)
    async with operator_api(config) as api:
        relay.target = str(api.make_url(WEBHOOK))
        service = api.app[SERVICES_KEY].billing_settings
        service.start()
        try:
            yield api
        finally:
            await service.stop()


async def put(api: OperatorApi, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    answer = await api.put(path, json=body, headers=headers)
    return answer.status, await answer.json()


async def topups(api: OperatorApi, headers: dict[str, str]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await (await api.get("/api/v1/billing/topups", headers=headers)).json())["items"]
    return items


async def test_an_auto_topup_is_charged_below_the_threshold_and_credited_once_by_the_signed_webhook(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with auto_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        status, shown = await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_visa"}, ann)
        assert status == 200 and shown["payment_method"] is not None and shown["auto_topup"] is None, shown
        assert "4242424242424242" not in str(shown)  # never card data, only how the provider names the card
        status, shown = await put(api, "/api/v1/billing/auto-topup", {"threshold": "10", "amount": "20"}, ann)
        assert status == 200 and shown["auto_topup"] == {"enabled": True, "threshold": "10.00", "amount": "20.00"}

        await until(lambda: _is(balance(api, "ann"), "20.00"), "the auto top-up's credit")
        [made] = await topups(api, ann)
        assert made["auto"] is True and made["state"] == "credited" and made["credited"] == "20.00"
        settings = await (await api.get(SETTINGS, headers=ann)).json()
        assert settings["last_auto_topup_at"] is not None
        await asyncio.sleep(1.0)  # five more turns of the loop: 20.00 is above the threshold, nothing more
        assert len(await topups(api, ann)) == 1 and await balance(api, "ann") == "20.00"
        ledger = await (await api.get("/api/v1/accounts/ann/ledger", headers=ann)).json()
        assert [(line["kind"], line["amount"]) for line in ledger["lines"]] == [("topup", "20.00")]


async def test_a_declined_auto_topup_is_tried_at_most_once_an_hour_and_the_renter_is_told(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with auto_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_chargeCustomerFail"}, ann)
        await put(api, "/api/v1/billing/auto-topup", {"threshold": "10", "amount": "20"}, ann)
        await until(lambda: _has_topups(api, ann, 1), "the auto top-up's try")
        await asyncio.sleep(1.5)  # many turns of the loop, the balance still under the threshold: no second try
        [tried] = await topups(api, ann)
        assert tried["auto"] is True and tried["state"] == "failed" and "declined" in tried["reason"].lower()
        assert await balance(api, "ann") == "0.00"
        events = await (await api.get("/api/v1/events", params={"kind": "payments.auto_topup"}, headers=api.auth)).json()
        assert [(e["kind"], e["subject"]) for e in events["items"]] == [("payments.auto_topup_failed", "ann")]
        await until(lambda: _delivered(relay, "payment_intent.payment_failed"), "the declined payment's webhook")
        await asyncio.sleep(0.5)
        events = await (await api.get("/api/v1/events", params={"kind": "payments."}, headers=api.auth)).json()
        kinds = [e["kind"] for e in events["items"]]
        assert kinds.count("payments.auto_topup_failed") == 1 and "payments.event_refused" not in kinds, kinds

        # An hour later (the service's clock moved on), the loop tries again: once.
        service = api.app[SERVICES_KEY].billing_settings
        last = (await service.get("ann")).last_auto_topup_at
        assert last is not None and last <= time.time()
        assert await service.auto_topup(last + 3599) == []
        again = await service.auto_topup(last + 3600)
        assert [t.state for t in again] == ["failed"] and len(await topups(api, ann)) == 2


async def test_a_declined_auto_topup_is_an_alert_the_renter_and_the_operator_see_until_a_new_card_even_after_a_restart(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with auto_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        bob = await api_key(api.master, "renter", "bob")
        await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_chargeCustomerFail"}, ann)
        await put(api, "/api/v1/billing/auto-topup", {"threshold": "10", "amount": "20"}, ann)
        await until(lambda: _has_topups(api, ann, 1), "the auto top-up's try")
        loop = api.app[SERVICES_KEY].alerts.loop
        [fired] = [t for t in await loop.step() if t.rule == "auto_topup_failed"]
        assert (fired.subject, fired.phase, fired.labels["renter"]) == ("ann", "firing", "ann")
        assert fired.labels["amount"] == "20.00 USD"
        assert "declined" in fired.labels["reason"].lower()

        assert ("auto_topup_failed", "ann") in await firing(api, ann)
        assert ("auto_topup_failed", "ann") in await firing(api, api.auth)  # the operator
        assert await firing(api, bob) == []  # another renter sees nothing of it
        assert [t for t in await loop.step() if t.rule == "auto_topup_failed"] == []  # fired once, not at every turn

    # A restarted Master lost the alert's state; its first auto top-up pass reads the failure back from the store.
    async with auto_master(tmp_path / "master", localstripe, relay) as api:
        topups_service = api.app[SERVICES_KEY].topups
        await until(lambda: _is_true("ann" in topups_service.failed_auto_topups()), "the failure read back")
        loop = api.app[SERVICES_KEY].alerts.loop
        [again] = [t for t in await loop.step() if t.rule == "auto_topup_failed"]
        assert (again.subject, again.phase) == ("ann", "firing")
        await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_visa"}, ann)  # a new card
        [resolved] = [t for t in await loop.step() if t.rule == "auto_topup_failed"]
        assert (resolved.subject, resolved.phase) == ("ann", "resolved") and await firing(api, ann) == []


async def firing(api: OperatorApi, headers: dict[str, str]) -> list[tuple[str, str]]:
    """The alerts firing now as ``GET /api/v1/alerts`` shows them to the caller: (rule, subject)."""
    shown = await (await api.get("/api/v1/alerts", headers=headers)).json()
    return [(a["rule"], a["subject"]) for a in shown["items"] if a["phase"] == "firing"]


async def _is_true(value: bool) -> bool:
    return value


async def test_hostile_settings_and_another_account_s_settings_are_refused(
    tmp_path: Path, localstripe: LocalStripe, relay: Relay
) -> None:
    async with auto_master(tmp_path / "master", localstripe, relay) as api:
        ann = await api_key(api.master, "renter", "ann")
        await api_key(api.master, "renter", "bob")
        acme = await api_key(api.master, "provider", "acme")
        status, said = await put(api, "/api/v1/billing/auto-topup", {"threshold": "10", "amount": "20"}, ann)
        assert status == 409 and "no saved payment method" in said["error"]["message"], said
        await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_visa"}, ann)
        for body, why in [
            ({"threshold": "10", "amount": "-20"}, "more than 0"),
            ({"threshold": "-1", "amount": "20"}, "threshold must be more than 0"),
            ({"threshold": "10", "amount": "99999999999"}, "at most 500.00"),
            ({"threshold": "10", "amount": "1"}, "at least 5.00"),
            ({"threshold": "10", "amount": "20.001"}, "smallest unit"),
            ({"threshold": "1e9", "amount": "20"}, "threshold"),
        ]:
            status, said = await put(api, "/api/v1/billing/auto-topup", body, ann)
            assert status == 400 and why in said["error"]["message"], (body, said)
        status, said = await put(api, "/api/v1/billing/payment-method", {"payment_method": "4242 4242 4242 4242"}, ann)
        assert status == 400, said  # a card number is no token: refused before anything is sent anywhere
        status, said = await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_unknown"}, ann)
        assert status == 400 and said["error"]["code"] == "invalid_payment_method", said  # unknown to Stripe: none kept
        status, said = await put(api, "/api/v1/billing/auto-topup", {"account": "bob", "threshold": "1", "amount": "20"}, ann)
        assert status == 403, said
        assert (await api.get(SETTINGS, params={"account": "bob"}, headers=ann)).status == 403
        status, said = await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_visa"}, acme)
        assert status == 403, said  # a provider has no billing settings to set
        answer = await api.get(SETTINGS, params={"account": "bob"}, headers=api.auth)  # the operator reads anyone's
        assert answer.status == 200 and (await answer.json())["payment_method"] is None
        status, said = await put(api, "/api/v1/billing/auto-topup", {"enabled": False}, ann)
        assert status == 200 and said["auto_topup"] is None


async def test_a_grid_without_a_payment_provider_takes_no_payment_method(tmp_path: Path) -> None:
    async with operator_api(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)) as api:
        ann = await api_key(api.master, "renter", "ann")
        status, said = await put(api, "/api/v1/billing/payment-method", {"payment_method": "pm_card_visa"}, ann)
        assert status == 503 and said["error"]["code"] == "payments_not_configured"


async def _is(value: Any, expected: str) -> bool:
    return bool(await value == expected)


async def _has_topups(api: OperatorApi, headers: dict[str, str], count: int) -> bool:
    return len(await topups(api, headers)) >= count


async def _delivered(deliveries: Relay, kind: str) -> bool:
    return bool(deliveries.of(kind))

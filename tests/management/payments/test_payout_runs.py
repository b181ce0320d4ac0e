"""Money out on a real Master (SQLite) and the fake of Stripe's Connect calls (tests/support/fake_connect.py, behind the
SDK's ``api_base``): a provider connects its payout account through the API, the payout run pays what matured once per
period, a run interrupted at each step and run again pays nothing twice, and the reconciliation finds a planted
difference and fires the alert.

Earnings are put in the ledger as the metering's charge entries would (hold -> provider), with their times: the window
is about the entries' ages, which a test cannot wait for."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from management.http.keys import SERVICES_KEY
from management.market.ledger import provider_account
from management.market.money import MICRO
from management.monitoring.evaluator import FIRING
from management.payments.records import PayoutRecord
from management.payments.stripe_provider import StripeProvider
from management.services.payouts import PayoutService
from management.store import payout_account_repo, payout_repo
from master.config import MasterConfig
from master.port import LedgerEntry, LedgerLine
from tests.management.hosts import api_key
from tests.support.fake_connect import FakeConnect, fake_connect_server
from tests.support.operator_api import OperatorApi, operator_api

DAY = 86400.0
NOW = time.time()


class Crash(Exception):
    """The Master dying at a step of a payout."""


@pytest.fixture
async def fake() -> AsyncIterator[FakeConnect]:
    async with fake_connect_server() as server:
        yield server


@contextlib.asynccontextmanager
async def paying_master(state_dir: Path, fake: FakeConnect, **settings: object) -> AsyncIterator[OperatorApi]:
    config = MasterConfig(
        state_dir=str(state_dir),
        link_port=0,
        payment_provider="stripe",
        stripe_api_key="sk_test_payouts",
        stripe_webhook_secret="whsec_payouts",
        stripe_api_base=fake.url,
        payout_min="5",
        **settings,  # type: ignore[arg-type]
    )
    async with operator_api(config) as api:
        yield api


async def earn(api: OperatorApi, provider: str, amount: int, age_s: float, key: str) -> None:
    """``amount`` micro-units charged to a renter's hold for ``provider``, ``age_s`` ago (a metering charge's shape)."""
    lines = [LedgerLine(account="hold:ann", amount=-amount), LedgerLine(account=provider_account(provider), amount=amount)]
    entry = LedgerEntry(key=key, ts=time.time() - age_s, kind="charge", memo="test earnings", lines=lines)
    assert await api.app[SERVICES_KEY].market.market.ledger.post(entry)


async def connected(api: OperatorApi, fake: FakeConnect, provider: str = "acme") -> dict[str, str]:
    """``provider`` with an onboarded payout account; its API key's header."""
    headers = await api_key(api.master, "provider", provider)
    answer = await api.post("/api/v1/billing/payout-account", json={}, headers=headers)
    assert answer.status == 200, await answer.text()
    async with aiohttp.ClientSession() as session, session.get((await answer.json())["onboarding_url"]) as browser:
        assert browser.status == 200  # the owner finished the hosted onboarding
    status = await (await api.get("/api/v1/billing/payout-account", headers=headers)).json()
    assert status["payouts_enabled"]
    return headers


def payout_service(api: OperatorApi, fake: FakeConnect, **given: Any) -> PayoutService:
    """Another payout service over this Master's store and ledger (as a restarted process makes), with ``given``."""
    services = api.app[SERVICES_KEY]
    return PayoutService(
        api.master,
        StripeProvider("sk_test_payouts", "whsec_payouts", api_base=fake.url),
        payout_account_repo(api.master.store),
        payout_repo(api.master.store),
        services.market.market.ledger,
        currency=services.payouts.currency,
        **{"settings": services.payouts.settings, **given},
    )


def crashing(api: OperatorApi, fake: FakeConnect, at: str) -> PayoutService:
    """A payout service of this Master whose process dies right after step ``at`` of a payout."""

    async def checkpoint(step: str, record: PayoutRecord) -> None:
        if step == at:
            raise Crash(step)

    return payout_service(api, fake, checkpoint=checkpoint)


async def provider_balance(api: OperatorApi, provider: str = "acme") -> int:
    return api.app[SERVICES_KEY].market.market.ledger.balance(provider_account(provider))


async def test_a_provider_connects_its_payout_account_and_reads_its_status(tmp_path, fake):
    async with paying_master(tmp_path, fake) as api:
        acme = await api_key(api.master, "provider", "acme")
        answer = await api.post("/api/v1/billing/payout-account", json={"return_url": "https://grid.example/back"}, headers=acme)
        assert answer.status == 200, await answer.text()
        body = await answer.json()
        assert body["account"] == "acme" and body["provider"] == "stripe"
        assert body["reference"].startswith("acct_") and not body["payouts_enabled"]
        assert body["onboarding_url"].startswith(fake.url)
        assert fake.posted("/v1/account_links")[0].form["return_url"] == "https://grid.example/back"

        again = await (await api.post("/api/v1/billing/payout-account", json={}, headers=acme)).json()
        assert again["reference"] == body["reference"] and len(fake.accounts) == 1  # one connected account

        fake.complete_onboarding(body["reference"])
        status = await (await api.get("/api/v1/billing/payout-account", headers=acme)).json()
        assert status["payouts_enabled"] and status["details_submitted"] and status["onboarding_url"] is None
        assert status["payable"] == "0.00"


async def test_only_a_provider_connects_its_own_payout_account(tmp_path, fake):
    async with paying_master(tmp_path, fake) as api:
        ann = await api_key(api.master, "renter", "ann")
        acme = await api_key(api.master, "provider", "acme")
        await api_key(api.master, "provider", "zeta")
        assert (await api.post("/api/v1/billing/payout-account", json={}, headers=ann)).status == 403
        assert (await api.post("/api/v1/billing/payout-account", json={"account": "zeta"}, headers=acme)).status == 403
        assert (await api.get("/api/v1/billing/payout-account", headers=acme)).status == 404  # none connected yet
        assert (await api.post("/api/v1/billing/payout-account", json={"account": "ann"}, headers=api.auth)).status == 409
        assert (await api.post("/api/v1/billing/payouts/run", headers=acme)).status == 403  # the operator's
        assert fake.accounts == {}


async def test_a_grid_without_a_payment_provider_connects_no_payout_account(api):
    acme = await api_key(api.master, "provider", "acme")
    answer = await api.post("/api/v1/billing/payout-account", json={}, headers=acme)
    assert answer.status == 503 and (await answer.json())["error"]["code"] == "payments_not_configured"


async def test_the_run_pays_what_matured_once_per_period(tmp_path, fake):
    async with paying_master(tmp_path, fake) as api:
        acme = await connected(api, fake)
        await earn(api, "acme", 30 * MICRO, 10 * DAY, "e-old")
        await earn(api, "acme", 20 * MICRO, 2 * DAY, "e-new")  # inside the 7-day window: waits

        ran = await (await api.post("/api/v1/billing/payouts/run", headers=api.auth)).json()
        again = await (await api.post("/api/v1/billing/payouts/run", headers=api.auth)).json()

        [payout] = ran["items"]
        assert payout["amount"] == "30.00" and payout["state"] == "paid" and payout["id"].startswith("payout:acme:")
        assert again["items"] == []  # the period is paid
        assert [(t["amount"], t["currency"], t["transfer_group"]) for t in fake.transfers] == [(3000, "usd", payout["id"])]
        assert await provider_balance(api) == 20 * MICRO
        status = await (await api.get("/api/v1/billing/payout-account", headers=acme)).json()
        assert status["payable"] == "0.00"
        listed = await (await api.get("/api/v1/billing/payouts", headers=acme)).json()
        assert [p["id"] for p in listed["items"]] == [payout["id"]]
        events = await (await api.get("/api/v1/events", params={"kind": "payments.payout"}, headers=api.auth)).json()
        assert [(e["kind"], e["subject"]) for e in events["items"]] == [("payments.payout_paid", "acme")]


async def test_below_the_minimum_or_not_onboarded_nothing_is_paid(tmp_path, fake):
    async with paying_master(tmp_path, fake) as api:
        await connected(api, fake, "acme")
        zeta = await api_key(api.master, "provider", "zeta")
        assert (await api.post("/api/v1/billing/payout-account", json={}, headers=zeta)).status == 200  # not onboarded
        await earn(api, "acme", 4 * MICRO, 10 * DAY, "e-acme")  # under payout_min (5)
        await earn(api, "zeta", 50 * MICRO, 10 * DAY, "e-zeta")

        ran = await (await api.post("/api/v1/billing/payouts/run", headers=api.auth)).json()

        assert ran["items"] == [] and fake.transfers == []


@pytest.mark.parametrize("at", ["made", "transferred", "posted"])
async def test_a_run_interrupted_after_a_step_and_run_again_pays_nothing_twice(tmp_path, fake, at):
    async with paying_master(tmp_path, fake) as api:
        await connected(api, fake)
        await earn(api, "acme", 30 * MICRO, 10 * DAY, "e-old")

        with pytest.raises(Crash):
            await crashing(api, fake, at).run()
        assert len(fake.transfers) == 1
        assert await provider_balance(api) == (0 if at == "posted" else 30 * MICRO)
        fake.forget_idempotency_keys()  # the rerun comes a day later: only the key on the transfer finds it

        ran = await (await api.post("/api/v1/billing/payouts/run", headers=api.auth)).json()

        assert len(fake.transfers) == 1  # nothing paid twice
        assert [(p["state"], p["amount"]) for p in ran["items"]] == [("paid", "30.00")]
        assert await provider_balance(api) == 0  # the ledger's entry once
        payouts = [e for e in await api.app[SERVICES_KEY].market.market.ledger.entries(["external"]) if e.kind == "payout"]
        assert len(payouts) == 1
        reconciled = await (await api.post("/api/v1/billing/payouts/reconcile", headers=api.auth)).json()
        assert reconciled["differences"] == [] and reconciled["payouts"] == 1


async def test_a_transfer_the_payment_provider_refused_is_tried_again_by_the_next_run(tmp_path, fake):
    async with paying_master(tmp_path, fake) as api:
        await connected(api, fake)
        await earn(api, "acme", 30 * MICRO, 10 * DAY, "e-old")
        reference = next(iter(fake.accounts))
        fake.accounts[reference]["payouts_enabled"] = False  # Stripe suspended it after the grid last read it

        ran = await (await api.post("/api/v1/billing/payouts/run", headers=api.auth)).json()
        assert ran["items"] == [] and fake.transfers == [] and await provider_balance(api) == 30 * MICRO
        await earn(api, "acme", 10 * MICRO, 9 * DAY, "e-later")  # earned meanwhile: not in this period's payout
        fake.complete_onboarding(reference)

        ran = await (await api.post("/api/v1/billing/payouts/run", headers=api.auth)).json()
        assert [p["amount"] for p in ran["items"]] == ["30.00"]  # the amount stored before the transfer
        assert [t["amount"] for t in fake.transfers] == [3000]
        events = await (await api.get("/api/v1/events", params={"kind": "payments.payout"}, headers=api.auth)).json()
        assert sorted(e["kind"] for e in events["items"]) == ["payments.payout_failed", "payments.payout_paid"]


async def test_the_reconciliation_finds_a_planted_difference_and_fires_the_alert(tmp_path, fake):
    async with paying_master(tmp_path, fake) as api:
        await connected(api, fake)
        await earn(api, "acme", 30 * MICRO, 10 * DAY, "e-old")
        await api.post("/api/v1/billing/payouts/run", headers=api.auth)
        alerts = api.app[SERVICES_KEY].alerts.loop
        clean = await (await api.post("/api/v1/billing/payouts/reconcile", headers=api.auth)).json()
        assert clean["differences"] == [] and clean["transfers"] == 1
        assert not [t for t in await alerts.step() if t.rule == "payout_unreconciled"]

        fake.plant_transfer(next(iter(fake.accounts)), 700)  # someone paid acme 7.00 on Stripe's dashboard
        found = await (await api.post("/api/v1/billing/payouts/reconcile", headers=api.auth)).json()

        assert [(d["kind"], d["provider"], d["key"]) for d in found["differences"]] == [("unknown_transfer", "7.00", None)]
        fired = [t for t in await alerts.step() if t.rule == "payout_unreconciled"]
        assert [(t.phase, t.subject) for t in fired] == [(FIRING, "fleet")]
        events = await (await api.get("/api/v1/events", params={"kind": "payments.payout_mismatch"}, headers=api.auth)).json()
        assert [e["data"]["kind"] for e in events["items"]] == ["unknown_transfer"]


async def test_a_started_master_reconciles_soon_so_a_restart_does_not_hide_a_difference_for_a_day(tmp_path, fake):
    """The reconciliation's result lives in memory: a Master that (re)starts runs one after ``reconcile_first_s``,
    not a whole ``reconcile_s`` (a day) later, so a difference on record fires its alert again soon after a restart."""
    async with paying_master(tmp_path, fake) as api:
        await connected(api, fake)
        fake.plant_transfer(next(iter(fake.accounts)), 700)  # a difference on Stripe's side, from before the restart
        services = api.app[SERVICES_KEY]
        assert services.payouts.last_reconciliation is None and services.payouts.unreconciled() == 0
        settings = dataclasses.replace(services.payouts.settings, reconcile_s=DAY, reconcile_first_s=0.2)
        restarted = payout_service(api, fake, settings=settings)
        restarted.start()
        try:
            for _ in range(200):  # bounded: 10 s at most
                if restarted.last_reconciliation is not None:
                    break
                await asyncio.sleep(0.05)
            assert restarted.last_reconciliation is not None, "no reconciliation after the start"
            assert restarted.unreconciled() == 1
        finally:
            await restarted.stop()

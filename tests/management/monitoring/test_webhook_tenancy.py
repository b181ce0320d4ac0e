"""Webhooks among tenants, through the real API on a real Master (SQLite in the test's tmp_path), with real aiohttp
receivers and black holes on 127.0.0.1:

- D6: a webhook to a target that is not public is refused when it is created, saying why (the operator's own may be
  private with ``webhook_allow_private``, another account's never);
- D7: an account has at most ``webhooks_per_account``, the list is paged, each account's deliveries have their own
  slots, and a delivery waiting to retry holds none;
- D8: what a webhook is sent is decided at delivery, from its account as it is then.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from management.app import api_app
from management.http.keys import SERVICES_KEY
from management.monitoring.evaluator import FIRING, AlertTransition
from management.monitoring.notifier import NotifierSettings, Webhook, WebhookNotifier
from management.store import webhook_repo
from master.accounts import AccountChange
from master.config import MasterConfig
from master.master import Master
from tests.management.hosts import api_key
from tests.management.monitoring.receiver import BlackHole, WebhookReceiver
from tests.management.monitoring.test_webhook_targets import REFUSED, settled


@pytest.fixture
async def hooks_api(tmp_path) -> AsyncIterator[TestClient]:
    """The API on a Master whose operator allows its own webhooks private targets (the receivers are on 127.0.0.1),
    three webhooks an account."""
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, webhook_allow_private=True, webhooks_per_account=3)
    master = Master(config)
    await master.start()
    client = TestClient(TestServer(api_app(master)))
    await client.start_server()
    client.master = master  # type: ignore[attr-defined]
    yield client
    await client.app[SERVICES_KEY].alerts.loop.notifier.stop()
    await client.close()
    await master.stop()


def transition(subject: str, provider: str) -> AlertTransition:
    return AlertTransition(
        key=f"gpu_overheating/{subject}/100.000/firing",
        rule="gpu_overheating",
        subject=subject,
        phase=FIRING,
        at=100.0,
        since=0.0,
        fired_at=100.0,
        value=91.0,
        severity="critical",
        scope="gpu",
        summary="hot",
        labels={"provider": provider, "agent_id": "agt-a"},
    )


# --- D6: refused at creation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("url", "why"), REFUSED, ids=[u for u, _ in REFUSED])
async def test_a_providers_webhook_to_a_target_that_is_not_public_is_refused_saying_why(api, url, why):
    acme = await api_key(api.master, "provider", "acme")
    refused = await api.post("/api/v1/webhooks", json={"url": url}, headers=acme)
    assert refused.status == 400
    message = (await refused.json())["error"]["message"]
    assert why in message and "public addresses only" in message
    assert await webhook_repo(api.master.store).list() == []


async def test_the_operators_webhook_may_be_private_only_with_the_setting_and_never_carries_credentials(api, hooks_api):
    for client, status in ((api, 400), (hooks_api, 201)):
        answer = await client.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/x"}, headers=await _ops(client))
        assert answer.status == status, await answer.text()
    renter = await api_key(hooks_api.master, "renter", "rita")  # the setting is the operator's own, never a tenant's
    assert (await hooks_api.post("/api/v1/webhooks", json={"url": "http://127.0.0.1:9/x"}, headers=renter)).status == 400
    with_credentials = await hooks_api.post(
        "/api/v1/webhooks", json={"url": "https://me:secret@hooks.example.net/x"}, headers=await _ops(hooks_api)
    )
    assert with_credentials.status == 400 and "credentials" in (await with_credentials.json())["error"]["message"]


async def _ops(client: TestClient) -> dict[str, str]:
    return await api_key(client.master, "operator", "ops")  # type: ignore[attr-defined]


# --- D7: a cap, pages, lanes --------------------------------------------------------------------------------------


async def test_an_account_has_at_most_its_webhooks_and_the_list_is_paged(hooks_api):
    acme = await api_key(hooks_api.master, "provider", "acme")
    made = []
    for n in range(3):
        answer = await hooks_api.post("/api/v1/webhooks", json={"url": f"https://hooks.example.net/{n}"}, headers=acme)
        assert answer.status == 201
        made.append((await answer.json())["id"])
    over = await hooks_api.post("/api/v1/webhooks", json={"url": "https://hooks.example.net/3"}, headers=acme)
    assert over.status == 409 and "webhooks_per_account" in (await over.json())["error"]["message"]

    first = await (await hooks_api.get("/api/v1/webhooks?limit=2", headers=acme)).json()
    assert [w["id"] for w in first["items"]] == made[:2] and first["next_cursor"]
    second = await hooks_api.get(f"/api/v1/webhooks?limit=2&cursor={first['next_cursor']}", headers=acme)
    rest = await second.json()
    assert [w["id"] for w in rest["items"]] == made[2:] and rest["next_cursor"] is None

    assert (await hooks_api.delete(f"/api/v1/webhooks/{made[0]}", headers=acme)).status == 204
    again = await hooks_api.post("/api/v1/webhooks", json={"url": "https://hooks.example.net/3"}, headers=acme)
    assert again.status == 201


async def test_one_accounts_black_holes_do_not_delay_another_accounts_delivery():
    """Eight webhooks of one account post to a receiver that never answers; another account's alert still arrives,
    while every slot the first account may hold stays held (and no more)."""
    hole = BlackHole()
    receiver = WebhookReceiver()
    await hole.start()
    await receiver.start()
    settings = NotifierSettings(concurrency=4, per_account=2, timeout_s=120.0, allow_private=True)
    notifier = WebhookNotifier(settings=settings)
    for n in range(8):  # the receivers are on 127.0.0.1: both accounts are operators, which the setting allows
        notifier.webhooks[f"hole-{n}"] = Webhook(id=f"wh-{n}", url=hole.url(), secret="s", owner="ops-a", role="operator")
    notifier.start()
    try:
        notifier.notify(transition("GPU-0", "prov-a"))  # eight deliveries into the black hole, queued first
        notifier.webhooks["calm"] = Webhook(id="wh-calm", url=receiver.url, secret="s", owner="ops-b", role="operator")
        notifier.notify(transition("GPU-1", "prov-a"))  # eight more into the black hole, and one for ops-b
        [request] = await receiver.wait_for(1, timeout_s=10.0)  # bounded: the black hole holds on for 120 s
        assert request.payload["alert"]["subject"] == "GPU-1"
        assert hole.accepted == settings.per_account  # ops-a holds its own slots, and only those
        assert (notifier.delivered, notifier.failed) == (1, 0)  # nothing of ops-a's has ended: ops-b went past it
    finally:
        await notifier.stop()
        await hole.stop()
        await receiver.stop()


async def test_a_delivery_waiting_to_retry_holds_no_slot():
    """One slot in all; the first delivery is answered 503 and waits (long) to retry; the next is delivered now."""
    receiver = WebhookReceiver(statuses=[503])
    await receiver.start()
    settings = NotifierSettings(concurrency=1, per_account=1, backoff_s=600.0, backoff_max_s=600.0, allow_private=True)
    notifier = WebhookNotifier(settings=settings, rng=random.Random(3))
    assert notifier.backoff(1) > 60  # with this seed, the retry sleeps well past the test's bounded wait
    notifier.rng = random.Random(3)
    notifier.webhooks["ops"] = Webhook(id="wh-ops", url=receiver.url, secret="s", owner="ops", role="operator")
    notifier.start()
    try:
        notifier.notify(transition("GPU-0", "prov-a"))
        await receiver.wait_for(1)
        notifier.notify(transition("GPU-1", "prov-a"))
        requests = await receiver.wait_for(2, timeout_s=10.0)
        assert [r.payload["alert"]["subject"] for r in requests] == ["GPU-0", "GPU-1"]
        assert notifier.delivered == 1 and notifier.waiting == 1  # GPU-0 sleeps before its retry, holding nothing
    finally:
        await notifier.stop()
        await receiver.stop()


# --- D8: decided at delivery --------------------------------------------------------------------------------------


@pytest.mark.parametrize("change", [AccountChange(role="renter"), AccountChange(disabled=True)], ids=["demoted", "disabled"])
async def test_a_webhook_made_by_an_operator_stops_getting_others_alerts_once_the_account_is_demoted_or_disabled(
    hooks_api, change
):
    receiver = WebhookReceiver()
    await receiver.start()
    master = hooks_api.master
    made = await hooks_api.post("/api/v1/webhooks", json={"url": receiver.url}, headers=await api_key(master, "operator", "ops2"))
    assert made.status == 201
    notifier = hooks_api.app[SERVICES_KEY].alerts.loop.notifier
    notifier.start()  # the alert loop runs in the Master's server; here the test hands it transitions itself
    try:
        notifier.notify(transition("GPU-0", "prov-b"))
        await receiver.wait_for(1)
        await master.accounts.update("ops2", change)
        notifier.notify(transition("GPU-1", "prov-b"))
        await settled(notifier, 2)
        assert notifier.withheld == 1 and len(receiver.requests) == 1  # another tenant's alert: no longer its to see
    finally:
        await receiver.stop()


async def test_a_webhook_url_ending_in_a_newline_is_refused(api):
    acme = await api_key(api.master, "provider", "acme")
    refused = await api.post("/api/v1/webhooks", json={"url": "https://hooks.example.net/x\n"}, headers=acme)
    assert refused.status == 400 and "url" in (await refused.json())["error"]["message"]
    assert await webhook_repo(api.master.store).list() == []


async def test_concurrent_requests_cannot_pass_the_webhook_cap_together(hooks_api):
    acme = await api_key(hooks_api.master, "provider", "acme")
    answers = await asyncio.gather(
        *(hooks_api.post("/api/v1/webhooks", json={"url": f"https://hooks.example.net/{n}"}, headers=acme) for n in range(8))
    )
    assert sorted(a.status for a in answers) == [201] * 3 + [409] * 5
    assert len(await webhook_repo(hooks_api.master.store).list(owner="acme")) == 3

"""Webhook notifications against a real aiohttp receiver: signed bodies, retries with backoff on 5xx, exactly one
accepted delivery per transition, the owner's alerts only, and a full queue drops rather than blocks."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random

from management.monitoring.evaluator import FIRING, AlertTransition
from management.monitoring.notifier import DELIVERY_HEADER, SIGNATURE_HEADER, NotifierSettings, Webhook, WebhookNotifier
from tests.management.monitoring.receiver import WebhookReceiver

# The receivers run on 127.0.0.1: the operator's webhooks may reach it only with the operator's setting on.
FAST = NotifierSettings(backoff_s=0.01, backoff_max_s=0.05, max_attempts=4, timeout_s=2.0, allow_private=True)


def transition(subject: str = "GPU-0", provider: str = "prov-a") -> AlertTransition:
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


def hook(url: str, *, owner: str = "operator", role: str = "operator", secret: str = "s3cret") -> Webhook:
    return Webhook(id=f"wh-{owner}", url=url, secret=secret, owner=owner, role=role)


async def settled(notifier: WebhookNotifier, deliveries: int) -> None:
    async def done() -> None:
        while notifier.delivered + notifier.failed < deliveries:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(done(), 5.0)


async def test_the_body_is_signed_with_the_webhooks_secret_and_carries_the_idempotency_key():
    receiver = WebhookReceiver()
    await receiver.start()
    notifier = WebhookNotifier(settings=FAST)
    notifier.webhooks["a"] = hook(receiver.url)
    notifier.start()
    try:
        assert notifier.notify(transition()) == 1
        [request] = await receiver.wait_for(1)
        expected = "sha256=" + hmac.new(b"s3cret", request.body, hashlib.sha256).hexdigest()
        assert request.headers[SIGNATURE_HEADER] == expected
        wrong = "sha256=" + hmac.new(b"other", request.body, hashlib.sha256).hexdigest()
        assert request.headers[SIGNATURE_HEADER] != wrong
        payload = request.payload
        assert payload["idempotency_key"] == request.headers[DELIVERY_HEADER] == transition().key
        assert (payload["alert"]["rule"], payload["alert"]["phase"], payload["alert"]["value"]) == (
            "gpu_overheating",
            "firing",
            91.0,
        )
    finally:
        await notifier.stop()
        await receiver.stop()


async def test_a_500_is_retried_with_backoff_until_a_200_and_delivered_exactly_once():
    receiver = WebhookReceiver(statuses=[500, 503])
    await receiver.start()
    notifier = WebhookNotifier(settings=FAST, rng=random.Random(7))
    notifier.webhooks["a"] = hook(receiver.url)
    notifier.start()
    try:
        notifier.notify(transition())
        await settled(notifier, 1)
        await asyncio.sleep(0.1)  # room for a wrong extra attempt to show up
        assert len(receiver.requests) == 3 and notifier.delivered == 1 and notifier.failed == 0
        assert len({r.body for r in receiver.requests}) == 1  # the same body (and key) every attempt
    finally:
        await notifier.stop()
        await receiver.stop()


async def test_a_receiver_that_keeps_failing_is_given_up_after_max_attempts_and_a_4xx_is_not_retried():
    receiver = WebhookReceiver(statuses=[500] * 10)
    await receiver.start()
    notifier = WebhookNotifier(settings=FAST)
    notifier.webhooks["a"] = hook(receiver.url)
    notifier.start()
    try:
        notifier.notify(transition())
        await settled(notifier, 1)
        assert len(receiver.requests) == FAST.max_attempts and notifier.failed == 1
        receiver.statuses = [404]
        notifier.notify(transition("GPU-1"))
        await settled(notifier, 2)
        assert len(receiver.requests) == FAST.max_attempts + 1 and notifier.failed == 2
    finally:
        await notifier.stop()
        await receiver.stop()


def test_backoff_is_exponential_with_full_jitter_and_capped():
    notifier = WebhookNotifier(settings=NotifierSettings(backoff_s=1.0, backoff_max_s=8.0), rng=random.Random(1))
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (9, 8.0)]:
        waits = [notifier.backoff(attempt) for _ in range(200)]
        assert all(0 <= w <= ceiling for w in waits) and max(waits) > ceiling * 0.8


async def test_a_provider_webhook_gets_only_its_own_hosts_alerts():
    receiver = WebhookReceiver()
    await receiver.start()
    notifier = WebhookNotifier(settings=FAST)
    notifier.webhooks["mine"] = hook(receiver.url, owner="prov-a", role="provider")
    notifier.start()
    try:
        assert notifier.notify(transition("GPU-other", provider="prov-b")) == 0
        assert notifier.notify(transition("GPU-mine", provider="prov-a")) == 1
        await settled(notifier, 1)
        # Its own alert was queued, and not sent: a provider's webhook may not reach 127.0.0.1 (test_webhook_targets).
        assert notifier.refused == 1 and receiver.requests == []
    finally:
        await notifier.stop()
        await receiver.stop()


async def test_a_full_queue_drops_the_oldest_delivery_and_notify_never_waits():
    notifier = WebhookNotifier(settings=NotifierSettings(queue_size=2))
    notifier.webhooks["a"] = hook("http://127.0.0.1:9/never")
    notifier._started = True  # started without its sender: nothing drains the lanes
    for n in range(5):
        notifier.notify(transition(f"GPU-{n}"))
    assert notifier.dropped == 3
    assert [d.key for d in notifier._lanes["operator"]] == [transition("GPU-3").key, transition("GPU-4").key]


async def test_a_full_queue_drops_from_the_account_with_the_most_waiting():
    notifier = WebhookNotifier(settings=NotifierSettings(queue_size=4))
    notifier.webhooks["flood"] = hook("http://127.0.0.1:9/a", owner="flood")
    notifier.webhooks["calm"] = hook("http://127.0.0.1:9/b", owner="calm")
    notifier._started = True
    notifier.notify(transition("GPU-0"))  # one each
    for n in range(1, 4):  # then the flood's webhook alone
        del notifier.webhooks["calm"]
        notifier.notify(transition(f"GPU-{n}"))
        notifier.webhooks["calm"] = hook("http://127.0.0.1:9/b", owner="calm")
    assert notifier.dropped == 1
    assert len(notifier._lanes["calm"]) == 1 and len(notifier._lanes["flood"]) == 3

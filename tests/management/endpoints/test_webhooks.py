"""An ended request's webhook (management/endpoints/webhooks.py): delivered through the grid's egress rule, judged
again at each connection, retried a bounded number of times, never followed through a redirect, never waited for.

Real receivers on 127.0.0.1 (tests/management/monitoring/receiver.py); names are answered by a table
(``NamesResolver``) so that none is looked up for real, and a black hole counts the connections it accepted (none:
nothing was tried)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from management.endpoints.queue import EndpointRequestRecord, RequestState
from management.endpoints.webhooks import RequestWebhooks, WebhookSettings
from management.views.endpoint_requests import request_status_body
from master.config import MasterConfig
from tests.management.monitoring.receiver import BlackHole, WebhookReceiver
from tests.management.monitoring.test_webhook_targets import NamesResolver

FAST = WebhookSettings(max_attempts=3, backoff_s=0.01, backoff_max_s=0.05, timeout_s=5.0)


def ended(request_id: str, webhook: str) -> EndpointRequestRecord:
    return EndpointRequestRecord(
        id=request_id,
        endpoint_id="ep-a",
        state=RequestState.COMPLETED.value,
        output='{"done":true}',
        submitted_at=100.0,
        started_at=100.5,
        ended_at=101.0,
        webhook=webhook,
    )


async def settled(hooks: RequestWebhooks) -> None:
    async def none_pending() -> None:
        while hooks.pending:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(none_pending(), 30)


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    running = WebhookReceiver()
    await running.start()
    yield running
    await running.stop()


@pytest.fixture
async def hole() -> AsyncIterator[BlackHole]:
    running = BlackHole()
    await running.start()
    yield running
    await running.stop()


def hooks_for(names: dict[str, str], *allowed: str, settings: WebhookSettings = FAST) -> tuple[RequestWebhooks, NamesResolver]:
    resolver = NamesResolver(names)
    rule = MasterConfig(egress_allow=list(allowed)).egress_rule()
    hooks = RequestWebhooks(request_status_body, egress=rule, settings=settings, resolver=lambda: resolver)
    hooks.start()
    return hooks, resolver


async def test_a_name_that_resolves_to_a_private_address_is_refused_at_delivery_without_connecting(hole: BlackHole) -> None:
    hooks, names = hooks_for({"rebind.test": "127.0.0.1"})
    url = hole.url("rebind.test")
    assert hooks.refusal(url) is None  # a name: nothing to say until it is resolved, at delivery
    hooks.notify(ended("req-1", url))
    await settled(hooks)
    await hooks.stop()
    assert (hole.accepted, hooks.refused, hooks.failed, hooks.delivered) == (0, 1, 1, 0)
    assert names.lookups == 1  # refused once, not tried again


async def test_a_host_the_operator_allows_gets_the_status_answer_and_failures_are_retried_a_bounded_number_of_times(
    receiver: WebhookReceiver,
) -> None:
    hooks, _ = hooks_for({"hooks.lan": "127.0.0.1"}, f"hooks.lan:{receiver.port}")
    url = f"http://hooks.lan:{receiver.port}/hook"
    receiver.statuses += [503, 429]
    hooks.notify(ended("req-1", url))
    got = await receiver.wait_for(3)
    await settled(hooks)
    assert [r.payload for r in got] == [json.loads(request_status_body(ended("req-1", url)))] * 3
    assert got[0].payload == {"id": "req-1", "status": "COMPLETED", "attempt": 1, "output": {"done": True},
                              "delayTime": 500, "executionTime": 500}  # fmt: skip
    assert {r.headers["X-Idlegrid-Request"] for r in got} == {"req-1"}
    assert (hooks.delivered, hooks.failed) == (1, 0)

    receiver.statuses += [500] * FAST.max_attempts
    hooks.notify(ended("req-2", url))
    await receiver.wait_for(3 + FAST.max_attempts)
    await settled(hooks)
    assert (hooks.delivered, hooks.failed) == (1, 1)  # gave up after max_attempts

    receiver.statuses.append(302)  # a redirect is an answer, never followed
    hooks.notify(ended("req-3", url))
    await receiver.wait_for(4 + FAST.max_attempts)
    await settled(hooks)
    assert receiver.followed == [] and (hooks.delivered, hooks.failed) == (1, 2)
    await hooks.stop()


async def test_notify_never_waits_and_what_is_pending_is_bounded(hole: BlackHole) -> None:
    settings = WebhookSettings(max_attempts=1, timeout_s=30.0, max_pending=2)
    hooks, _ = hooks_for({}, f"127.0.0.1:{hole.port}", settings=settings)
    for i in range(3):
        hooks.notify(ended(f"req-{i}", hole.url()))  # returns at once: the black hole holds each delivery
    assert (hooks.pending, hooks.dropped) == (2, 1)
    hooks.notify(ended("req-none", ""))  # no webhook: nothing to deliver
    assert hooks.pending == 2
    await hole.wait_for(2)
    await hooks.stop()  # the deliveries under way end with the Master
    assert hooks.pending == 0 and hooks.delivered == 0
    hooks.notify(ended("req-late", hole.url()))  # stopped: nothing starts
    assert hooks.pending == 0

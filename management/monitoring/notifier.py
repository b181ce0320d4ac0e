"""Webhook notifications of alert transitions, on their own tasks: the alert loop hands a transition over with
``notify`` (never waits, never raises) and the deliveries go on in the background.

- Each webhook has its own secret; the body is signed: ``X-Idlegrid-Signature: sha256=<hex HMAC-SHA256(secret,
  body)>``. The body carries ``idempotency_key`` (also ``X-Idlegrid-Delivery``): the same for every attempt of one
  transition, so a receiver that got it twice (an answer lost on the way back) can tell.
- A delivery is tried again on a connection error, a timeout, 429 or 5xx, after exponential backoff with full
  jitter, up to ``max_attempts``; any other answer ends it (2xx: delivered; other 4xx: refused, logged).
- The queue is bounded: when full, the oldest waiting delivery is dropped (and counted), the Master never waits.
- A webhook only gets the transitions its owner may see (management/monitoring/visibility.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
from dataclasses import dataclass, field

import aiohttp
import msgspec

from management.monitoring.evaluator import AlertTransition
from management.monitoring.visibility import Viewer, visible

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Idlegrid-Signature"
DELIVERY_HEADER = "X-Idlegrid-Delivery"


class Webhook(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    url: str
    secret: str
    owner: str  # the account that created it
    role: str  # its role when it did: what it may see
    created_at: float = 0.0


def sign(secret: str, body: bytes) -> str:
    """The signature header's value for ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def body_of(transition: AlertTransition) -> bytes:
    payload = {"idempotency_key": transition.key, "alert": msgspec.to_builtins(transition)}
    return json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Delivery:
    webhook: Webhook
    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class NotifierSettings:
    queue_size: int = 10_000
    max_attempts: int = 6
    backoff_s: float = 1.0  # the first retry waits up to this (full jitter), doubling each time
    backoff_max_s: float = 300.0
    timeout_s: float = 10.0
    concurrency: int = 16  # deliveries under way at once


@dataclass
class WebhookNotifier:
    settings: NotifierSettings = field(default_factory=NotifierSettings)
    rng: random.Random = field(default_factory=random.Random)
    webhooks: dict[str, Webhook] = field(default_factory=dict)
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    _queue: asyncio.Queue[Delivery] | None = None
    _task: asyncio.Task[None] | None = None
    _under_way: set[asyncio.Task[None]] = field(default_factory=set)
    _session: aiohttp.ClientSession | None = None

    def start(self) -> None:
        self._queue = asyncio.Queue(self.settings.queue_size)
        self._task = asyncio.create_task(self._run(), name="alert-webhooks")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._under_way) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    def notify(self, transition: AlertTransition) -> int:
        """Queue ``transition`` for every webhook whose owner may see it; how many deliveries were queued."""
        if self._queue is None:
            return 0
        body = body_of(transition)
        queued = 0
        for hook in self.webhooks.values():
            if not visible(transition.labels, Viewer(account=hook.owner, role=hook.role)):
                continue
            delivery = Delivery(webhook=hook, key=transition.key, body=body)
            while True:
                try:
                    self._queue.put_nowait(delivery)
                    break
                except asyncio.QueueFull:
                    self._queue.get_nowait()
                    self.dropped += 1
                    log.warning("alert webhook queue full: the oldest delivery was dropped")
            queued += 1
        return queued

    def backoff(self, attempt: int) -> float:
        """How long to wait before attempt ``attempt + 1`` (full jitter over an exponential ceiling)."""
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_s * 2 ** (attempt - 1))
        return self.rng.uniform(0, ceiling)

    async def _run(self) -> None:
        assert self._queue is not None
        slots = asyncio.Semaphore(self.settings.concurrency)
        while True:
            delivery = await self._queue.get()
            await slots.acquire()
            task = asyncio.create_task(self._deliver(delivery, slots), name=f"alert-webhook-{delivery.webhook.id}")
            self._under_way.add(task)
            task.add_done_callback(self._under_way.discard)

    async def _deliver(self, delivery: Delivery, slots: asyncio.Semaphore) -> None:
        try:
            for attempt in range(1, self.settings.max_attempts + 1):
                retry, status = await self._attempt(delivery)
                if not retry:
                    if status is not None and 200 <= status < 300:
                        self.delivered += 1
                    else:
                        self.failed += 1
                        log.warning("alert webhook %s refused delivery %s: HTTP %s", delivery.webhook.id, delivery.key, status)
                    return
                if attempt < self.settings.max_attempts:
                    await asyncio.sleep(self.backoff(attempt))
            self.failed += 1
            log.warning("alert webhook %s: delivery %s gave up after %d attempts", delivery.webhook.id, delivery.key, attempt)
        finally:
            slots.release()

    async def _attempt(self, delivery: Delivery) -> tuple[bool, int | None]:
        """(try again?, HTTP status or None)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s))
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(delivery.webhook.secret, delivery.body),
            DELIVERY_HEADER: delivery.key,
        }
        try:
            async with self._session.post(delivery.webhook.url, data=delivery.body, headers=headers) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("alert webhook %s: %s; will retry", delivery.webhook.id, exc)
            return True, None
        return (status == 429 or status >= 500), status

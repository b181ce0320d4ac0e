"""Webhook notifications of alert transitions, on their own tasks: the alert loop hands a transition over with
``notify`` (never waits, never raises) and the deliveries go on in the background.

- Each webhook has its own secret; the body is signed: ``X-Idlegrid-Signature: sha256=<hex HMAC-SHA256(secret,
  body)>``. The body carries ``idempotency_key`` (also ``X-Idlegrid-Delivery``): the same for every attempt of one
  transition, so a receiver that got it twice (an answer lost on the way back) can tell.
- A delivery is tried again on a connection error, a timeout, 429 or 5xx, after exponential backoff with full
  jitter, up to ``max_attempts``; any other answer ends it (2xx: delivered; a redirect: never followed; other 4xx:
  refused, logged).
- Targets: public addresses only, judged on every connection (webhook_targets.py); the operator's own webhooks may
  reach private ones when ``allow_private`` is set. A refused target is not retried.
- Each account has its own lane: its deliveries wait in its own queue, and at most ``per_account`` of its attempts
  are under way at once (of ``concurrency`` for all accounts), so one account's slow or silent receivers delay only
  its own alerts. Lanes take turns. A delivery waiting to retry holds no slot: it sleeps on a timer, outside its
  lane, and joins the lane's end when the timer fires.
- Waiting deliveries (in lanes or on retry timers) are bounded by ``queue_size``: when full, the oldest waiting
  delivery of the account with the most waiting is dropped (and counted); the Master never waits.
- A webhook only gets the transitions its owner may see, decided when it is delivered from the account as it is then
  (``viewer_of``: a demoted or disabled account stops receiving others' alerts at once; visibility.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import random
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from common.egress import EgressRule
from management.monitoring.evaluator import AlertTransition
from management.monitoring.visibility import Viewer, visible
from management.monitoring.webhook_targets import OPERATOR_RULE, PublicResolver, TargetRefused, url_refusal

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Idlegrid-Signature"
DELIVERY_HEADER = "X-Idlegrid-Delivery"


class Webhook(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    url: str
    secret: str
    owner: str  # the account that created it: what it may see is this account's, as it is at each delivery
    role: str  # the account's role when it created it (shown; what counts is the role at delivery)
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
    labels: Mapping[str, str]  # the transition's: who may see it is decided at delivery
    attempt: int = 1  # the attempt this one is, when it is next tried


@dataclass(frozen=True, slots=True)
class NotifierSettings:
    queue_size: int = 10_000  # deliveries waiting (in lanes and on retry timers), all accounts together
    max_attempts: int = 6
    backoff_s: float = 1.0  # the first retry waits up to this (full jitter), doubling each time
    backoff_max_s: float = 300.0
    timeout_s: float = 10.0
    concurrency: int = 16  # attempts under way at once, all accounts together
    per_account: int = 2  # attempts under way at once for one account's webhooks
    per_account_webhooks: int = 10  # webhooks an account may have (management/monitoring/settings.py)
    allow_private: bool = False  # the operator's own webhooks may reach private and loopback addresses
    egress: EgressRule = OPERATOR_RULE  # what any webhook may reach: public addresses, and the operator's egress_allow


ViewerOf = Callable[[Webhook], Awaitable[Viewer | None]]


async def viewer_as_created(hook: Webhook) -> Viewer | None:
    """The viewer a webhook was made with: for a notifier that has no accounts to ask (tests of delivery alone)."""
    return Viewer(account=hook.owner, role=hook.role)


@dataclass
class WebhookNotifier:
    settings: NotifierSettings = field(default_factory=NotifierSettings)
    rng: random.Random = field(default_factory=random.Random)
    webhooks: dict[str, Webhook] = field(default_factory=dict)
    # The owner as it is now (None: gone or disabled), asked at each delivery; the Master's passes its accounts.
    viewer_of: ViewerOf = viewer_as_created
    # What names resolve through (each answer judged by PublicResolver); the system's resolver by default.
    resolver: Callable[[], AbstractResolver] = DefaultResolver
    delivered: int = 0
    failed: int = 0
    dropped: int = 0
    refused: int = 0  # of the failed: the target was not one a webhook may reach
    withheld: int = 0  # deliveries not made: the owner may no longer see the alert (or is gone, or disabled)
    _started: bool = False
    _last_seen: dict[str, Viewer] = field(default_factory=dict)  # owner -> as its latest delivery found it
    _lanes: OrderedDict[str, deque[Delivery]] = field(default_factory=OrderedDict)  # owner -> waiting, in turn
    _in_lanes: int = 0  # deliveries in all lanes together
    _active: Counter[str] = field(default_factory=Counter)  # owner -> attempts under way
    _timers: set[asyncio.TimerHandle] = field(default_factory=set)  # retries sleeping, holding no slot
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _under_way: set[asyncio.Task[None]] = field(default_factory=set)
    _sessions: dict[bool, aiohttp.ClientSession] = field(default_factory=dict)  # private allowed? -> its client

    def start(self) -> None:
        self._started = True
        self._task = asyncio.create_task(self._run(), name="alert-webhooks")

    async def stop(self) -> None:
        self._started = False
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        tasks = [t for t in (self._task, *self._under_way) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()

    @property
    def waiting(self) -> int:
        """Deliveries waiting: in their lanes, and sleeping before a retry."""
        return self._in_lanes + len(self._timers)

    def notify(self, transition: AlertTransition) -> int:
        """Queue ``transition`` for every webhook whose owner may see it; how many deliveries were queued."""
        if not self._started:
            return 0
        body = body_of(transition)
        queued = 0
        for hook in self.webhooks.values():
            # A first sift, by the owner as last seen (as it made the webhook, until a delivery asks): whether it may
            # see the alert is decided again, from the account as it is then, when it is delivered.
            if not visible(transition.labels, self._last_seen.get(hook.owner) or Viewer(hook.owner, hook.role)):
                continue
            self._enqueue(Delivery(webhook=hook, key=transition.key, body=body, labels=dict(transition.labels)))
            queued += 1
        return queued

    def backoff(self, attempt: int) -> float:
        """How long to wait before attempt ``attempt + 1`` (full jitter over an exponential ceiling)."""
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_s * 2 ** (attempt - 1))
        return self.rng.uniform(0, ceiling)

    # --- lanes ------------------------------------------------------------------------------------

    def _enqueue(self, delivery: Delivery) -> None:
        while self.waiting >= self.settings.queue_size and self._lanes:
            fullest = max(self._lanes, key=lambda owner: len(self._lanes[owner]))
            self._lanes[fullest].popleft()
            self._in_lanes -= 1
            if not self._lanes[fullest]:
                del self._lanes[fullest]
            self.dropped += 1
            log.warning("alert webhook queue full: the oldest delivery of account %s was dropped", fullest)
        if self.waiting >= self.settings.queue_size:  # all of it sleeping before retries: the newcomer goes
            self.dropped += 1
            return
        self._lanes.setdefault(delivery.webhook.owner, deque()).append(delivery)
        self._in_lanes += 1
        self._wake.set()

    def _next(self) -> Delivery | None:
        """The next delivery to try: from the first lane in turn with a slot of its own free; that lane goes last."""
        for owner, lane in self._lanes.items():
            if self._active[owner] < self.settings.per_account:
                delivery = lane.popleft()
                self._in_lanes -= 1
                if lane:
                    self._lanes.move_to_end(owner)
                else:
                    del self._lanes[owner]
                return delivery
        return None

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            # Slots are counted where they are taken and given back (_active), not by the tasks still finishing.
            while sum(self._active.values()) < self.settings.concurrency:
                delivery = self._next()
                if delivery is None:
                    break
                self._active[delivery.webhook.owner] += 1
                task = asyncio.create_task(self._deliver(delivery), name=f"alert-webhook-{delivery.webhook.id}")
                self._under_way.add(task)
                task.add_done_callback(self._under_way.discard)
            await self._wake.wait()

    def _retry_later(self, delivery: Delivery) -> None:
        """Sleep on a timer (holding no slot), then join the lane's end."""

        def due() -> None:
            self._timers.discard(timer)
            if self._started:
                self._enqueue(delivery)

        timer = asyncio.get_running_loop().call_later(self.backoff(delivery.attempt - 1), due)
        self._timers.add(timer)

    # --- one attempt --------------------------------------------------------------------------------

    async def _deliver(self, delivery: Delivery) -> None:
        owner = delivery.webhook.owner
        try:
            retry = await self._attempt_once(delivery)
        finally:
            self._active[owner] -= 1
            if self._active[owner] <= 0:
                del self._active[owner]
            self._wake.set()
        if not retry:
            return
        if delivery.attempt < self.settings.max_attempts:
            self._retry_later(replace(delivery, attempt=delivery.attempt + 1))
            return
        self.failed += 1
        log.warning(
            "alert webhook %s: delivery %s gave up after %d attempts", delivery.webhook.id, delivery.key, delivery.attempt
        )

    async def _attempt_once(self, delivery: Delivery) -> bool:
        """One attempt (the owner's sight and the target checked first); whether to try again."""
        hook = delivery.webhook
        if hook.id not in self.webhooks and hook not in self.webhooks.values():  # deleted since it was queued
            self.withheld += 1
            return False
        viewer = await self.viewer_of(hook)
        if viewer is None:  # gone or disabled: sifted as made again, and withheld here while it stays so
            self._last_seen.pop(hook.owner, None)
        else:
            self._last_seen[hook.owner] = viewer
        if viewer is None or not visible(delivery.labels, viewer):
            self.withheld += 1
            log.info("alert webhook %s: delivery %s withheld: account %s may not see it now", hook.id, delivery.key, hook.owner)
            return False
        private = self.settings.allow_private and viewer.role == "operator"
        why = url_refusal(hook.url, allow_private=private, rule=self.settings.egress)
        if why is not None:
            return self._refuse(delivery, why)
        try:
            retry, status = await self._post(delivery, private)
        except TargetRefused as exc:
            return self._refuse(delivery, str(exc))
        if retry:
            log.info("alert webhook %s: attempt %d of %s: HTTP %s; will retry", hook.id, delivery.attempt, delivery.key, status)
            return True
        if status is not None and 200 <= status < 300:
            self.delivered += 1
        else:
            self.failed += 1
            said = "a redirect, which is not followed" if status is not None and 300 <= status < 400 else "a refusal"
            log.warning("alert webhook %s refused delivery %s: HTTP %s (%s)", hook.id, delivery.key, status, said)
        return False

    def _refuse(self, delivery: Delivery, why: str) -> bool:
        self.failed += 1
        self.refused += 1
        log.warning("alert webhook %s: delivery %s not sent: %s", delivery.webhook.id, delivery.key, why)
        return False

    def _session(self, private: bool) -> aiohttp.ClientSession:
        session = self._sessions.get(private)
        if session is None:
            resolver = self.resolver() if private else PublicResolver(self.resolver(), self.settings.egress)
            # No DNS cache and no kept-alive connection: every delivery resolves, and is judged, afresh (DNS
            # rebinding). No proxy from the environment, no cookies kept between deliveries.
            connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False, force_close=True)
            session = self._sessions[private] = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return session

    async def _post(self, delivery: Delivery, private: bool) -> tuple[bool, int | None]:
        """(try again?, HTTP status or None)."""
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(delivery.webhook.secret, delivery.body),
            DELIVERY_HEADER: delivery.key,
        }
        session = self._session(private)
        try:
            async with session.post(delivery.webhook.url, data=delivery.body, headers=headers, allow_redirects=False) as answer:
                status = answer.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("alert webhook %s: %s; will retry", delivery.webhook.id, exc)
            return True, None
        return (status == 429 or status >= 500), status

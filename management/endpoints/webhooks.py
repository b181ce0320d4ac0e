"""A request's webhook: once an endpoint request has ended, its status answer is POSTed to the URL its renter gave at
``/run`` (docs/endpoints.md, "The request routes").

- ``refusal(url)``: what ``/run`` asks first (no DNS): an http(s) URL with a host and no credentials, whose host the
  grid's one egress rule (common/egress.py, the Master's ``egress_allow``) does not refuse on sight.
- ``notify(record)``: the book's end hook (management/endpoints/requests.py ``on_end``). It never waits and never
  raises: a request with a webhook gets a delivery task of its own, and the book goes on.
- Each delivery resolves its host afresh and connects only when every address is public or the name is allowed by
  ``egress_allow`` (``PublicResolver``: no DNS cache, no kept-alive connection, no redirect followed, no proxy from the
  environment), so a renter cannot make the Master post into its own network.
- A connection error, a timeout, 429 or 5xx is tried again after exponential backoff with full jitter, up to
  ``max_attempts``; any other answer ends it (2xx delivered; a redirect or another 4xx: refused, logged). A target
  refused by the egress rule is not tried again.
- Deliveries under way or waiting to retry are bounded (``max_pending``): past it a new one is dropped and counted;
  attempts at once are bounded (``concurrency``); a retry's wait holds no slot.

Deliveries live in memory: one pending when the Master stops is not sent by the next (the request's status still
tells its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver

from common.egress import EgressRule
from management.endpoints.queue import EndpointRequestRecord
from management.monitoring.webhook_targets import OPERATOR_RULE, PublicResolver, TargetRefused, url_refusal

log = logging.getLogger(__name__)

MAX_WEBHOOK_URL = 2048
DELIVERY_HEADER = "X-Idlegrid-Request"  # the request's id: the same for every attempt, so a receiver can tell resends


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    max_attempts: int = 5
    backoff_s: float = 1.0  # the first retry waits up to this (full jitter), doubling each time
    backoff_max_s: float = 60.0
    timeout_s: float = 10.0
    concurrency: int = 16  # attempts under way at once
    max_pending: int = 10_000  # deliveries under way or waiting to retry


class RequestWebhooks:
    """Delivers each ended request's status answer (``render``) to its webhook, off the book's path."""

    def __init__(
        self,
        render: Callable[[EndpointRequestRecord], bytes],
        *,
        egress: EgressRule = OPERATOR_RULE,
        settings: WebhookSettings | None = None,
        resolver: Callable[[], AbstractResolver] = DefaultResolver,
        rng: random.Random | None = None,
    ) -> None:
        self._render = render
        self._egress = egress
        self.settings = settings or WebhookSettings()
        self._resolver = resolver
        self._rng = rng or random.Random()
        self._slots = asyncio.Semaphore(self.settings.concurrency)
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._started = False
        self.delivered = 0
        self.failed = 0
        self.refused = 0  # of the failed: the target was one the egress rule refuses
        self.dropped = 0

    def refusal(self, url: str) -> str | None:
        """Why ``url`` may not be a request's webhook (judged without DNS); None when it may."""
        if len(url) > MAX_WEBHOOK_URL:
            return f"webhook: {MAX_WEBHOOK_URL} characters at most"
        return url_refusal(url, allow_private=False, rule=self._egress)

    def start(self) -> None:
        self._started = True

    async def stop(self) -> None:
        self._started = False
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def pending(self) -> int:
        return len(self._tasks)

    def notify(self, rec: EndpointRequestRecord) -> None:
        """The book's end hook: start delivering ``rec``'s end to its webhook, if it has one (never waits)."""
        if not rec.webhook or not self._started:
            return
        if len(self._tasks) >= self.settings.max_pending:
            self.dropped += 1
            log.warning("endpoint request %s: webhook dropped, %d deliveries are pending already", rec.id, len(self._tasks))
            return
        try:
            body = self._render(rec)
        except Exception:
            self.failed += 1
            log.exception("endpoint request %s: its webhook's body could not be made", rec.id)
            return
        task = asyncio.create_task(self._deliver(rec.id, rec.webhook, body), name=f"request-webhook-{rec.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def backoff(self, attempt: int) -> float:
        """How long to wait after attempt ``attempt`` failed (full jitter over an exponential ceiling)."""
        ceiling = min(self.settings.backoff_max_s, self.settings.backoff_s * 2 ** (attempt - 1))
        return self._rng.uniform(0, ceiling)

    async def _deliver(self, request_id: str, url: str, body: bytes) -> None:
        for attempt in range(1, self.settings.max_attempts + 1):
            async with self._slots:
                retry = await self._attempt(request_id, url, body, attempt)
            if not retry:
                return
            if attempt < self.settings.max_attempts:
                await asyncio.sleep(self.backoff(attempt))
        self.failed += 1
        log.warning("endpoint request %s: webhook gave up after %d attempts", request_id, self.settings.max_attempts)

    async def _attempt(self, request_id: str, url: str, body: bytes, attempt: int) -> bool:
        """One POST; whether to try again."""
        why = self.refusal(url)  # the rule may have changed since /run
        if why is not None:
            return self._refuse(request_id, why)
        headers = {"Content-Type": "application/json", DELIVERY_HEADER: request_id}
        try:
            async with self._client().post(url, data=body, headers=headers, allow_redirects=False) as answer:
                status = answer.status
        except TargetRefused as exc:
            return self._refuse(request_id, str(exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.info("endpoint request %s: webhook attempt %d: %s; will retry", request_id, attempt, exc)
            return True
        if status == 429 or status >= 500:
            log.info("endpoint request %s: webhook attempt %d: HTTP %d; will retry", request_id, attempt, status)
            return True
        if 200 <= status < 300:
            self.delivered += 1
        else:
            self.failed += 1
            log.warning("endpoint request %s: webhook refused: HTTP %d (a redirect is not followed)", request_id, status)
        return False

    def _refuse(self, request_id: str, why: str) -> bool:
        self.failed += 1
        self.refused += 1
        log.warning("endpoint request %s: webhook not sent: %s", request_id, why)
        return False

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=PublicResolver(self._resolver(), self._egress), use_dns_cache=False, force_close=True
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

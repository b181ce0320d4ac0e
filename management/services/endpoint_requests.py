"""Requests to renters' endpoints, the renters' side of queue mode (docs/endpoints.md, "The request routes"): run,
run and wait, status, stream, cancel, retry, and an endpoint's health.

Every call names the endpoint and is limited to ``account`` (the API's ``Scope.owner``: the endpoint's owner, whether
it called with an API key or one of the endpoint's invocation keys; None for the operator). Another account's
endpoint, a deleted one, and a request of another endpoint all answer NotFound, as a missing one does.

The requests themselves are the book's (management/endpoints/requests.py); this service adds what a renter's call
needs around it: the endpoint's check, the webhook's (management/endpoints/webhooks.py), bounded waits, and each
request's stream cursor, so that a stream read without ``after`` answers the partial outputs after the ones already
read, as RunPod's does. When an endpoint is deleted its open requests are cancelled, so no caller waits forever.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from common.errors import Conflict, IdlegridError, NotFound
from management.endpoints.queue import OPEN_STATES, EndpointRequestRecord, Partial, RequestState
from management.endpoints.requests import MAX_TAKE_WAIT_S, RequestBook
from management.endpoints.scaler import EndpointScale
from management.endpoints.spec import EndpointRecord
from management.endpoints.webhooks import RequestWebhooks
from management.services.endpoints import EndpointsService
from management.store.endpoint_requests import EndpointRequestRepo

__all__ = [
    "EndpointHealthReport",
    "EndpointRequestsService",
    "InvalidEndpointRequest",
    "QueueFull",
    "MAX_RUNSYNC_WAIT_S",
    "MAX_STREAM_WAIT_S",
    "RUN_BODY_SLACK",
    "StreamRead",
]

JSON = Any
RUNSYNC_WAIT_S = 90.0  # as RunPod's /runsync
MAX_RUNSYNC_WAIT_S = 300.0
STREAM_WAIT_S = 10.0
MAX_STREAM_WAIT_S = MAX_TAKE_WAIT_S
RUN_BODY_SLACK = 16 << 10  # a /run body may be this much larger than the input it carries (the webhook, the braces)
STREAM_CURSORS = 100_000  # requests whose stream position is kept (the least recently read forgotten first)
FAR_SEQ = 1 << 62  # "after every partial": a wait for any change of the request
# What one endpoint's open requests may hold on the Master (they are kept in memory, inputs included, until they end).
MAX_OPEN_REQUESTS = 10_000
MAX_OPEN_INPUT_CHARS = 256 << 20


class QueueFull(IdlegridError):
    """An endpoint holding as many open requests (or input) as it may: 429, until some end."""

    code = "queue_full"


class InvalidEndpointRequest(IdlegridError):
    """A request a renter sent that the route refuses as written (a webhook the egress rule refuses): 400."""

    code = "invalid_endpoint_request"


@dataclass(frozen=True)
class RequestPolicy:
    """A request's own bounds (RunPod's per-request ``policy``), in seconds: each at most its endpoint's."""

    execution_timeout_s: float | None = None
    ttl_s: float | None = None


def _within(policy: RequestPolicy | None, execution_timeout_s: float, ttl_s: float) -> tuple[float | None, float | None]:
    """The policy's bounds; InvalidEndpointRequest for one past the endpoint's (its owner's bound on what a request
    may cost: an invocation key does not widen it)."""
    if policy is None:
        return None, None
    for asked, own, name, field in (
        (policy.execution_timeout_s, execution_timeout_s, "executionTimeout", "execution_timeout_s"),
        (policy.ttl_s, ttl_s, "ttl", "ttl_s"),
    ):
        if asked is not None and asked > own:
            raise InvalidEndpointRequest(
                f"policy.{name} is {asked * 1000:.0f} ms, past this endpoint's {field} ({own:g} s): a request's own "
                "bound may only be shorter"
            )
    return policy.execution_timeout_s, policy.ttl_s


@dataclass(frozen=True, slots=True)
class StreamRead:
    """A stream's answer: the request as it is and the partial outputs after the ones already read."""

    request: EndpointRequestRecord
    partials: tuple[Partial, ...]


@dataclass(frozen=True, slots=True)
class EndpointHealthReport:
    jobs: dict[str, int]  # by state: the open ones from the book, the ended ones from the store
    workers: int  # heard from lately
    busy_workers: int  # holding a request


@dataclass(frozen=True, slots=True)
class EndpointOverview:
    """An endpoint at a glance (its console page): its requests now and lately, its workers, what it cost."""

    endpoint: EndpointRecord
    health: EndpointHealthReport
    scale: EndpointScale | None  # the autoscaler's last tick; None before its first
    oldest_wait_s: float | None  # how long the oldest queued request has waited; None: none waits
    latest: list[EndpointRequestRecord]  # the newest first
    spent_24h: int  # micro-units its workers cost in the last 24 hours
    completed_24h: int  # requests completed and still kept (ended ones are kept a day: RESULT_RETENTION_S)

    @property
    def cost_per_request(self) -> int | None:
        """Micro-units per completed request over the last day; None before any completed."""
        return self.spent_24h // self.completed_24h if self.completed_24h else None


async def _nothing_spent(_endpoint: EndpointRecord) -> int:
    return 0


LATEST_SHOWN = 20


class EndpointRequestsService:
    def __init__(
        self, book: RequestBook, endpoints: EndpointsService, repo: EndpointRequestRepo, webhooks: RequestWebhooks
    ) -> None:
        self._book = book
        self._endpoints = endpoints
        self._repo = repo
        self._webhooks = webhooks
        self._cursors: OrderedDict[str, tuple[int, int]] = OrderedDict()  # request -> (attempt, last seq read)
        endpoints.when_deleted(self._end_requests_of)
        # What an endpoint's workers cost in the last day (the autoscaler's shell's count; set by the composition).
        self.spend_of: Callable[[EndpointRecord], Awaitable[int]] = _nothing_spent

    def body_limit(self, endpoint_id: str) -> int:
        """The most bytes a /run body of this endpoint may carry (its input's bound and a little more)."""
        return self._endpoints.limits_of(endpoint_id).max_input_bytes + RUN_BODY_SLACK

    async def _endpoint(self, endpoint_id: str, account: str | None) -> EndpointRecord:
        return await self._endpoints.get(endpoint_id, account=account)

    async def _request(self, endpoint_id: str, request_id: str, account: str | None) -> EndpointRequestRecord:
        await self._endpoint(endpoint_id, account)
        rec = await self._book.status(request_id)
        if rec is None or rec.endpoint_id != endpoint_id:
            raise NotFound(f"endpoint {endpoint_id} has no request {request_id!r}")
        return rec

    async def run(
        self,
        endpoint_id: str,
        input: JSON,
        *,
        webhook: str | None = None,
        account: str | None = None,
        policy: RequestPolicy | None = None,
    ) -> EndpointRequestRecord:
        """Queue a request; RequestTooLarge past the endpoint's input bound, InvalidEndpointRequest for a webhook the
        egress rule refuses or a ``policy`` past the endpoint's own bounds."""
        endpoint = await self._endpoint(endpoint_id, account)
        if endpoint.spec.load_balanced:  # no worker would ever take it: its workers serve HTTP at its URL
            raise Conflict(f"endpoint {endpoint.id} is load-balanced: send its requests to {self._endpoints.url_of(endpoint)}")
        if webhook:
            why = self._webhooks.refusal(webhook)
            if why is not None:
                raise InvalidEndpointRequest(why)
        execution_timeout_s, ttl_s = _within(policy, endpoint.spec.execution_timeout_s, endpoint.spec.ttl_s)
        self._room_for_one(endpoint.id)
        return await self._book.submit(
            endpoint.id,
            input,
            account=endpoint.account,
            webhook=webhook or "",
            execution_timeout_s=execution_timeout_s,
            ttl_s=ttl_s,
        )

    def _room_for_one(self, endpoint_id: str) -> None:
        count, chars = self._book.open_load(endpoint_id)
        if count >= MAX_OPEN_REQUESTS or chars >= MAX_OPEN_INPUT_CHARS:
            raise QueueFull(
                f"endpoint {endpoint_id} holds {count} open requests ({chars} characters of input), the most it may "
                f"({MAX_OPEN_REQUESTS} requests, {MAX_OPEN_INPUT_CHARS} characters); send again once some have ended"
            )

    async def run_sync(
        self,
        endpoint_id: str,
        input: JSON,
        *,
        wait_s: float = RUNSYNC_WAIT_S,
        webhook: str | None = None,
        account: str | None = None,
        policy: RequestPolicy | None = None,
    ) -> EndpointRequestRecord:
        """Queue a request and wait up to ``wait_s`` (at most MAX_RUNSYNC_WAIT_S) for its end; the request as it is
        when it ended or the wait did."""
        rec = await self.run(endpoint_id, input, webhook=webhook, account=account, policy=policy)
        return await self._until_end(rec, min(max(wait_s, 0.0), MAX_RUNSYNC_WAIT_S))

    async def _until_end(self, rec: EndpointRequestRecord, wait_s: float) -> EndpointRequestRecord:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while rec.is_open and (remaining := deadline - loop.time()) > 0:
            rec = (await self._book.stream(rec.id, FAR_SEQ, wait_s=remaining)).request
        return rec

    async def status(self, endpoint_id: str, request_id: str, *, account: str | None = None) -> EndpointRequestRecord:
        return await self._request(endpoint_id, request_id, account)

    async def stream(
        self,
        endpoint_id: str,
        request_id: str,
        *,
        after: int | None = None,
        wait_s: float = STREAM_WAIT_S,
        account: str | None = None,
    ) -> StreamRead:
        """The partial outputs after seq ``after`` (None: after the last one read through this call), waiting up to
        ``wait_s`` (at most MAX_STREAM_WAIT_S) for one, or for the request's end, when there is none yet."""
        rec = await self._request(endpoint_id, request_id, account)
        began = rec.attempt
        if after is None:
            attempt, last = self._cursors.get(request_id, (rec.attempt, -1))
            after = last if attempt == rec.attempt else -1  # a new attempt streams from its start
        streamed = await self._book.stream(request_id, after, wait_s=min(max(wait_s, 0.0), MAX_STREAM_WAIT_S))
        rec, partials = streamed.request, streamed.partials
        if rec.attempt != began:  # a new attempt began while waiting: its partials from its start
            partials, after = rec.partials, -1
        self._remember(rec, partials, after)
        return StreamRead(rec, partials)

    def _remember(self, rec: EndpointRequestRecord, partials: tuple[Partial, ...], after: int) -> None:
        self._cursors[rec.id] = (rec.attempt, max([after, *(p.seq for p in partials)]))
        self._cursors.move_to_end(rec.id)
        while len(self._cursors) > STREAM_CURSORS:
            self._cursors.popitem(last=False)

    async def cancel(self, endpoint_id: str, request_id: str, *, account: str | None = None) -> EndpointRequestRecord:
        """End a queued or running request ``cancelled``; Conflict for one that has ended."""
        await self._request(endpoint_id, request_id, account)
        return await self._book.cancel(request_id)

    async def retry(self, endpoint_id: str, request_id: str, *, account: str | None = None) -> EndpointRequestRecord:
        """Queue a failed, timed-out or cancelled request again; Conflict for a completed or open one."""
        await self._request(endpoint_id, request_id, account)
        self._room_for_one(endpoint_id)
        self._cursors.pop(request_id, None)
        return await self._book.retry(request_id)

    async def health(self, endpoint_id: str, *, account: str | None = None) -> EndpointHealthReport:
        endpoint = await self._endpoint(endpoint_id, account)
        now = self._book.health(endpoint.id)
        jobs = {state.value: 0 for state in RequestState}
        for state, n in (await self._repo.count_by_state(endpoint.id)).items():
            if state in jobs and RequestState(state) not in OPEN_STATES:
                jobs[state] = n
        jobs.update(now.requests)  # the open ones as the book holds them now
        return EndpointHealthReport(jobs=jobs, workers=now.workers, busy_workers=now.busy_workers)

    async def overview(
        self, endpoint_id: str, *, account: str | None = None, latest: int = LATEST_SHOWN, now: float | None = None
    ) -> EndpointOverview:
        """The endpoint's health, its autoscaler's last tick, its oldest wait, its latest requests and its day's cost."""
        endpoint = await self._endpoint(endpoint_id, account)
        health = await self.health(endpoint.id)
        queued = self._book.queued(endpoint.id)
        now = time.time() if now is None else now
        oldest = min((r.submitted_at for r in queued), default=None)
        return EndpointOverview(
            endpoint=endpoint,
            health=health,
            scale=self._endpoints.scale_of(endpoint.id),
            oldest_wait_s=None if oldest is None else max(0.0, now - oldest),
            latest=await self._repo.latest(endpoint.id, limit=latest),
            spent_24h=await self.spend_of(endpoint),
            completed_24h=health.jobs.get(RequestState.COMPLETED.value, 0),
        )

    async def _end_requests_of(self, endpoint: EndpointRecord) -> None:
        """A deleted endpoint's open requests end ``cancelled``: its callers stop waiting, its workers drop them."""
        for rec in self._book.open_of(endpoint.id):
            try:
                await self._book.cancel(rec.id)
            except (Conflict, NotFound):  # ended meanwhile
                continue

"""Requests to serverless endpoints, in RunPod Serverless's shape (docs/endpoints.md, "The request routes"): run, run
and wait, status, stream, cancel, retry, health. These routes take one of the endpoint's invocation keys as well as its
owner's or the operator's API key (``Route.invocation``, management/api/auth.py): the caller's scope is the endpoint's
owner either way.

A /run body is read up to the endpoint's input bound and a little more (``body_limit``): a larger one is refused 413
from its Content-Length, or as soon as that many bytes have come, never read whole."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from aiohttp import web

from management.api.auth import scope_of
from management.http.errors import ApiError, BadRequest, validation_message
from management.http.keys import SERVICES_KEY
from management.http.requests import json_response, parse_query
from management.http.schemas import EmptyQuery
from management.services.endpoint_requests import MAX_RUNSYNC_WAIT_S, MAX_STREAM_WAIT_S, RUN_BODY_SLACK, RequestPolicy
from management.views.endpoint_requests import endpoint_health_view, request_status_view, request_stream_view

JSON = Any
READ_CHUNK = 64 << 10


class RunPolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """RunPod's per-request ``policy``: ``executionTimeout`` and ``ttl`` in ms, each at most the endpoint's own."""

    executionTimeout: Annotated[int, msgspec.Meta(ge=1, le=86_400_000)] | None = None  # noqa: N815 (RunPod's name)
    ttl: Annotated[int, msgspec.Meta(ge=1, le=7 * 86_400_000)] | None = None


class RunRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST .../run and .../runsync: the handler's input (any JSON, at most 1 MiB encoded), optionally a URL that
    gets the request's status answer POSTed once it ends (public addresses only, or hosts the operator allows), and
    a ``policy`` of the request's own, shorter bounds."""

    input: JSON
    webhook: Annotated[str, msgspec.Meta(max_length=2048)] | None = None
    policy: RunPolicy | None = None

    def request_policy(self) -> RequestPolicy | None:
        if self.policy is None:
            return None
        ms = self.policy.executionTimeout, self.policy.ttl
        return RequestPolicy(*(v / 1000 if v is not None else None for v in ms))


class RunSyncQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How long to wait for the output, in ms (90 s by default, as RunPod; at most 300 s)."""

    wait: Annotated[int, msgspec.Meta(ge=0, le=int(MAX_RUNSYNC_WAIT_S * 1000))] = 90_000


class StreamQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``after``: answer the partial outputs after this seq (left out: after the ones already read through this route);
    ``wait``: how long to wait for one, in ms, when there is none yet (at most 30 s)."""

    after: Annotated[int, msgspec.Meta(ge=-1, le=1 << 31)] | None = None
    wait: Annotated[int, msgspec.Meta(ge=0, le=int(MAX_STREAM_WAIT_S * 1000))] = 10_000


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (RunPolicy, RunRequest, RunSyncQuery, StreamQuery)


async def read_run_body(request: web.Request, limit: int) -> RunRequest:
    """The body as a RunRequest, refused 413 past ``limit`` bytes before it is read whole."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(request.content_length, limit)
    raw = bytearray()
    while chunk := await request.content.read(READ_CHUNK):
        raw += chunk
        if len(raw) > limit:
            raise _too_large(None, limit)
    try:
        return msgspec.json.decode(bytes(raw), type=RunRequest)
    except msgspec.ValidationError as exc:
        raise BadRequest(validation_message(exc, "body")) from None
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", code="bad_json") from None


def _too_large(size: int | None, limit: int) -> ApiError:
    said = f"{size} bytes" if size is not None else f"over {limit} bytes"
    return ApiError(
        413,
        "request_too_large",
        f"the request body is {said}; this endpoint takes a body of at most {limit} bytes (an input of at most "
        f"{limit - RUN_BODY_SLACK} bytes of JSON): pass large inputs by reference (a URL the handler fetches)",
    )


def _ids(request: web.Request) -> tuple[str, str]:
    return request.match_info["endpoint_id"], request.match_info["request_id"]


async def run(request: web.Request) -> web.Response:
    service = request.app[SERVICES_KEY].endpoint_requests
    endpoint_id = request.match_info["endpoint_id"]
    parse_query(request, EmptyQuery)
    body = await read_run_body(request, service.body_limit(endpoint_id))
    rec = await service.run(
        endpoint_id, body.input, webhook=body.webhook, account=scope_of(request).owner, policy=body.request_policy()
    )
    return json_response(request_status_view(rec))


async def run_sync(request: web.Request) -> web.Response:
    service = request.app[SERVICES_KEY].endpoint_requests
    endpoint_id = request.match_info["endpoint_id"]
    query = parse_query(request, RunSyncQuery)
    body = await read_run_body(request, service.body_limit(endpoint_id))
    rec = await service.run_sync(
        endpoint_id,
        body.input,
        wait_s=query.wait / 1000,
        webhook=body.webhook,
        account=scope_of(request).owner,
        policy=body.request_policy(),
    )
    return json_response(request_status_view(rec))


async def status(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    endpoint_id, request_id = _ids(request)
    rec = await request.app[SERVICES_KEY].endpoint_requests.status(endpoint_id, request_id, account=scope_of(request).owner)
    return json_response(request_status_view(rec))


async def stream(request: web.Request) -> web.Response:
    query = parse_query(request, StreamQuery)
    endpoint_id, request_id = _ids(request)
    read = await request.app[SERVICES_KEY].endpoint_requests.stream(
        endpoint_id, request_id, after=query.after, wait_s=query.wait / 1000, account=scope_of(request).owner
    )
    return json_response(request_stream_view(read))


async def cancel(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    endpoint_id, request_id = _ids(request)
    rec = await request.app[SERVICES_KEY].endpoint_requests.cancel(endpoint_id, request_id, account=scope_of(request).owner)
    return json_response(request_status_view(rec))


async def retry(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    endpoint_id, request_id = _ids(request)
    rec = await request.app[SERVICES_KEY].endpoint_requests.retry(endpoint_id, request_id, account=scope_of(request).owner)
    return json_response(request_status_view(rec))


async def health(request: web.Request) -> web.Response:
    parse_query(request, EmptyQuery)
    report = await request.app[SERVICES_KEY].endpoint_requests.health(
        request.match_info["endpoint_id"], account=scope_of(request).owner
    )
    return json_response(endpoint_health_view(report))

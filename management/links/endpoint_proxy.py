"""A load-balanced endpoint's one URL on the links listener (docs/endpoints.md, "Load-balanced mode"):
``/e/<endpoint id>/<path>`` goes to one of its ready workers' HTTP server, ``<path>`` on its ``http_port``.

1. **Who may call**: one of the endpoint's invocation keys as ``Authorization: Bearer`` (``authorize_invocation``):
   none, unknown or revoked is 401, another endpoint's key is 403. A queue-mode endpoint has no URL here (404, saying
   where its requests go).
2. **Which worker**: the pool's (management/endpoints/pool.py): the ready worker with the fewest outstanding requests;
   with none ready the request is held until one is, within the endpoint's ``max_held`` and ``max_hold_s``; past them
   503 with ``Retry-After`` and the reason.
3. **The request** passes through the Master's tunnel to that worker's port, as a link's does (hosts never listen):
   method, the path after the prefix, the query, headers (not the invocation key, no hop-by-hop header, none of the
   platform's cookies) and the body streamed; the answer streams back as it comes (an OpenAI-style stream works),
   without any ``Set-Cookie`` (this origin is shared with the links and, by host, the console).
4. **Its bound**: ``execution_timeout_s`` from the worker taking it to the answer's end: no answer by then is a 504
   ``execution_timeout``; an answer still streaming then is cut (a short body, never one that looks complete).
5. **Counting**: the request counts on its worker until its answer ends, it fails, times out, or its client goes away
   (the client's connection is watched while the request is held or proxied: gone, the request is ended and
   released).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from common.errors import IdlegridError
from management.endpoints.pool import HeldTooLong, Lease
from management.endpoints.spec import EndpointRecord
from management.http.keys import SERVICES_KEY
from management.links.names import ENDPOINT_PREFIX, LinkAddress
from management.links.proxy import HOP_BY_HOP, SANDBOX, forwarded_headers, stream_body
from management.services.endpoints import InvocationForbidden, InvocationRefused

if TYPE_CHECKING:
    from management.services.links import LinksService

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25  # how often a waiting request's client connection is looked at


def add_endpoint_routes(app: web.Application) -> None:
    """``/e/<endpoint id>/...`` on the links listener's application."""
    app.router.add_route("*", ENDPOINT_PREFIX + "{endpoint_id}", _trailing_slash)
    app.router.add_route("*", ENDPOINT_PREFIX + "{endpoint_id}/{rest:.*}", serve_endpoint)


async def _trailing_slash(request: web.Request) -> web.StreamResponse:
    location = f"{ENDPOINT_PREFIX}{request.match_info['endpoint_id']}/"
    raise web.HTTPPermanentRedirect(location + (f"?{request.query_string}" if request.query_string else ""))


async def serve_endpoint(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES_KEY]
    endpoint_id = request.match_info["endpoint_id"]
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    try:
        invocation = await services.endpoints.authorize_invocation(endpoint_id, key if scheme.lower() == "bearer" else "")
    except InvocationRefused as exc:
        return _error(401, exc.code, str(exc), {"WWW-Authenticate": 'Bearer realm="idlegrid endpoint"'})
    except InvocationForbidden as exc:
        return _error(403, exc.code, str(exc))
    endpoint = invocation.endpoint
    if not endpoint.spec.load_balanced:
        why = f"endpoint {endpoint.id} is in queue mode: send its requests to /api/v1/endpoints/{endpoint.id}/run or /runsync"
        return _error(404, "not_found", why)
    path = "/" + request.match_info["rest"]
    return await _until_disconnected(request, _forward(request, endpoint, path))


async def _until_disconnected(request: web.Request, work: Coroutine[Any, Any, web.StreamResponse]) -> web.StreamResponse:
    """Run ``work`` while the client is there: once its connection is gone, ``work`` is cancelled (a held request leaves
    the hold, a proxied one is cut and its worker's count given back)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if request.transport is None or request.transport.is_closing():
                log.info("an endpoint's client went away mid-request", extra={"path": request.path})
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return web.Response(status=499)  # never sent: the connection is gone
    finally:
        if not task.done():  # this handler itself was cancelled (the server stopping)
            task.cancel()


async def _forward(request: web.Request, endpoint: EndpointRecord, path: str) -> web.StreamResponse:
    services = request.app[SERVICES_KEY]
    pool = services.balancer
    try:
        lease = await pool.acquire(endpoint)
    except HeldTooLong as exc:
        return _error(503, exc.code, str(exc), {"Retry-After": str(exc.retry_after_s)})
    try:
        return await _to_worker(request, services.links, endpoint, lease, path)
    finally:
        pool.release(lease)


async def _to_worker(
    request: web.Request, links: LinksService, endpoint: EndpointRecord, lease: Lease, path: str
) -> web.StreamResponse:
    pool = request.app[SERVICES_KEY].balancer
    try:
        tunnel = await links.tunnels.get(LinkAddress(lease.workload_id, lease.port))
    except IdlegridError as exc:
        pool.failed(lease)
        return _error(502, "worker_unavailable", f"endpoint {endpoint.id}'s worker cannot be reached now: {exc}")
    tunnel.in_use += 1
    # The request's execution bound, from the worker taking it to its answer's end (as a queue-mode attempt's).
    limit_s = endpoint.spec.execution_timeout_s
    deadline = asyncio.get_running_loop().time() + limit_s
    try:
        target = path + (f"?{request.query_string}" if request.query_string else "")
        body = stream_body(request) if request.body_exists else None
        try:
            async with asyncio.timeout_at(deadline):
                upstream = await tunnel.session.request(
                    request.method,
                    f"http://endpoint{target}",
                    headers=forwarded_headers(request, prefix=f"{ENDPOINT_PREFIX}{endpoint.id}", strip_auth=True),
                    data=body,
                    allow_redirects=False,
                )
        except TimeoutError:
            why = f"endpoint {endpoint.id}'s worker did not answer within its execution_timeout_s ({limit_s:g} s)"
            return _error(504, "execution_timeout", why)
        except (aiohttp.ClientError, OSError) as exc:
            pool.failed(lease)
            why = f"endpoint {endpoint.id}'s worker did not answer on port {lease.port}: {exc}"
            return _error(502, "worker_unavailable", why)
        async with upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for name, value in upstream.headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() not in ("set-cookie", "set-cookie2"):
                    response.headers.add(name, value)
            response.headers["Content-Security-Policy"] = SANDBOX  # a shared origin: its pages get an opaque one
            await response.prepare(request)
            try:
                async with asyncio.timeout_at(deadline):
                    async for chunk in upstream.content.iter_any():
                        await response.write(chunk)
                        await asyncio.sleep(0)
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                why = f"past its execution_timeout_s ({limit_s:g} s)" if isinstance(exc, TimeoutError) else str(exc)
                log.info("endpoint %s: the answer ended early: %s", endpoint.id, why)
                if request.transport is not None:
                    request.transport.close()  # a short body, never one that looks complete
                return response
            await response.write_eof()
            return response
    finally:
        tunnel.in_use -= 1
        tunnel.last_used = time.monotonic()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    response = web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)
    response.headers["Cache-Control"] = "no-store"
    return response


async def readiness(links: LinksService, workload_id: str, port: int, path: str, timeout_s: float) -> bool:
    """The pool's probe (management/endpoints/pool.py ``Probe``): ``path`` of the worker's port through its tunnel;
    True for a 200, False for anything else (no tunnel, no answer in ``timeout_s``, another status)."""
    try:
        tunnel = await links.tunnels.get(LinkAddress(workload_id, port))
        tunnel.last_used = time.monotonic()
        async with tunnel.session.get(
            f"http://endpoint{path}", allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as answer:
            await answer.read()
            return answer.status == 200
    except (IdlegridError, aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.debug("readiness of %s: %s", workload_id, exc)
        return False

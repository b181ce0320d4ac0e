"""The lean path of an endpoint's request routes called with an invocation key (docs/endpoints.md, "The request path's
cost"): one middleware doing for them what the API's chain does, and then the route's handler itself.

An endpoint's clients call its request routes (run, runsync, status, stream, cancel, retry, health) hundreds of times a
second, and through the whole chain each call crossed eleven middlewares, each a coroutine frame that every suspension
of the handler (a runsync suspends three to five times) went through again: the console's session and page middlewares
and the audit do nothing for these calls. So a call on a route declared ``invocation`` that carries an invocation key
is served here, as the chain would serve it, in its order: its request counted in the API's metrics (``ApiMetrics``),
errors in the JSON shape (``error_answer``), the key checked against the endpoint the path names (``invocation_scope``:
401 unknown or revoked, 403 another endpoint's or a disabled owner's), the endpoint's rate limit (429), no audit event
(these routes are never audited, management/api/audit.py), and the Master's gate (``API_GATE_KEY``: 503 once it stops,
its changes under way let finish). What runs before (the head deadline's mark, the standby gate, the links' refusal)
runs before it, as for every call. Any other call (an API key on the same routes, any other route) goes down the chain.
"""

from __future__ import annotations

import time
from typing import Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware

from management.api.auth import INVOKED_ENDPOINT_KEY, SCOPE_KEY, invocation_key, invocation_scope
from management.api.metrics import ApiMetrics
from management.api.ratelimit import KeyRateLimits
from management.api.route import DECLARED_KEY
from management.http.errors import Handler, error_answer
from management.http.keys import SERVICES_KEY

LEAN_METHODS = frozenset({"GET", "POST"})  # the request routes' (a HEAD goes down the chain, as aiohttp serves it)


class Gate(Protocol):
    """The Master's API gate (management/app.py ``ApiGate``): a call it lets through, or its 503."""

    async def serve(self, request: web.Request, handler: Handler) -> web.StreamResponse: ...


# The gate the Master's server puts on its app (absent: a test's app, which has no gate in its chain either).
API_GATE_KEY: web.AppKey[Gate] = web.AppKey("api_gate")


def invocation_path(metrics: ApiMetrics, rate_limits: KeyRateLimits) -> Middleware:
    """The middleware, placed in the chain before ``metrics``' own (after the standby gate and the links' refusal)."""

    @web.middleware
    async def invocation(request: web.Request, handler: Handler) -> web.StreamResponse:
        method = request.method
        resource = request.match_info.route.resource
        if method not in LEAN_METHODS or resource is None:
            return await handler(request)
        route = request.app[DECLARED_KEY].get((method, resource.canonical))
        if route is None or not route.invocation:
            return await handler(request)
        key = invocation_key(request.headers.get("Authorization", ""))
        if key is None:  # the owner's or the operator's API key: its own limits, down the chain
            return await handler(request)
        started = time.perf_counter()
        status = 500
        try:
            try:
                response = await _serve(request, key, rate_limits)
            except Exception as exc:
                response = error_answer(request, exc)
            status = response.status
            return response
        except web.HTTPException as exc:  # an answer below 400 raised (none of these routes does), as the chain's
            status = exc.status
            raise
        finally:
            metrics.observe(method, resource.canonical, status, time.perf_counter() - started)

    return invocation


async def _serve(request: web.Request, key: str, rate_limits: KeyRateLimits) -> web.StreamResponse:
    endpoint_id = request.match_info["endpoint_id"]
    request[SCOPE_KEY] = await invocation_scope(request.app[SERVICES_KEY], request, key)
    request[INVOKED_ENDPOINT_KEY] = endpoint_id
    wait = rate_limits.endpoint_wait_s(endpoint_id)
    if wait > 0:
        return rate_limits.endpoint_refusal(endpoint_id, wait)
    gate = request.app.get(API_GATE_KEY)
    handler = request.match_info.handler
    return await (handler(request) if gate is None else gate.serve(request, handler))


__all__ = ["API_GATE_KEY", "Gate", "invocation_path"]

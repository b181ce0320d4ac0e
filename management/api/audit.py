"""The audit trail: every successful change made through the API is recorded as an event, decided here once.

An ``audit`` event's subject is the calling account; its data names the key (``key_id``, "" for a legacy
operator key), the role, the method, the route pattern, the target (the id in the path, or what the call
created when its handler names it) and the status. Reads (GET, HEAD, OPTIONS) and refused calls (any
status of 400 or more, raised errors included) are not recorded. Being a middleware, no handler can forget it.

An endpoint's request routes (those declared ``invocation``: run, runsync, cancel, retry, docs/endpoints.md) are not
audited per request, whoever calls them: each request is a record of its own already (its account, its times, its
state), RunPod's serverless keeps no audit entry per request either, and an event per request was a second store
write on the path of every request. What changes an endpoint (its spec, its keys) is audited as any change.
"""

from __future__ import annotations

import logging

from aiohttp import web

from management.api.auth import SCOPE_KEY
from management.api.route import DECLARED_KEY
from management.http.errors import Handler
from management.http.keys import SERVICES_KEY
from management.services.accounts import AuditEntry

log = logging.getLogger(__name__)

READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
AUDIT_TARGET_KEY = web.RequestKey("audit_target", str)  # a handler that creates something names it here


def created(request: web.Request, target: str) -> None:
    """Name what the call created (an account, a key, a join token's provider) for its audit event."""
    request[AUDIT_TARGET_KEY] = target


@web.middleware
async def audit_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    scope = request.get(SCOPE_KEY)
    if scope is None or request.method in READ_ONLY_METHODS or response.status >= 400:
        return response
    route = request.match_info.route.resource
    declared = request.app[DECLARED_KEY].get((request.method, route.canonical)) if route is not None else None
    if declared is not None and declared.invocation:  # a request of an endpoint: its own record is its trail
        return response
    target = request.get(AUDIT_TARGET_KEY) or ",".join(request.match_info.values())
    principal = scope.principal
    entry = AuditEntry(
        account=principal.account,
        key_id=principal.key_id,
        role=principal.role.value,
        method=request.method,
        route=route.canonical if route is not None else request.path,
        target=target,
        status=response.status,
    )
    try:
        await request.app[SERVICES_KEY].accounts.record_audit(entry)
    except Exception:  # the change is made and answered for: a lost audit event is logged, not turned into a 500
        log.exception("audit event not recorded", extra={"account": entry.account, "route": entry.route})
    return response

"""The API's authentication and authorization: who is calling, and may it call this route.

Every API call carries a key (``Authorization: Bearer <key>``); the key belongs to an account, and
the account's role (read at every check, never stored on the key) is the caller's role. A revoked
key is refused (401), so is every key of a disabled account (403). Keys naming no account are the
legacy operator keys and belong to the bootstrap ``operator`` account. Each route's declaration
(management/api/routing.py) names the resource and the action it performs; who may do what, and the
scope of a call, are decided in management/access_control.py, which the console reads too.

An endpoint's invocation key (``igek_...``, docs/endpoints.md) is no API key: ``authenticate`` never finds it, so every
route answers it 401, except the routes declared ``invocation`` (an endpoint's request routes). There it is checked
against the endpoint the path names (401 unknown or revoked, 403 another endpoint's), and the call's scope is the
endpoint's owner, as if the owner had called: the key's own name and id stand for it in the audit, and the endpoint's
own rate limit, not an API key's, counts its calls (``INVOKED_ENDPOINT_KEY``).
"""

from __future__ import annotations

from aiohttp import web

from common.errors import NotFound
from management.access_control import AccountRole, Principal, Scope, scope_for
from management.api.route import DECLARED_KEY
from management.endpoints.spec import INVOCATION_KEY_PREFIX
from management.http.errors import Forbidden, Handler, Unauthorized
from management.http.keys import SERVICES_KEY
from management.services import Services
from master.port import BOOTSTRAP_ACCOUNT

SCOPE_KEY = web.RequestKey("scope", Scope)
# The endpoint an invocation key called (its request routes): its calls count against that endpoint's own rate limit,
# not an API key's (management/api/ratelimit.py).
INVOKED_ENDPOINT_KEY = web.RequestKey("invoked_endpoint", str)


def scope_of(request: web.Request) -> Scope:
    return request[SCOPE_KEY]


async def authenticate(services: Services, header: str) -> Principal:
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    try:
        credential = await services.accounts.credential(key.strip())
    except NotFound:
        raise Unauthorized("API key not recognised") from None
    record, account = credential.key, credential.account
    if record.revoked_at is not None:
        raise Unauthorized(f"API key {record.key_id} ({record.name!r}) was revoked; use another key, or ask for a new one")
    if not record.subject:  # a legacy key: its own role counts, and only the operator's is valid
        if record.role != AccountRole.OPERATOR.value:
            raise Forbidden(
                f"API key {record.name!r} is a {record.role or 'roleless'} key naming no account; issue it again with one"
            )
        return Principal(record.name, AccountRole.OPERATOR, BOOTSTRAP_ACCOUNT, record.key_id, record.key_hash)
    if account is None:
        raise Forbidden(f"API key {record.key_id} belongs to account {record.subject!r}, which does not exist")
    if account.disabled:
        raise Forbidden(f"account {account.id!r} is disabled; its keys are refused until an operator enables it")
    try:
        role = AccountRole(account.role)
    except ValueError:
        raise Forbidden(f"account {account.id!r} has role {account.role!r}, which this API does not know") from None
    return Principal(record.name, role, account.id, record.key_id, record.key_hash)


def invocation_key(header: str) -> str | None:
    """The invocation key a bearer header carries; None for any other (an API key, nothing)."""
    scheme, _, key = header.partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key.startswith(INVOCATION_KEY_PREFIX) else None


async def invocation_scope(services: Services, request: web.Request, key: str) -> Scope:
    """The scope of a call with an invocation key on a route that takes one: the endpoint's owner."""
    invocation = await services.endpoints.authorize_invocation(request.match_info["endpoint_id"], key)
    owner = invocation.endpoint.account
    try:
        disabled = (await services.accounts.checked_account(owner)).disabled  # as an API key's account is checked
    except NotFound:
        disabled = True
    if disabled:
        raise Forbidden(
            f"account {owner!r}, which owns this endpoint, is disabled or gone; its keys are refused until it is enabled"
        )
    principal = Principal(
        f"invocation key {invocation.key.name}",
        AccountRole.RENTER,
        invocation.endpoint.account,
        invocation.key.id,
        invocation.key.key_hash,
    )
    return Scope(principal, invocation.endpoint.account)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/api/"):
        return await handler(request)
    resource = request.match_info.route.resource
    method = "GET" if request.method == "HEAD" else request.method  # aiohttp serves HEAD on every GET route
    route = request.app[DECLARED_KEY].get((method, resource.canonical)) if resource is not None else None
    if route is not None and route.public:
        return await handler(request)
    header = request.headers.get("Authorization", "")
    if route is not None and route.invocation and (key := invocation_key(header)) is not None:
        request[SCOPE_KEY] = await invocation_scope(request.app[SERVICES_KEY], request, key)
        request[INVOKED_ENDPOINT_KEY] = request.match_info["endpoint_id"]
        return await handler(request)
    principal = await authenticate(request.app[SERVICES_KEY], header)
    if resource is None:  # no such route: the router answers 404 (or 405) to whoever asks
        return await handler(request)
    if route is None or route.resource is None or route.action is None:
        # Served but not declared (a test's or an extension's route): the operator's alone. A declared API route
        # never lands here (tests/management/test_api_routing.py holds the app and the declarations together).
        if principal.role is not AccountRole.OPERATOR:
            raise Forbidden(f"a {principal.role.value} key may not use {request.method} {resource.canonical}")
        request[SCOPE_KEY] = Scope(principal, None)
    else:
        request[SCOPE_KEY] = scope_for(principal, route.resource, route.action)
    return await handler(request)


__all__ = ["INVOKED_ENDPOINT_KEY", "SERVICES_KEY", "SCOPE_KEY", "auth_middleware", "authenticate", "scope_of"]

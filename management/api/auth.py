"""Who may do what, decided here and nowhere else.

Every API call carries a key (``Authorization: Bearer <key>``); the key's record names a role and a
subject (the provider or renter account it belongs to). Routes name the resource and the action they
perform in ``ROUTES``; ``PERMISSIONS`` says which role may perform which action on which resource;
``Scope.owner`` is the ownership filter the façade applies to what it reads, so that a provider's
call only ever sees its own hosts and their GPUs, and another account's resource answers 404 just
as a missing one does (existence is not leaked).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aiohttp import web

from common.errors import NotFound
from management.api.errors import BadRequest, Forbidden, Handler, Unauthorized
from management.operations import Operations


class Role(str, enum.Enum):
    OPERATOR = "operator"
    PROVIDER = "provider"
    RENTER = "renter"


class Resource(str, enum.Enum):
    AGENTS = "agents"
    GPUS = "gpus"
    COMMANDS = "commands"
    TOKENS = "tokens"
    EVENTS = "events"
    SIGNING_KEYS = "signing_keys"
    TIERS = "tiers"
    WORKLOADS = "workloads"


class Action(str, enum.Enum):
    READ = "read"
    MAINTAIN = "maintain"  # drain and undrain a host
    WRITE = "write"  # create, revoke, rotate, retire


# The operator may do everything. A provider reads its own hosts and their GPUs and takes its own hosts in and out
# of maintenance; it issues no raw commands, tokens or keys. A renter has no operator/provider resource yet (its
# workloads come with the scheduler). Tiers describe what is sold: any account may read them.
PERMISSIONS: dict[Role, dict[Resource, frozenset[Action]]] = {
    Role.OPERATOR: {resource: frozenset(Action) for resource in Resource},
    Role.PROVIDER: {
        Resource.AGENTS: frozenset({Action.READ, Action.MAINTAIN}),
        Resource.GPUS: frozenset({Action.READ}),
        Resource.TIERS: frozenset({Action.READ}),
    },
    Role.RENTER: {Resource.TIERS: frozenset({Action.READ})},
}
# Workloads: a renter submits, reads and cancels its own (Scope.owner is its account); providers see none of them
# through these routes (what runs on their hosts shows in the agents' and GPUs' views, never a renter's env).
PERMISSIONS[Role.RENTER][Resource.WORKLOADS] = frozenset({Action.READ, Action.WRITE})

# (method, route pattern) -> what the route does. A route missing here is refused to everyone but the operator.
ROUTES: dict[tuple[str, str], tuple[Resource, Action]] = {
    ("GET", "/api/v1/agents"): (Resource.AGENTS, Action.READ),
    ("GET", "/api/v1/agents/{agent_id}"): (Resource.AGENTS, Action.READ),
    ("POST", "/api/v1/agents/{agent_id}/drain"): (Resource.AGENTS, Action.MAINTAIN),
    ("POST", "/api/v1/agents/{agent_id}/undrain"): (Resource.AGENTS, Action.MAINTAIN),
    ("POST", "/api/v1/agents/{agent_id}/revoke"): (Resource.AGENTS, Action.WRITE),
    ("GET", "/api/v1/gpus"): (Resource.GPUS, Action.READ),
    ("POST", "/api/v1/gpus/{uuid}/repair"): (Resource.GPUS, Action.WRITE),  # clear a fault: the operator's call
    ("GET", "/api/v1/tiers"): (Resource.TIERS, Action.READ),
    ("GET", "/api/v1/commands"): (Resource.COMMANDS, Action.READ),
    ("GET", "/api/v1/commands/{command_id}"): (Resource.COMMANDS, Action.READ),
    ("POST", "/api/v1/commands"): (Resource.COMMANDS, Action.WRITE),
    ("POST", "/api/v1/tokens"): (Resource.TOKENS, Action.WRITE),
    ("GET", "/api/v1/events"): (Resource.EVENTS, Action.READ),
    ("GET", "/api/v1/signing-keys"): (Resource.SIGNING_KEYS, Action.READ),
    ("POST", "/api/v1/signing-keys/rotate"): (Resource.SIGNING_KEYS, Action.WRITE),
    ("POST", "/api/v1/signing-keys/{key_id}/retire"): (Resource.SIGNING_KEYS, Action.WRITE),
    ("POST", "/api/v1/workloads"): (Resource.WORKLOADS, Action.WRITE),
    ("GET", "/api/v1/workloads"): (Resource.WORKLOADS, Action.READ),
    ("GET", "/api/v1/workloads/{workload_id}"): (Resource.WORKLOADS, Action.READ),
    ("POST", "/api/v1/workloads/{workload_id}/cancel"): (Resource.WORKLOADS, Action.WRITE),
}


@dataclass(frozen=True)
class Principal:
    name: str
    role: Role
    subject: str  # the provider or renter account; "" for the operator


@dataclass(frozen=True)
class Scope:
    """What one call may see: ``owner`` is the provider or renter account it is limited to, None for everything."""

    principal: Principal
    owner: str | None


SCOPE_KEY = web.RequestKey("scope", Scope)
OPERATIONS_KEY = web.AppKey("operations", Operations)


def permitted(role: Role, resource: Resource, action: Action) -> bool:
    return action in PERMISSIONS[role].get(resource, frozenset())


def scope_for(principal: Principal, resource: Resource, action: Action) -> Scope:
    """The scope of a call, or Forbidden naming what the role may not do."""
    if not permitted(principal.role, resource, action):
        raise Forbidden(f"a {principal.role.value} key may not {action.value} {resource.value.replace('_', ' ')}")
    owner = principal.subject if principal.role in (Role.PROVIDER, Role.RENTER) else None
    return Scope(principal, owner)


def acting_account(scope: Scope, named: str | None) -> str:
    """The account a new resource (a workload) belongs to: a renter's own (naming another is Forbidden); the
    operator must name one (BadRequest otherwise)."""
    if scope.owner is not None:
        if named is not None and named != scope.owner:
            raise Forbidden(f"a {scope.principal.role.value} key acts only for its own account ({scope.owner!r}), not {named!r}")
        return scope.owner
    if named is None:
        raise BadRequest("account: an operator must name the account the workload belongs to")
    return named


def scope_of(request: web.Request) -> Scope:
    return request[SCOPE_KEY]


async def authenticate(operations: Operations, header: str) -> Principal:
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    try:
        record = await operations.check_api_key(key.strip())
    except NotFound:
        raise Unauthorized("API key not recognised") from None
    try:
        role = Role(record.role)
    except ValueError:
        raise Forbidden(f"API key {record.name!r} has role {record.role!r}, which this API does not know") from None
    if role is not Role.OPERATOR and not record.subject:
        raise Forbidden(f"API key {record.name!r} is a {role.value} key naming no account; issue it again with one")
    return Principal(name=record.name, role=role, subject=record.subject)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/api/"):
        return await handler(request)
    principal = await authenticate(request.app[OPERATIONS_KEY], request.headers.get("Authorization", ""))
    route = request.match_info.route.resource
    if route is None:  # no such route: the router answers 404 (or 405) to whoever asks
        return await handler(request)
    method = "GET" if request.method == "HEAD" else request.method  # aiohttp serves HEAD on every GET route
    what = ROUTES.get((method, route.canonical))
    if what is None:
        if principal.role is not Role.OPERATOR:
            raise Forbidden(f"a {principal.role.value} key may not use {request.method} {route.canonical}")
        request[SCOPE_KEY] = Scope(principal, None)
    else:
        request[SCOPE_KEY] = scope_for(principal, *what)
    return await handler(request)

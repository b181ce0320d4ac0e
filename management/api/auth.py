"""Who may do what, decided here and nowhere else.

Every API call carries a key (``Authorization: Bearer <key>``); the key belongs to an account, and
the account's role (read at every check, never stored on the key) is the caller's role. A revoked
key is refused (401), so is every key of a disabled account (403). Keys naming no account are the
legacy operator keys and belong to the bootstrap ``operator`` account. Routes name the resource and
the action they perform in ``ROUTES``; ``PERMISSIONS`` says which role may perform which action on
which resource; ``Scope.owner`` is the ownership filter the façade applies: a provider's or renter's
call only ever sees its own account's hosts, GPUs, account and keys, and another account's resource
answers 404 just as a missing one does (existence is not leaked).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from aiohttp import web

from common.errors import NotFound
from management.api.errors import BadRequest, Forbidden, Handler, Unauthorized
from management.operations import Operations
from master.accounts import BOOTSTRAP_ACCOUNT


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
    ACCOUNTS = "accounts"  # accounts, and whoami
    KEYS = "keys"  # API keys
    OFFERS = "offers"  # the market's offers: public to every account
    LEDGER = "ledger"  # balances, ledger statements, spend, earnings, payouts; credits (write)
    RENTALS = "rentals"  # rentals (a renter's own; a provider's hosts'), and rating one (write)
    PRICES = "prices"  # providers' price records and defaults (the market)
    HOST_PRICES = "host_prices"  # the price in force on one host: public, as it is in offers
    FLEET = "fleet"  # the console's fleet at a glance: every host's figures, the operator's alone
    PASSWORD = "password"  # an account's console password (set it)
    REPORTS = "reports"  # reports along dimensions (management/monitoring/reports.py): each account its own rows
    ALERT_RULES = "alert_rules"  # alert rules: every account reads them, the operator changes them
    ALERTS = "alerts"  # alerts firing and recent transitions: each account its own (management/monitoring/visibility.py)
    SILENCES = "silences"  # muting alerts' notifications: the operator's
    WEBHOOKS = "webhooks"  # where alert notifications go: each account its own
    HOST_ENROLLMENT = "host_enrollment"  # a join token for one's own new host (the console's "Add a host")


class Action(str, enum.Enum):
    READ = "read"
    MAINTAIN = "maintain"  # drain and undrain a host
    WRITE = "write"  # create, revoke, rotate, retire


# The operator may do everything. A provider reads its own hosts and their GPUs and takes its own hosts in and out
# of maintenance; it issues no raw commands or join tokens. Every account reads its own account (whoami) and
# manages its own API keys (create, list, revoke), as on GitHub or Vast: only an operator creates or changes
# accounts. Tiers describe what is sold: any account may read them.
_OWN_ACCOUNT_AND_KEYS: dict[Resource, frozenset[Action]] = {
    Resource.ACCOUNTS: frozenset({Action.READ}),
    Resource.KEYS: frozenset({Action.READ, Action.WRITE}),
}
PERMISSIONS: dict[Role, dict[Resource, frozenset[Action]]] = {
    Role.OPERATOR: {resource: frozenset(Action) for resource in Resource},
    Role.PROVIDER: {
        Resource.AGENTS: frozenset({Action.READ, Action.MAINTAIN}),
        Resource.GPUS: frozenset({Action.READ}),
        Resource.TIERS: frozenset({Action.READ}),
        **_OWN_ACCOUNT_AND_KEYS,
    },
    Role.RENTER: {Resource.TIERS: frozenset({Action.READ}), **_OWN_ACCOUNT_AND_KEYS},
}
# Workloads: a renter submits, reads and cancels its own (Scope.owner is its account); providers see none of them
# through these routes (what runs on their hosts shows in the agents' and GPUs' views, never a renter's env).
PERMISSIONS[Role.RENTER][Resource.WORKLOADS] = frozenset({Action.READ, Action.WRITE})

# The market: every account searches offers; a renter rents, bids, reads its balance and ledger and rates its rentals;
# a provider reads its earnings, payouts and the rentals on its hosts. Only the operator credits an account.
for _role in (Role.PROVIDER, Role.RENTER):
    PERMISSIONS[_role][Resource.OFFERS] = frozenset({Action.READ})
    PERMISSIONS[_role][Resource.LEDGER] = frozenset({Action.READ})
PERMISSIONS[Role.PROVIDER][Resource.RENTALS] = frozenset({Action.READ})
PERMISSIONS[Role.RENTER][Resource.RENTALS] = frozenset({Action.READ, Action.WRITE})
# The market's prices: a provider reads and sets its own (its hosts' and its default), as the operator does anyone's.
# The price in force on a host is public (offers show it): every role reads it, of any host, whoever owns it.
PERMISSIONS[Role.PROVIDER][Resource.PRICES] = frozenset({Action.READ, Action.WRITE})
PERMISSIONS[Role.PROVIDER][Resource.HOST_PRICES] = frozenset({Action.READ})
PERMISSIONS[Role.RENTER][Resource.HOST_PRICES] = frozenset({Action.READ})
# Adding a host: a provider makes a join token bound to its own account (Scope.owner), never another's; the raw
# tokens resource (a token for any provider) stays the operator's.
PERMISSIONS[Role.PROVIDER][Resource.HOST_ENROLLMENT] = frozenset({Action.WRITE})
# Passwords (the console's sign-in): every account sets its own (Scope.owner), the operator anyone's.
for _role in (Role.PROVIDER, Role.RENTER):
    PERMISSIONS[_role][Resource.PASSWORD] = frozenset({Action.WRITE})
# Reports: a provider reads its own hosts' rows, a renter its own rentals' (report_owners); the operator every row.
for _role in (Role.PROVIDER, Role.RENTER):
    PERMISSIONS[_role][Resource.REPORTS] = frozenset({Action.READ})

# Alerts: every account reads the rules and its own alerts, and manages its own webhooks.
for _role in (Role.PROVIDER, Role.RENTER):
    PERMISSIONS[_role][Resource.ALERT_RULES] = frozenset({Action.READ})
    PERMISSIONS[_role][Resource.ALERTS] = frozenset({Action.READ})
    PERMISSIONS[_role][Resource.WEBHOOKS] = frozenset({Action.READ, Action.WRITE})

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
    ("GET", "/api/v1/workloads/{workload_id}/explain"): (Resource.WORKLOADS, Action.READ),
    ("POST", "/api/v1/workloads/{workload_id}/cancel"): (Resource.WORKLOADS, Action.WRITE),
    # accounts and API keys
    ("GET", "/api/v1/whoami"): (Resource.ACCOUNTS, Action.READ),
    ("POST", "/api/v1/accounts"): (Resource.ACCOUNTS, Action.WRITE),
    ("GET", "/api/v1/accounts"): (Resource.ACCOUNTS, Action.READ),
    ("GET", "/api/v1/accounts/{account_id}"): (Resource.ACCOUNTS, Action.READ),
    ("PATCH", "/api/v1/accounts/{account_id}"): (Resource.ACCOUNTS, Action.WRITE),
    ("POST", "/api/v1/accounts/{account_id}/keys"): (Resource.KEYS, Action.WRITE),
    ("GET", "/api/v1/accounts/{account_id}/keys"): (Resource.KEYS, Action.READ),
    ("POST", "/api/v1/keys/{key_id}/revoke"): (Resource.KEYS, Action.WRITE),
    # the market
    ("GET", "/api/v1/offers"): (Resource.OFFERS, Action.READ),
    ("GET", "/api/v1/offers/{offer_id}"): (Resource.OFFERS, Action.READ),
    ("POST", "/api/v1/offers/{offer_id}/rent"): (Resource.WORKLOADS, Action.WRITE),
    ("POST", "/api/v1/workloads/{workload_id}/bid"): (Resource.WORKLOADS, Action.WRITE),
    ("GET", "/api/v1/accounts/{account_id}/balance"): (Resource.LEDGER, Action.READ),
    ("POST", "/api/v1/accounts/{account_id}/credit"): (Resource.LEDGER, Action.WRITE),
    ("GET", "/api/v1/accounts/{account_id}/ledger"): (Resource.LEDGER, Action.READ),
    ("GET", "/api/v1/accounts/{account_id}/spend"): (Resource.LEDGER, Action.READ),
    ("GET", "/api/v1/accounts/{account_id}/earnings"): (Resource.LEDGER, Action.READ),
    ("GET", "/api/v1/accounts/{account_id}/payouts"): (Resource.LEDGER, Action.READ),
    ("GET", "/api/v1/rentals"): (Resource.RENTALS, Action.READ),
    ("GET", "/api/v1/rentals/{rental_id}"): (Resource.RENTALS, Action.READ),
    ("POST", "/api/v1/rentals/{rental_id}/rating"): (Resource.RENTALS, Action.WRITE),
}
ROUTES |= {  # renter access: tunnels to a workload's containers (its owner's, or any for the operator)
    ("POST", "/api/v1/workloads/{workload_id}/tunnels"): (Resource.WORKLOADS, Action.WRITE),
    ("GET", "/api/v1/workloads/{workload_id}/logs"): (Resource.WORKLOADS, Action.READ),
}
ROUTES |= {  # the market: prices
    ("GET", "/api/v1/prices"): (Resource.PRICES, Action.READ),
    ("PUT", "/api/v1/prices/default"): (Resource.PRICES, Action.WRITE),
    ("PUT", "/api/v1/agents/{agent_id}/price"): (Resource.PRICES, Action.WRITE),
    ("DELETE", "/api/v1/agents/{agent_id}/price"): (Resource.PRICES, Action.WRITE),
    ("GET", "/api/v1/agents/{agent_id}/price"): (Resource.HOST_PRICES, Action.READ),
}
ROUTES |= {  # telemetry history: a provider its own hosts' GPUs (the owner filter), a renter its own workloads'
    ("GET", "/api/v1/gpus/{uuid}/telemetry"): (Resource.GPUS, Action.READ),
    # measured verification (management/api/verification.py): the operator starts a run, the host's provider reads
    ("POST", "/api/v1/agents/{agent_id}/verify"): (Resource.AGENTS, Action.WRITE),
    ("GET", "/api/v1/agents/{agent_id}/verifications"): (Resource.AGENTS, Action.READ),
    ("GET", "/api/v1/agents/{agent_id}/telemetry"): (Resource.AGENTS, Action.READ),
    ("GET", "/api/v1/workloads/{workload_id}/telemetry"): (Resource.WORKLOADS, Action.READ),
}
ROUTES |= {  # the console's passwords
    ("PUT", "/api/v1/accounts/{account_id}/password"): (Resource.PASSWORD, Action.WRITE),
}
ROUTES |= {  # alerts (management/api/alerts.py)
    ("GET", "/api/v1/alert-rules"): (Resource.ALERT_RULES, Action.READ),
    ("PUT", "/api/v1/alert-rules/{name}"): (Resource.ALERT_RULES, Action.WRITE),
    ("DELETE", "/api/v1/alert-rules/{name}"): (Resource.ALERT_RULES, Action.WRITE),
    ("GET", "/api/v1/alerts"): (Resource.ALERTS, Action.READ),
    ("POST", "/api/v1/silences"): (Resource.SILENCES, Action.WRITE),
    ("GET", "/api/v1/silences"): (Resource.SILENCES, Action.READ),
    ("POST", "/api/v1/silences/{silence_id}/expire"): (Resource.SILENCES, Action.WRITE),
    ("POST", "/api/v1/webhooks"): (Resource.WEBHOOKS, Action.WRITE),
    ("GET", "/api/v1/webhooks"): (Resource.WEBHOOKS, Action.READ),
    ("DELETE", "/api/v1/webhooks/{webhook_id}"): (Resource.WEBHOOKS, Action.WRITE),
}

ROUTES |= {  # monitoring: reports
    ("GET", "/api/v1/reports/{kind}"): (Resource.REPORTS, Action.READ),
}

# Routes served without a key: the API's own description (management/api/openapi.py, reference.py), public as the
# document of any public API is. They are in no role's permissions and need none.
PUBLIC_ROUTES: frozenset[tuple[str, str]] = frozenset({("GET", "/api/v1/openapi.json"), ("GET", "/api/v1/docs")})


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key and the account it belongs to."""

    name: str  # the key's name
    role: Role  # the account's
    account: str  # the account's id; the bootstrap "operator" account for a legacy key
    key_id: str  # the key's public id; "" for a legacy key
    key_hash: str  # what the key is told apart by (its rate limit)


@dataclass(frozen=True)
class Scope:
    """What one call may see: ``owner`` is the account it is limited to, None (the operator) for everything."""

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
    owner = None if principal.role is Role.OPERATOR else principal.account
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


def acting_provider(scope: Scope, named: str | None) -> str:
    """The provider whose prices a call sets: a provider's own (naming another is Forbidden); the operator must name
    one (BadRequest otherwise)."""
    if scope.owner is not None:
        if named is not None and named != scope.owner:
            raise Forbidden(f"a {scope.principal.role.value} key sets only its own prices ({scope.owner!r}), not {named!r}'s")
        return scope.owner
    if named is None:
        raise BadRequest("provider: an operator must name the provider whose default price this is")
    return named


def report_owners(scope: Scope) -> tuple[str | None, str | None]:
    """(provider, renter) a report is cut to: a provider's hosts, a renter's rentals, neither for the operator."""
    if scope.owner is None:
        return None, None
    if scope.principal.role is Role.PROVIDER:
        return scope.owner, None
    return None, scope.owner


def scope_of(request: web.Request) -> Scope:
    return request[SCOPE_KEY]


async def authenticate(operations: Operations, header: str) -> Principal:
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send an API key as 'Authorization: Bearer <key>'")
    try:
        credential = await operations.credential(key.strip())
    except NotFound:
        raise Unauthorized("API key not recognised") from None
    record, account = credential.key, credential.account
    if record.revoked_at is not None:
        raise Unauthorized(f"API key {record.key_id} ({record.name!r}) was revoked; use another key, or ask for a new one")
    if not record.subject:  # a legacy key: its own role counts, and only the operator's is valid
        if record.role != Role.OPERATOR.value:
            raise Forbidden(
                f"API key {record.name!r} is a {record.role or 'roleless'} key naming no account; issue it again with one"
            )
        return Principal(record.name, Role.OPERATOR, BOOTSTRAP_ACCOUNT, record.key_id, record.key_hash)
    if account is None:
        raise Forbidden(f"API key {record.key_id} belongs to account {record.subject!r}, which does not exist")
    if account.disabled:
        raise Forbidden(f"account {account.id!r} is disabled; its keys are refused until an operator enables it")
    try:
        role = Role(account.role)
    except ValueError:
        raise Forbidden(f"account {account.id!r} has role {account.role!r}, which this API does not know") from None
    return Principal(record.name, role, account.id, record.key_id, record.key_hash)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not request.path.startswith("/api/"):
        return await handler(request)
    public = request.match_info.route.resource
    if public is not None and ("GET" if request.method == "HEAD" else request.method, public.canonical) in PUBLIC_ROUTES:
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

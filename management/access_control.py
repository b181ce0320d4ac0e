"""Who may do what: the accounts' roles, the resources and actions of the management API and the console, the
permissions of each role, and the scope of a call. One place, read by the API's authorization (management/api/auth.py,
from each route's declaration in management/api/routing.py) and by the console's pages (management/console/session.py).

An account has one role (``AccountRole``, master/accounts.py: operator, provider or renter). ``PERMISSIONS`` says which
role may perform which action on which resource; ``Scope.owner`` is the ownership filter the services apply: a
provider's or renter's call only ever sees its own account's hosts, GPUs, account and keys, and another account's
resource answers 404 just as a missing one does (existence is not leaked).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from management.http.errors import BadRequest, Forbidden
from master.port import AccountRole

__all__ = [
    "AccountRole",
    "Action",
    "PERMISSIONS",
    "Principal",
    "Resource",
    "Scope",
    "acting_account",
    "acting_provider",
    "permitted",
    "report_owners",
    "scope_for",
]


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
    TEMPLATES = "templates"  # launch templates (docs/templates.md): every account reads them
    SSH_KEYS = "ssh_keys"  # SSH public keys: each account its own (docs/ssh.md)
    SECRETS = "secrets"  # an account's secrets for its workloads: each account its own, values never shown again
    ENDPOINTS = "endpoints"  # serverless endpoints and their invocation keys: a renter's own (docs/endpoints.md)
    TOPUPS = "topups"  # money in through the payment provider: a renter tops up its own balance, sets its saved
    # payment method, auto top-up and spend caps (docs/payments.md)
    DISPUTES = "disputes"  # disputes of rentals: a renter opens and reads its own, a provider reads those about its
    # hosts (docs/disputes.md)
    DISPUTE_ANSWERS = "dispute_answers"  # a provider's answer to a dispute about its host
    DISPUTE_RESOLUTIONS = "dispute_resolutions"  # the operator's resolution of a dispute: full, partial or no refund
    PAYOUTS = "payouts"  # money out: a provider connects its own payout account and reads its payouts (docs/payments.md)
    PAYOUT_RUNS = "payout_runs"  # running the payout run and the reconciliation now: the operator's


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
PERMISSIONS: dict[AccountRole, dict[Resource, frozenset[Action]]] = {
    AccountRole.OPERATOR: {resource: frozenset(Action) for resource in Resource},
    AccountRole.PROVIDER: {
        Resource.AGENTS: frozenset({Action.READ, Action.MAINTAIN}),
        Resource.GPUS: frozenset({Action.READ}),
        Resource.TIERS: frozenset({Action.READ}),
        **_OWN_ACCOUNT_AND_KEYS,
    },
    AccountRole.RENTER: {Resource.TIERS: frozenset({Action.READ}), **_OWN_ACCOUNT_AND_KEYS},
}
# Workloads: a renter submits, reads and cancels its own (Scope.owner is its account); providers see none of them
# through these routes (what runs on their hosts shows in the agents' and GPUs' views, never a renter's env).
PERMISSIONS[AccountRole.RENTER][Resource.WORKLOADS] = frozenset({Action.READ, Action.WRITE})

# The market: every account searches offers; a renter rents, bids, reads its balance and ledger and rates its rentals;
# a provider reads its earnings, payouts and the rentals on its hosts. Only the operator credits an account.
for _role in (AccountRole.PROVIDER, AccountRole.RENTER):
    PERMISSIONS[_role][Resource.OFFERS] = frozenset({Action.READ})
    PERMISSIONS[_role][Resource.LEDGER] = frozenset({Action.READ})
PERMISSIONS[AccountRole.PROVIDER][Resource.RENTALS] = frozenset({Action.READ})
PERMISSIONS[AccountRole.RENTER][Resource.RENTALS] = frozenset({Action.READ, Action.WRITE})
# The market's prices: a provider reads and sets its own (its hosts' and its default), as the operator does anyone's.
# The price in force on a host is public (offers show it): every role reads it, of any host, whoever owns it.
PERMISSIONS[AccountRole.PROVIDER][Resource.PRICES] = frozenset({Action.READ, Action.WRITE})
PERMISSIONS[AccountRole.PROVIDER][Resource.HOST_PRICES] = frozenset({Action.READ})
PERMISSIONS[AccountRole.RENTER][Resource.HOST_PRICES] = frozenset({Action.READ})
# Adding a host: a provider makes a join token bound to its own account (Scope.owner), never another's; the raw
# tokens resource (a token for any provider) stays the operator's.
PERMISSIONS[AccountRole.PROVIDER][Resource.HOST_ENROLLMENT] = frozenset({Action.WRITE})
# Passwords (the console's sign-in): every account sets its own (Scope.owner), the operator anyone's.
for _role in (AccountRole.PROVIDER, AccountRole.RENTER):
    PERMISSIONS[_role][Resource.PASSWORD] = frozenset({Action.WRITE})
# Reports: a provider reads its own hosts' rows, a renter its own rentals' (report_owners); the operator every row.
for _role in (AccountRole.PROVIDER, AccountRole.RENTER):
    PERMISSIONS[_role][Resource.REPORTS] = frozenset({Action.READ})

# Alerts: every account reads the rules and its own alerts, and manages its own webhooks.
for _role in (AccountRole.PROVIDER, AccountRole.RENTER):
    PERMISSIONS[_role][Resource.ALERT_RULES] = frozenset({Action.READ})
    PERMISSIONS[_role][Resource.ALERTS] = frozenset({Action.READ})
    PERMISSIONS[_role][Resource.WEBHOOKS] = frozenset({Action.READ, Action.WRITE})

# SSH public keys (docs/ssh.md): every account adds, lists and deletes its own (Scope.owner), the operator anyone's.
for _role in (AccountRole.PROVIDER, AccountRole.RENTER):
    PERMISSIONS[_role][Resource.SSH_KEYS] = frozenset({Action.READ, Action.WRITE})
# Secrets: a renter keeps its own (storage credentials, tokens its workloads' env names); each account acts on its
# own only, the operator's included (docs/storage.md).
PERMISSIONS[AccountRole.RENTER][Resource.SECRETS] = frozenset({Action.READ, Action.WRITE})
# Serverless endpoints (docs/endpoints.md): a renter makes, changes and deletes its own and their invocation keys
# (Scope.owner), the operator anyone's. An invocation key is no API key: it opens none of these routes.
PERMISSIONS[AccountRole.RENTER][Resource.ENDPOINTS] = frozenset({Action.READ, Action.WRITE})
# Top-ups (docs/payments.md): a renter opens and reads its own (Scope.owner); the operator reads anyone's and may open
# one for a renter. The provider's webhook is public: its signature is its credential.
PERMISSIONS[AccountRole.RENTER][Resource.TOPUPS] = frozenset({Action.READ, Action.WRITE})
# Disputes (docs/disputes.md): a renter opens and reads its own; the disputed host's provider reads and answers them;
# only the operator resolves (the service limits each to its own: another's answers 404).
PERMISSIONS[AccountRole.RENTER][Resource.DISPUTES] = frozenset({Action.READ, Action.WRITE})
PERMISSIONS[AccountRole.PROVIDER][Resource.DISPUTES] = frozenset({Action.READ})
PERMISSIONS[AccountRole.PROVIDER][Resource.DISPUTE_ANSWERS] = frozenset({Action.WRITE})
# Payouts (docs/payments.md): a provider connects and reads its own payout account and reads its payouts; the operator
# anyone's, and alone runs a payout run or a reconciliation on demand.
PERMISSIONS[AccountRole.PROVIDER][Resource.PAYOUTS] = frozenset({Action.READ, Action.WRITE})


@dataclass(frozen=True)
class Principal:
    """Who is calling: the key and the account it belongs to."""

    name: str  # the key's name
    role: AccountRole  # the account's
    account: str  # the account's id; the bootstrap "operator" account for a legacy key
    key_id: str  # the key's public id; "" for a legacy key
    key_hash: str  # what the key is told apart by (its rate limit)


@dataclass(frozen=True)
class Scope:
    """What one call may see: ``owner`` is the account it is limited to, None (the operator) for everything."""

    principal: Principal
    owner: str | None


def permitted(role: AccountRole, resource: Resource, action: Action) -> bool:
    return action in PERMISSIONS[role].get(resource, frozenset())


def scope_for(principal: Principal, resource: Resource, action: Action) -> Scope:
    """The scope of a call, or Forbidden naming what the role may not do."""
    if not permitted(principal.role, resource, action):
        raise Forbidden(f"a {principal.role.value} key may not {action.value} {resource.value.replace('_', ' ')}")
    owner = None if principal.role is AccountRole.OPERATOR else principal.account
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
    if scope.principal.role is AccountRole.PROVIDER:
        return scope.owner, None
    return None, scope.owner


# Launch templates: the catalog is the same for everyone, and every account reads it.
for _role in (AccountRole.PROVIDER, AccountRole.RENTER):
    PERMISSIONS[_role][Resource.TEMPLATES] = frozenset({Action.READ})

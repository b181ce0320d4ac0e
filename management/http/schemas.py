"""What the API accepts: one msgspec struct per request body and per list query, typed and bounded.

Decoding goes through msgspec, never the stdlib ``json`` module: msgspec refuses ``NaN`` and
``Infinity`` (which ``json`` accepts), numbers out of the float range (``1e999``), booleans where a
number is asked for, and unknown fields. Every string has a length and a character class; every
number has bounds. A struct's JSON Schema (``msgspec.json.schema``) can feed an OpenAPI document.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Annotated, Any, ClassVar, Literal

import msgspec

from common.containers import WireSpec
from management.views.base import StructFields
from management.workloads.states import WORKLOAD_STATES
from master.port import AgentState, CommandState, GpuState, WorkloadSpec

# An OpenAPI document, or a piece of one (a schema, an operation, a parameter): JSON Schema's shape is open by nature.
OpenApiJson = dict[str, Any]

# Ids the Master mints ("agt-…", "cmd-…", GPU UUIDs, key ids), tier and model names, event subjects.
Identifier = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z")]
# Account and place names people choose: a provider, a region.
AccountName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")]
EventKindPrefix = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z_]+(\.[a-z_]*)*\Z")]
Cursor = Annotated[str, msgspec.Meta(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9_-]+\Z")]

DEFAULT_PAGE = 100
MAX_PAGE = 1000
PageLimit = Annotated[int, msgspec.Meta(ge=1, le=MAX_PAGE)]
SEQ_MAX = 2**63 - 1  # the store keeps event sequence numbers as signed 64-bit integers
EventSeq = Annotated[int, msgspec.Meta(ge=0, le=SEQ_MAX)]

MAX_COMMAND_TIMEOUT_S = 7 * 86400.0
MAX_COMMAND_WAIT_S = 20.0  # the longest a read of one command may wait for it to be final (?wait_s=)
MAX_TOKEN_TTL_S = 30 * 86400.0

AGENT_STATES = tuple(s.value for s in AgentState)
GPU_STATES = tuple(s.value for s in GpuState)
COMMAND_STATES = tuple(s.value for s in CommandState)

# A state filter's value. Checked by name in the query's ``__post_init__`` (whose message lists the valid states);
# the enum is what the OpenAPI document states (management/api/openapi.py), so a generated request can be valid.
AgentStateName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, extra_json_schema={"enum": list(AGENT_STATES)})]
GpuStateName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, extra_json_schema={"enum": list(GPU_STATES)})]
CommandStateName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, extra_json_schema={"enum": list(COMMAND_STATES)})]
WorkloadStateName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, extra_json_schema={"enum": list(WORKLOAD_STATES)})]


def _one_of(field: str, value: str | None, valid: Collection[str]) -> None:
    if value is not None and value not in valid:
        raise ValueError(f"{field} {value!r} is not one of: {', '.join(valid)}")


def _finite(field: str, value: float | None) -> None:
    # msgspec's own bounds refuse inf; NaN compares false with every bound, so it is refused here by name.
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number")


# --- bodies ----------------------------------------------------------------------------------


class CreateCommand(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/commands. ``spec`` is the body of a ``kind`` command, checked against that kind's type: a bad one
    is an ``invalid_command`` naming the field."""

    agent_id: Identifier
    kind: Identifier
    # Open here, since its type depends on ``kind``: the grid service makes it typed once (``ContainerSpec``,
    # ``DeleteSpec``), after the host is checked, so that a bad one answers as the command ledger always has.
    spec: WireSpec
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_COMMAND_TIMEOUT_S)] | None = None

    def __post_init__(self) -> None:
        _finite("timeout_s", self.timeout_s)


class CreateToken(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/tokens: a one-time join token enrolling hosts for ``provider``."""

    provider: AccountName
    ttl_s: Annotated[float, msgspec.Meta(ge=1, le=MAX_TOKEN_TTL_S)] | None = None  # default: the Master's setting

    def __post_init__(self) -> None:
        _finite("ttl_s", self.ttl_s)


class SubmitWorkload(WorkloadSpec, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/workloads: a workload spec (master.records.WorkloadSpec), and for an operator the account."""

    account: AccountName | None = None  # a renter's key submits for its own account; an operator names one

    def spec(self) -> WorkloadSpec:
        return WorkloadSpec(**{name: getattr(self, name) for name in WorkloadSpec.__struct_fields__})


# --- accounts and API keys -------------------------------------------------------------------
# The Master checks every account again (master/accounts.py); these bounds make a bad body a 400 naming the field.

# The id's characters are checked by the Master (master/accounts.py), whose message says what an id may hold.
AccountId = Annotated[str, msgspec.Meta(min_length=1, max_length=63)]
AccountRole = Literal["operator", "provider", "renter"]
DisplayName = Annotated[str, msgspec.Meta(max_length=128)]
QuotaName = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Share = Annotated[float, msgspec.Meta(gt=0, le=1e6)]
Quota = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
KeyName = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class CreateAccount(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/accounts."""

    id: AccountId
    role: AccountRole
    name: DisplayName = ""
    share: Share = 1.0
    project_shares: Annotated[dict[QuotaName, Share], msgspec.Meta(max_length=64)] = {}
    gpu_quota: Quota | None = None
    tier_quotas: Annotated[dict[QuotaName, Quota], msgspec.Meta(max_length=64)] = {}

    def __post_init__(self) -> None:
        _finite("share", self.share)


class UpdateAccount(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PATCH /api/v1/accounts/{id}: the fields given are changed; ``"gpu_quota": null`` removes the limit."""

    name: DisplayName | msgspec.UnsetType = msgspec.UNSET
    role: AccountRole | msgspec.UnsetType = msgspec.UNSET
    disabled: bool | msgspec.UnsetType = msgspec.UNSET
    share: Share | msgspec.UnsetType = msgspec.UNSET
    project_shares: Annotated[dict[QuotaName, Share], msgspec.Meta(max_length=64)] | msgspec.UnsetType = msgspec.UNSET
    gpu_quota: Quota | None | msgspec.UnsetType = msgspec.UNSET
    tier_quotas: Annotated[dict[QuotaName, Quota], msgspec.Meta(max_length=64)] | msgspec.UnsetType = msgspec.UNSET

    def __post_init__(self) -> None:
        if isinstance(self.share, float):
            _finite("share", self.share)


class CreateApiKey(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """POST /api/v1/accounts/{id}/keys: ``name`` says what the key is for ("ci", "laptop")."""

    name: KeyName


PasswordText = Annotated[str, msgspec.Meta(max_length=4096)]  # master/passwords.py says what a password must be


class SetPassword(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """PUT /api/v1/accounts/{id}/password: the new password (at least 12 characters); ``current_password`` is
    required when an account changes its own password and has one."""

    password: PasswordText
    current_password: PasswordText | None = None


# --- list queries ----------------------------------------------------------------------------


class PageQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    repeatable: ClassVar[frozenset[str]] = frozenset()  # parameters that may be given more than once

    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | None = None


class AgentQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    state: AgentStateName | None = None
    provider: AccountName | None = None
    region: AccountName | None = None
    tier: Identifier | None = None  # hosts with a GPU of this tier
    model: Identifier | None = None  # hosts with a GPU of this model

    def __post_init__(self) -> None:
        _one_of("state", self.state, AGENT_STATES)


class GpuQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    state: GpuStateName | None = None
    tier: Identifier | None = None
    model: Identifier | None = None
    agent_id: Identifier | None = None
    offered: bool | None = None  # ?offered=true: only GPUs renters are offered now

    def __post_init__(self) -> None:
        _one_of("state", self.state, GPU_STATES)


class CommandQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    agent_id: Identifier | None = None
    repeatable: ClassVar[frozenset[str]] = frozenset({"state"})

    state: list[CommandStateName] | None = None  # ?state=pending&state=sent

    def __post_init__(self) -> None:
        for state in self.state or ():
            _one_of("state", state, COMMAND_STATES)


class EventQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    subject: Identifier | None = None
    kind: EventKindPrefix | None = None
    after: EventSeq | None = None  # start after this sequence number (a cursor continues from there)


class WorkloadQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    repeatable: ClassVar[frozenset[str]] = frozenset({"state"})

    account: AccountName | None = None  # an operator's filter; a renter sees only its own
    state: list[WorkloadStateName] | None = None  # ?state=queued&state=running

    def __post_init__(self) -> None:
        for state in self.state or ():
            _one_of("state", state, WORKLOAD_STATES)


class AccountQuery(PageQuery, kw_only=True, forbid_unknown_fields=True):
    role: AccountRole | None = None


class CommandWaitQuery(msgspec.Struct, forbid_unknown_fields=True):
    """``?wait_s=N`` on one command: the answer waits until the command is final or N seconds have passed (a long
    poll: one request where a client would otherwise poll again and again); 0, the default, answers at once."""

    wait_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_COMMAND_WAIT_S)] = 0.0


class EmptyQuery(msgspec.Struct, forbid_unknown_fields=True):
    """Routes that take no query parameters still refuse unknown ones, so a typo is never silently ignored."""


def query_fields(schema: type[msgspec.Struct], query: Any) -> StructFields:
    """A query string (a MultiDict) as a plain dict: repeatable fields as lists, others given once. Open: it is what
    ``msgspec.convert`` makes ``schema`` from."""
    repeatable: frozenset[str] = getattr(schema, "repeatable", frozenset())
    fields: StructFields = {}
    for name in query.keys():
        if name in fields:
            continue
        values = query.getall(name)
        if name in repeatable:
            fields[name] = values
        elif len(values) > 1:
            raise ValueError(f"query parameter {name!r} is given {len(values)} times; give it once")
        else:
            fields[name] = values[0]
    return fields


REQUEST_SCHEMAS: tuple[type[msgspec.Struct], ...] = (
    CreateCommand,
    CreateToken,
    AgentQuery,
    GpuQuery,
    CommandQuery,
    EventQuery,
    SubmitWorkload,
    WorkloadQuery,
)
REQUEST_SCHEMAS += (CreateAccount, UpdateAccount, CreateApiKey, AccountQuery)


# --- the market: providers' prices (management/api/resources/prices.py) ---------------------------------------------------------
# Amounts are decimal strings per GPU-hour ("2.50"); the price book (management/market/prices.py) checks the rest and
# names the field it refuses.
# The pattern is for the OpenAPI document; the price book parses the text itself (and names the field it refuses).
AmountText = Annotated[
    str, msgspec.Meta(min_length=1, max_length=32, extra_json_schema={"pattern": r"^[0-9]{1,12}(\.[0-9]{1,6})?$"})
]


class SetPrice(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    on_demand: AmountText
    min_bid: AmountText | None = None  # null: the host is not rented interruptible
    reserved_discount: Annotated[float, msgspec.Meta(ge=0, le=0.9)] = 0.0
    max_duration_s: Annotated[float, msgspec.Meta(ge=3600, le=10 * 365 * 86400.0)] | None = None


class SetDefaultPrice(SetPrice, kw_only=True, forbid_unknown_fields=True):
    provider: AccountName | None = None  # an operator names the provider; a provider sets its own


class PriceQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    provider: AccountName | None = None  # an operator's filter; a provider sees only its own


REQUEST_SCHEMAS += (SetPrice, SetDefaultPrice, PriceQuery)
# --- end of the market's prices ---


def ecma_patterns(schema: Any) -> Any:
    """``schema`` with each pattern's closing ``\\Z`` written ``$``. The structs end their patterns with Python's ``\\Z``
    (its ``$`` also matches before a final newline: "12\\n" once passed as a price); JSON Schema's patterns are ECMA 262,
    where ``$`` is the end of the text, and ``\\Z`` means nothing."""
    if isinstance(schema, dict):
        return {
            k: (v[:-2] + "$" if k == "pattern" and isinstance(v, str) and v.endswith("\\Z") else ecma_patterns(v))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [ecma_patterns(v) for v in schema]
    return schema


def json_schemas() -> OpenApiJson:
    """JSON Schema (2020-12, as OpenAPI 3.1 uses) of every request body and list query, by struct name: a JSON
    document, open by nature."""
    _, components = msgspec.json.schema_components(REQUEST_SCHEMAS, ref_template="#/components/schemas/{name}")
    return ecma_patterns(components)


# --- telemetry history (management/monitoring/history.py) ------------------------------------------------------------

UnixSeconds = Annotated[float, msgspec.Meta(ge=0, le=1e11, description="unix seconds")]


class TelemetryQuery(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``?from=&to=&step=``: the window ``[from, to)`` in unix seconds (default: the day before now), and the step in
    seconds, a whole number of minutes (default: the finest giving at most 1,440 points)."""

    from_: UnixSeconds | None = msgspec.field(default=None, name="from")
    to: UnixSeconds | None = None
    step: Annotated[int, msgspec.Meta(ge=60, le=90 * 86400)] | None = None

"""The Master's store: one repository per aggregate, the contract both backends (SQLite, MongoDB) keep.

These are the Master's own aggregates; management's are declared in management/store/ and reached through
``Store.repository`` (master/store/plugin.py), with the same contract.

Repositories take and return the record structs of ``master.records``; a backend never hands out
an object it still holds, and copies a record when it is written, so callers may keep mutating theirs.

Reading never fails on one bad record: a stored record that no longer decodes is left where it is,
skipped, and reported in ``Store.quarantine`` (``get`` answers None for it). Writing refuses a record
holding a NaN or an infinity (``UnstorableRecord``), which JSON cannot carry back.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Sequence
from enum import Enum
from typing import Protocol

from master.records import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventRecord,
    GpuRecord,
    HostRollup,
    LeaseRecord,
    RevocationRecord,
    SecretRecord,
    TelemetryRollup,
    TokenRecord,
)
from master.store.aggregates import Aggregate
from master.store.metrics import StoreMetrics
from master.store.plugin import AggregatePlugin, Repo
from master.store.quarantine import Quarantine

__all__ = [
    "AccountRepo",
    "Aggregate",
    "AgentRepo",
    "ApiKeyRepo",
    "CommandRepo",
    "EventRepo",
    "GpuRepo",
    "HostRollupRepo",
    "LeaseRepo",
    "RevocationRepo",
    "SecretRepo",
    "RollupRepo",
    "Store",
    "TokenOutcome",
    "TokenRepo",
    "prefix_upper_bound",
]


class TokenOutcome(str, Enum):
    """What consuming a join token found."""

    OK = "ok"
    UNKNOWN = "unknown"
    USED = "used"
    EXPIRED = "expired"


class AgentRepo(Protocol):
    async def get(self, agent_id: str) -> AgentRecord | None: ...

    async def put(self, rec: AgentRecord) -> None:
        """Insert, or replace the agent with the same id."""

    async def put_many(self, recs: Sequence[AgentRecord]) -> None:
        """Insert, or replace the agents with the same ids, in one batch."""

    async def list(self, *, state: str | None = None, provider: str | None = None) -> builtins.list[AgentRecord]:
        """Agents matching every filter given, ordered by id."""


class GpuRepo(Protocol):
    async def put_many(self, recs: Sequence[GpuRecord]) -> None:
        """Insert, or replace the GPUs with the same uuid, in one batch."""

    async def get(self, uuid: str) -> GpuRecord | None: ...

    async def list(
        self,
        *,
        agent_id: str | None = None,
        tier: str | None = None,
        state: str | None = None,
        model: str | None = None,
    ) -> builtins.list[GpuRecord]:
        """GPUs matching every filter given, ordered by agent id, then index."""


class CommandRepo(Protocol):
    async def put(self, rec: CommandRecord) -> None:
        """Insert, or replace the command with the same id."""

    async def get(self, command_id: str) -> CommandRecord | None: ...

    async def list(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> builtins.list[CommandRecord]:
        """Commands matching the filters, newest first by ``created_at``; an empty ``states`` matches none."""


class TokenRepo(Protocol):
    async def put(self, rec: TokenRecord) -> None: ...

    async def consume(self, token_hash: str, *, agent_id: str, now: float) -> tuple[TokenOutcome, TokenRecord | None]:
        """Spend a join token once: of any number of concurrent consumers, exactly one gets ``OK``.

        A token past its expiry is ``EXPIRED`` and stays unspent; a spent one is ``USED`` (even if it
        has since expired). The record is returned with every outcome but ``UNKNOWN``.
        """


class ApiKeyRepo(Protocol):
    async def put(self, rec: ApiKeyRecord) -> None:
        """Insert, or replace the key with the same hash."""

    async def get(self, key_hash: str) -> ApiKeyRecord | None: ...

    async def mark_used(self, key_hash: str, when: float) -> None:
        """Set the key's ``last_used`` and nothing else (a revocation written meanwhile is kept); no key, no change."""

    async def by_key_id(self, key_id: str) -> ApiKeyRecord | None:
        """The key with this public id ("" names none)."""

    async def list(self, *, subject: str) -> builtins.list[ApiKeyRecord]:
        """The keys of one account, revoked ones included, oldest first (then by key id)."""


class AccountRepo(Protocol):
    async def add(self, rec: AccountRecord) -> bool:
        """Insert a new account; False (and nothing written) when the id is taken, even by a concurrent add."""

    async def put(self, rec: AccountRecord) -> None:
        """Replace the account with the same id (or insert it)."""

    async def get(self, account_id: str) -> AccountRecord | None: ...

    async def list(self, *, role: str | None = None, after: str | None = None, limit: int = 1000) -> builtins.list[AccountRecord]:
        """Accounts with ``id > after`` (all when None) and the role given, ordered by id, at most ``limit``."""


class EventRepo(Protocol):
    async def append(self, rec: EventRecord) -> int:
        """Record one event; returns the ``seq`` assigned to it, greater than any returned before."""

    async def append_many(self, recs: Sequence[EventRecord]) -> None:
        """Record events in one batch, with increasing ``seq`` in the order given."""

    async def list(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> builtins.list[EventRecord]:
        """Events with ``seq > after_seq`` matching the filters, in ascending ``seq``, each with its ``seq`` set."""


class RevocationRepo(Protocol):
    async def put(self, rec: RevocationRecord) -> None:
        """Insert, or replace the revocation of the same certificate serial."""

    async def list(self) -> builtins.list[RevocationRecord]:
        """Every revocation, oldest first."""


class RollupRepo(Protocol):
    async def put_many(self, recs: Sequence[TelemetryRollup]) -> None:
        """Insert, or replace the rollups with the same (gpu_uuid, minute), in one batch."""

    async def list(
        self, gpu_uuid: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[TelemetryRollup]:
        """One GPU's rollups with ``since_minute <= minute < until_minute``, in ascending minute."""

    async def delete_before(self, gpu_uuids: Collection[str], before_minute: int) -> int:
        """Delete these GPUs' rollups with ``minute < before_minute`` (retention); returns how many went."""


class HostRollupRepo(Protocol):
    """A host's own telemetry history (HostRollup), by minute or by hour; as RollupRepo, keyed by (agent_id, minute)."""

    async def put_many(self, recs: Sequence[HostRollup]) -> None:
        """Insert, or replace the host rollups with the same (agent_id, minute), in one batch."""

    async def list(self, agent_id: str, *, since_minute: int = 0, until_minute: int | None = None) -> builtins.list[HostRollup]:
        """One host's rollups with ``since_minute <= minute < until_minute``, in ascending minute."""

    async def delete_before(self, agent_ids: Collection[str], before_minute: int) -> int:
        """Delete these hosts' rollups with ``minute < before_minute`` (retention); returns how many went."""


class LeaseRepo(Protocol):
    """The leader lease of the Masters sharing this store (docs/ha.md); every change is one atomic step, so of
    Masters racing for it at most one holds it at any time. ``now`` is wall-clock seconds (the acquirer's clock)."""

    async def acquire(self, holder: str, url: str, api_url: str, ttl_s: float, now: float) -> LeaseRecord | None:
        """Take the lease until ``now + ttl_s`` if it is free, lapsed (``expires_at <= now``) or ``holder``'s already;
        a new holder gets the previous epoch + 1 (1 for the first), the same holder keeps its epoch. None when another
        holds it unexpired, or took it concurrently."""

    async def renew(self, holder: str, epoch: int, ttl_s: float, now: float) -> LeaseRecord | None:
        """Extend the lease to ``now + ttl_s`` while its stored holder and epoch are still these; None otherwise."""

    async def current(self) -> LeaseRecord | None:
        """The lease as stored (lapsed or not); None before anyone took it."""

    async def release(self, holder: str, epoch: int) -> bool:
        """Let the lease lapse now (a clean stop), if it is still ``holder``'s at ``epoch``; the epoch is kept, so the
        next holder's is higher. Whether it was released."""


class SecretRepo(Protocol):
    """Renters' secrets, sealed; keyed by (account, name). Never replaced in place: a name is deleted, then created."""

    async def insert(self, rec: SecretRecord) -> None:
        """Store a new secret; DuplicateSecret if the account already has one of that name."""

    async def get(self, account: str, name: str) -> SecretRecord | None: ...

    async def list(self, account: str) -> builtins.list[SecretRecord]:
        """The account's secrets by name."""

    async def delete(self, account: str, name: str) -> bool:
        """Whether there was one to delete."""


class Store(Protocol):
    agents: AgentRepo
    gpus: GpuRepo
    commands: CommandRepo
    tokens: TokenRepo
    api_keys: ApiKeyRepo
    accounts: AccountRepo
    events: EventRepo
    revocations: RevocationRepo
    rollups: RollupRepo
    hourly_rollups: RollupRepo  # the same records, one per GPU and hour, downsampled from ``rollups``
    secrets: SecretRepo  # renters' secrets, sealed (master/secrets.py)
    host_rollups: HostRollupRepo  # a host's own telemetry, one per host and minute
    host_hourly_rollups: HostRollupRepo  # the same, one per host and hour, downsampled from ``host_rollups``
    leases: LeaseRepo  # the leader lease (docs/ha.md)
    backend: str  # "sqlite" | "mongodb"
    quarantine: Quarantine  # the records found undecodable, kept aside
    metrics: StoreMetrics  # write latency and quarantined records; register into the daemon's registry

    def repository(self, plugin: AggregatePlugin[Repo]) -> Repo:
        """The repository of an aggregate another part keeps here (master/store/plugin.py), built on first use."""

    async def open(self) -> None:
        """Connect and apply pending migrations; raises ConfigError for a store newer than this code."""

    async def close(self) -> None: ...

    async def schema_version(self) -> int:
        """The highest migration applied to the underlying database."""

    def writes_by(self, holder: str, epoch: int) -> None:
        """High availability (docs/ha.md): every record written from now on carries its writer. MongoDB stores
        ``_holder`` and ``_epoch`` in each document it writes, and refuses (``Fenced``) to overwrite a command or an
        agent that a higher epoch wrote; SQLite (one Master per file) does nothing."""


def prefix_upper_bound(prefix: str) -> str:
    """An exclusive upper bound for the strings that start with ``prefix``, for an index range scan.

    Both backends compare strings by code point (as UTF-8 bytes), so the prefix followed by the highest
    code point bounds them all (but those continuing with that very code point, which no kind uses).
    """
    return prefix + "\U0010ffff"

"""The narrow views ``MasterPort`` hands management: what management reads of each Master part, and nothing more.

Each part the port exposes is typed by one of these read-only protocols, not by its class: the Master's own objects
satisfy them (mypy checks ``Master`` against ``MasterPort``: master.master.implements_port), and a management module
that calls anything they do not list fails type checking. Writes are never here: each is an operation of the port
(``record_event``, ``mark_gpu_faulty``, ``update_account``...), so the Master decides how it is done.

The exception is ``ManagementStore``: the repositories of management's own aggregates (workloads, rentals, the
ledger...), which management declares itself (management/store/) and reaches through the store's plugin seam
(``repository``, master/store/plugin.py), reading and writing them whole because it is their one writer; the Master's
records in the same store (telemetry history, revocations) are read-only there.

To let management read something new of a part: add it to the part's protocol here (a read, never a write); to let it
change something: add an operation to ``MasterRequests`` (master/requests.py) and its signature to ``MasterPort``.
tests/test_master_door.py counts the reaches past these views and expects none.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry

from common.inventory import GpuSample, HostSample
from master.accounts import Credential
from master.allocations import Hold
from master.changes import DEFAULT_CAPACITY, PLACEMENT, ChangeKind, Listener, Subscription
from master.leadership import LeaderRole
from master.records import (
    AccountRecord,
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    GpuRecord,
    HostRollup,
    RevocationRecord,
    SecretRecord,
    TelemetryRollup,
)
from master.store.plugin import AggregatePlugin, Repo


class HostDirectory(Protocol):
    """The hosts and GPUs the Master knows, as it holds them in memory (master/registry.py)."""

    @property
    def agents(self) -> Mapping[str, AgentRecord]: ...
    @property
    def gpus(self) -> Mapping[str, GpuRecord]: ...
    def get(self, agent_id: str) -> AgentRecord: ...
    def gpus_of(self, agent_id: str) -> list[GpuRecord]: ...
    def gpu_of_unit(self, uuid: str) -> GpuRecord | None: ...
    def last_relays(self) -> set[str]: ...


class GpuHolds(Protocol):
    """Which container holds each GPU (or MIG instance) now (master/allocations.py)."""

    def holder(self, gpu_uuid: str) -> Hold | None: ...
    def holds(self) -> dict[str, Hold]: ...


class AccountDirectory(Protocol):
    """Accounts and their API keys, read (master/accounts.py); changes are the port's account operations."""

    async def get(self, account_id: str) -> AccountRecord: ...
    async def checked(self, account_id: str) -> AccountRecord: ...
    async def list(
        self, *, role: str | None = None, after: str | None = None, limit: int = 1000
    ) -> builtins.list[AccountRecord]: ...
    async def require_provider(self, account_id: str) -> AccountRecord: ...
    async def sign_in(self, account_id: str, password: str) -> AccountRecord: ...
    async def keys(self, account_id: str) -> builtins.list[ApiKeyRecord]: ...
    async def key(self, key_id: str) -> ApiKeyRecord: ...
    async def credential(self, key: str) -> Credential: ...


class TelemetryView(Protocol):
    """The latest sample of each GPU and of each host (master/telemetry.py)."""

    @property
    def latest(self) -> Mapping[str, GpuSample]: ...
    @property
    def latest_hosts(self) -> Mapping[str, HostSample]: ...
    def usage(self, uuid: str) -> tuple[float, int] | None:
        """A GPU's latest utilization (percent) and memory used (MiB), read without making its sample; None if none."""


class LeaderView(Protocol):
    """Who leads, with high availability on (master/leadership.py, docs/ha.md)."""

    @property
    def role(self) -> LeaderRole: ...
    @property
    def deposed_reason(self) -> str: ...
    @property
    def deposed(self) -> asyncio.Event: ...
    def leads(self) -> bool: ...
    def leader_api_url(self) -> str: ...


class ChangeSubscriptions(Protocol):
    """The Master's change feed, to subscribe to (master/changes.py); only the Master publishes."""

    def subscribe(self, capacity: int = DEFAULT_CAPACITY, *, kinds: Collection[ChangeKind] = PLACEMENT) -> Subscription: ...
    def listen(self, listener: Listener, kinds: Collection[ChangeKind]) -> Callable[[], None]: ...


class OpenCommands(Protocol):
    """The commands sent and not finished yet, by id (master/commands.py)."""

    @property
    def open(self) -> Mapping[str, CommandRecord]: ...


class LinkedRelay(Protocol):
    @property
    def region(self) -> str: ...


class RelayLinks(Protocol):
    """The relays linked to this Master now, by relay id (master/link.py)."""

    @property
    def links(self) -> Mapping[str, LinkedRelay]: ...
    @property
    def agent_links(self) -> Mapping[str, LinkedRelay]: ...  # the relay carrying each agent connected now


class SecretShelf(Protocol):
    """Renters' secrets, read (master/secrets.py): names, values for a workload, and the Master's seal. Creating and
    deleting one are the port's operations."""

    async def list(self, account: str) -> builtins.list[SecretRecord]: ...
    async def names(self, account: str) -> set[str]: ...
    async def resolve(self, account: str, names: Iterable[str]) -> dict[str, str]: ...
    def seal(self, value: str) -> str: ...
    def unseal(self, sealed: str) -> str: ...


class FleetPreparation(Protocol):
    async def prepare(self) -> None: ...


class MetricsExposition(Protocol):
    """The process's Prometheus registry, served on /metrics, where management adds its own series beside the
    Master's; and the fleet's gauges, summed before a scrape (master/metrics.py)."""

    @property
    def registry(self) -> CollectorRegistry: ...
    @property
    def fleet(self) -> FleetPreparation: ...


class RollupHistory(Protocol):
    async def list(
        self, gpu_uuid: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[TelemetryRollup]: ...


class HostRollupHistory(Protocol):
    async def list(
        self, agent_id: str, *, since_minute: int = 0, until_minute: int | None = None
    ) -> builtins.list[HostRollup]: ...


class RevocationList(Protocol):
    async def list(self) -> builtins.list[RevocationRecord]: ...


class ManagementStore(Protocol):
    """The store as management reaches it: its own aggregates' repositories, through the store's plugin seam (each
    module of management/store/ declares one, master/store/plugin.py), read and written whole (it is their one writer);
    and the Master's records it reads: telemetry history and revoked certificates."""

    # --- management's own aggregates ---
    def repository(self, plugin: AggregatePlugin[Repo]) -> Repo:
        """A management aggregate's repository (management/store/): kept in this store, fenced as the Master's own."""

    # --- the Master's, read ---
    @property
    def rollups(self) -> RollupHistory: ...
    @property
    def hourly_rollups(self) -> RollupHistory: ...
    @property
    def host_rollups(self) -> HostRollupHistory: ...
    @property
    def host_hourly_rollups(self) -> HostRollupHistory: ...
    @property
    def revocations(self) -> RevocationList: ...
    @property
    def backend(self) -> str: ...

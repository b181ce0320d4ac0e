"""The Master's published interface: all management may import from ``master``.

``MasterPort`` is every operation and read management needs of a running Master; ``master.master.Master`` implements
it (checked by mypy: tests/master/test_port.py). The rest of this module re-exports the record, state, store and
helper types management reads, so a management module imports ``master.port`` and nothing else from ``master``
(tests/test_dependency_rule.py enforces it). Only entry points (the CLI, the local grid, the server's composition)
build a ``Master`` itself.

The door is narrow: each part ``MasterPort`` hands out is typed by a read-only view (master/views.py) listing what
management reads of it, and every write is an operation of the port. To let management read more of a part: the
member in its view; to give it something new, or a write: the method in ``MasterRequests`` (master/requests.py) and its
signature here; a new record type: re-export it below. tests/test_master_door.py counts reaches past the port.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Any, Protocol

from common.containers import CommandSpec
from common.inventory import GpuSample
from common.overlay import OverlaySpec
from common.tunnel import TunnelKind
from master.accounts import BOOTSTRAP_ACCOUNT, AccountChange, AccountRole, Credential, IssuedKey
from master.allocations import DUPLICATE_UUID_FLAG, GPU_UNREACHABLE_FLAG, Hold
from master.authority import Authority
from master.changes import (
    DEFAULT_CAPACITY,
    PLACEMENT,
    AgentWritten,
    Change,
    ChangeKind,
    CommandFinished,
    ContainerExited,
    GpuHealthChanged,
    GpusWritten,
    HoldsChanged,
    HostChanged,
    Resync,
    SamplesTaken,
    Subscription,
)
from master.command_secrets import SEALED
from master.commands import InvalidCommand, command_spec
from master.config import ConsoleSettings, LinkSettings, MasterConfig
from master.faults import LASTING
from master.history import MINUTES_PER_HOUR, downsample, downsample_host
from master.keys import SigningKeyInfo
from master.loops import Loop, stop_loop
from master.network_floors import NetworkFloors, Shortfall
from master.overlay import OverlayAuthority, OverlaySettings, write_lighthouse
from master.records import (
    MAX_GPUS_PER_REPLICA,
    MAX_REPLICAS,
    NO_IMAGE,
    RENTAL_KINDS,
    RESTART_POLICIES,
    AccountRecord,
    AgentRecord,
    AgentResult,
    AlertRuleRecord,
    Amount,
    ApiKeyRecord,
    Assignment,
    CommandArg,
    CommandRecord,
    EndpointWorkerRef,
    EnvName,
    EnvValue,
    EventData,
    EventRecord,
    FairShareUsage,
    GpuFault,
    GpuRecord,
    HostRollup,
    ImageRef,
    KeptOutput,
    LabelKey,
    LabelValue,
    LedgerEntry,
    LedgerLine,
    PlacementConstraints,
    PortLink,
    PriceChange,
    PriceRecord,
    RentalHost,
    RentalRecord,
    RentalTerms,
    ReplicaSpec,
    RevocationRecord,
    RuleSpec,
    SecretRecord,
    ShortText,
    SilenceRecord,
    SshKeyRecord,
    TelemetryRollup,
    TokenRecord,
    WebhookRecord,
    WorkloadName,
    WorkloadRecord,
    WorkloadSpec,
)
from master.reputation import WEIGHTS, Reputation, reputation, reputation_score
from master.secrets import SECRET_NAME_PATTERN, InvalidSecret
from master.states import AgentState, CommandState, GpuState, StateMachine
from master.tiers import TierJson, TierPolicy, describe_tiers
from master.tunnels import OpenedTunnel, TunnelUnavailable
from master.verification import MEASURED_FLAGS, VERIFIED, measured_rate, measured_verified, verification_label
from master.verifier import HISTORY_KIND
from master.views import (
    AccountDirectory,
    ChangeSubscriptions,
    GpuHolds,
    HostDirectory,
    LeaderView,
    ManagementStore,
    MetricsExposition,
    OpenCommands,
    RelayLinks,
    SecretShelf,
    TelemetryView,
)
from master.worker_calls import CallOutcome, TakenRequest, WorkerCalls, WorkerError, WorkerRef

# A workload spec (or a piece of one, a link) as plain JSON, before WorkloadSpec decodes it (the CLI's flags and file,
# a template with overrides over it, a console form) or turned back into builtins for an answer: open until checked.
SpecJson = dict[str, Any]


class MasterPort(Protocol):
    """What management uses of a running Master: its parts as read-only views, and operations for every write."""

    # --- the parts management reads, each through its narrow view (master/views.py) ---
    @property
    def config(self) -> MasterConfig: ...
    @property
    def policy(self) -> TierPolicy: ...
    @property
    def store(self) -> ManagementStore: ...  # management's own repositories, by name; the Master's history, read
    @property
    def registry(self) -> HostDirectory: ...  # agents and GPUs in memory
    @property
    def allocations(self) -> GpuHolds: ...  # who holds each GPU
    @property
    def commands(self) -> OpenCommands: ...  # the command ledger's open commands (``market.ledger`` is money)
    @property
    def accounts(self) -> AccountDirectory: ...
    @property
    def changes(self) -> ChangeSubscriptions: ...  # the one change feed management subscribes to
    @property
    def telemetry(self) -> TelemetryView: ...
    @property
    def metrics(self) -> MetricsExposition: ...
    @property
    def hub(self) -> RelayLinks: ...
    @property
    def leadership(self) -> LeaderView | None: ...
    @property
    def secrets(self) -> SecretShelf: ...  # renters' secrets, sealed; values leave only through ``resolve``

    # --- the writes management makes: each an operation, so the Master decides how (master/requests.py) ---
    async def record_event(self, kind: str, subject: str, /, **data: Any) -> None: ...
    async def record_events(self, events: list[tuple[str, str, EventData]]) -> None: ...
    async def mark_gpu_faulty(self, gpu: GpuRecord, fault: GpuFault) -> None: ...
    async def clear_gpu_fault(self, gpu: GpuRecord, reason: str, *, ecc_acknowledged: int | None = None) -> None: ...
    async def create_account(self, rec: AccountRecord) -> AccountRecord: ...
    async def update_account(self, account_id: str, change: AccountChange) -> AccountRecord: ...
    async def set_password(self, account_id: str, password: str, *, current_password: str | None = None) -> AccountRecord: ...
    async def create_account_key(self, account_id: str, name: str) -> IssuedKey: ...
    async def revoke_account_key(self, key_id: str) -> ApiKeyRecord: ...
    async def create_secret(self, account: str, name: str, value: str) -> SecretRecord: ...
    async def delete_secret(self, account: str, name: str) -> None: ...
    async def open_tunnel(
        self, kind: TunnelKind, *, account: str, workload: str, agent_id: str, container: str, **params: Any
    ) -> OpenedTunnel: ...
    async def request_verification(self, agent_id: str, gpu_uuids: Iterable[str] = ()) -> list[str]: ...
    def watch_host_samples(self, agent_id: str, now: float) -> dict[str, list[GpuSample]]: ...
    def signing_keys(self) -> list[SigningKeyInfo]: ...
    def when_elected(self, serve: Callable[[], Awaitable[None]]) -> None: ...

    # --- lifecycle and high availability ---
    async def start(self) -> None: ...
    async def start_standby(self, api_url: str) -> None: ...
    async def stop(self) -> None: ...
    def leads(self) -> bool: ...
    def serves(self) -> bool: ...
    @property
    def role(self) -> str: ...
    @property
    def started_at(self) -> float: ...
    @property
    def link_url(self) -> str: ...

    # --- relays and enrollment ---
    def enrollment_urls(self) -> list[tuple[str, str]]: ...
    def ca_chain_pem(self) -> bytes: ...
    async def create_token(self, provider: str, ttl_s: float | None = None) -> tuple[str, TokenRecord]: ...
    async def create_api_key(self, name: str, role: str = "operator") -> str: ...

    # --- hosts and GPUs ---
    def agent(self, agent_id: str) -> AgentRecord: ...
    def gpus(self, agent_id: str | None = None) -> list[GpuRecord]: ...
    def offered(self, gpu: GpuRecord) -> bool: ...
    async def drain(self, agent_id: str) -> AgentRecord: ...
    async def undrain(self, agent_id: str) -> AgentRecord: ...
    async def revoke(self, agent_id: str, reason: str = ...) -> AgentRecord: ...
    async def repair_gpu(self, uuid: str) -> GpuRecord: ...
    async def record_rental_outcome(self, agent_id: str, *, failed: bool, reason: str, now: float) -> Reputation: ...
    async def record_rating(self, agent_id: str, rating: int, rental_id: str, now: float, *, weight: int = 1) -> Reputation: ...

    # --- commands ---
    async def create_command(self, agent_id: str, spec: CommandSpec, *, timeout_s: float | None = None) -> CommandRecord: ...
    def check_command_target(self, agent_id: str) -> None: ...
    async def command(self, command_id: str, *, wait_s: float = 0.0) -> CommandRecord: ...
    async def list_commands(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> list[CommandRecord]: ...
    def pull_progress(self, agent_id: str, container: str) -> str: ...
    def serve_worker_calls(self, calls: WorkerCalls | None) -> None: ...  # endpoint workers' calls (None: 503)
    def overlay_network(self, held: Collection[str]) -> str: ...
    def overlay_paths(self, agent_id: str, container: str) -> dict[str, str]: ...
    def overlay_spec(
        self,
        *,
        workload_id: str,
        network: str,
        replica: int,
        replicas: int,
        gpus: int,
        agent_id: str,
        now: float,
        max_duration_s: float | None = None,
        blocklist: Sequence[str] = (),
        attempt: int = 0,
    ) -> OverlaySpec | None: ...

    # --- signing keys and events ---
    async def rotate_signing_key(self) -> SigningKeyInfo: ...
    async def retire_signing_key(self, key_id: str) -> SigningKeyInfo: ...
    async def events_after(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]: ...


__all__ = [
    "AgentResult",
    "RuleSpec",
    "TierJson",
    "AccountDirectory",  # the narrow views of the parts (master/views.py)
    "ChangeSubscriptions",
    "GpuHolds",
    "HostDirectory",
    "LeaderView",
    "ManagementStore",
    "MetricsExposition",
    "OpenCommands",
    "RelayLinks",
    "SecretShelf",
    "TelemetryView",
    "OpenedTunnel",
    "SEALED",
    "InvalidCommand",  # with command_spec: a raw command's JSON made typed once, at the API's edge
    "command_spec",
    "OverlaySpec",
    "Authority",  # a local grid's own certificates (management/devgrid/localgrid.py, an entry point)
    "OverlayAuthority",  # with OverlaySettings and write_lighthouse: a local grid issues its lighthouse (management/devgrid)
    "OverlaySettings",
    "write_lighthouse",
    "MEASURED_FLAGS",
    "VERIFIED",
    "measured_rate",
    "measured_verified",
    "verification_label",
    "HISTORY_KIND",
    "BOOTSTRAP_ACCOUNT",
    "DEFAULT_CAPACITY",
    "DUPLICATE_UUID_FLAG",
    "GPU_UNREACHABLE_FLAG",
    "LASTING",
    "MAX_GPUS_PER_REPLICA",
    "MAX_REPLICAS",
    "NO_IMAGE",  # with the spec's field types and parts: an endpoint's worker spec (management/endpoints/spec.py)
    "CommandArg",
    "EnvName",
    "EnvValue",
    "ImageRef",
    "LabelKey",
    "LabelValue",
    "PlacementConstraints",
    "ReplicaSpec",
    "ShortText",
    "WorkloadName",
    "RESTART_POLICIES",
    "MINUTES_PER_HOUR",
    "PLACEMENT",
    "RENTAL_KINDS",
    "WEIGHTS",
    "AccountChange",
    "AccountRecord",
    "AccountRole",
    "AgentRecord",
    "AgentState",
    "AgentWritten",
    "AlertRuleRecord",
    "Amount",
    "ApiKeyRecord",
    "Assignment",
    "Change",
    "ChangeKind",
    "CommandFinished",
    "CommandRecord",
    "CommandState",
    "ConsoleSettings",
    "LinkSettings",
    "ContainerExited",
    "Credential",
    "EventData",
    "EventRecord",
    "FairShareUsage",
    "GpuFault",
    "GpuHealthChanged",
    "GpuRecord",
    "GpuState",
    "GpusWritten",
    "Hold",
    "HoldsChanged",
    "HostChanged",
    "HostRollup",
    "IssuedKey",
    "KeptOutput",
    "LedgerEntry",
    "LedgerLine",
    "Loop",
    "MasterConfig",
    "MasterPort",
    "NetworkFloors",
    "PriceChange",
    "PriceRecord",
    "RentalHost",
    "RentalRecord",
    "RentalTerms",
    "Reputation",
    "Resync",
    "RevocationRecord",
    "SECRET_NAME_PATTERN",
    "InvalidSecret",
    "SecretRecord",
    "SamplesTaken",
    "Shortfall",
    "SigningKeyInfo",
    "SilenceRecord",
    "SpecJson",
    "SshKeyRecord",
    "StateMachine",
    "Subscription",
    "TelemetryRollup",
    "TierPolicy",
    "TokenRecord",
    "TunnelUnavailable",
    "WebhookRecord",
    "WorkloadRecord",
    "EndpointWorkerRef",
    "WorkloadSpec",
    "WorkerCalls",  # with WorkerRef, TakenRequest, WorkerError, CallOutcome: what the request queue implements
    "WorkerRef",
    "TakenRequest",
    "WorkerError",
    "CallOutcome",
    "PortLink",
    "describe_tiers",
    "downsample",
    "downsample_host",
    "reputation",
    "reputation_score",
    "stop_loop",
]

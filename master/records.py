"""What the Master stores: one record type per aggregate. Both store implementations persist exactly these."""

from __future__ import annotations

from typing import Any

import msgspec

from common.inventory import GpuInfo, HostInfo


class AgentRecord(msgspec.Struct, kw_only=True):
    id: str
    provider: str
    state: str  # see master.states.AgentState
    region: str = ""
    relay: str = ""  # id of the Access relay it is connected through, "" when not connected
    cert_serial: str = ""
    cert_not_after: float = 0.0
    cert_issued_at: float = 0.0  # of the current certificate; 0 when enrolled before renewals were recorded
    # Earlier certificates that may still be valid (serial -> not_after): a revocation must cover them too.
    previous_serials: dict[str, float] = {}
    host: HostInfo | None = None
    simulated: bool = False
    runtime: str = ""  # from the inventory: one of common.inventory.RUNTIMES, "" when never reported
    isolation: str = ""  # one of common.inventory.ISOLATIONS
    enrolled_at: float = 0.0
    last_seen: float = 0.0
    connected_since: float | None = None
    # Reputation inputs, kept as running counters so the score is explainable.
    uptime_s: float = 0.0
    downtime_s: float = 0.0
    commands_succeeded: int = 0
    commands_failed: int = 0
    drained: bool = False  # an operator drained it: it comes back to maintenance, not ready
    containers: dict[str, list[str]] = {}  # container name -> GPU uuids it was given
    # Containers that ended on their own (name -> exit status) and are not deleted yet: they keep their GPUs.
    exited: dict[str, int] = {}
    state_reason: str = ""
    version: int = 0  # bumped on every write, for optimistic concurrency


class GpuFault(msgspec.Struct, frozen=True, kw_only=True):
    """Why a GPU is faulty (master/faults.py): an Xid error, uncorrectable ECC errors, or overheating."""

    kind: str  # "xid" | "ecc" | "overheat"
    reason: str  # for a person: what was seen, e.g. "Xid 79: GPU has fallen off the bus"
    since: float
    code: int | None = None  # the Xid number, the ECC count, the temperature


class GpuRecord(msgspec.Struct, kw_only=True):
    uuid: str
    agent_id: str
    index: int
    model: str  # catalog key, e.g. "h100-sxm", or "" when unknown
    info: GpuInfo
    state: str  # see master.states.GpuState
    tier: str | None = None
    flags: list[str] = []  # reasons the GPU was not tiered up, e.g. "vram_mismatch"
    updated_at: float = 0.0
    fault: GpuFault | None = None  # set while the GPU is faulty because of its hardware; cleared by a repair
    # The uncorrectable ECC count (volatile, since the driver loaded) an operator accepted with the last repair:
    # only a count above it is a new fault.
    ecc_acknowledged: int = 0


class CommandRecord(msgspec.Struct, kw_only=True):
    id: str
    agent_id: str
    kind: str  # "create_container" | "delete_container"
    spec: dict[str, Any]
    state: str  # see master.states.CommandState
    created_at: float
    deadline: float
    signature: str = ""  # base64 Ed25519 over the command body
    key_id: str = ""
    sent_at: float | None = None
    acked_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    result: dict[str, Any] | None = None
    error: str | None = None
    version: int = 0


class TokenRecord(msgspec.Struct, kw_only=True):
    """A one-time join token; only its SHA-256 is stored."""

    token_hash: str
    provider: str
    created_at: float
    expires_at: float
    used_at: float | None = None
    used_by: str | None = None  # agent id enrolled with it


class ApiKeyRecord(msgspec.Struct, kw_only=True):
    """An API key; only its SHA-256 is stored. A key naming an account (``subject``) takes its role from that
    account at every check, so a key never outlives a change of role; ``role`` counts only for legacy keys
    naming no account (the operator's, from before accounts existed)."""

    key_hash: str
    name: str
    role: str  # legacy keys only: "operator"
    created_at: float
    subject: str = ""  # the account (AccountRecord.id) the key belongs to; "" for a legacy operator key
    key_id: str = ""  # public id ("key-…"), safe to show and to name in a revocation; "" for legacy keys
    revoked_at: float | None = None  # refused from then on
    last_used: float | None = None  # when a check last read it from the store (accurate to the key cache period)


# --- accounts: who uses the grid, and what the scheduler reads about them -------------------------------------


class AccountRecord(msgspec.Struct, kw_only=True):
    """An account: an operator, a provider (its id is the ``provider`` of its agents and join tokens) or a renter."""

    id: str  # chosen by the operator, see master.accounts.ACCOUNT_ID_PATTERN
    role: str  # "operator" | "provider" | "renter"
    name: str = ""  # for display
    created_at: float = 0.0
    disabled: bool = False  # every key of a disabled account is refused
    share: float = 1.0  # fair-share weight among renters
    project_shares: dict[str, float] = {}  # project -> weight within the account's share
    gpu_quota: int | None = None  # GPUs held at once; None: no limit
    tier_quotas: dict[str, int] = {}  # tier -> GPUs of that tier held at once
    updated_at: float = 0.0


class EventRecord(msgspec.Struct, kw_only=True):
    """One recorded fact: a state transition, a refusal, a reputation change."""

    ts: float
    kind: str  # e.g. "agent.transition", "gpu.transition", "command.transition", "agent.revoked"
    subject: str  # id of the agent, gpu or command it is about
    data: dict[str, Any] = {}
    seq: int = 0  # assigned by the store, increasing


class RevocationRecord(msgspec.Struct, kw_only=True):
    serial: str  # certificate serial, hex
    agent_id: str
    revoked_at: float
    reason: str = ""


class TelemetryRollup(msgspec.Struct, kw_only=True):
    """One minute of one GPU's telemetry."""

    gpu_uuid: str
    agent_id: str
    minute: int  # unix time // 60
    samples: int
    utilization_avg: float
    utilization_max: float
    memory_used_mib_max: int
    temperature_max: float | None = None
    power_avg_w: float | None = None
    ecc_uncorrected: int = 0

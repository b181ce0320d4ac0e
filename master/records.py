"""What the Master stores: one record type per aggregate. Both store implementations persist exactly these."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import msgspec

from common.containers import RegistryAuth, WireSpec
from common.inventory import GPU_VENDORS, GpuInfo, GpuReach, HostInfo, ImageSource, UnofferedGpu
from common.restart_policy import RESTART_POLICIES as RESTART_POLICIES  # published: master.port re-exports it
from common.storage import CheckpointSpec, StorageAccess, StorageMount
from common.wire import BenchmarkFigures

# What an agent reported of a command (CommandResult.result): its runtime's facts, each kind of command its own, and
# the Master passes them on unread, so they are open.
AgentResult = dict[str, Any]
# An alert rule's fields as management/monitoring/rules.py reads them (JSON from the API, a table from a rules file):
# the Master stores a rule's fields and never reads them, so they are open here.
RuleSpec = dict[str, Any]


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
    # The agent's GPU self-test, from its latest hello: which GPUs reach a container of its runtime (a GPU that does not
    # is flagged GPU_UNREACHABLE_FLAG and not offered); empty when nothing was tested.
    gpu_reach: list[GpuReach] = []
    # Cards on the host's PCI bus its agent does not offer, each with why and what to install, from its latest hello
    # (docs/gpus.md); empty from agents older than the field. Shown to the provider, never offered.
    unoffered_gpus: list[UnofferedGpu] = []
    images: list[str] = []  # the images the host already has, warm first (bounded by the wire: MAX_IMAGES_IN_REPORT)
    overlay_key: str = ""  # the host's Nebula public key (PEM), from hello; "" when it runs no overlay (docs/overlay.md)
    image_source: ImageSource | None = None  # where its engine gets images, from hello; None: unknown (pulls anything)
    enrolled_at: float = 0.0
    last_seen: float = 0.0
    connected_since: float | None = None
    # Reputation inputs, kept as running counters so the score is explainable.
    uptime_s: float = 0.0
    downtime_s: float = 0.0
    commands_succeeded: int = 0
    commands_failed: int = 0
    # --- market reputation inputs (master/reputation.py): running counters, so every component shows its evidence ---
    containers_started: int = 0  # create_container commands the host carried out
    containers_failed: int = 0  # create_container commands the host reported failed through its own fault
    # create_container commands that failed through the renter's request (common.errors.is_renter_fault: no such
    # image, credentials refused, image too large, ...): shown, never counted against the host
    containers_refused: int = 0
    rentals_completed: int = 0  # rentals that ended without a host failure
    rentals_failed: int = 0  # rentals that ended through the host (the renter refunded)
    ratings_count: int = 0  # renters' ratings of ended rentals on the host
    ratings_sum: int = 0  # their sum (each 1..5)
    gpus_verified: int = 0  # of the GPUs in its latest inventory: tiered, with no flag
    gpus_unverified: int = 0  # no tier matched, but nothing flagged either
    gpus_flagged: int = 0  # flagged: unknown model, VRAM mismatch, a duplicated uuid, ...
    # --- end of market reputation inputs ---
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


class GpuVerification(msgspec.Struct, kw_only=True):
    """A GPU's latest verification (master/verification.py); the history is its ``gpu.verification`` events."""

    status: str  # "verified" | "failed" | "refused"
    code: str = ""  # why it failed: "late", "wrong_answer", "replayed", ...
    reason: str = ""
    at: float
    simulated: bool = False  # a simulated GPU: never shown as verified
    driver_version: str = ""  # the driver it ran on: a new driver calls for a new run
    commit_s: float | None = None
    challenge_tflops: float | None = None
    figures: BenchmarkFigures | None = None


# Out of the garbage collector's sight (``gc=False``): the Master keeps one per GPU of the fleet (800,000 at 100,000
# agents), and it holds only its card's values (a list of flag strings, frozen structs) and never a record or anything
# that could hold one back, so it can never be part of a cycle. Each cost 16 bytes of header and a visit in every full
# collection (docs/capacity.md, "Where the next wall is").
class GpuRecord(msgspec.Struct, kw_only=True, gc=False):
    uuid: str
    agent_id: str
    index: int
    model: str  # catalog key, e.g. "h100-sxm", or "" when unknown
    info: GpuInfo
    state: str  # see master.states.GpuState
    tier: str | None = None
    # Reasons the GPU was not tiered up, e.g. "vram_mismatch": a tuple, so that the many GPUs with none share the one
    # empty tuple (an empty list was 56 bytes of the Master's memory per GPU).
    flags: tuple[str, ...] = ()
    updated_at: float = 0.0
    fault: GpuFault | None = None  # set while the GPU is faulty because of its hardware; cleared by a repair
    # The uncorrectable ECC count (volatile, since the driver loaded) an operator accepted with the last repair:
    # only a count above it is a new fault.
    ecc_acknowledged: int = 0
    verification: GpuVerification | None = None  # the latest measured verification (None: never measured)


class CommandRecord(msgspec.Struct, kw_only=True):
    id: str
    agent_id: str
    kind: str  # "create_container" | "delete_container"
    # As stored: a create's secret fields (env values, registry password, storage keys) are master.command_secrets.SEALED
    # here, and ``sealed`` holds them encrypted with the Master's secrets.key; the ledger joins them only to sign and send.
    # The wire's JSON, not the typed spec: sealed values would not parse, and an older Master's records stay readable.
    spec: WireSpec
    state: str  # see master.states.CommandState
    created_at: float
    deadline: float
    signature: str = ""  # base64 Ed25519 over the command body
    key_id: str = ""
    sent_at: float | None = None
    acked_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    result: AgentResult | None = None  # what the agent reported (CommandResult.result)
    error: str | None = None
    version: int = 0
    sealed: str = ""  # the secret fields of ``spec`` (master/command_secrets.py), a Fernet token; "": it has none


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
    # The console's sign-in (master/passwords.py): an argon2id hash, "" while none is set; never shown by any view.
    password_hash: str = ""
    # Raised at every password change: console sessions remember the epoch they began in and end when it moves on.
    password_epoch: int = 0


class FairShareUsage(msgspec.Struct, kw_only=True):
    """The scheduler's fair-share memory of one account (``project`` None) or of one project in it: GPU-seconds used,
    decayed with the policy's half-life to ``decayed_to`` (management/scheduler/usage.py decays it on from there)."""

    account: str
    project: str | None = None  # None: the account's own figure, all its projects together
    gpu_seconds: float
    decayed_to: float  # unix time the figure is decayed to


# An event's facts: each kind has its own (the log is every part's, management's included), so they are open.
EventData = dict[str, Any]


class EventRecord(msgspec.Struct, kw_only=True):
    """One recorded fact: a state transition, a refusal, a reputation change."""

    ts: float
    kind: str  # e.g. "agent.transition", "gpu.transition", "command.transition", "agent.revoked"
    subject: str  # id of the agent, gpu or command it is about
    data: EventData = {}
    seq: int = 0  # assigned by the store, increasing


class RevocationRecord(msgspec.Struct, kw_only=True):
    serial: str  # certificate serial, hex
    agent_id: str
    revoked_at: float
    reason: str = ""


class TelemetryRollup(msgspec.Struct, kw_only=True):
    """One minute of one GPU's telemetry, or (in the hourly rollups) one hour of it made of its minutes.

    Averages are over the samples; maxima and the error counters (counters since the agent started, as the
    samples carry them) are the highest seen; ``throttle_reasons`` every reason seen at least once."""

    gpu_uuid: str
    agent_id: str
    minute: int  # unix time // 60; an hourly rollup's is the first minute of its hour (a multiple of 60)
    samples: int
    utilization_avg: float
    utilization_max: float
    memory_used_mib_max: int
    temperature_max: float | None = None
    power_avg_w: float | None = None
    ecc_uncorrected: int = 0
    # --- telemetry history (issue 13); defaults keep the rollups written before it decodable ---
    minutes: int = 1  # how many one-minute rollups this one summarizes (1 for a minute's own)
    memory_used_mib_avg: float | None = None
    temperature_avg: float | None = None
    power_max_w: float | None = None
    clock_sm_avg_mhz: float | None = None
    clock_mem_avg_mhz: float | None = None
    ecc_corrected: int = 0
    xid_count: int = 0
    throttle_reasons: list[str] = msgspec.field(default_factory=list)
    # Issue 29: how many times less often than configured agents were told to report during this minute, or 0 when
    # reports were shed without pacing (>= 1 or 0: the rollup is thinner than usual, its ``samples`` fewer by design).
    thinned: float = 1.0


# --- host telemetry history: a host's own CPU, memory, disk and network over time (docs/monitoring.md) -------------


class HostRollup(msgspec.Struct, kw_only=True):
    """One minute of one host's readings of itself (common.inventory.HostSample), or (in the hourly host rollups) one
    hour of it made of its minutes. Averages are over the samples that carry the reading; None: no sample did.

    ``net_rx_bytes``/``net_tx_bytes``: the bytes moved in the span, the sum of the counters' steps between
    consecutive samples (each step counted in the later sample's minute; a counter that went backwards, a reboot,
    counts 0 for that step); None where no step had both counters. A rate is bytes / (minutes * 60)."""

    agent_id: str
    minute: int  # unix time // 60; an hourly rollup's is the first minute of its hour (a multiple of 60)
    samples: int
    minutes: int = 1  # how many one-minute host rollups this one summarizes
    cpu_pct_avg: float | None = None
    cpu_pct_max: float | None = None
    load_1m_avg: float | None = None
    ram_used_mib_avg: float | None = None
    ram_used_mib_max: int | None = None
    ram_total_mib: int | None = None  # the latest reading
    disk_used_gib: float | None = None  # the highest
    disk_free_gib_min: float | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None


# --- workloads: what a renter asks to run, and what became of it -------------------------------------------------
# The spec is checked here for shape and bounds (every error names its field, e.g. ``$.replica.gpus``); what it
# names against the Master's configuration (GPU models in the catalog, tiers in the policy, priority classes) is
# checked where a workload is submitted (management/workloads/states.py), so a stored record never stops
# decoding because the configuration changed.

WorkloadName = Annotated[str, msgspec.Meta(min_length=1, max_length=63, pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")]
ImageRef = Annotated[str, msgspec.Meta(min_length=1, max_length=512, pattern=r"^[^\s\x00]+\Z")]
ShortText = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*\Z")]
CommandArg = Annotated[str, msgspec.Meta(max_length=4096)]
EnvName = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[A-Za-z_][A-Za-z0-9_]*\Z")]
EnvValue = Annotated[str, msgspec.Meta(max_length=32768)]
LabelKey = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]*\Z")]
LabelValue = Annotated[str, msgspec.Meta(max_length=256)]
PortNumber = Annotated[int, msgspec.Meta(ge=1, le=65535)]
# Money in a spec or a request: a decimal string in the grid's currency, exact to the micro-unit ("2.5", "0.000125");
# stored and computed as integer micro-units (management/market/money.py), never as a float.
Amount = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,6})?\Z", max_length=16)]
HostRef = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*\Z")]

MAX_REPLICAS = 64
MAX_GPUS_PER_REPLICA = 16
NO_IMAGE = "none"  # a spec's image for a command the process runtime runs on the host itself (no container engine)
PLACEMENTS = ("binpack", "spread")


def _require_finite(field: str, value: float | None) -> None:
    # msgspec's bounds refuse infinities; NaN passes every comparison, and TOML or Python callers can hand one in.
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, not {value!r}")


class ReplicaSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What one replica needs from one host."""

    gpus: Annotated[int, msgspec.Meta(ge=1, le=MAX_GPUS_PER_REPLICA)] = 1
    min_vram_mib: Annotated[int, msgspec.Meta(ge=0, le=16 * 1024 * 1024)] = 0
    models: Annotated[list[ShortText], msgspec.Meta(max_length=64)] = []  # catalog keys; [] = any model
    # GPU vendors it runs on (common.inventory.GPU_VENDORS: "nvidia" for a CUDA image, "amd" for a ROCm one); [] = any
    vendors: Annotated[list[ShortText], msgspec.Meta(max_length=8)] = []
    tiers: Annotated[list[ShortText], msgspec.Meta(max_length=64)] = []  # tier names; [] = any tier
    min_compute_capability: Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,2}\.[0-9]\Z")] | None = None
    cpu_cores: Annotated[float, msgspec.Meta(gt=0, le=1024)] | None = None
    ram_mib: Annotated[int, msgspec.Meta(ge=1, le=16 * 1024 * 1024)] | None = None
    mig_profile: Annotated[str, msgspec.Meta(pattern=r"^[1-9][0-9]?g\.[0-9]{1,3}gb(\+me)?\Z")] | None = None

    def __post_init__(self) -> None:
        _require_finite("replica.cpu_cores", self.cpu_cores)
        unknown = sorted(set(self.vendors) - set(GPU_VENDORS))
        if unknown:
            raise ValueError(f"replica.vendors: {', '.join(unknown)} is not a GPU vendor; known: {', '.join(GPU_VENDORS)}")
        for field in ("models", "vendors", "tiers"):
            values = getattr(self, field)
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"replica.{field} names {', '.join(repeated)} more than once")


class PlacementConstraints(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Where replicas may run."""

    regions: Annotated[list[ShortText], msgspec.Meta(max_length=64)] = []  # [] = anywhere
    min_reputation: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.0
    min_bandwidth_mbps: Annotated[float, msgspec.Meta(ge=0, le=1_000_000)] = 0.0
    # GiB of free disk the host must report (HostInfo.disk_free_gib) for a replica to be placed there; not a quota
    # the container is held to. 0: any host.
    min_disk_gib: Annotated[float, msgspec.Meta(ge=0, le=1_000_000)] = 0.0
    nvlink: bool = False  # a multi-GPU replica needs its GPUs NVLinked
    allow_process_runtime: bool = False  # may run on a host without container isolation

    def __post_init__(self) -> None:
        _require_finite("constraints.min_reputation", self.min_reputation)
        _require_finite("constraints.min_bandwidth_mbps", self.min_bandwidth_mbps)
        _require_finite("constraints.min_disk_gib", self.min_disk_gib)


RENTAL_KINDS = ("on_demand", "interruptible", "reserved")


class RentalTerms(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a renter pays for a workload (docs/market.md). Absent from a spec: on demand at the listed price.

    - ``on_demand``: runs until stopped, at the price the host lists when it starts; ``max_price`` caps what it takes.
    - ``interruptible``: runs at ``bid`` per GPU-hour on hosts whose minimum bid it meets; an on-demand or reserved
      rental, or a higher bid, that needs its GPUs preempts it (SIGTERM, grace, back to the queue).
    - ``reserved``: ``reserved_s`` prepaid at the host's reserved discount, never preempted.
    """

    kind: str = "on_demand"  # one of RENTAL_KINDS
    max_price: Amount | None = None  # per GPU-hour: on_demand and reserved take only offers at or under it
    bid: Amount | None = None  # per GPU-hour: interruptible only, and required there
    offer: HostRef | None = None  # rent this offer: the workload runs on this host or waits for it
    reserved_s: Annotated[float, msgspec.Meta(ge=3600, le=366 * 86400.0)] | None = None  # reserved only, and required

    def __post_init__(self) -> None:
        _require_finite("rental.reserved_s", self.reserved_s)
        if self.kind not in RENTAL_KINDS:
            raise ValueError(f"rental.kind {self.kind!r} is not one of: {', '.join(RENTAL_KINDS)}")
        if self.kind == "interruptible" and self.bid is None:
            raise ValueError("rental.bid is required for an interruptible rental (the price per GPU-hour offered)")
        if self.kind != "interruptible" and self.bid is not None:
            raise ValueError(f"rental.bid is for interruptible rentals; a {self.kind} rental pays the listed price")
        if self.kind == "interruptible" and self.max_price is not None:
            raise ValueError("rental.max_price is for on_demand and reserved rentals; an interruptible one pays its bid")
        if self.kind == "reserved" and self.reserved_s is None:
            raise ValueError("rental.reserved_s is required for a reserved rental (the prepaid period, at least 3600 s)")
        if self.kind != "reserved" and self.reserved_s is not None:
            raise ValueError(f"rental.reserved_s is for reserved rentals, not {self.kind}")


LINK_KINDS = ("http", "tcp")  # http: reached by an HTTPS link (docs/links.md); tcp: by port-forward or SSH only


class PortLink(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a declared port is (docs/links.md): ``http`` ports get a link (a URL served through the tunnels),
    private to the owner unless ``public``."""

    port: PortNumber
    kind: str = "http"  # one of LINK_KINDS
    public: bool = False  # anyone with the URL may open it (no account, no token)

    def __post_init__(self) -> None:
        if self.kind not in LINK_KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of: {', '.join(LINK_KINDS)}")
        if self.public and self.kind != "http":
            raise ValueError(f"port {self.port}: only an http port can be public (a tcp port has no link)")


class WorkloadSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A renter's workload: ``replicas`` copies of one container, each on one host."""

    name: WorkloadName
    image: ImageRef
    command: Annotated[list[CommandArg], msgspec.Meta(max_length=256)] = []
    env: Annotated[dict[EnvName, EnvValue], msgspec.Meta(max_length=256)] = {}  # the renter's secrets
    ports: Annotated[list[PortNumber], msgspec.Meta(max_length=64)] = []  # container ports to expose
    replicas: Annotated[int, msgspec.Meta(ge=1, le=MAX_REPLICAS)] = 1
    replica: ReplicaSpec = msgspec.field(default_factory=ReplicaSpec)
    constraints: PlacementConstraints = msgspec.field(default_factory=PlacementConstraints)
    priority: ShortText = "normal"  # a priority class name
    project: ShortText = "default"
    max_duration_s: Annotated[float, msgspec.Meta(gt=0, le=366 * 86400.0)] | None = None
    # One of RESTART_POLICIES; None: what the renter means (``restart_policy_in_force``), which submit stores.
    restart_policy: str | None = None
    max_restarts: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3  # with on_failure or always
    placement: str | None = None  # one of PLACEMENTS; None: the policy's default
    labels: Annotated[dict[LabelKey, LabelValue], msgspec.Meta(max_length=64)] = {}
    rental: RentalTerms | None = None  # None: on demand at the listed price (answers always state the terms in force)
    # Credentials for a private image's registry: a secret like env's values, sent to the hosts only and never shown
    # again (answers give the username alone).
    registry_auth: RegistryAuth | None = None
    # The kind of each declared port that has one (docs/links.md); a port not listed is plain tcp.
    links: Annotated[list[PortLink], msgspec.Meta(max_length=64)] = []
    # Object storage (docs/storage.md): fetched before the command starts, uploaded at the end and on a period, one
    # checkpoint directory restored wherever the workload runs next; ``storage`` says where and names the key secret.
    inputs: Annotated[list[StorageMount], msgspec.Meta(max_length=16)] = []
    outputs: Annotated[list[StorageMount], msgspec.Meta(max_length=16)] = []
    checkpoint: CheckpointSpec | None = None
    storage: StorageAccess | None = None
    # SIGTERM to SIGKILL when the grid stops it (preemption, cancel, max duration, a drained host): long enough to
    # write and upload a checkpoint; None: the scheduler's grace. Bounded by the Master's max_stop_grace_s.
    stop_grace_s: Annotated[float, msgspec.Meta(ge=1, le=600)] | None = None
    # A gang's network (docs/overlay.md): "overlay", a private network its replicas reach each other on, with torchrun's
    # variables; "none" for replicas that need not reach each other (a Master without lighthouses takes only these).
    # One replica gets no network either way.
    network: Literal["overlay", "none"] = "overlay"

    def __post_init__(self) -> None:
        _require_finite("max_duration_s", self.max_duration_s)
        _require_finite("stop_grace_s", self.stop_grace_s)
        repeated = sorted({p for p in self.ports if self.ports.count(p) > 1})
        if repeated:
            raise ValueError(f"ports lists {', '.join(map(str, repeated))} more than once")
        linked = [link.port for link in self.links]
        if len(set(linked)) != len(linked):
            raise ValueError("links names a port more than once")
        undeclared = [port for port in linked if port not in self.ports]
        if undeclared:
            raise ValueError(f"links names port {undeclared[0]}, which ports does not declare; add it to ports")
        if self.restart_policy is not None and self.restart_policy not in RESTART_POLICIES:
            raise ValueError(f"restart_policy {self.restart_policy!r} is not one of: {', '.join(RESTART_POLICIES)}")
        if self.placement is not None and self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} is not one of: {', '.join(PLACEMENTS)} (or null for the default)")

    @property
    def restart_policy_in_force(self) -> str:
        """The restart policy the spec sets, else what a renter means by its other choices: work that keeps a checkpoint
        or is rented interruptible (a bid: preemption is part of the deal) resumes, ``on_failure``; other work ``never``."""
        if self.restart_policy is not None:
            return self.restart_policy
        interruptible = self.rental is not None and self.rental.kind == "interruptible"
        return "on_failure" if self.checkpoint is not None or interruptible else "never"

    @property
    def runs_image(self) -> bool:
        """False for image "none": the command runs on a process-runtime host itself, without a container engine."""
        return self.image != NO_IMAGE


class Assignment(msgspec.Struct, kw_only=True):
    """One replica placed on one host: the container that runs it and the create command that started it."""

    replica: int
    agent_id: str
    units: list[str]  # GPU uuids (or MIG instance ids) the container was given
    container: str  # its name on the host
    command_id: str = ""  # of the create_container command
    state: str = "pending"  # "pending" | "running" | "exited" | "deleting" | "deleted"
    overlay_fingerprint: str = ""  # of the overlay certificate its create carried (hex SHA-256); "" for none


class EndpointWorkerRef(msgspec.Struct, frozen=True, kw_only=True):
    """The serverless endpoint a worker workload serves, and which of its workers it is (docs/endpoints.md, "The
    autoscaler's shell"). Set only by the endpoint's autoscaler when it submits the workload, never from a renter's
    spec: the workloads API takes a ``WorkloadSpec``, which has no such field, so no renter can pose as a worker."""

    endpoint_id: str
    worker_id: str
    concurrency: int = 1  # requests the worker runs at once (its endpoint's, when it was asked for)


class WorkloadRecord(msgspec.Struct, kw_only=True):
    id: str  # "wl-" + random hex
    account: str  # the renter account that owns it
    spec: WorkloadSpec
    state: str  # see management.workloads.states.WorkloadState
    state_reason: str = ""
    created_at: float
    queued_at: float  # when it was submitted: its place in a FIFO queue, kept across requeues
    attempts: int = 0  # how many times it was scheduled
    scheduled_at: float | None = None
    started_at: float | None = None  # when its latest run started: kept by a requeue, cleared when it is placed again
    finished_at: float | None = None
    assignments: list[Assignment] = []
    restarts: int = 0
    preemptions: int = 0
    preempted_for: str = ""  # while preempted: the workload it is stopping for (kept across a Master restart)
    exit_codes: list[int] = []
    # Set by the transition that ended a run through a host (its container did not start, the host went offline or
    # away, a GPU became faulty): "<agent id>: why". Cleared when it is placed again. The market refunds the renter
    # and records a penalty in that host's reputation.
    host_failure: str = ""
    # The hosts where its container did not start through the host's fault (not the renter's request), oldest first:
    # the scheduler places it elsewhere, and past the lifecycle's start_retries it fails (management/workloads/lifecycle.py).
    start_failed_on: list[str] = []
    # A gang's overlay block ("100.64.1.0/25", docs/overlay.md), allocated at its first placement and kept while it is
    # open, so a replica that restarts or moves keeps its address; "" for a single replica or without an overlay.
    network: str = ""
    # Fingerprints of every overlay certificate its creates carried (newest last, at most OVERLAY_ISSUED_KEPT): a
    # replica's create blocks those its current containers do not hold, so a replica left on a lost host cannot take
    # the address of the replica that replaced it (docs/overlay.md).
    overlay_issued: list[str] = []
    detail: str = ""  # while it starts: how its image pull goes ("pulling image: 12.0 MB of 45.3 MB, ..."), from the host
    version: int = 0  # bumped on every write; a write naming an older version is refused (StaleWorkload)
    # The registry password of ``spec.registry_auth``, sealed with the Master's secrets.key at submit (the spec then holds
    # master.command_secrets.SEALED in its place); "": none, or a workload stored before passwords were sealed.
    sealed_registry_password: str = ""
    endpoint_worker: EndpointWorkerRef | None = None  # a serverless endpoint's worker (None: an ordinary workload)


# --- the market: prices, rentals, the ledger (docs/market.md) --------------------------------------------------


class PriceRecord(msgspec.Struct, kw_only=True):
    """A provider's prices, in micro-units per GPU-hour: for one host (``agent_id``), or its default for every host
    that has none of its own (``agent_id`` ""). Keyed by (provider, agent_id)."""

    provider: str
    agent_id: str = ""
    on_demand: int  # >= 0
    min_bid: int | None = None  # None: the host is not rented interruptible
    reserved_discount: float = 0.0  # fraction off on_demand for a prepaid reserved period, in [0, 0.9]
    max_duration_s: float | None = None  # the longest rental the host takes; None: no limit
    updated_at: float = 0.0


class RentalHost(msgspec.Struct, kw_only=True):
    """One host of a rental: who earns from it, how many GPUs (units) it gave, at what price per GPU-hour
    (micro-units) when the rental started: the listed price (on demand), the reserved price, or the bid."""

    agent_id: str
    provider: str
    gpus: int
    price: int
    units: list[str] = []


class PriceChange(msgspec.Struct, kw_only=True):
    """From ``at`` on, every host of the rental costs ``price`` micro-units per GPU-hour (an interruptible rental's
    bid raised or lowered)."""

    at: float
    price: int


class RentalRecord(msgspec.Struct, kw_only=True):
    """One run of a workload on its hosts, from the moment every container runs (charging starts) to its end.
    A workload that is requeued and placed again gets a new rental: its id is ``<workload id>-a<attempt>``."""

    id: str
    workload_id: str
    account: str  # the renter
    kind: str  # one of RENTAL_KINDS
    hosts: list[RentalHost]
    bid_changes: list[PriceChange] = []  # ascending ``at``, all after ``started_at``
    started_at: float  # charging starts: every container runs
    ended_at: float | None = None  # None while it runs; charging stops here (at the latest at its hosts' last heartbeat)
    end_reason: str = ""
    # Set when it ended through the host (a container that failed to start, the host offline mid-run, a GPU fault):
    # the renter is refunded the affected time and the host's reputation takes a penalty. For a person: why.
    host_failure: str = ""
    reserved_until: float | None = None  # reserved rentals: the end of the prepaid period
    rating: int | None = None  # 1..5, the renter's, once it has ended
    version: int = 0  # bumped on every write (optimistic concurrency)

    @property
    def gpus(self) -> int:
        return sum(h.gpus for h in self.hosts)


class LedgerLine(msgspec.Struct, kw_only=True):
    """One side of a ledger entry: ``amount`` micro-units onto ledger account ``account`` (negative: off it).
    ``host`` and ``workload`` say what the money was for, so statements can group by them."""

    account: str  # e.g. "renter:alice", "hold:alice", "provider:acme", "platform:fees", "external"
    amount: int
    host: str = ""
    workload: str = ""


class LedgerEntry(msgspec.Struct, kw_only=True):
    """A double-entry posting: its lines sum to zero. ``key`` makes it idempotent: an entry whose key is already in the
    ledger is not written again (e.g. ``charge:<rental>:<period>``), so a restarted Master neither charges twice nor
    skips a period."""

    key: str
    ts: float
    kind: str  # "credit" | "topup" | "hold" | "charge" | "refund" | "release" | "prepay" | "payout" | "adjust"
    memo: str  # why, for a person
    lines: list[LedgerLine]
    rental: str = ""  # the rental it belongs to, "" for none
    seq: int = 0  # assigned by the store, increasing


# --- alerting: rules, silences and webhooks an operator (or an owner) set through the API (management/monitoring/) ---


class AlertRuleRecord(msgspec.Struct, kw_only=True):
    """An alert rule put through the API: ``spec`` holds its fields as management/monitoring/rules.py reads them
    (the Master stores rules, it does not evaluate them). A stored rule replaces the shipped rule of its name."""

    name: str
    spec: RuleSpec
    updated_at: float
    updated_by: str


class SilenceRecord(msgspec.Struct, kw_only=True):
    """Notifications of matching alerts are held back until ``expires_at`` (each matcher set must agree)."""

    id: str
    expires_at: float
    created_at: float
    created_by: str
    rule: str | None = None
    subject: str | None = None
    labels: dict[str, str] = {}
    comment: str = ""


class WebhookRecord(msgspec.Struct, kw_only=True):
    """Where alert notifications are posted; ``secret`` signs them (shown once, when created). ``owner`` and
    ``role``: the account that created it and its role then, which decide what it is sent."""

    id: str
    url: str
    secret: str
    owner: str
    role: str
    created_at: float


class SshKeyRecord(msgspec.Struct, kw_only=True):
    """An SSH public key an account registered (docs/ssh.md): the platform's SSH end lets that account's sessions in
    with it. ``public_key`` is the OpenSSH line without its comment (``ssh-ed25519 AAAA...``); ``fingerprint`` is
    OpenSSH's ``SHA256:...`` of its blob, what a ticket names and what the agent compares."""

    id: str  # "sshk-" + random hex
    account: str
    name: str  # the key's comment, or what the account called it
    public_key: str
    fingerprint: str
    created_at: float


class LeaseRecord(msgspec.Struct, kw_only=True):
    """The leader lease Masters sharing one store contend for (master/leadership.py, docs/ha.md): who holds it, where
    relays (``url``, its link) and API callers (``api_url``) reach it, its ``epoch`` (raised with every change of
    holder, never lowered) and when it lapses unless renewed (``expires_at``, wall-clock seconds)."""

    holder: str
    url: str
    api_url: str
    epoch: int
    expires_at: float


OUTPUT_STATES = ("pending", "kept", "lost")


class KeptOutput(msgspec.Struct, kw_only=True):
    """A workload container's output, kept by the Master after the container is deleted (docs/workloads.md, "Output").

    ``pending`` from the moment the Master asks for the container's deletion (the host keeps the output meanwhile),
    ``kept`` once the Master has read it from the host, ``lost`` when the host kept none (it never started, the host
    left the grid) or it could not be read in time; ``reason`` says why.
    """

    id: str  # output_key(workload_id, replica, attempt) (management/store/outputs.py)
    workload_id: str
    account: str  # the workload's owner: who may read it
    replica: int
    attempt: int
    agent_id: str
    container: str
    state: str = "pending"  # one of OUTPUT_STATES
    reason: str = ""
    data: bytes = b""  # stdout and stderr together, the last bytes up to the bound (cut ones start with a marker)
    truncated: bool = False
    exit_code: int | None = None
    ended_at: float  # when the Master asked for the deletion: retention counts from here
    collected_at: float | None = None
    tries: int = 0  # reads from the host that failed (the host was offline, the tunnel broke)


# --- renters' secrets (docs/storage.md) ---------------------------------------------------------------------------


class SecretRecord(msgspec.Struct, kw_only=True):
    """One account's named secret; ``sealed`` is its value encrypted with the Master's secret key (master/secrets.py),
    so the store (and its backups) never hold the value in clear. Keyed by (account, name)."""

    account: str
    name: str
    sealed: str  # a Fernet token (URL-safe base64): encrypted and authenticated
    created_at: float
    size: int = 0  # the value's length in bytes, for lists (the value itself is never shown again)

    def __repr__(self) -> str:
        return f"SecretRecord(account={self.account!r}, name={self.name!r}, size={self.size})"

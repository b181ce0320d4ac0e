"""What the API answers: one msgspec struct per answer's shape, so the OpenAPI document (``openapi.py``) can state it.

The views (``management/views.py``) build these structs: each answer's shape is defined here, once, and the OpenAPI
document states it. The market's offers (``management/market/offers.py``) are still built as dicts;
``tests/management/test_api_responses.py`` encodes every view's output and decodes it as its struct, so a value of the
wrong type (or a key an offer adds and its struct lacks) fails the suite. Every struct
forbids unknown fields: its JSON Schema says ``additionalProperties: false``, and schemathesis holds the live server
to that (``tests/management/test_openapi_schemathesis.py``).

Records the views pass through unchanged (a host's facts, a GPU's fault, a reputation, an assignment, the scheduler's
filter counts) are described by their own structs from ``master``/``common``; what a view reshapes (times as RFC 3339
strings, money as decimal strings, a spec's env as its names) has its own struct here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from common.containers import WireSpec
from common.inventory import GpuReach, HostInfo
from common.wire import BenchmarkFigures
from management.scheduler.model import FilterCount, QuotaCheck
from master.port import Assignment, EventData, GpuFault, Reputation, WorkloadSpec

# An RFC 3339 UTC time with milliseconds, as ``views.rfc3339`` writes it; null (where allowed) for "never".
Time = Annotated[
    str, msgspec.Meta(pattern=r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z\Z", description="RFC 3339 UTC")
]
# Money: a decimal string in the grid's currency with at least two decimals, exact to the micro-unit ("2.50", "-0.000125").
Money = Annotated[str, msgspec.Meta(pattern=r"^-?[0-9]+\.[0-9]{2,6}\Z", description="a decimal amount in the grid's currency")]


class View(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every answer's struct: unknown fields are refused (``additionalProperties: false``)."""


# --- errors --------------------------------------------------------------------------------------------------------


class ErrorDetail(View):
    code: str  # "not_found", "bad_request", "rate_limited", ... (errors.STATUS_OF_CODE)
    message: str  # for a person: what was wrong and, where it can, what to do


class Error(View):
    """Every refusal and failure: ``{"error": {"code", "message"}}`` (management/http/errors.py)."""

    error: ErrorDetail


# --- hosts and GPUs ------------------------------------------------------------------------------------------------


class SampleView(View):
    uuid: str
    ts: Time | None
    utilization_pct: float
    memory_used_mib: int
    temperature_c: float | None
    power_w: float | None
    clock_sm_mhz: int | None
    ecc_corrected: int
    ecc_uncorrected: int
    clock_mem_mhz: int | None
    xid_count: int
    throttle_reasons: list[str]  # common.inventory.THROTTLE_REASONS


class PcieView(View):
    gen: int | None
    width: int | None


class MigInstanceView(View):
    uuid: str
    profile: str
    memory_mib: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    held_by: str | None


class MigView(View):
    enabled: bool
    instances: list[MigInstanceView]


class GpuVerificationView(View):
    """A GPU's latest measured verification (management/services/verification.py); ``label`` is what a person reads."""

    label: str  # "verified", "simulated", "unmeasured", "failed: late", ...
    status: str | None  # "verified" | "failed" | "refused"; None: never run
    code: str
    reason: str
    at: Time | None
    commit_s: float | None
    challenge_tflops: float | None
    figures: BenchmarkFigures | None


class GpuView(View):
    uuid: str
    agent_id: str
    index: int
    name: str
    model: str
    tier: str | None
    state: str
    flags: list[str]
    fault: GpuFault | None
    offered: bool
    memory_total_mib: int
    compute_capability: str
    pcie: PcieView
    nvlinks: int
    simulated: bool
    updated_at: Time | None
    telemetry: SampleView | None
    held_by: str | None
    mig: MigView
    verification: GpuVerificationView


class HostedReplicaView(View):
    workload_id: str
    name: str
    image: str
    replica: int
    gpus: list[str]
    container: str
    state: str
    container_state: str
    started_at: Time | None


class AgentView(View):
    id: str
    provider: str
    state: str
    state_reason: str
    region: str
    relay: str
    reachable: bool
    runtime: str | None
    isolation: str | None
    images: list[str]
    simulated: bool
    host: HostInfo | None
    enrolled_at: Time | None
    last_seen: Time | None
    connected_since: Time | None
    cert_serial: str
    cert_not_after: Time | None
    drained: bool
    containers: list[str]
    exited: dict[str, int]
    # The agent's GPU self-test: whether each GPU reaches a container of its runtime, what was seen, the fix.
    gpu_selftest: list[GpuReach]
    gpus: list[GpuView]
    reputation: Reputation
    workloads: list[HostedReplicaView]


class TierView(View):
    name: str
    description: str
    criteria: dict[str, Any]  # the policy file's criteria as written: open (master/tiers.py)
    examples: list[str]


# --- commands, tokens, events, signing keys ------------------------------------------------------------------------


class CommandView(View):
    id: str
    agent_id: str
    kind: str
    spec: WireSpec  # the command's body as signed (its kind's type, encoded), secrets redacted
    state: str
    created_at: Time | None
    deadline: Time | None
    sent_at: Time | None
    acked_at: Time | None
    finished_at: Time | None
    attempts: int
    key_id: str
    result: dict[str, Any] | None  # what the agent reported: its runtime's facts, open
    error: str | None


class CommandAccepted(View):
    id: str
    state: str


class EventView(View):
    seq: int
    ts: Time | None
    kind: str
    subject: str
    data: EventData


class TokenView(View):
    token: str  # shown this once
    provider: str
    expires_at: Time | None


class SigningKeyView(View):
    key_id: str
    public_key: str
    state: str
    created_at: Time | None
    retired_at: Time | None


# --- workloads -----------------------------------------------------------------------------------------------------


class RegistryAuthView(View):
    """A private image's registry credentials as answers show them: the username; the password never."""

    username: str


class WorkloadSpecView(WorkloadSpec, forbid_unknown_fields=True):
    """The spec as submitted, but ``env`` is the sorted list of its names: the values are never shown again."""

    env: list[str] = []  # type: ignore[assignment]
    registry_auth: RegistryAuthView | None = None  # type: ignore[assignment]


class RentalTermsView(View):
    """How a workload pays (the market's ``workload_terms``)."""

    kind: str
    currency: str
    max_price: str | None
    bid: str | None
    offer: str | None
    reserved_s: float | None
    rental: str | None
    price: Money | list[Money] | None  # a list when its hosts are priced differently
    per_hour: Money | None
    summary: str


class ExplanationView(View):
    """Why a queued workload waits (the scheduler's explanation, its two times as RFC 3339)."""

    job_id: str
    position: int
    queue_length: int
    ahead: list[str]
    filters: list[FilterCount]
    quota: QuotaCheck | None
    blocked_by: str | None
    reserved_start: Time | None
    estimated_start: Time | None
    fits_now: bool
    cannot_fit: str | None
    summary: str


class WorkloadView(View):
    id: str
    account: str
    name: str
    state: str
    state_reason: str
    spec: WorkloadSpecView
    created_at: Time | None
    queued_at: Time | None
    scheduled_at: Time | None
    started_at: Time | None
    finished_at: Time | None
    attempts: int
    restarts: int
    preemptions: int
    exit_codes: list[int]
    assignments: list[Assignment]
    host_failure: str | None
    detail: str  # while it starts: how its image pull goes, "" otherwise
    version: int
    rental: RentalTermsView


class OutputView(View):
    """The output kept of one replica's container of one attempt (its bytes: GET .../logs?replica=&attempt=)."""

    replica: int
    attempt: int
    state: str  # "pending" (its host still holds it) | "kept" | "lost" (``reason`` says why)
    host: str
    bytes: int
    truncated: bool  # only its last bytes are kept; the text starts with a marker that says how many were dropped
    exit_code: int | None
    reason: str
    ended_at: Time | None
    collected_at: Time | None


class ReplicaNetworkView(View):
    """A gang replica on its workload's overlay (docs/overlay.md): its address, and how it reaches each peer now."""

    replica: int
    address: str
    peers: dict[str, str]  # peer address -> "direct" or "relay" (as its host last said; empty before it said)


class NetworkView(View):
    network: str  # the workload's block of the overlay
    replicas: list[ReplicaNetworkView]


class TransferView(View):
    at: Time | None
    what: str  # inputs_fetched | checkpoint_restored | checkpoint_uploaded | outputs_uploaded | upload_failed
    host: str
    bytes: int
    seconds: float
    error: str


class StorageView(View):
    """A workload's data (docs/storage.md): its last checkpoint (when taken, its whole size), the checkpoint the
    latest run resumed from, the time its hosts spent moving data, the last failure, the latest transfers."""

    checkpoint_at: Time | None
    checkpoint_bytes: int | None
    checkpoint_uploads: int
    restored_from: Time | None
    transfer_s: float
    last_error: str
    recent: list[TransferView]


class WorkloadDetail(WorkloadView):
    """GET /api/v1/workloads/{id}: the workload, why it waits while it is queued (null otherwise), the output kept
    of its containers that were deleted, and a gang's private network (null for one replica, or with the overlay
    off)."""

    waiting: ExplanationView | None
    outputs: list[OutputView]
    network: NetworkView | None = None
    storage: StorageView | None = None  # null for a workload that names no storage


# --- accounts and API keys -----------------------------------------------------------------------------------------


class AccountView(View):
    id: str
    role: str
    name: str
    disabled: bool
    created_at: Time | None
    updated_at: Time | None
    share: float
    project_shares: dict[str, float]
    gpu_quota: int | None
    tier_quotas: dict[str, int]


class ApiKeyView(View):
    key_id: str
    account: str
    name: str
    created_at: Time | None
    last_used: Time | None
    revoked_at: Time | None


class IssuedApiKeyView(ApiKeyView):
    key: str  # shown this once


class WhoamiView(View):
    account: str
    role: str
    key_id: str
    key_name: str
    name: str


# --- the market: prices --------------------------------------------------------------------------------------------


class PriceTermsView(View):
    on_demand: Money
    min_bid: Money | None  # null: not rented interruptible
    reserved_discount: float
    reserved: Money
    max_duration_s: float | None


class PriceRecordView(PriceTermsView):
    provider: str
    agent_id: str | None  # null: the provider's default
    scope: Literal["host", "provider"]
    currency: str
    updated_at: Time | None


class HostPriceView(PriceTermsView):
    agent_id: str
    provider: str
    source: str  # the host's own, its provider's default, or the grid's
    currency: str


class PriceListing(View):
    currency: str
    grid_default: PriceTermsView
    items: list[PriceRecordView]


# --- the market: offers, money, rentals ----------------------------------------------------------------------------


class OfferView(View):
    id: str
    host: str
    provider: str
    region: str
    model: str
    num_gpus: int
    num_gpus_on_demand: int
    total_gpus: int
    gpu_ram: float
    tier: str
    compute_capability: str
    cuda: str
    price: Money
    min_bid: Money | None
    reserved_price: Money
    max_duration_s: float | None
    reliability: float
    inet_down: float | None
    inet_up: float | None
    cpu_cores: float
    ram_gib: float
    disk_gib: float | None
    verified: bool
    interruptible: bool
    runtime: str
    nvlink: bool
    score: float
    images: list[str]  # the images the host already has, warm first
    tflops: float | None  # measured dense tensor TFLOP/s (a passed verification run), None until measured
    memory_bandwidth_gbs: float | None
    tflops_per_price: float | None  # TFLOP/s per currency unit per GPU-hour


class EmptiedByView(View):
    condition: str
    position: int
    matched_before: int
    sentence: str


class OfferSearch(View):
    offers: list[OfferView]
    next_cursor: str | None
    total: int
    sort: str
    emptied_by: EmptiedByView | None


class FundsView(View):
    account: str
    currency: str
    available: Money
    held: Money
    running_per_hour: Money
    covers_s: float | None
    warning: str | None


class LedgerLineView(View):
    account: str
    amount: Money
    host: str | None
    workload: str | None


class LedgerEntryView(View):
    seq: int
    key: str
    ts: Time | None
    kind: str
    memo: str
    rental: str | None
    lines: list[LedgerLineView]


class Credited(View):
    """POST /api/v1/accounts/{id}/credit: the entry written and the balance after it."""

    entry: LedgerEntryView
    balance: FundsView


class StatementLineView(View):
    seq: int
    ts: Time | None
    key: str
    kind: str
    memo: str
    rental: str | None
    workload: str | None
    amount: Money
    balance: Money


class StatementView(View):
    accounts: list[str]
    currency: str
    after_seq: int
    opening: Money
    closing: Money
    lines: list[StatementLineView]
    next_after: int
    more: bool


class WorkloadSpendView(View):
    workload: str
    charged: Money
    refunded: Money
    net: Money


class HostEarningsView(View):
    agent_id: str
    gross: Money
    fee: Money
    refunded: Money
    net: Money


class PeriodEarningsView(View):
    label: str
    start: Time | None
    end: Time | None
    gross: Money
    fee: Money
    refunded: Money
    net: Money


class SpendStatements(View):
    account: str
    currency: str
    items: list[WorkloadSpendView]


class EarningsStatements(View):
    account: str
    currency: str
    items: list[HostEarningsView]


class PayoutStatements(View):
    account: str
    currency: str
    items: list[PeriodEarningsView]


class RentalHostView(View):
    agent_id: str
    provider: str
    gpus: int
    price: Money


class BidChangeView(View):
    at: Time | None
    price: Money


class RentalView(View):
    """A rental; ``account`` and ``workload`` are the renter's, absent from a provider's view."""

    id: str
    kind: str
    currency: str
    hosts: list[RentalHostView]
    bid_changes: list[BidChangeView]
    gpus: int
    started_at: Time | None
    ended_at: Time | None
    end_reason: str | None
    host_failure: str | None
    reserved_until: Time | None
    rating: int | None
    charged: Money
    account: str | msgspec.UnsetType = msgspec.UNSET
    workload: str | msgspec.UnsetType = msgspec.UNSET


# --- pages ---------------------------------------------------------------------------------------------------------


def page_of(item: type[msgspec.Struct]) -> type[msgspec.Struct]:
    """The ``{"items": [...], "next_cursor": str | null}`` shape of a list of ``item`` (management/http/paging.py),
    named ``<Item>Page`` (a name OpenAPI accepts, unlike a generic's ``Page[Item]``)."""
    name = item.__name__.removesuffix("View") + "Page"
    return msgspec.defstruct(
        name,
        [("items", list[item]), ("next_cursor", str | None)],  # type: ignore[valid-type]
        kw_only=True,
        forbid_unknown_fields=True,
        module=__name__,
    )


AgentPage = page_of(AgentView)
GpuPage = page_of(GpuView)
TierPage = page_of(TierView)
CommandPage = page_of(CommandView)
EventPage = page_of(EventView)
SigningKeyPage = page_of(SigningKeyView)
WorkloadPage = page_of(WorkloadView)
AccountPage = page_of(AccountView)
ApiKeyPage = page_of(ApiKeyView)
RentalPage = page_of(RentalView)


class TunnelGrantView(View):
    """POST /api/v1/workloads/{id}/tunnels: dial ``url`` with ``ticket`` in the X-Idlegrid-Ticket header before
    ``expires_at``, trusting ``ca_pem`` (the platform CA) for the relay's certificate."""

    id: str
    kind: str
    workload: str
    agent_id: str
    relay_id: str
    url: str
    ticket: str
    ca_pem: str
    expires_at: Time


# --- telemetry history ---------------------------------------------------------------------------------------------


class TelemetryPointView(View):
    """One step of one GPU: averages over its samples, maxima, and the error counters' highest value (counters since
    the agent started). ``minutes``: how many one-minute rollups it summarizes (fewer than the step: gaps)."""

    ts: Time  # the step's start
    minutes: int
    samples: int
    utilization_avg: float
    utilization_max: float
    memory_used_mib_avg: float | None
    memory_used_mib_max: int
    temperature_avg: float | None
    temperature_max: float | None
    power_avg_w: float | None
    power_max_w: float | None
    clock_sm_avg_mhz: float | None
    clock_mem_avg_mhz: float | None
    ecc_corrected: int
    ecc_uncorrected: int
    xid_count: int
    throttle_reasons: list[str]


class TelemetrySeriesView(View):
    gpu_uuid: str
    agent_id: str
    unit: str | None  # a workload's: the GPU or MIG instance it was given
    since: Time | None  # a workload's run: its bounds (until null: still running)
    until: Time | None
    points: list[TelemetryPointView]


class HostSampleView(View):
    """A host's latest reading of itself (common.inventory.HostSample); null fields: the host did not say."""

    ts: Time | None
    cpu_pct: float | None
    load_1m: float | None
    ram_used_mib: int | None
    ram_total_mib: int | None
    disk_used_gib: float | None
    disk_free_gib: float | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None


class HostPointView(View):
    """One step of a host's own readings: averages over its samples, maxima, the lowest free disk, the latest total
    memory, and the network's bytes per second over the minutes with data. Null: the host did not say."""

    ts: Time  # the step's start
    minutes: int
    samples: int
    cpu_pct_avg: float | None
    cpu_pct_max: float | None
    load_1m_avg: float | None
    ram_used_mib_avg: float | None
    ram_used_mib_max: int | None
    ram_total_mib: int | None
    disk_used_gib: float | None
    disk_free_gib_min: float | None
    net_rx_bytes_per_s: float | None
    net_tx_bytes_per_s: float | None


TelemetrySubject = Literal["gpu", "host", "workload"]


class TelemetryView(View):
    """A GPU's, a host's or a workload's telemetry history: a series per GPU (per GPU and run for a workload)."""

    subject: TelemetrySubject
    id: str
    from_: Time = msgspec.field(name="from")
    to: Time
    step_s: int
    resolution_s: int  # 60: read from the one-minute rollups; 3600: from the hourly ones
    host: HostSampleView | None  # a host's answer: its latest sample of itself; null otherwise
    host_points: list[HostPointView] | None  # a host's answer: its own history at the step; null otherwise
    series: list[TelemetrySeriesView]

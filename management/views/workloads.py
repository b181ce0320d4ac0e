"""Workloads as their owner and the operator see them: the spec as submitted (the env's values and the registry
password never shown again), how it pays (``rental``), why it waits, the output kept of its containers, a gang's
network and what moved of its data."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import msgspec

from common.overlay import replica_address
from management.market.money import format_amount
from management.scheduler.model import Explanation, FilterCount, QuotaCheck
from management.services.market import WorkloadTerms
from management.views.base import Money, StructFields, Time, View, page_of, rfc3339
from management.workloads.storage import StorageSummary
from master.port import (
    Assignment,
    KeptOutput,
    SpecJson,
    WorkloadRecord,
    WorkloadSpec,
)


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


WorkloadPage = page_of(WorkloadView)


def redact_registry_auth(spec: SpecJson) -> SpecJson:
    """A spec with its registry credentials reduced to the username: the password is the renter's secret, sent to the
    hosts only and never shown again, to anyone (the operator's command list included). ``spec`` is JSON (a command's
    stored body, a workload spec as builtins) and so is what it returns: a view."""
    auth = spec.get("registry_auth")
    if not isinstance(auth, Mapping):
        return dict(spec)
    return {**spec, "registry_auth": {"username": auth.get("username", "")}}


def output_view(kept: KeptOutput) -> OutputView:
    """What is kept of a deleted container's output, without the bytes."""
    return OutputView(
        replica=kept.replica,
        attempt=kept.attempt,
        state=kept.state,
        host=kept.agent_id,
        bytes=len(kept.data),
        truncated=kept.truncated,
        exit_code=kept.exit_code,
        reason=kept.reason,
        ended_at=rfc3339(kept.ended_at),
        collected_at=rfc3339(kept.collected_at),
    )


def workload_spec_view(workload: WorkloadRecord) -> WorkloadSpecView:
    """The spec as submitted, but the env's values are the renter's secrets: they go to the containers only, and are
    never shown again, to anyone (the names are, so a renter can check what it sent); so is the registry password."""
    spec = msgspec.to_builtins(workload.spec)
    spec["env"] = sorted(workload.spec.env)
    return msgspec.convert(redact_registry_auth(spec), WorkloadSpecView)


def workload_view(workload: WorkloadRecord, terms: WorkloadTerms) -> WorkloadView:
    """A workload as its owner and the operator see it. ``terms``: how it pays (the market's ``workload_terms``),
    stated in every answer about a workload as ``rental``."""
    return WorkloadView(**_workload_fields(workload, terms))


def workload_detail(
    workload: WorkloadRecord,
    terms: WorkloadTerms,
    waiting: Explanation | None,
    outputs: Sequence[KeptOutput],
    paths: Mapping[int, dict[str, str]] | None = None,
    storage: StorageSummary | None = None,
) -> WorkloadDetail:
    """One workload: its view, why it waits while it is queued (None otherwise), the output kept of its deleted
    containers, a gang's network with each replica's address and how it reaches its peers (``paths``: replica ->
    peer -> "direct" or "relay", from WorkloadsService.network_paths), and what moved of its data (``storage``)."""
    return WorkloadDetail(
        **_workload_fields(workload, terms),
        waiting=explanation_view(waiting) if waiting is not None else None,
        outputs=[output_view(kept) for kept in outputs],
        network=network_view(workload, paths or {}) if workload.network else None,
        storage=storage_view(storage) if storage is not None else None,
    )


def storage_view(s: StorageSummary) -> StorageView:
    return StorageView(
        checkpoint_at=rfc3339(s.checkpoint_at),
        checkpoint_bytes=s.checkpoint_bytes,
        checkpoint_uploads=s.checkpoint_uploads,
        restored_from=rfc3339(s.restored_at),
        transfer_s=round(s.transfer_s, 3),
        last_error=s.last_error,
        recent=[
            TransferView(at=rfc3339(t.at), what=t.what, host=t.host, bytes=t.bytes, seconds=round(t.seconds, 3), error=t.error)
            for t in s.recent
        ],
    )


def network_view(workload: WorkloadRecord, paths: Mapping[int, dict[str, str]]) -> NetworkView:
    replicas = [
        ReplicaNetworkView(replica=r, address=replica_address(workload.network, r), peers=dict(paths.get(r, {})))
        for r in range(workload.spec.replicas)
    ]
    return NetworkView(network=workload.network, replicas=replicas)


def _workload_fields(workload: WorkloadRecord, terms: WorkloadTerms) -> StructFields:
    return {
        "id": workload.id,
        "account": workload.account,
        "name": workload.spec.name,
        "state": workload.state,
        "state_reason": workload.state_reason,
        "spec": workload_spec_view(workload),
        "created_at": rfc3339(workload.created_at),
        "queued_at": rfc3339(workload.queued_at),
        "scheduled_at": rfc3339(workload.scheduled_at),
        "started_at": rfc3339(workload.started_at),
        "finished_at": rfc3339(workload.finished_at),
        "attempts": workload.attempts,
        "restarts": workload.restarts,
        "preemptions": workload.preemptions,
        "exit_codes": workload.exit_codes,
        "assignments": list(workload.assignments),
        "host_failure": workload.host_failure or None,
        "detail": workload.detail,  # while it starts: how its image pull goes
        "version": workload.version,
        "rental": rental_terms_view(terms),
    }


def rental_terms_view(t: WorkloadTerms) -> RentalTermsView:
    """How a workload pays: its terms as submitted, its price per GPU-hour (a list when its hosts are priced
    differently, null while undecided) and per hour as decimal strings, and the market's sentence."""
    prices = [format_amount(p) for p in t.prices]
    return RentalTermsView(
        kind=t.terms.kind,
        currency=t.currency,
        max_price=t.terms.max_price,
        bid=t.terms.bid,
        offer=t.terms.offer,
        reserved_s=t.terms.reserved_s,
        rental=t.rental,
        price=None if not prices else prices[0] if len(prices) == 1 else prices,
        per_hour=format_amount(t.per_hour) if t.per_hour is not None else None,
        summary=t.summary,
    )


def explanation_view(explanation: Explanation) -> ExplanationView:
    """Why a workload waits: the scheduler core's explanation as it is (its sentences already speak of workloads and
    print times for people), with its two times as RFC 3339."""
    fields = {field.name: getattr(explanation, field.name) for field in dataclasses.fields(explanation)}
    fields["reserved_start"] = rfc3339(explanation.reserved_start)
    fields["estimated_start"] = rfc3339(explanation.estimated_start)
    return ExplanationView(**fields)

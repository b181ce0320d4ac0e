"""Disputes as the API answers them (docs/disputes.md): the dispute, its evidence, the provider's answer, the
operator's resolution, with amounts as decimal strings."""

from __future__ import annotations

from typing import Literal

from management.market.money import format_amount
from management.payments.disputes import DisputeRecord, EventEvidence, Evidence
from management.views.base import Money, Time, View, page_of, rfc3339
from master.port import EventData


class ChargeEvidenceView(View):
    """One ledger entry of the rental: ``amount`` its net on the renter's accounts (available and held)."""

    key: str
    kind: str
    at: Time | None
    memo: str
    amount: Money


class EventEvidenceView(View):
    at: Time | None
    kind: str
    subject: str
    data: EventData


class TelemetryEvidenceView(View):
    minutes: int  # minutes with the host's own samples in the rental's span
    gpu_minutes: int  # GPU-minutes with samples of the rental's GPUs
    utilization_avg: float | None
    temperature_max: float | None
    ecc_uncorrected_max: int


class EvidenceView(View):
    """Gathered when the dispute was opened: the meter's seconds and charges, the host's telemetry, faults and
    container exits in the rental's span (a minute either side), the verification history of its GPUs."""

    started_at: Time | None
    ended_at: Time | None
    seconds: int
    end_reason: str
    host_failure: str | None
    charges: list[ChargeEvidenceView]
    telemetry: TelemetryEvidenceView
    faults: list[EventEvidenceView]
    exits: list[EventEvidenceView]
    verification: list[EventEvidenceView]
    truncated: bool  # the host's history was longer than what was read


class DisputeView(View):
    id: str
    rental: str
    workload: str
    account: str  # the renter
    agent_id: str  # the disputed host
    provider: str
    state: Literal["open", "answered", "resolved"]
    reason: str
    created_at: Time | None
    disputable: Money  # what the renter paid for the host in the rental, net of refunds (the platform's fee apart)
    held: Money  # held off the provider's earnings until the resolution
    fee: Money  # the platform's fee on those charges (returned too on a full refund)
    answer: str | None
    answered_at: Time | None
    resolution: Literal["full", "partial", "none"] | None
    refunded: Money
    released: Money
    note: str | None
    resolved_at: Time | None
    resolved_by: str | None
    evidence: EvidenceView | None


DisputePage = page_of(DisputeView)


def _event(e: EventEvidence) -> EventEvidenceView:
    return EventEvidenceView(at=rfc3339(e.ts), kind=e.kind, subject=e.subject, data=e.data)


def evidence_view(ev: Evidence) -> EvidenceView:
    t = ev.telemetry
    return EvidenceView(
        started_at=rfc3339(ev.started_at),
        ended_at=rfc3339(ev.ended_at),
        seconds=ev.seconds,
        end_reason=ev.end_reason,
        host_failure=ev.host_failure or None,
        charges=[
            ChargeEvidenceView(key=c.key, kind=c.kind, at=rfc3339(c.ts), memo=c.memo, amount=format_amount(c.amount))
            for c in ev.charges
        ],
        telemetry=TelemetryEvidenceView(
            minutes=t.minutes,
            gpu_minutes=t.gpu_minutes,
            utilization_avg=t.utilization_avg,
            temperature_max=t.temperature_max,
            ecc_uncorrected_max=t.ecc_uncorrected_max,
        ),
        faults=[_event(e) for e in ev.faults],
        exits=[_event(e) for e in ev.exits],
        verification=[_event(e) for e in ev.verification],
        truncated=ev.truncated,
    )


def dispute_view(rec: DisputeRecord) -> DisputeView:
    return DisputeView(
        id=rec.id,
        rental=rec.rental_id,
        workload=rec.workload_id,
        account=rec.account,
        agent_id=rec.agent_id,
        provider=rec.provider,
        state=rec.state,
        reason=rec.reason,
        created_at=rfc3339(rec.created_at),
        disputable=format_amount(rec.disputable),
        held=format_amount(rec.held),
        fee=format_amount(rec.fee),
        answer=rec.answer or None,
        answered_at=rfc3339(rec.answered_at),
        resolution=rec.resolution,
        refunded=format_amount(rec.refunded),
        released=format_amount(rec.released),
        note=rec.note or None,
        resolved_at=rfc3339(rec.resolved_at),
        resolved_by=rec.resolved_by or None,
        evidence=evidence_view(rec.evidence) if rec.evidence is not None else None,
    )

"""Disputes of rentals (docs/disputes.md): the one writer of dispute records and of the ledger entries that hold and
release their amounts. The rules are management/payments/disputes.py's (pure); this service reads the rental, its
ledger entries and the host's history, and stores what the rules decide.

Who may do what (the API's permissions: management/access_control.py): a renter opens a dispute of its own ended rental
within ``window_s`` of its end (another's rental answers 404, as reading it does); the provider of the disputed host
answers it (a dispute about another provider's host: 404); the operator opens (for the renter), answers and resolves
any. Reads follow the same lines. One dispute per rental and host.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Annotated

import msgspec

from common.errors import Conflict, NotFound
from management.market.ledger import FEES, LedgerBook, hold_account, provider_account, renter_account
from management.payments.disputes import (
    STATE_FILTERS,
    ChargeEvidence,
    DisputeRecord,
    EventEvidence,
    Evidence,
    StateFilter,
    TelemetryEvidence,
    check_window,
    clean_text,
    disputed_host,
    held_amount,
    hold_entry,
    new_dispute_id,
    paid_for_host,
    refund_of,
    resolve_entry,
)
from management.services.models import KeyText, Page, page_of
from management.store.disputes import DisputeRepo
from management.store.rentals import RentalRepo
from master.port import EventRecord, LedgerEntry, MasterPort, RentalRecord

OPENED_EVENT = "disputes.opened"
ANSWERED_EVENT = "disputes.answered"
RESOLVED_EVENT = "disputes.resolved"
EVENT_PAGE = 500
EVENT_PAGES = 20  # at most this many pages of a subject's history are read for the evidence
MARGIN_S = 60.0  # the evidence's span: the rental's, and a minute either side
FAULT_KINDS = ("gpu.fault", "gpu.hardware_error", "gpu.transition", "agent.transition")


def _scope(owner: str | None, role: str) -> tuple[str | None, str | None]:
    """The (account, provider) filters of what ``owner`` may list: a renter its own, a provider those about its hosts."""
    return (owner if role == "renter" else None), (owner if role == "provider" else None)


class DisputeKey(msgspec.Struct, array_like=True, frozen=True):
    """Where a page of disputes ends: the last one's creation time and id (the list is newest first)."""

    created_at: Annotated[float, msgspec.Meta(ge=0, le=1e11)]
    id: KeyText


class DisputeService:
    def __init__(
        self,
        master: MasterPort,
        disputes: DisputeRepo,
        rentals: RentalRepo,
        ledger: LedgerBook,
        *,
        window_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._master = master
        self._disputes = disputes
        self._rentals = rentals
        self._ledger = ledger
        self.window_s = window_s
        self._clock = clock
        self._lock = asyncio.Lock()

    # --- reading ---------------------------------------------------------------------------------------------------

    async def get(self, dispute_id: str, *, owner: str | None, role: str) -> DisputeRecord:
        rec = await self._disputes.get(dispute_id)
        if rec is None or not _visible(rec, owner, role):
            raise NotFound(f"no dispute {dispute_id!r}")
        return rec

    async def list_disputes(
        self, *, owner: str | None, role: str, rental_id: str | None = None, limit: int = 100
    ) -> list[DisputeRecord]:
        """A renter's own disputes, a provider's (about its hosts), or (operator) all; newest first."""
        account, provider = _scope(owner, role)
        return await self._disputes.list(account=account, provider=provider, rental_id=rental_id, limit=limit)

    async def page(
        self,
        *,
        owner: str | None,
        role: str,
        rental_id: str | None,
        after: DisputeKey | None,
        limit: int,
        state: StateFilter | None = None,
    ) -> Page[DisputeRecord]:
        """A page of what ``list_disputes`` lists (only those ``state`` keeps: STATE_FILTERS), starting after
        ``after``."""
        account, provider = _scope(owner, role)
        before = (after.created_at, after.id) if after is not None else None
        states = STATE_FILTERS[state] if state is not None else None
        found = await self._disputes.list(
            account=account, provider=provider, rental_id=rental_id, states=states, before=before, limit=limit + 1
        )
        return page_of(found, limit, lambda rec: DisputeKey(rec.created_at, rec.id))

    # --- writing ---------------------------------------------------------------------------------------------------

    async def open(self, rental_id: str, reason: str, *, agent_id: str | None, owner: str | None) -> DisputeRecord:
        """The renter's dispute of its ended rental (the host named, or its only host): the evidence gathered, the
        amount paid for the host held off its provider's earnings (``dispute:<id>:hold``)."""
        why = clean_text(reason, "reason", required=True)
        rental = await self._rentals.get(rental_id)
        if rental is None or (owner is not None and rental.account != owner):
            raise NotFound(f"no rental {rental_id!r}")
        now = self._clock()
        check_window(rental, now, self.window_s)
        host_id = disputed_host(rental, agent_id)
        host = next(h for h in rental.hosts if h.agent_id == host_id)
        async with self._lock:
            taken = [d for d in await self._disputes.list(rental_id=rental.id, limit=100) if d.agent_id == host_id]
            if taken:
                raise Conflict(f"rental {rental.id} on {host_id} is already disputed ({taken[0].id})")
            entries = await self._ledger.rental_entries(rental.id)
            disputable, fee = paid_for_host(entries, provider_account(host.provider), host_id)
            rec = DisputeRecord(
                id=new_dispute_id(),
                rental_id=rental.id,
                workload_id=rental.workload_id,
                account=rental.account,
                agent_id=host_id,
                provider=host.provider,
                reason=why,
                created_at=now,
                disputable=disputable,
                held=0,
                fee=fee,
                evidence=await self._evidence(rental, host_id, entries),
                version=1,
            )

            def compute() -> list[LedgerEntry]:
                rec.held = held_amount(disputable, self._ledger.balances(), host.provider)
                entry = hold_entry(rec, now)
                return [entry] if entry is not None else []

            await self._ledger.post_computed(compute)
            await self._disputes.put(rec)
        await self._master.record_event(
            OPENED_EVENT, rental.account, dispute=rec.id, rental=rental.id, agent_id=host_id, provider=host.provider,
            held=rec.held,
        )  # fmt: skip
        return rec

    async def answer(self, dispute_id: str, text: str, *, owner: str | None, role: str) -> DisputeRecord:
        """The provider's side (it replaces an earlier answer) while the dispute is not resolved."""
        said = clean_text(text, "answer", required=True)
        async with self._lock:
            rec = await self.get(dispute_id, owner=owner, role=role)
            if rec.state == "resolved":
                raise Conflict(f"dispute {rec.id} is resolved ({rec.resolution}); it takes no more answers")
            rec = msgspec.structs.replace(rec, answer=said, answered_at=self._clock(), state="answered", version=rec.version + 1)
            await self._disputes.put(rec)
        await self._master.record_event(ANSWERED_EVENT, rec.provider, dispute=rec.id, rental=rec.rental_id)
        return rec

    async def resolve(self, dispute_id: str, resolution: str, amount: int | None, note: str, *, by: str) -> DisputeRecord:
        """The operator's decision, final: ``full`` (everything held and the platform's fee back to the renter),
        ``partial`` (``amount`` of what is held to the renter, the rest to the provider) or ``none`` (all to the
        provider); one ledger entry, ``dispute:<id>:resolve``."""
        why = clean_text(note, "note", required=False)
        async with self._lock:
            rec = await self.get(dispute_id, owner=None, role="operator")
            if rec.state == "resolved":
                raise Conflict(f"dispute {rec.id} was already resolved ({rec.resolution}) by {rec.resolved_by}")
            refund, fee_back = refund_of(rec, resolution, amount)
            now = self._clock()
            returned: list[int] = []

            def compute() -> list[LedgerEntry]:
                entry, fee = resolve_entry(rec, refund, fee_back, self._ledger.balance(FEES), now, by)
                returned.append(fee)
                return [entry] if entry is not None else []

            await self._ledger.post_computed(compute)
            rec = msgspec.structs.replace(
                rec,
                state="resolved",
                resolution=resolution,  # refund_of accepted it: one of RESOLUTIONS
                refunded=refund + returned[0],
                released=rec.held - refund,
                note=why,
                resolved_at=now,
                resolved_by=by,
                version=rec.version + 1,
            )
            await self._disputes.put(rec)
        await self._master.record_event(
            RESOLVED_EVENT, rec.account, dispute=rec.id, rental=rec.rental_id, resolution=resolution,
            refunded=rec.refunded, released=rec.released, by=by,
        )  # fmt: skip
        return rec

    # --- the evidence ----------------------------------------------------------------------------------------------

    async def _evidence(self, rental: RentalRecord, agent_id: str, entries: Iterable[LedgerEntry]) -> Evidence:
        ended = rental.ended_at if rental.ended_at is not None else self._clock()
        since, until = rental.started_at - MARGIN_S, ended + MARGIN_S
        renter = {renter_account(rental.account), hold_account(rental.account)}
        charges = [
            ChargeEvidence(
                key=e.key,
                kind=e.kind,
                ts=e.ts,
                memo=e.memo,
                amount=sum(ln.amount for ln in e.lines if ln.account in renter),
            )
            for e in entries
        ]
        host = next(h for h in rental.hosts if h.agent_id == agent_id)
        host_events, cut = await self._events(agent_id, since, until)
        faults = [_fact(e) for e in host_events if e.kind in FAULT_KINDS]
        exits = [
            _fact(e)
            for e in host_events
            if e.kind == "container.exited" and str(e.data.get("container", "")).startswith(f"{rental.workload_id}-")
        ]
        verification: list[EventEvidence] = []
        for unit in host.units:
            unit_events, unit_cut = await self._events(unit, since, until)
            cut = cut or unit_cut
            faults += [_fact(e) for e in unit_events if e.kind in FAULT_KINDS]
            verification += [_fact(e) for e in unit_events if e.kind == "gpu.verification"]
        return Evidence(
            started_at=rental.started_at,
            ended_at=rental.ended_at,
            seconds=int(max(0.0, ended - rental.started_at)),
            end_reason=rental.end_reason,
            host_failure=rental.host_failure,
            charges=charges,
            telemetry=await self._telemetry(agent_id, host.units, since, until),
            faults=sorted(faults, key=lambda f: f.ts),
            exits=exits,
            verification=sorted(verification, key=lambda f: f.ts),
            truncated=cut,
        )

    async def _events(self, subject: str, since: float, until: float) -> tuple[list[EventRecord], bool]:
        """The subject's events in [since, until], and whether its history was longer than what is read."""
        found: list[EventRecord] = []
        after = 0
        for _ in range(EVENT_PAGES):
            page = await self._master.events_after(subject=subject, after_seq=after, limit=EVENT_PAGE)
            found += [e for e in page if since <= e.ts <= until]
            if len(page) < EVENT_PAGE:
                return found, False
            after = page[-1].seq
            if page[-1].ts > until:
                return found, False
        return found, True

    async def _telemetry(self, agent_id: str, units: list[str], since: float, until: float) -> TelemetryEvidence:
        first, last = int(since // 60), int(until // 60)
        host_minutes = await self._master.store.host_rollups.list(agent_id, since_minute=first, until_minute=last)
        gpu_minutes = []
        for unit in units:
            gpu_minutes += await self._master.store.rollups.list(unit, since_minute=first, until_minute=last)
        temps = [r.temperature_max for r in gpu_minutes if r.temperature_max is not None]
        return TelemetryEvidence(
            minutes=sum(1 for r in host_minutes if r.samples),
            gpu_minutes=sum(1 for r in gpu_minutes if r.samples),
            utilization_avg=sum(r.utilization_avg for r in gpu_minutes) / len(gpu_minutes) if gpu_minutes else None,
            temperature_max=max(temps) if temps else None,
            ecc_uncorrected_max=max((r.ecc_uncorrected for r in gpu_minutes), default=0),
        )


def _fact(event: EventRecord) -> EventEvidence:
    return EventEvidence(ts=event.ts, kind=event.kind, subject=event.subject, data=dict(event.data))


def _visible(rec: DisputeRecord, owner: str | None, role: str) -> bool:
    if owner is None:
        return True
    if role == "renter":
        return rec.account == owner
    if role == "provider":
        return rec.provider == owner
    return False

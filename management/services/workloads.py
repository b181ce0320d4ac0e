"""Renters' workloads: submit (money before work), read, list, explain why one waits, cancel, and the console's
overview of one.

``account``: the renter account a call is limited to (the API's ``Scope.owner``), None for the operator; another
account's workload answers NotFound, as a missing one does. The workload book is loaded by the composition root
(management/app.py) before the first call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from common.errors import Conflict, NotFound
from management.scheduler.model import Explanation
from management.services.market import MarketService, RentalDetail, WorkloadTerms
from management.services.models import Page, page_of
from management.store import output_repo
from management.store.workloads import workload_order
from management.workloads.book import WorkloadBook
from management.workloads.runner import SchedulerLoop
from management.workloads.states import WorkloadState
from management.workloads.storage import STORAGE_EVENT_PREFIX, StorageSummary, summarize
from master.port import EventRecord, KeptOutput, MasterPort, WorkloadRecord, WorkloadSpec

EVENTS_PAGE = 500  # storage reports read per store call


class WorkloadKey(msgspec.Struct, array_like=True, frozen=True):
    listed: Annotated[str, msgspec.Meta(max_length=160)]  # management.store.workloads.workload_order of the last item


@dataclass(frozen=True)
class WorkloadOverview:
    """Everything the console's workload page shows, read in one call: the record, why it waits (while queued), how
    it pays (the market's terms), its events (oldest first), its rentals and what they charged so far, and the output
    kept of its deleted containers (by replica, then attempt)."""

    workload: WorkloadRecord
    explanation: Explanation | None
    terms: WorkloadTerms
    events: list[EventRecord]
    rentals: list[RentalDetail]
    charged: int  # micro-units, refunds taken off
    currency: str
    outputs: list[KeptOutput] = field(default_factory=list)


@dataclass(frozen=True)
class WorkloadRuns:
    """A workload's charge so far (micro-units, refunds taken off), the hosts it ran on (first placed first) and how
    long its rentals ran (charged time, every attempt; None before its first started)."""

    charged: int
    hosts: list[str]
    ran_s: float | None


class WorkloadsService:
    EVENTS_SHOWN = 200  # an overview's newest events

    def __init__(self, master: MasterPort, book: WorkloadBook, scheduler: SchedulerLoop, market: MarketService) -> None:
        self._master = master
        self.book = book  # the one writer of workload records, shared with the scheduling loop
        self.scheduler = scheduler  # its loop runs where the composition root started it; explaining needs its snapshot
        self._market = market

    async def submit_workload(self, account: str, spec: WorkloadSpec) -> WorkloadRecord:
        await self._market.admit(account, spec)  # money before work: 402 with the figures
        return await self.book.submit(account, spec, time.time())

    async def get_workload(self, workload_id: str, *, account: str | None = None) -> WorkloadRecord:
        return await self.book.get(workload_id, account=account)

    async def list_workloads(
        self,
        *,
        account: str | None = None,
        states: list[str] | None = None,
        owner: str | None = None,
        after: WorkloadKey | None = None,
        limit: int,
    ) -> Page[WorkloadRecord]:
        """Newest first (by creation time, then id); a page continues strictly after the last one's key. ``owner``
        limits it to one account whatever ``account`` asks (another account's filter finds nothing)."""
        if owner is not None:
            if account is not None and account != owner:
                return Page([], None)
            account = owner
        found = await self.book.list(account=account, states=states, before=after.listed if after else None, limit=limit + 1)
        return page_of(found, limit, lambda w: WorkloadKey(workload_order(w.created_at, w.id)))

    async def runs_of(self, records: list[WorkloadRecord], *, now: float) -> dict[str, WorkloadRuns]:
        """What a list of workloads shows of each (already read within the caller's scope): its charge so far, its
        hosts and how long it ran, from its rentals (every attempt) and its current placements. One rentals read per
        workload."""
        runs: dict[str, WorkloadRuns] = {}
        for record in records:
            rentals, _ = await self._market.list_rentals(
                owner=None, role="operator", workload=record.id, agent_id=None, open_only=False, after=None, limit=100
            )
            hosts = [a.agent_id for a in record.assignments]
            hosts += [h.agent_id for r in rentals for h in r.rental.hosts]
            ran = sum(max(0.0, (r.rental.ended_at or now) - r.rental.started_at) for r in rentals) if rentals else None
            runs[record.id] = WorkloadRuns(charged=sum(r.charged for r in rentals), hosts=list(dict.fromkeys(hosts)), ran_s=ran)
        return runs

    async def resubmit(self, workload_id: str, *, account: str | None = None) -> WorkloadRecord:
        """Submit the workload's spec again, as a new workload of its owner (the console's Restart): its registry
        password opened from the record, where it is kept sealed. NotFound for another account's."""
        record = await self.book.get(workload_id, account=account)
        spec = record.spec
        if spec.registry_auth is not None and record.sealed_registry_password:
            password = self._master.secrets.unseal(record.sealed_registry_password)
            auth = msgspec.structs.replace(spec.registry_auth, password=password)
            spec = msgspec.structs.replace(spec, registry_auth=auth)
        return await self.submit_workload(record.account, spec)

    def network_paths(self, record: WorkloadRecord) -> dict[int, dict[str, str]]:
        """A gang's replicas' overlay paths (replica -> peer address -> "direct" or "relay"), as their hosts last said."""
        if not record.network:
            return {}
        return {a.replica: self._master.overlay_paths(a.agent_id, a.container) for a in record.assignments}

    async def workload_and_wait(
        self, workload_id: str, *, account: str | None = None
    ) -> tuple[WorkloadRecord, Explanation | None]:
        """The workload and, while it is queued, why it waits."""
        record = await self.get_workload(workload_id, account=account)
        if record.state != WorkloadState.QUEUED:
            return record, None
        try:
            return record, await self.scheduler.explain(workload_id)
        except NotFound:  # placed or cancelled between the two reads
            return await self.get_workload(workload_id, account=account), None

    async def explain_workload(self, workload_id: str, *, account: str | None = None) -> Explanation:
        """Why a queued workload waits, constraint by constraint; Conflict for one that does not wait."""
        record = await self.get_workload(workload_id, account=account)
        if record.state != WorkloadState.QUEUED:
            raise Conflict(f"workload {workload_id} is {record.state} ({record.state_reason}); only a queued workload waits")
        return await self.scheduler.explain(workload_id)

    async def workload_outputs(self, workload_id: str) -> list[KeptOutput]:
        """The output kept of a workload's deleted containers, by replica then attempt (the caller has checked who may
        see the workload)."""
        kept = await output_repo(self._master.store).list(workload_id=workload_id)
        return sorted(kept, key=lambda k: (k.replica, k.attempt))

    async def workload_storage(self, record: WorkloadRecord) -> StorageSummary | None:
        """What moved of the workload's data (its hosts' reports), None for a workload that names no storage."""
        if not (record.spec.inputs or record.spec.outputs or record.spec.checkpoint):
            return None
        events: list[EventRecord] = []
        after = 0
        while True:  # every report, oldest first (a checkpoint every few minutes: a long run has thousands)
            page = await self._master.events_after(
                subject=record.id, kind_prefix=STORAGE_EVENT_PREFIX, after_seq=after, limit=500
            )
            events += page
            if len(page) < 500:
                return summarize(events)
            after = page[-1].seq

    async def cancel_workload(self, workload_id: str, *, account: str | None = None) -> WorkloadRecord:
        return await self.book.cancel(workload_id, account, time.time())

    async def workload_overview(self, workload_id: str, *, account: str | None = None) -> WorkloadOverview:
        """The workload (NotFound for another account's), why it waits, its terms, events, rentals and charge."""
        record, explanation = await self.workload_and_wait(workload_id, account=account)
        events = await self._master.events_after(subject=workload_id, kind_prefix=None, after_seq=0, limit=10_000)
        rentals, _ = await self._market.list_rentals(
            owner=None, role="operator", workload=workload_id, agent_id=None, open_only=False, after=None, limit=100
        )
        return WorkloadOverview(
            workload=record,
            explanation=explanation,
            terms=self._market.workload_terms(record),
            events=events[-self.EVENTS_SHOWN :],
            rentals=rentals,
            charged=sum(r.charged for r in rentals),
            currency=self._market.currency,
            outputs=await self.workload_outputs(workload_id),
        )

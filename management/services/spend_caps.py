"""Spend caps at work (docs/payments.md, "Spend caps"): every ``check_s`` the watch reads each capped renter's
spending in each cap's window (management/payments/caps.py ``read_caps``, from its rentals: the open ones the meter
holds and those ended in the window) and acts on what it finds:

- a soft cap reached: one ``payments.spend_cap_reached`` event (subject: the renter) per crossing, again only after
  the spending fell below it in between (a rolling hour) or a new month began;
- a hard cap reached: the same event, ``hard`` true; the scheduler places no new paid work of the account (or the
  project) while it holds (``CapBlocks``: only free hosts, and the workload's wait names the cap), and running paid
  work in its scope (work on a free host spends nothing and goes on) is sent back to the queue the way a preemption
  stops it (SIGTERM, the grace, SIGKILL: the workload checkpoints in its grace, its outputs are kept, nothing is
  destroyed); it starts again, from its checkpoint, once the cap allows (the hour rolls on, a new month, the cap
  raised or removed).

Reads only; the billing records are the settings service's, the workloads the book's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import msgspec

from common.errors import InvalidTransition, NotFound
from management.market.charges import price_at
from management.market.metering_loop import MeterLoop
from management.market.money import format_amount
from management.payments.caps import CapBlocks, CapReading, describe, read_caps, window_start
from management.payments.records import BillingRecord
from management.store.billing import BillingRepo
from management.store.rentals import RentalRepo, rental_order
from management.workloads.book import WorkloadBook
from master.port import Loop, MasterPort, RentalRecord, stop_loop

log = logging.getLogger(__name__)

CAP_REACHED_EVENT = "payments.spend_cap_reached"
PAGE = 200


class SpendCapWatch:
    def __init__(
        self,
        master: MasterPort,
        billing: BillingRepo,
        rentals: RentalRepo,
        meter: MeterLoop,
        book: WorkloadBook,
        blocks: CapBlocks,
        *,
        currency: str,
        check_s: float = 30.0,
        grace_s: float = 30.0,
        restart_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._master = master
        self._billing = billing
        self._rentals = rentals
        self._meter = meter
        self._book = book
        self.blocks = blocks
        self.currency = currency
        self._check_s = check_s
        self._grace_s = grace_s
        self._restart_s = restart_s
        self._clock = clock
        self._projects: dict[str, str] = {}  # workload id -> its project (a workload's spec never changes)
        self._told: set[tuple[str, int, float]] = set()  # (account, cap index, window start for months) told
        self._last: dict[str, list[CapReading]] = {}  # account -> its caps as last read
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = Loop("spend caps", self._check_s, self._check_now, self._restart_s).start()

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None

    def readings(self, account: str) -> list[CapReading]:
        """The account's caps as last read (empty before the first reading)."""
        return list(self._last.get(account, []))

    def all_readings(self) -> dict[str, list[CapReading]]:
        """Every capped renter's caps as last read (the alert rule ``spend_cap_reached`` watches them)."""
        return {account: list(caps) for account, caps in self._last.items() if caps}

    async def _check_now(self) -> None:
        await self.check(self._clock())

    async def check(self, now: float) -> None:
        """Read every capped renter's caps at ``now`` and act on them (the module's text)."""
        after: str | None = None
        while True:
            page = await self._billing.list(after=after, limit=PAGE)
            for rec in page:
                await self._check_account(rec, now)
            if len(page) < PAGE:
                return
            after = page[-1].id

    async def read(self, rec: BillingRecord, now: float) -> list[CapReading]:
        """The account's caps and what was spent in each one's window up to ``now``."""
        if not rec.caps:
            return []
        since = min(window_start(cap.window, now) for cap in rec.caps)
        # An open rental counts up to where its meter stands (its hosts' last heartbeats), the end it would be charged
        # to if it stopped now: a cap reached by seconds no host has reported yet would stop the work, and the rental
        # would then be charged less than the cap, which would no longer be reached.
        rentals: dict[str, RentalRecord] = {
            r.id: msgspec.structs.replace(r, ended_at=self._meter.metered_until(r, now))
            for r in self._meter.open_rentals(account=rec.id)
        }
        after: str | None = None
        while True:
            page = await self._rentals.list(account=rec.id, ended_since=since, after=after, limit=1000)
            for r in page:
                rentals.setdefault(r.id, r)  # the meter's open rental is the current one (bid changes)
            if len(page) < 1000:
                break
            after = rental_order(page[-1].started_at, page[-1].id)
        for r in rentals.values():
            if r.workload_id not in self._projects:
                self._projects[r.workload_id] = await self._project_of(r.workload_id)
        return read_caps(rec.caps, list(rentals.values()), self._projects, now)

    async def _check_account(self, rec: BillingRecord, now: float) -> None:
        readings = await self.read(rec, now)
        self._last[rec.id] = readings
        blocked: dict[str, str] = {}
        for index, reading in enumerate(readings):
            cap = reading.cap
            key = (rec.id, index, window_start(cap.window, now) if cap.window == "month" else 0.0)
            if not reading.reached:
                self._told.discard(key)
                continue
            why = f"{describe(cap, self.currency)} is reached ({format_amount(reading.spent)} {self.currency} spent)"
            if cap.hard:
                blocked.setdefault(cap.project if cap.scope == "project" else "", why)
            if key not in self._told:
                self._told.add(key)
                await self._master.record_event(
                    CAP_REACHED_EVENT,
                    rec.id,
                    scope=cap.scope,
                    project=cap.project,
                    window=cap.window,
                    limit=format_amount(cap.limit),
                    spent=format_amount(reading.spent),
                    hard=cap.hard,
                    reason=why,
                )
        self.blocks.replace(rec.id, blocked)
        if blocked:
            await self._stop_capped(rec.id, now)

    async def _stop_capped(self, account: str, now: float) -> None:
        for rental in self._meter.open_rentals(account=account):
            project = self._projects.get(rental.workload_id, "")
            why = self.blocks.reason(account, project)
            if not why or not any(price_at(rental, h, now) for h in rental.hosts):
                continue  # not capped, or free: it spends nothing, and the scheduler would place it there again
            reason = f"stopped: {why}; it waits in the queue until the cap allows it"
            try:
                await self._book.end(rental.workload_id, "requeue", reason, now, grace_s=self._grace_s)
            except (InvalidTransition, NotFound) as exc:  # it stopped meanwhile
                log.info("workload %s not stopped for its spend cap: %s", rental.workload_id, exc)

    async def _project_of(self, workload_id: str) -> str:
        try:
            return (await self._book.get(workload_id)).spec.project
        except NotFound:
            return ""

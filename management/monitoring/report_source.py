"""Where reports read their records: the Master's registry (hosts, GPUs) in memory, and from the store the rollups of
the window, the rentals that ran in it, the ledger's charge and refund entries and the commands that failed. What the
caller may see is cut by ``reports.restrict``; the figures are computed by ``reports.build_report`` (pure)."""

from __future__ import annotations

import math

from management.monitoring.reports import (
    FAILED_COMMAND_STATES,
    GpuFacts,
    HostFacts,
    Report,
    ReportInputs,
    build_report,
    check_provider_dimensions,
    restrict,
)
from management.store import ledger_repo, rental_repo
from management.store.rentals import rental_order
from master.port import CommandRecord, LedgerEntry, MasterPort, RentalRecord, TelemetryRollup

PAGE = 1000
COMMANDS_READ = 100_000  # the failed commands a report reads at most (newest first)


class ReportSource:
    def __init__(self, master: MasterPort) -> None:
        self._master = master

    async def report(
        self, kind: str, by: tuple[str, ...], start: float, end: float, *, provider: str | None, renter: str | None
    ) -> Report:
        """The report as ``provider`` (its hosts), ``renter`` (its rentals) or, neither given, the operator sees it.
        A provider's by renter or workload is refused (HiddenDimension): the renter is hidden from providers."""
        if provider is not None:
            check_provider_dimensions(by)
        inputs = restrict(await self.inputs(start, end, provider=provider, renter=renter), provider=provider, renter=renter)
        return build_report(inputs, kind, by, start, end)

    async def inputs(self, start: float, end: float, *, provider: str | None = None, renter: str | None = None) -> ReportInputs:
        """The records of the window: of ``provider``'s hosts, or (``renter``) with the rollups of its rentals' GPUs
        only; ``restrict`` still cuts them to what the caller may see."""
        registry, store = self._master.registry, self._master.store
        hosts = {
            a.id: HostFacts(provider=a.provider, region=a.region, enrolled_at=a.enrolled_at)
            for a in registry.agents.values()
            if provider is None or a.provider == provider
        }
        gpus = [GpuFacts(g.uuid, g.agent_id, g.tier or "", g.model) for g in registry.gpus.values() if g.agent_id in hosts]
        rentals: list[RentalRecord] = []
        after: str | None = None
        while True:
            page = await rental_repo(store).list(provider=provider, account=renter, ended_since=start, after=after, limit=PAGE)
            rentals.extend(r for r in page if r.started_at < end)
            if len(page) < PAGE:
                break
            after = rental_order(page[-1].started_at, page[-1].id)
        held: set[str] = set()
        if renter is not None:
            rentals = [r for r in rentals if r.account == renter]
            held = {unit for r in rentals for h in r.hosts for unit in h.units}
        since, until = math.ceil(start / 60), math.ceil(end / 60)
        rollups: list[TelemetryRollup] = []
        for gpu in gpus:
            if renter is None or gpu.uuid in held:
                rollups.extend(await store.rollups.list(gpu.uuid, since_minute=since, until_minute=until))
        entries: list[LedgerEntry] = []
        seq = 0
        while True:
            batch = await ledger_repo(store).list(account=f"provider:{provider}" if provider else None, after_seq=seq, limit=PAGE)
            entries.extend(e for e in batch if e.kind in ("charge", "refund") and start <= e.ts < end)
            if len(batch) < PAGE:
                break
            seq = batch[-1].seq
        known = {r.id for r in rentals}
        for rental_id in sorted({e.rental for e in entries if e.rental and e.rental not in known}):
            found = await rental_repo(store).get(rental_id)  # ended before the window, charged or refunded in it
            if found is not None:
                rentals.append(found)  # outside the window it adds no time: it tells which GPUs the money was for
        commands: list[CommandRecord] = [
            c
            for c in await self._master.list_commands(states=sorted(FAILED_COMMAND_STATES), limit=COMMANDS_READ)
            if c.agent_id in hosts
        ]
        return ReportInputs(hosts=hosts, gpus=gpus, rollups=rollups, rentals=rentals, entries=entries, commands=commands)

"""The metering loop: opens a rental when a workload starts running, charges it every metering period through the
ledger, ends it (refunding a run that ended through its host) when the workload stops running, stops a workload whose
renter's money ran out, and warns renters whose balance is running low.

It follows the workload book (``WorkloadBook.subscribe``): the listener only notes a transition with the time it saw it
(listeners must not block); ``tick`` opens and ends the rentals noted, then meters every open one
(management/market/charges.py computes the entries; ``LedgerBook.post_computed`` posts them under the ledger's lock).

Restarts: ``load`` reads the open rentals and rebuilds each one's metering state from its ledger entries, so charges
resume from the last period posted (entry keys make a repeated charge impossible); a workload still running without
a rental (a Master killed between "run" and the insert) gets one from its ``started_at``; an open rental whose
workload no longer runs is ended. A rental's final entries are posted before the rental is stored as ended: a Master
killed in between finds it open, ends it again, and posts nothing twice.

The money running out stops the workload with ``WorkloadBook.end(..., "fail", "the renter's balance ran out")``,
not a cancel: a cancel is the renter's (or an operator's) own act and says so; this is the grid ending the run for a
stated reason, which the renter reads on its workload, and a failed workload is not restarted (its restart policy
would only run it into an empty balance again).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

import msgspec

from common.errors import InvalidTransition, NotFound
from management.market.charges import FeeRate, MeterState, MeterStep, apply, cost_until, price_at, state_of, step
from management.market.ledger import LedgerBook
from management.market.money import format_amount, parse_amount
from management.market.prices import HostPrice
from management.market.sla import SlaTerms, sla_credit
from management.store.rentals import RentalRepo, StaleRental, rental_order
from management.workloads.book import WorkloadBook
from management.workloads.states import WorkloadState
from master.port import (
    AgentState,
    LedgerEntry,
    Loop,
    MasterConfig,
    MasterPort,
    PriceChange,
    RentalHost,
    RentalRecord,
    WorkloadRecord,
    reputation,
    stop_loop,
)

log = logging.getLogger(__name__)

LOW_BALANCE_EVENT = "market.low_balance"
RAN_OUT_REASON = "the renter's balance ran out"
PAGE = 1000

Prices = Callable[[str, str], HostPrice]  # (provider, agent id) -> the price in force
Reliability = Callable[[str], float | None]  # agent id -> its reliability in [0, 1], None when unknown


class MeterSettings(msgspec.Struct, frozen=True, kw_only=True):
    period_s: float = 60.0
    platform_fee_percent: float = 10.0
    reliable_fee_percent: float = 5.0
    reliable_threshold: float = 0.97
    low_balance_warning_s: float = 3600.0
    grace_s: float = 30.0  # a workload stopped for want of money: SIGTERM, this long, SIGKILL
    restart_s: float = 1.0
    hold_s: float = 3600.0  # a running rental holds this long of its cost (at least one period)
    sla: SlaTerms = SlaTerms()  # the SLA credit's formula (docs/disputes.md)

    @property
    def tick_s(self) -> float:
        return min(5.0, self.period_s / 4)

    @property
    def reserve_s(self) -> float:
        """A rental runs out while what is held still pays this long: two ticks (the one that sees it may come late),
        so the stop falls before the money's end and the provider is paid for every metered second."""
        return 2 * self.tick_s

    @classmethod
    def of(cls, config: MasterConfig) -> MeterSettings:
        return cls(
            period_s=config.metering_period_s,
            platform_fee_percent=config.platform_fee_percent,
            reliable_fee_percent=config.reliable_fee_percent,
            reliable_threshold=config.reliable_threshold,
            low_balance_warning_s=config.low_balance_warning_s,
            grace_s=config.preemption_grace_s,
            restart_s=config.loop_restart_s,
            hold_s=config.rental_hold_s,
            sla=SlaTerms(
                percent=config.sla_credit_percent,
                min_downtime_s=config.sla_min_downtime_s,
                cap_s=config.sla_credit_cap_s,
            ),
        )


def rental_id(workload: WorkloadRecord) -> str:
    """The rental of a workload's current run: ``<workload id>-a<attempt>``."""
    return f"{workload.id}-a{workload.attempts}"


def rental_hosts(wl: WorkloadRecord, master: MasterPort, prices: Prices) -> list[RentalHost]:
    """The hosts a running workload's rental pays, each at its price per GPU-hour now: the bid (interruptible), the
    host's reserved price (reserved) or its listed price (on demand)."""
    terms = wl.spec.rental
    kind = terms.kind if terms is not None else "on_demand"
    gpus: dict[str, list[str]] = {}
    for a in wl.assignments:
        gpus.setdefault(a.agent_id, []).extend(a.units)
    hosts = []
    for agent_id, units in gpus.items():
        agent = master.registry.agents.get(agent_id)
        provider = agent.provider if agent is not None else ""
        listed = prices(provider, agent_id)
        if kind == "interruptible" and terms is not None and terms.bid is not None:
            price = parse_amount(terms.bid)
        elif kind == "reserved":
            price = listed.reserved
        else:
            price = listed.on_demand
        hosts.append(RentalHost(agent_id=agent_id, provider=provider, gpus=max(1, len(units)), price=price, units=units))
    return hosts


def terms_refusal(wl: WorkloadRecord, master: MasterPort, prices: Prices) -> str | None:
    """Why a workload's rental may not start on the hosts it was placed on, at their terms now, or None. The scheduler
    checked them at placement; a bid lowered, or a host's price raised, between placement and the run must not make the
    rental start under the host's terms (one ran at 0.000001 on a host whose minimum bid was 0.40)."""
    terms = wl.spec.rental
    if terms is None:
        return None
    currency = master.config.currency
    for host in rental_hosts(wl, master, prices):
        listed = prices(host.provider, host.agent_id)
        if terms.kind == "interruptible":
            if listed.min_bid is None:
                return f"host {host.agent_id} is no longer rented interruptible"
            if host.price < listed.min_bid:
                return (
                    f"its bid {format_amount(host.price)} {currency} is under host {host.agent_id}'s minimum bid "
                    f"{format_amount(listed.min_bid)} {currency}"
                )
        elif terms.max_price is not None and host.price > parse_amount(terms.max_price):
            return (
                f"host {host.agent_id} now costs {format_amount(host.price)} {currency} per GPU-hour, over its max_price "
                f"{terms.max_price} {currency}"
            )
    return None


class MeterLoop:
    def __init__(
        self,
        master: MasterPort,
        book: WorkloadBook,
        ledger: LedgerBook,
        rentals_repo: RentalRepo,
        prices: Prices,
        settings: MeterSettings,
        clock: Callable[[], float] = time.time,
        *,
        reliability: Reliability | None = None,
    ) -> None:
        self._master = master
        self._book = book
        self._ledger = ledger
        self._rentals = rentals_repo
        self._prices = prices
        self.settings = settings
        self._clock = clock
        self._reliability = reliability or self._reputation_score
        self._open: dict[str, RentalRecord] = {}  # rental id -> the open rental
        self._state: dict[str, MeterState] = {}  # rental id -> what the ledger holds for it
        self._noted: list[tuple[WorkloadRecord, float]] = []  # transitions seen, not yet acted on
        self._warned: set[str] = set()  # renters warned of a low balance, until it is covered again
        self._outcomes: set[str] = set()  # rental ids whose outcome went into their hosts' reputation
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        book.subscribe(self._on_workload)

    # --- start and stop --------------------------------------------------------------------------------------------

    async def load(self) -> int:
        """Pick up after a restart (see the module's text); returns how many rentals are open. The workload book
        and the ledger book must be loaded first."""
        now = self._clock()
        async with self._lock:
            after: str | None = None
            while True:
                page = await self._rentals.list(open_only=True, after=after, limit=PAGE)
                for rec in page:
                    self._open[rec.id] = rec
                    self._state[rec.id] = state_of(rec.id, await self._ledger.rental_entries(rec.id))
                if len(page) < PAGE:
                    break
                after = _order(page[-1])
            running = {rental_id(w): w for w in self._book.open_workloads(state=WorkloadState.RUNNING)}
            for rid, wl in running.items():
                if rid not in self._open:
                    await self._start(wl, wl.started_at if wl.started_at is not None else now)
            for rid in [r for r in self._open if r not in running]:
                gone = await self._workload(self._open[rid].workload_id)
                ended_at = gone.finished_at if gone is not None and gone.finished_at is not None else now
                await self._end(rid, gone, ended_at)
            return len(self._open)

    def start(self) -> None:
        if self._task is None:
            self._task = Loop("meter", self.settings.tick_s, self._tick_now, self.settings.restart_s).start()

    async def stop(self) -> None:
        await stop_loop(self._task)
        self._task = None

    async def _tick_now(self) -> None:
        await self.tick(self._clock())

    # --- reading ---------------------------------------------------------------------------------------------------

    def open_rentals(self, *, account: str | None = None) -> list[RentalRecord]:
        return sorted(
            (r for r in self._open.values() if account is None or r.account == account), key=lambda r: (r.started_at, r.id)
        )

    def metered_until(self, rental: RentalRecord, now: float) -> float:
        """Where an open rental's meter stands at ``now``: where it would end if it ended now. That is ``now`` or its
        hosts' last heartbeat, when earlier, but never before the periods already charged: a host heard last before
        them (its stored last_seen lags the heartbeats by the flush, and after a Master restart that is all there is
        until it reconnects) still ran them, and the rental's end is what its renter reads beside the charge."""
        last = min([now, *(self._heartbeats(rental).values())])
        state = self._state.get(rental.id)
        charged_to = rental.started_at + (state.last_period * self.settings.period_s if state is not None else 0.0)
        return max(rental.started_at, charged_to, last)

    def rental_for(self, wl: WorkloadRecord) -> RentalRecord | None:
        """The open rental of this run of a workload (its id names the attempt): one lookup, for lists of workloads."""
        return self._open.get(rental_id(wl))

    def rental_of(self, workload_id: str) -> RentalRecord | None:
        """The open rental of a workload, if it runs."""
        return next((r for r in self._open.values() if r.workload_id == workload_id), None)

    # --- the work --------------------------------------------------------------------------------------------------

    async def tick(self, now: float) -> None:
        """Open and end the rentals of the transitions seen, meter every open rental at ``now``, stop the workloads
        whose money ran out, and warn renters running low."""
        async with self._lock:
            await self._act_on_noted()
            for rid in sorted(self._open):
                rental = self._open.get(rid)
                if rental is None:
                    continue
                done = await self._meter(rental, now)
                if done.ran_out:
                    await self._stop(rental, now)
            await self._act_on_noted()
            await self._warn_low_balances(now)

    async def change_bid(self, workload_id: str, bid_micro: int, now: float) -> RentalRecord:
        """An interruptible rental's bid, from ``now`` on: a PriceChange appended to its rental. NotFound when the
        workload has no running rental, InvalidTransition when the rental is not interruptible."""
        if bid_micro < 0:
            raise ValueError(f"bid must be 0 or more, not {bid_micro}")
        async with self._lock:
            await self._act_on_noted()
            rental = self.rental_of(workload_id)
            if rental is None:
                raise NotFound(f"workload {workload_id!r} has no running rental; a bid changes only while it runs")
            if rental.kind != "interruptible":
                raise InvalidTransition(f"rental {rental.id} is {rental.kind}: only an interruptible rental's bid changes")
            at = max([now, rental.started_at, *(c.at for c in rental.bid_changes)])
            changed = msgspec.structs.replace(
                rental, bid_changes=[*rental.bid_changes, PriceChange(at=at, price=bid_micro)], version=rental.version + 1
            )
            await self._rentals.update(changed, expected_version=rental.version)
            self._open[rental.id] = changed
            return changed

    def _on_workload(self, what: str, rec: WorkloadRecord) -> None:
        if what in ("transition", "cancelled"):
            self._noted.append((rec, self._clock()))

    async def _act_on_noted(self) -> None:
        while self._noted:
            wl, seen = self._noted.pop(0)
            rid = rental_id(wl)
            if wl.state == WorkloadState.RUNNING:
                if rid not in self._open:
                    await self._start(wl, wl.started_at if wl.started_at is not None else seen)
            elif rid in self._open:
                await self._end(rid, wl, wl.finished_at if wl.finished_at is not None else seen)
            elif wl.host_failure and rid not in self._outcomes:
                # It never ran (a container did not start there): nothing was charged, but the host failed a renter.
                self._outcomes.add(rid)
                await self._record_failure_before_start(wl, rid, seen)

    async def _record_failure_before_start(self, wl: WorkloadRecord, rid: str, now: float) -> None:
        agent_id = wl.host_failure.split(":", 1)[0]
        if agent_id not in self._master.registry.agents:
            return
        why = f"rental {rid} did not start through the host: {wl.host_failure}"
        await self._credit_failed_start(wl, rid, agent_id, now)
        await self._master.record_rental_outcome(agent_id, failed=True, reason=why, now=now)

    async def _credit_failed_start(self, wl: WorkloadRecord, rid: str, agent_id: str, now: float) -> None:
        """A start the host failed: nothing ran or was charged, but the renter waited; the SLA credit of the minimum
        downtime, at the host's price now (docs/disputes.md)."""
        host = next((h for h in rental_hosts(wl, self._master, self._prices) if h.agent_id == agent_id), None)
        if host is None or not host.provider:
            return

        def compute() -> list[LedgerEntry]:
            entry = sla_credit(
                rental_id=rid,
                renter=wl.account,
                workload=wl.id,
                agent_id=agent_id,
                provider=host.provider,
                price=host.price,
                gpus=host.gpus,
                last_heard=now,
                noticed=now,
                why=f"did not start: {wl.host_failure}",
                terms=self.settings.sla,
                provider_balances=self._ledger.balance_view(),
            )
            return [entry] if entry is not None else []

        await self._ledger.post_computed(compute)

    async def _start(self, wl: WorkloadRecord, started_at: float) -> None:
        rid = rental_id(wl)
        refused = terms_refusal(wl, self._master, self._prices)
        if refused is not None and await self._rentals.get(rid) is None:
            await self._requeue(wl, refused, started_at)
            return
        terms = wl.spec.rental
        kind = terms.kind if terms is not None else "on_demand"
        hosts = rental_hosts(wl, self._master, self._prices)
        reserved_s = terms.reserved_s if terms is not None else None
        rec = RentalRecord(
            id=rid,
            workload_id=wl.id,
            account=wl.account,
            kind=kind,
            hosts=hosts,
            started_at=started_at,
            reserved_until=started_at + reserved_s if kind == "reserved" and reserved_s is not None else None,
            version=1,
        )
        if not await self._rentals.insert(rec):
            stored = await self._rentals.get(rid)
            if stored is None or stored.ended_at is not None:
                return
            rec = stored
        self._open[rid] = rec
        self._state[rid] = state_of(rid, await self._ledger.rental_entries(rid))
        await self._meter(rec, started_at)

    async def _end(self, rid: str, wl: WorkloadRecord | None, now: float) -> None:
        """End an open rental: charges stop at ``now`` or at its hosts' last heartbeat, when earlier."""
        rental = self._open[rid]
        failure = wl.host_failure if wl is not None else ""
        reason = f"workload {wl.state}: {wl.state_reason}" if wl is not None else "its workload is gone"
        ended_at = self.metered_until(rental, now)
        ended = msgspec.structs.replace(rental, ended_at=ended_at, end_reason=reason, host_failure=failure)
        await self._meter(ended, now)  # the final charge, the hold released, the refund: before the rental is stored
        stored = msgspec.structs.replace(ended, version=rental.version + 1)
        try:
            await self._rentals.update(stored, expected_version=rental.version)
        except StaleRental:
            current = await self._rentals.get(rid)
            if current is not None and current.ended_at is None:
                stored = msgspec.structs.replace(
                    current,
                    ended_at=ended.ended_at,
                    end_reason=ended.end_reason,
                    host_failure=failure,
                    version=current.version + 1,
                )
                await self._rentals.update(stored, expected_version=current.version)
        del self._open[rid]
        self._state.pop(rid, None)
        await self._record_outcome(ended, now)

    async def _record_outcome(self, rental: RentalRecord, now: float) -> None:
        self._outcomes.add(rental.id)
        failed_host = rental.host_failure.split(":", 1)[0] if rental.host_failure else ""
        for host in rental.hosts:
            if host.agent_id not in self._master.registry.agents:
                continue
            failed = host.agent_id == failed_host
            why = f"rental {rental.id} ended through the host: {rental.host_failure}" if failed else f"rental {rental.id} ended"
            await self._master.record_rental_outcome(host.agent_id, failed=failed, reason=why, now=now)

    async def _meter(self, rental: RentalRecord, now: float) -> MeterStep:
        state = self._state.setdefault(rental.id, MeterState(rental=rental.id))
        heartbeats = self._heartbeats(rental)
        fees = {h.agent_id: self._fee(h.agent_id) for h in rental.hosts}
        computed: list[MeterStep] = []

        def compute() -> list[LedgerEntry]:
            available = self._ledger.funds(rental.account).available
            s = self.settings
            done = step(
                rental,
                now,
                heartbeats=heartbeats,
                period_s=s.period_s,
                state=state,
                available=available,
                fees=fees,
                hold_s=s.hold_s,
                reserve_s=s.reserve_s,
                sla=s.sla,
                balances=self._ledger.balance_view(),
            )
            computed.append(done)
            return done.entries

        posted = await self._ledger.post_computed(compute)
        for entry in posted:
            apply(state, entry)
        if len(posted) < len(computed[0].entries):  # another writer posted one of them: read the rental's entries
            self._state[rental.id] = state_of(rental.id, await self._ledger.rental_entries(rental.id))
        return computed[0]

    async def _requeue(self, wl: WorkloadRecord, why: str, now: float) -> None:
        """A run whose terms the hosts no longer take: no rental opens, nothing is charged, its containers stop and
        it waits in the queue for hosts whose terms it meets."""
        reason = f"not started at the hosts' terms: {why}; it waits for a host whose terms it meets"
        try:
            await self._book.end(wl.id, "requeue", reason, now, grace_s=self.settings.grace_s)
        except (InvalidTransition, NotFound) as exc:
            log.info("workload %s not requeued for its terms: %s", wl.id, exc)

    async def _stop(self, rental: RentalRecord, now: float) -> None:
        try:
            await self._book.end(rental.workload_id, "fail", RAN_OUT_REASON, now, grace_s=self.settings.grace_s)
        except (InvalidTransition, NotFound) as exc:  # it stopped meanwhile: its transition ends the rental
            log.info("workload %s not stopped for want of money: %s", rental.workload_id, exc)

    def unbilled(self, account: str, now: float) -> int:
        """What ``account``'s open rentals ran up since their last charge: owed, and taken from the hold at the next."""
        total = 0
        for rental in self._open.values():
            if rental.account == account:
                state = self._state.get(rental.id)
                total += max(0, cost_until(rental, now) - (state.charged_total if state is not None else 0))
        return total

    def balance_cover_s(self, now: float) -> dict[str, float]:
        """Each renter with running rentals: how many seconds its balance (available and held, less what ran since the
        last charges) covers them at their current prices (the alert rule ``renter_balance_low`` watches it)."""
        per_second: dict[str, float] = {}
        for rental in self._open.values():
            rate = sum(price_at(rental, h, now) * h.gpus for h in rental.hosts) / 3600.0
            per_second[rental.account] = per_second.get(rental.account, 0.0) + rate
        cover: dict[str, float] = {}
        for renter, rate in per_second.items():
            funds = self._ledger.funds(renter)
            left = max(0, funds.available + funds.held - self.unbilled(renter, now))
            cover[renter] = left / rate if rate else math.inf
        return cover

    async def _warn_low_balances(self, now: float) -> None:
        per_second: dict[str, float] = {}
        for rental in self._open.values():
            rate = sum(price_at(rental, h, now) * h.gpus for h in rental.hosts) / 3600.0
            per_second[rental.account] = per_second.get(rental.account, 0.0) + rate
        for renter in sorted(self._warned - per_second.keys()):
            self._warned.discard(renter)
        for renter, rate in sorted(per_second.items()):
            funds = self._ledger.funds(renter)
            needed = math.ceil(rate * self.settings.low_balance_warning_s)
            if funds.available + funds.held >= needed:
                self._warned.discard(renter)
                continue
            if renter in self._warned:
                continue
            self._warned.add(renter)
            covers_s = (funds.available + funds.held) / rate if rate else math.inf
            await self._master.record_event(
                LOW_BALANCE_EVENT,
                renter,
                available=format_amount(funds.available),
                held=format_amount(funds.held),
                needed=format_amount(needed),
                covers_s=round(covers_s, 1),
                warning_s=self.settings.low_balance_warning_s,
                reason=(
                    f"the balance covers about {covers_s:.0f} s of the running rentals, less than "
                    f"{self.settings.low_balance_warning_s:g} s"
                ),
            )

    # --- inside ----------------------------------------------------------------------------------------------------

    def _heartbeats(self, rental: RentalRecord) -> dict[str, float]:
        """Each host's last heartbeat (a host the registry does not know has none: -inf). A host not known to be offline
        counts as heard when this Master began listening: the time the Master itself was down (SIGKILL, restart) is
        not the host's silence, and its rentals ran on; the stored ``last_seen`` also lags by the heartbeat flush."""
        seen = {}
        listening_since = self._master.started_at
        for h in rental.hosts:
            agent = self._master.registry.agents.get(h.agent_id)
            if agent is None:
                seen[h.agent_id] = -math.inf
            elif agent.state == AgentState.OFFLINE.value:
                seen[h.agent_id] = agent.last_seen
            else:
                seen[h.agent_id] = max(agent.last_seen, listening_since)
        return seen

    def _reputation_score(self, agent_id: str) -> float | None:
        agent = self._master.registry.agents.get(agent_id)
        return reputation(agent).score if agent is not None else None

    def _fee(self, agent_id: str) -> FeeRate:
        s = self.settings
        score = self._reliability(agent_id)
        if score is not None and score >= s.reliable_threshold:
            return FeeRate(percent=s.reliable_fee_percent, why=f"reliable host: {score:.3f} >= {s.reliable_threshold:g}")
        why = "platform fee" if score is None else f"platform fee: reliability {score:.3f} < {s.reliable_threshold:g}"
        return FeeRate(percent=s.platform_fee_percent, why=why)

    async def _workload(self, workload_id: str) -> WorkloadRecord | None:
        try:
            return await self._book.get(workload_id)
        except NotFound:
            return None


def _order(rental: RentalRecord) -> str:
    return rental_order(rental.started_at, rental.id)

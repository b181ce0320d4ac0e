"""The market service: offers, rentals, ratings and the ledger's money, one method each. Handlers parse, call one
method here, render; ownership (``owner``: the caller's account, None for the operator) is applied here as the API's
auth module decided it, and another account's resource answers NotFound. The market (prices, balances, open rentals,
the fee window) is loaded by the composition root (management/app.py) before the first call.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from common.errors import Conflict, IdlegridError, NotFound
from management.market.charges import price_at
from management.market.completion import CompletionPolicy, CompletionRate
from management.market.ledger import (
    EXTERNAL,
    FEES,
    HostEarnings,
    PeriodEarnings,
    Statement,
    WorkloadSpend,
    hold_account,
    provider_account,
    renter_account,
    statement_csv,
)
from management.market.market import Market
from management.market.metering_loop import rental_hosts
from management.market.money import format_amount, parse_amount, period_cost
from management.market.offers import Offer, OfferChoices, SearchResult
from management.services.offer_details import OfferDetail, offer_detail
from management.store import rental_repo
from management.store.rentals import rental_order
from management.workloads.book import WorkloadBook
from management.workloads.states import GONE_ASSIGNMENT_STATES, WorkloadState
from master.port import (
    BOOTSTRAP_ACCOUNT,
    AgentState,
    LedgerEntry,
    MasterPort,
    RentalRecord,
    RentalTerms,
    WorkloadRecord,
    WorkloadSpec,
)

PROVIDER_PREFIX = provider_account("")
RATED_PAGE = 500


def rating_weight(paid: int, unit: str, most: int) -> int:
    """How many times a rating counts: 1, plus 1 for each ``unit`` (an amount) paid on the host, at most ``most``."""
    per = parse_amount(unit)
    if per <= 0:
        return most
    return max(1, min(most, 1 + paid // per))


KINDS_SAID = {"on_demand": "on demand", "interruptible": "interruptible", "reserved": "reserved"}


class PaymentRequired(IdlegridError):
    """The renter's balance does not cover what it asked for (a reserved period is prepaid whole)."""

    code = "insufficient_funds"


@dataclass(frozen=True)
class FundsDetail:
    account: str
    available: int
    held: int
    running_per_hour: int  # what the account's running rentals cost per hour now
    currency: str
    warning: str = ""
    unbilled: int = 0  # what the running rentals ran up since their last charge: the next charge takes it from the hold
    reserve_s: float = 0.0  # running work is stopped while what is left still pays this long (docs/payments.md)

    @property
    def covers_s(self) -> float | None:
        """The runway: how long until running work is stopped for want of money at the running rate (what is
        available and held, less what already ran, less the reserve the stop keeps); None when nothing costs anything."""
        if self.running_per_hour <= 0:
            return None
        left = max(0, self.available + self.held - self.unbilled)
        return max(0.0, left * 3600 / self.running_per_hour - self.reserve_s)


@dataclass(frozen=True)
class RentalDetail:
    rental: RentalRecord
    charged: int  # what the renter paid for it so far, refunds taken off
    currency: str


@dataclass(frozen=True)
class WorkloadTerms:
    """How a workload pays (``MarketService.workload_terms``): its terms as submitted, its rental (None before one
    opens), the price per GPU-hour in force or known now (micro-units, lowest first: several when its hosts are priced
    differently, none while the host it is placed on decides), what it costs per hour in all (None: not known yet),
    and a sentence for people."""

    terms: RentalTerms
    currency: str
    rental: str | None
    prices: list[int]
    per_hour: int | None
    summary: str


@dataclass
class Statements:
    account: str
    currency: str
    items: list[Any] = field(default_factory=list)


FitCheck = Callable[[str, WorkloadSpec], Awaitable[str | None]]  # (account, spec) -> why it could never run here, or None


@dataclass(frozen=True)
class RatingRules:
    """When a renter's rating counts in a host's reputation, and how much (docs/market-prices.md, "Ratings")."""

    min_run_s: float  # the rental ran at least this long
    weight_unit: str  # an amount: a rating counts once more per this much paid on the host
    max_weight: int
    window_s: float  # one rating per renter and host in this long


@dataclass(frozen=True)
class MarketRules:
    """The market service's settings: management/settings.py maps them from the operator's file, whose defaults
    (master/config.py) they are."""

    currency: str
    metering_period_s: float  # running rentals are charged this often: a first period is what admission checks
    low_balance_warning_s: float  # warn when the balance covers less than this long of what runs
    rating: RatingRules


class MarketService:
    def __init__(
        self, master: MasterPort, book: WorkloadBook, market: Market, rules: MarketRules, *, fit_check: FitCheck | None = None
    ) -> None:
        self._master = master
        self._book = book
        self.market = market
        self._rules = rules
        # The scheduler's "could this ever run here" (SchedulerLoop.never_fits), given by the composition root.
        self.fit_check = fit_check

    @property
    def currency(self) -> str:
        return self._rules.currency

    # --- offers ---------------------------------------------------------------------------------------------------

    async def search_offers(self, query: str, *, sort: str | None, limit: int, cursor: str | None) -> SearchResult:
        return self.market.offers.search(query, sort, limit, cursor)

    async def get_offer(self, offer_id: str) -> Offer:
        return self.market.offers.offer(offer_id)

    async def offer_choices(self) -> OfferChoices:
        """The models, tiers and regions offered now: a search form's menus."""
        return self.market.offers.choices()

    async def offer_detail(self, offer_id: str) -> OfferDetail:
        """One offer with its host's facts, its GPUs' measured figures, and its price and availability history."""
        return await offer_detail(self._master, self.market, offer_id, self.currency)

    async def rent_offer(self, account: str, offer_id: str, spec: WorkloadSpec) -> WorkloadRecord:
        """A workload pinned to one offer's host. Refused at once (never left waiting for ever) when the offer cannot
        take it: too few free GPUs, a bid under the host's minimum or a host that is not rented interruptible, a price
        over the renter's cap, a reserved period the balance does not cover."""
        offer = self.market.offers.offer(offer_id)
        terms = msgspec.structs.replace(spec.rental or RentalTerms(), offer=offer_id)
        gpus = spec.replicas * spec.replica.gpus
        if offer.runtime == "process" and spec.runs_image:
            raise Conflict(
                f"offer {offer_id} runs commands on the host itself (the process runtime), never an image: rent a host "
                f"with a container engine for image {spec.image} (idlegrid offers search 'runtime=docker'), or run the "
                'command on this one with image "none" and constraints.allow_process_runtime (the CLI\'s '
                "--allow-process-runtime)"
            )
        if offer.runtime == "process" and not spec.constraints.allow_process_runtime:
            raise Conflict(
                f"offer {offer_id} runs renters' work as a sandboxed host process (the process runtime), which the "
                "workload does not allow: set constraints.allow_process_runtime (the CLI's --allow-process-runtime, the "
                'console\'s "May run as a sandboxed process")'
            )
        if spec.replicas != 1:
            raise Conflict(f"an offer is one host: rent it with replicas 1 (asked {spec.replicas}); submit a gang instead")
        wanted_disk = spec.constraints.min_disk_gib
        if wanted_disk:  # the offer's host must report that much free disk, or the workload would wait for ever
            info = self._master.registry.get(offer_id).host
            if info is None or info.disk_free_gib < wanted_disk:
                free = f"{info.disk_free_gib:g} GiB of free disk" if info is not None else "no free disk reported"
                asked = f"{wanted_disk:g} GiB (constraints.min_disk_gib)"
                raise Conflict(f"offer {offer_id} has {free}; the workload asks for {asked}")
        # on demand (and reserved) may take what interruptible rentals hold there: the scheduler preempts them
        room = offer.num_gpus if terms.kind == "interruptible" else offer.num_gpus_on_demand
        if spec.replica.gpus > room:
            what = "free" if terms.kind == "interruptible" else "free or held by interruptible rentals"
            raise Conflict(f"offer {offer_id} has {room} GPU(s) {what} now; the workload asks for {spec.replica.gpus}")
        cur = self.currency
        if terms.kind == "interruptible":
            bid = parse_amount(terms.bid or "0")
            if offer.min_bid is None:
                raise Conflict(
                    f"offer {offer_id} is not rented interruptible; rent it on demand at {format_amount(offer.price)} {cur}"
                )
            if bid < offer.min_bid:
                raise Conflict(
                    f"bid {format_amount(bid)} {cur} is under offer {offer_id}'s minimum bid {format_amount(offer.min_bid)} {cur}"
                )
        else:
            price = offer.reserved_price if terms.kind == "reserved" else offer.price
            if terms.max_price is not None and price > parse_amount(terms.max_price):
                raise Conflict(
                    f"offer {offer_id} costs {format_amount(price)} {cur} per GPU-hour {KINDS_SAID[terms.kind]}, over "
                    f"your max_price {terms.max_price}"
                )
            if terms.kind == "reserved" and terms.reserved_s is not None:
                prepaid = price * gpus * int(terms.reserved_s) // 3600
                funds = self.market.ledger.funds(account)
                if funds.available < prepaid:
                    raise PaymentRequired(
                        f"a reserved period of {terms.reserved_s / 3600:g} h on {gpus} GPU(s) is prepaid: "
                        f"{format_amount(prepaid)} {cur}; the balance available is {format_amount(funds.available)} {cur}"
                    )
        if offer.max_duration_s is not None:
            longest = terms.reserved_s if terms.kind == "reserved" else spec.max_duration_s
            if longest is None or longest > offer.max_duration_s:
                raise Conflict(
                    f"offer {offer_id} takes rentals of at most {offer.max_duration_s / 3600:g} h: set max_duration_s "
                    "(or a reserved period) within it"
                )
        if terms.kind == "interruptible":
            first, said = parse_amount(terms.bid or "0"), "your bid"
        else:
            first = offer.reserved_price if terms.kind == "reserved" else offer.price
            said = f"offer {offer_id}'s {KINDS_SAID[terms.kind]} price"
        self.check_first_period(account, spec, first, said)
        await self.check_fits(account, spec)
        rented = msgspec.structs.replace(spec, rental=terms)
        return await self._book.submit(account, rented, time.time())

    def check_first_period(self, account: str, spec: WorkloadSpec, price: int, said: str) -> None:
        """PaymentRequired (402, with the figures) when the renter's available balance does not pay one metering period
        of ``spec``'s GPUs at ``price`` per GPU-hour: work never starts on a balance that cannot pay for it (a dust
        balance once started 28 GPUs, and 0.05 rented 8 GPUs at 28 an hour to be stopped 8 s later)."""
        if price <= 0:
            return
        gpus = spec.replicas * spec.replica.gpus
        period_s = self._rules.metering_period_s
        needed = period_cost(price, gpus, period_s)
        available = self.market.ledger.funds(account).available
        if needed > available:
            cur = self.currency
            per_hour = price * gpus
            raise PaymentRequired(
                f"{gpus} GPU(s) at {format_amount(price)} {cur} per GPU-hour ({said}) cost {format_amount(per_hour)} {cur} "
                f"per hour; work starts only on a balance that pays one metering period ({period_s:g} s): needed "
                f"{format_amount(needed)} {cur}, the balance available is {format_amount(available)} {cur}; add funds"
            )

    def cheapest_price(self, spec: WorkloadSpec) -> tuple[int, str] | None:
        """The least ``spec`` could pay per GPU-hour on this grid now, and what sets it: its bid (interruptible), else
        the lowest listed (or reserved) price of any host; None when the grid has no host to price it."""
        terms = spec.rental or RentalTerms()
        if terms.kind == "interruptible":
            return parse_amount(terms.bid or "0"), "your bid"
        listed = [
            self.market.prices.price(agent.provider, agent.id)
            for agent in self._master.registry.agents.values()
            if agent.state != AgentState.RETIRED
        ]
        if not listed:
            return None
        prices = [p.reserved if terms.kind == "reserved" else p.on_demand for p in listed]
        return min(prices), f"the cheapest host's {KINDS_SAID[terms.kind]} price"

    async def check_fits(self, account: str, spec: WorkloadSpec) -> None:
        """Conflict (409) naming what to change when ``spec`` could never run on this grid as it is now (the process
        runtime not allowed, a model or tier the grid lacks, more GPUs on one host than any has): refused at once,
        never queued to wait for ever."""
        if self.fit_check is not None:
            why = await self.fit_check(account, spec)
            if why is not None:
                raise Conflict(f"this workload can never run on this grid: {why}")

    async def admit(self, account: str, spec: WorkloadSpec) -> None:
        """A submitted workload that could never run here is refused at once (409, naming the field or flag that fixes
        it), and one the renter's balance can never start (402, with the figures), never left queued: even the
        cheapest host on the grid costs more than the balance pays for one period."""
        await self.check_fits(account, spec)
        cheapest = self.cheapest_price(spec)
        if cheapest is not None:
            self.check_first_period(account, spec, *cheapest)

    async def change_bid(self, workload_id: str, bid: int, *, account: str | None) -> WorkloadRecord:
        """A new bid on an interruptible workload: stored on its terms (the scheduler ranks and preempts by it) and, while
        it runs, on its rental from now on. A running rental's bid must still meet each of its hosts' minimum bids."""
        rec = await self._book.get(workload_id, account=account)
        rental = self.market.meter.rental_of(workload_id)
        # Running: its rental's hosts. Placed but not yet running (scheduled, starting): the hosts it was placed on,
        # whose minimum the rental will pay from the moment it starts (a lowered bid there once skipped the check).
        hosts = (
            [(h.provider, h.agent_id) for h in rental.hosts]
            if rental is not None
            else [(provider, agent_id) for agent_id, provider in self._assigned_hosts(rec)]
        )
        where = "runs" if rental is not None else "is placed"
        for provider, agent_id in hosts:
            minimum = self.market.prices.price(provider, agent_id).min_bid
            if minimum is None or bid < minimum:
                said = "is no longer rented interruptible" if minimum is None else f"takes bids from {format_amount(minimum)}"
                raise Conflict(f"host {agent_id}, where {workload_id} {where}, {said} {self.currency}; bid again")
        updated = await self._book.change_bid(rec.id, format_amount(bid), time.time())
        if rental is not None:
            await self.market.meter.change_bid(workload_id, bid, time.time())
        return updated

    def _assigned_hosts(self, rec: WorkloadRecord) -> list[tuple[str, str]]:
        """(agent id, provider) of each host a workload is placed on and not leaving."""
        hosts: dict[str, str] = {}
        for a in rec.assignments:
            if a.state in GONE_ASSIGNMENT_STATES:
                continue
            agent = self._master.registry.agents.get(a.agent_id)
            hosts[a.agent_id] = agent.provider if agent is not None else ""
        return sorted(hosts.items())

    def workload_terms(self, rec: WorkloadRecord) -> WorkloadTerms:
        """How a workload pays, stated plainly (renters of other markets are surprised by silent on-demand fallbacks):
        the kind, the price per GPU-hour in force (while it runs) or what decides it (while it waits), and a sentence."""
        terms = rec.spec.rental or RentalTerms()
        cur = self.currency
        rental = self.market.meter.rental_for(rec)
        said = KINDS_SAID[terms.kind]
        prices: list[int] = []
        per_hour: int | None = None
        hosts = rental.hosts if rental is not None else None
        if hosts is None and rec.state == WorkloadState.RUNNING:  # the meter opens its rental on its next tick, at these prices
            hosts = rental_hosts(rec, self._master, self.market.prices.price)
        if hosts:
            now = time.time()
            price_of = (lambda h: price_at(rental, h, now)) if rental is not None else (lambda h: h.price)
            per_hour = sum(price_of(h) * h.gpus for h in hosts)
            prices = sorted({price_of(h) for h in hosts})
            source = {"on_demand": "the host's listed price", "interruptible": "your bid", "reserved": "the reserved price"}
            summary = (
                f"{said} at {' / '.join(format_amount(p) for p in prices)} {cur} per GPU-hour ({source[terms.kind]}): "
                f"{format_amount(per_hour)} {cur} per hour for {sum(h.gpus for h in hosts)} GPU(s), charged per second while "
                "it runs"
            )
        elif terms.kind == "interruptible":
            summary = f"{said} at your bid of {terms.bid} {cur} per GPU-hour, on hosts whose minimum bid it meets"
            per_hour = parse_amount(terms.bid or "0") * rec.spec.replicas * rec.spec.replica.gpus
        elif terms.kind == "reserved":
            summary = f"{said} for {(terms.reserved_s or 0) / 3600:g} h at the host's reserved price, prepaid when it starts"
        elif terms.offer is not None and (agent := self._master.registry.agents.get(terms.offer)) is not None:
            listed = self.market.prices.price(agent.provider, agent.id)
            price = listed.reserved if terms.kind == "reserved" else listed.on_demand
            prices = [price]
            per_hour = price * rec.spec.replicas * rec.spec.replica.gpus
            when = "prepaid when it starts" if terms.kind == "reserved" else "charged per second once it runs"
            summary = f"{said} at {format_amount(price)} {cur} per GPU-hour (offer {terms.offer}'s price now); {when}"
        else:
            cap = f", at most {terms.max_price} {cur}" if terms.max_price is not None else ""
            summary = f"{said} at the listed price per GPU-hour of the host it is placed on{cap}; charged once it runs"
        return WorkloadTerms(
            terms=terms,
            currency=cur,
            rental=rental.id if rental is not None else None,
            prices=prices,
            per_hour=per_hour,
            summary=summary,
        )

    # --- money ----------------------------------------------------------------------------------------------------

    @staticmethod
    def _owned(account_id: str, owner: str | None) -> None:
        if owner is not None and account_id != owner:
            raise NotFound(f"no account {account_id!r}")

    async def _ledger_accounts(self, account_id: str) -> list[str]:
        account = await self._master.accounts.get(account_id)
        if account.role == "renter":
            return [renter_account(account_id), hold_account(account_id)]
        if account.role == "provider":
            return [provider_account(account_id)]
        return [FEES, EXTERNAL] if account_id == BOOTSTRAP_ACCOUNT else [FEES]

    async def funds(self, account_id: str, *, owner: str | None = None) -> FundsDetail:
        self._owned(account_id, owner)
        await self._master.accounts.get(account_id)  # NotFound for no such account
        funds = self.market.ledger.funds(account_id)
        now = time.time()
        meter = self.market.meter
        running = sum(price_at(r, h, now) * h.gpus for r in meter.open_rentals(account=account_id) for h in r.hosts)
        unbilled = meter.unbilled(account_id, now)
        warning = ""
        warn_s = self._rules.low_balance_warning_s
        if running > 0 and (funds.available + funds.held) * 3600 < running * warn_s:
            warning = f"the balance covers less than {warn_s / 3600:g} h of what runs now; at zero, running work is stopped"
        return FundsDetail(
            account_id, funds.available, funds.held, running, self.currency, warning, unbilled, meter.settings.reserve_s
        )

    async def credit(self, account_id: str, amount: int, memo: str, *, key: str | None) -> LedgerEntry:
        account = await self._master.accounts.get(account_id)
        if account.role != "renter":
            raise Conflict(f"account {account_id!r} is a {account.role}; only renters' balances are credited")
        key = key or f"{account_id}:{time.time_ns()}"  # no key given: a credit of its own
        return await self.market.ledger.credit(account_id, amount, memo or "credited by an operator", key=f"credit:{key}")

    async def ledger_statement(
        self, account_id: str, *, owner: str | None, after_seq: int, limit: int, period: str = ""
    ) -> Statement:
        self._owned(account_id, owner)
        accounts = await self._ledger_accounts(account_id)
        return await self.market.ledger.statement(accounts, after_seq, limit, period)

    @staticmethod
    def statement_csv(statement: Statement) -> str:
        return statement_csv(statement)

    async def spend(self, account_id: str, *, owner: str | None) -> Statements:
        self._owned(account_id, owner)
        await self._master.accounts.get(account_id)
        items: list[WorkloadSpend] = await self.market.ledger.spend_by_workload(account_id)
        return Statements(account_id, self.currency, list(items))

    async def earnings(self, account_id: str, *, owner: str | None) -> Statements:
        self._owned(account_id, owner)
        await self._master.accounts.get(account_id)
        items: list[HostEarnings] = await self.market.ledger.earnings_by_host(account_id)
        return Statements(account_id, self.currency, list(items))

    async def payouts(self, account_id: str, period: str, *, owner: str | None) -> Statements:
        self._owned(account_id, owner)
        await self._master.accounts.get(account_id)
        items: list[PeriodEarnings] = await self.market.ledger.payouts(account_id, period)
        return Statements(account_id, self.currency, list(items))

    # --- rentals --------------------------------------------------------------------------------------------------

    async def _detail(self, rental: RentalRecord) -> RentalDetail:
        charged = 0
        for entry in await self.market.ledger.rental_entries(rental.id):
            if entry.kind not in ("charge", "refund"):  # an SLA credit or a dispute is money of its own, not the charge
                continue
            for line in entry.lines:
                if line.account.startswith(PROVIDER_PREFIX) or line.account == FEES:  # what the renter paid out
                    charged += line.amount
        return RentalDetail(rental, charged, self.currency)

    async def list_rentals(
        self,
        *,
        owner: str | None,
        role: str,
        workload: str | None,
        agent_id: str | None,
        open_only: bool,
        after: str | None,
        limit: int,
    ) -> tuple[list[RentalDetail], str | None]:
        """A renter's own rentals, a provider's hosts' rentals, or (operator) all; by start."""
        account = owner if role == "renter" else None
        provider = owner if role == "provider" else None
        found = await rental_repo(self._master.store).list(
            account=account,
            provider=provider,
            workload_id=workload,
            agent_id=agent_id,
            open_only=open_only,
            after=after,
            limit=limit + 1,
        )
        more = len(found) > limit
        found = found[:limit]
        next_key = rental_order(found[-1].started_at, found[-1].id) if more and found else None
        return [await self._detail(r) for r in found], next_key

    async def _owned_rental(self, rental_id: str, owner: str | None, role: str) -> RentalRecord:
        rental = await rental_repo(self._master.store).get(rental_id)
        visible = rental is not None and (
            owner is None
            or (role == "renter" and rental.account == owner)
            or (role == "provider" and any(h.provider == owner for h in rental.hosts))
        )
        if rental is None or not visible:
            raise NotFound(f"no rental {rental_id!r}")
        return rental

    async def get_rental(self, rental_id: str, *, owner: str | None, role: str) -> RentalDetail:
        return await self._detail(await self._owned_rental(rental_id, owner, role))

    def completion(self, agent_id: str, *, owner: str | None) -> CompletionRate:
        """A host's rental completion rate by close reason over the window (a provider's own hosts; NotFound else)."""
        agent = self._master.registry.agents.get(agent_id)
        if agent is None or (owner is not None and agent.provider != owner):
            raise NotFound(f"no agent {agent_id!r}")
        return self.market.reliability.completion(agent_id)

    @property
    def completion_policy(self) -> CompletionPolicy:
        """The grid's completion threshold and minimum of rentals (docs/disputes.md, "Settings")."""
        return self.market.reliability.completion_policy

    def hosts_under_review(self) -> list[CompletionRate]:
        """Every host under review for its completion rate, the lowest rate first (the operator's: no owner filter)."""
        return self.market.reliability.held_for_review()

    async def review_completion(self, agent_id: str, *, by: str) -> CompletionRate:
        """The operator reviewed a host under review: its count starts afresh, and it is offered again."""
        self.completion(agent_id, owner=None)
        return await self.market.reliability.review(agent_id, by)

    async def rate_rental(self, rental_id: str, rating: int, *, owner: str | None, role: str) -> RentalDetail:
        """The renter's 1..5 of an ended rental, once; it counts in each of its hosts' reputation, weighted by what was
        paid on the host. Refused (409, saying why) for a rental that ran less than ``rating_min_run_s``, one that cost
        money and was not paid, and a host this renter already rated within ``rating_window_s``: ratings were nearly
        free (20 one-star ratings of rentals that ran seconds, for 0.01 in all, sank hosts' scores)."""
        rental = await self._owned_rental(rental_id, owner, role)
        if rental.ended_at is None:
            raise Conflict(f"rental {rental_id} is still running; rate it once it has ended")
        if rental.rating is not None:
            raise Conflict(f"rental {rental_id} was already rated {rental.rating}")
        rules = self._rules.rating
        ran = rental.ended_at - rental.started_at
        if ran < rules.min_run_s:
            raise Conflict(
                f"rental {rental_id} ran {ran:.0f} s; a rating counts for a rental that ran at least {rules.min_run_s:g} s"
            )
        paid = await self._paid_per_host(rental)
        if any(h.price > 0 for h in rental.hosts) and sum(paid.values()) <= 0:
            raise Conflict(f"rental {rental_id} was not paid for; a rating counts for a rental that was")
        now = time.time()
        for host in rental.hosts:
            earlier = await self._rated_within(rental, host.agent_id, now - rules.window_s)
            if earlier is not None:
                raise Conflict(
                    f"you rated host {host.agent_id} for rental {earlier} within the last "
                    f"{rules.window_s / 86400:g} days; one rating per host in that time"
                )
        rated = msgspec.structs.replace(rental, rating=rating, version=rental.version + 1)
        await rental_repo(self._master.store).update(rated, expected_version=rental.version)
        for host in rental.hosts:
            weight = rating_weight(paid.get(host.agent_id, 0), rules.weight_unit, rules.max_weight)
            await self._master.record_rating(host.agent_id, rating, rental_id, now, weight=weight)
        return await self._detail(rated)

    async def _paid_per_host(self, rental: RentalRecord) -> dict[str, int]:
        """What the renter was charged for the rental on each host (charges, before any refund)."""
        paid: dict[str, int] = {}
        for entry in await self.market.ledger.rental_entries(rental.id):
            if entry.kind != "charge":
                continue
            for line in entry.lines:
                if line.host and (line.account.startswith(PROVIDER_PREFIX) or line.account == FEES):
                    paid[line.host] = paid.get(line.host, 0) + line.amount
        return paid

    async def _rated_within(self, rental: RentalRecord, agent_id: str, since: float) -> str | None:
        """Another rental of the same renter on ``agent_id``, ended since ``since``, that was rated; None if none."""
        after: str | None = None
        while True:
            page = await rental_repo(self._master.store).list(
                account=rental.account, agent_id=agent_id, ended_since=since, after=after, limit=RATED_PAGE
            )
            for other in page:
                if other.id != rental.id and other.rating is not None:
                    return other.id
            if len(page) < RATED_PAGE:
                return None
            after = rental_order(page[-1].started_at, page[-1].id)


__all__ = ["FundsDetail", "MarketService", "PaymentRequired", "RentalDetail", "Statements"]

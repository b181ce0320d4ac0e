"""Metering: what a rental owes at a moment, and the ledger entries that charge it. Pure: no I/O, no clock.

A rental is charged per host: that host's price per GPU-hour (its price when the rental started, then each bid
change from its ``at`` on) x its GPUs x the whole seconds since ``started_at``, / 3600, rounded down on that host's
cumulative total. Each host's figure is cumulative, so whatever was charged before, the next charge is "what is owed
now minus what was charged", and the sum over any number of charges is exact (money.cost of the whole run).

``step`` turns a rental, the time, its hosts' last heartbeats, what the ledger already holds for it (``MeterState``,
rebuilt from its entries by ``state_of``) and the renter's available balance into the entries to post:

- at the start, ``hold:<rental>:0``: the rental's hold moves from ``renter:<id>`` to ``hold:<id>`` (capped at what the
  renter has): the cost of ``hold_s`` (the grid's ``rental_hold_s``, one hour by default; never less than one period) at
  the prices in force; a reserved rental instead has ``prepay:<rental>``: its whole prepaid period into the hold;
- for every metering period that ended, and that every host heartbeated past, ONE entry ``charge:<rental>:<k>``
  (k: the last whole period it covers; several periods missed by a stopped Master are charged in one) that both
  settles and re-holds: each host's charge goes from the hold to its provider less the fee, the fee to
  ``platform:fees``, and the hold is brought back to the cost of ``hold_s`` from there (from or back to the renter).
  Settling and re-holding in one entry means a Master killed between them cannot exist;
- at the end, ``charge:<rental>:end``: the rest up to ``ended_at`` (a reserved rental ended by its renter owes its
  whole prepaid period, the provider keeps it, unless it was never prepaid whole), and the release of what is left in the hold;
- when the rental ended through its host (``host_failure``), ``refund:<rental>``: every charge of the rental back to
  the renter: each provider and the fees give back what they received from it, at most what they still have (a payout
  or a credit may have taken it since); the platform pays the rest (``external``, as it pays a credit); and, given
  ``sla`` terms, ``sla:<rental>``: the downtime's SLA credit from the failing host's provider to the renter, capped at
  what that provider has after the refund (management/market/sla.py, docs/disputes.md).

No balance but ``external`` goes below zero: a charge takes at most what the rental holds plus what the renter has available. When
what is owed, plus what ``reserve_s`` more of running costs, exceeds that, ``MeterStep.ran_out`` is set: the caller
stops the workload. The reserve is how long the caller may take to see it (the metering loop: two of its ticks), so the
stop falls while the hold still pays every second up to it, and the provider is paid for every metered second. With
``reserve_s`` 0 the stop comes only once what is owed exceeds what there is, and the final entry charges only what there
was (a provider then loses the seconds between the money's end and the stop).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import msgspec

from management.market.ledger import EXTERNAL, FEES, hold_account, provider_account, renter_account
from management.market.money import format_amount
from management.market.sla import KIND as SLA_KIND
from management.market.sla import SlaTerms, sla_credit, sla_key
from master.port import LedgerEntry, LedgerLine, RentalHost, RentalRecord

__all__ = [
    "FeeRate",
    "MeterState",
    "MeterStep",
    "apply",
    "cost_until",
    "host_cost_until",
    "period_cost",
    "price_at",
    "state_of",
    "step",
]

END = "end"


class FeeRate(msgspec.Struct, frozen=True, kw_only=True):
    """The platform's share of one host's charges, in percent, and why that rate (for the entry's memo)."""

    percent: float
    why: str = "platform fee"

    @property
    def basis_points(self) -> int:
        return round(self.percent * 100)

    def of(self, charge: int) -> int:
        """The fee on ``charge`` micro-units, rounded down (the provider keeps the fraction)."""
        return charge * self.basis_points // 10_000


NO_FEE = FeeRate(percent=0.0, why="no fee")


@dataclasses.dataclass
class MeterState:
    """What the ledger holds for one rental: read from its entries (``state_of``), never kept apart from them."""

    rental: str
    opened: bool = False  # hold:<rental>:0 or prepay:<rental> posted
    last_period: int = 0  # the last period k charged by a charge:<rental>:<k>
    held: int = 0  # what the rental holds now in hold:<renter>
    charged: dict[str, int] = dataclasses.field(default_factory=dict)  # agent id -> charged so far
    paid: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)  # (account, agent id) -> received
    prepaid: int = 0  # what prepay:<rental> took into the hold (a reserved rental)
    settled: bool = False  # charge:<rental>:end posted
    refunded: bool = False  # refund:<rental> posted
    credited: bool = False  # sla:<rental> posted (an SLA credit for a host failure)

    @property
    def charged_total(self) -> int:
        return sum(self.charged.values())

    def copy(self) -> MeterState:
        return dataclasses.replace(self, charged=dict(self.charged), paid=dict(self.paid))


@dataclasses.dataclass(frozen=True)
class MeterStep:
    """What one metering step found: the entries to post, in order, and whether the renter's money ran out."""

    entries: list[LedgerEntry]
    ran_out: bool = False
    owed: int = 0  # what the rental owes up to now (or its end) beyond what was charged before this step


# --- what is owed ----------------------------------------------------------------------------------------------


def _whole_seconds(rental: RentalRecord, t: float) -> int:
    return max(0, math.floor(t - rental.started_at))


def price_at(rental: RentalRecord, host: RentalHost, t: float) -> int:
    """The host's price per GPU-hour in force at ``t``: its price at the start, or the last bid change at or before t."""
    price = host.price
    for change in rental.bid_changes:
        if change.at <= t:
            price = change.price
    return price


def host_cost_until(rental: RentalRecord, host: RentalHost, t: float) -> int:
    """What ``host`` of ``rental`` has earned from ``started_at`` to ``t``: price x GPUs x whole seconds / 3600, with
    each bid change priced from its own second on, rounded down on the total."""
    micro_seconds = 0  # price x GPU-seconds, divided by 3600 once at the end
    seg_start, price = rental.started_at, host.price
    for change in rental.bid_changes:
        if change.at >= t:
            break
        if change.at > seg_start:
            micro_seconds += price * host.gpus * (_whole_seconds(rental, change.at) - _whole_seconds(rental, seg_start))
            seg_start = change.at
        price = change.price
    micro_seconds += price * host.gpus * (_whole_seconds(rental, t) - _whole_seconds(rental, seg_start))
    return micro_seconds // 3600


def cost_until(rental: RentalRecord, t: float) -> int:
    """What the whole rental costs from ``started_at`` to ``t`` (the sum of its hosts' cumulative costs)."""
    return sum(host_cost_until(rental, h, t) for h in rental.hosts)


def period_cost(rental: RentalRecord, start: float, period_s: float) -> int:
    """What the rental costs from ``start`` to ``start + period_s`` at the prices in force (the hold for a period)."""
    return cost_until(rental, start + period_s) - cost_until(rental, start)


# --- what the ledger holds ---------------------------------------------------------------------------------------


def _charge_period(key: str, rental_id: str) -> int | str | None:
    prefix = f"charge:{rental_id}:"
    if not key.startswith(prefix):
        return None
    tail = key[len(prefix) :]
    return END if tail == END else int(tail)


def apply(state: MeterState, entry: LedgerEntry) -> None:
    """Fold one of the rental's entries into ``state``."""
    rid = state.rental
    if entry.key in (f"hold:{rid}:0", f"prepay:{rid}"):
        state.opened = True
    if entry.key == f"prepay:{rid}":
        state.prepaid = sum(line.amount for line in entry.lines if line.account.startswith("hold:"))
    period = _charge_period(entry.key, rid)
    if period == END:
        state.settled = True
    elif isinstance(period, int):
        state.last_period = max(state.last_period, period)
    if entry.key == f"refund:{rid}":
        state.refunded = True
    if entry.key == sla_key(rid) and entry.kind == SLA_KIND:
        state.credited = True
        return  # its lines are the provider's and the renter's: nothing the rental holds, charged or paid
    for line in entry.lines:
        if line.account.startswith("hold:"):
            state.held += line.amount
            if entry.kind == "charge" and line.host:
                state.charged[line.host] = state.charged.get(line.host, 0) - line.amount
        elif entry.kind == "charge" and line.host and (line.account == FEES or line.account.startswith("provider:")):
            state.paid[(line.account, line.host)] = state.paid.get((line.account, line.host), 0) + line.amount


def state_of(rental_id: str, entries: Iterable[LedgerEntry]) -> MeterState:
    """The rental's metering state from its ledger entries (those with ``rental == rental_id``)."""
    state = MeterState(rental=rental_id)
    for entry in entries:
        if entry.rental == rental_id:
            apply(state, entry)
    return state


# --- the step ---------------------------------------------------------------------------------------------------


def _describe_hosts(rental: RentalRecord, t: float, fees: Mapping[str, FeeRate]) -> str:
    parts = []
    for h in rental.hosts:
        fee = fees.get(h.agent_id, NO_FEE)
        parts.append(
            f"{h.agent_id} ({h.provider}) {h.gpus} GPU(s) at {format_amount(price_at(rental, h, t))}/GPU-hour, "
            f"fee {fee.percent:g}% ({fee.why})"
        )
    return "; ".join(parts)


def _take(owed: dict[str, int], budget: int) -> dict[str, int]:
    """Charges for what each host is owed, in host order, taking at most ``budget`` in all."""
    taken: dict[str, int] = {}
    for agent_id, amount in owed.items():
        take = max(0, min(amount, budget))
        taken[agent_id] = take
        budget -= take
    return taken


def _charge_entry(
    rental: RentalRecord,
    key: str,
    ts: float,
    memo: str,
    charges: Mapping[str, int],
    fees: Mapping[str, FeeRate],
    hold_change: int,
) -> LedgerEntry | None:
    """Charges from the hold to each host's provider and the fees, and ``hold_change`` moved from the renter into the
    hold (negative: from the hold back to the renter). None when it would move nothing."""
    renter, hold, wl = renter_account(rental.account), hold_account(rental.account), rental.workload_id
    lines: list[LedgerLine] = []
    for h in rental.hosts:
        charge = charges.get(h.agent_id, 0)
        if charge <= 0:
            continue
        fee = fees.get(h.agent_id, NO_FEE).of(charge)
        lines.append(LedgerLine(account=hold, amount=-charge, host=h.agent_id, workload=wl))
        lines.append(LedgerLine(account=provider_account(h.provider), amount=charge - fee, host=h.agent_id, workload=wl))
        if fee:
            lines.append(LedgerLine(account=FEES, amount=fee, host=h.agent_id, workload=wl))
    if hold_change:
        lines.append(LedgerLine(account=renter, amount=-hold_change, workload=wl))
        lines.append(LedgerLine(account=hold, amount=hold_change, workload=wl))
    if not lines:
        return None
    return LedgerEntry(key=key, ts=ts, kind="charge", memo=memo, lines=lines, rental=rental.id)


def step(
    rental: RentalRecord,
    now: float,
    *,
    heartbeats: Mapping[str, float],
    period_s: float,
    state: MeterState,
    available: int,
    fees: Mapping[str, FeeRate],
    hold_s: float | None = None,
    reserve_s: float = 0.0,
    sla: SlaTerms | None = None,
    balances: Mapping[str, int],
) -> MeterStep:
    """The entries to post for ``rental`` at ``now`` (see the module's text), given what the ledger holds for it
    (``state``) and what its renter has available. ``heartbeats``: each host's last heartbeat (a host missing from it
    has none: nothing is charged for it before the rental ends). Posting them and calling again at the same ``now``
    with the state they make gives nothing more. ``hold_s``: how long of running the hold pays for (None: one period);
    ``reserve_s``: how long before what there is runs out the rental is said to have run out. ``sla``: the SLA credit's
    terms (None: no credit; the downtime runs from the rental's ``ended_at`` to ``now``, when the meter saw it end).
    ``balances``: the ledger's balances before this step (a refund takes back from an account, and a credit from a
    provider, at most what it has after the step's earlier entries)."""
    held_s = max(period_s, hold_s if hold_s is not None else period_s)
    st = state.copy()
    entries: list[LedgerEntry] = []
    ran_out = False
    renter, hold, wl = renter_account(rental.account), hold_account(rental.account), rental.workload_id

    def post(entry: LedgerEntry | None) -> None:
        nonlocal available
        if entry is None:
            return
        entries.append(entry)
        available += sum(line.amount for line in entry.lines if line.account == renter)
        apply(st, entry)

    # A hold is opened once, before the rental's end is processed: an ended rental whose end posted a credit (an SLA
    # credit raises what the renter has) must not find money for a hold on a replay of the same step.
    if not st.opened and st.last_period == 0 and not st.settled and not st.credited:
        if rental.kind == "reserved" and rental.reserved_until is not None:
            full = cost_until(rental, rental.reserved_until)
            amount, key, kind = min(full, available), f"prepay:{rental.id}", "prepay"
            ran_out = amount < full
            memo = f"prepaid reserved period to {rental.reserved_until:.0f}: {format_amount(full)}"
        else:
            full = period_cost(rental, rental.started_at, held_s)
            amount, key, kind = min(full, available), f"hold:{rental.id}:0", "hold"
            memo = f"hold of {held_s:g} s from the start: {format_amount(full)}"
        if amount < full:
            memo += f"; the renter had {format_amount(available)}"
        if amount > 0:
            lines = [
                LedgerLine(account=renter, amount=-amount, workload=wl),
                LedgerLine(account=hold, amount=amount, workload=wl),
            ]
            post(LedgerEntry(key=key, ts=rental.started_at, kind=kind, memo=memo, lines=lines, rental=rental.id))

    def owed_at(t: float) -> dict[str, int]:
        return {h.agent_id: max(0, host_cost_until(rental, h, t) - st.charged.get(h.agent_id, 0)) for h in rental.hosts}

    if rental.ended_at is None:
        seen = min((heartbeats.get(h.agent_id, -math.inf) for h in rental.hosts), default=now)
        bound = max(rental.started_at, min(now, seen))
        whole = max(0, math.floor((bound - rental.started_at) / period_s))
        if whole > st.last_period and not st.settled:
            t_k = rental.started_at + whole * period_s
            owed = owed_at(t_k)
            budget = st.held + available
            charges = _take(owed, budget)
            ran_out = ran_out or sum(charges.values()) < sum(owed.values())
            charged = sum(charges.values())
            target = period_cost(rental, t_k, held_s)
            if rental.kind == "reserved" and rental.reserved_until is not None and t_k < rental.reserved_until:
                target = max(target, st.held - charged)  # the prepaid stays held until the reserved period ends
            target = min(target, budget - charged)
            first = st.last_period + 1
            span = f"period {whole}" if first == whole else f"periods {first}..{whole}"
            memo = (
                f"{span} to {t_k - rental.started_at:g} s: {format_amount(charged)} charged; "
                f"{_describe_hosts(rental, t_k, fees)}; {format_amount(target)} held"
            )
            post(_charge_entry(rental, f"charge:{rental.id}:{whole}", t_k, memo, charges, fees, target + charged - st.held))
        owed_now = sum(owed_at(bound).values())
        reserve = period_cost(rental, bound, reserve_s) if reserve_s > 0 else 0
        ran_out = ran_out or owed_now + reserve > st.held + available
        return MeterStep(entries=entries, ran_out=ran_out, owed=owed_now)

    if not st.settled:
        end = max(rental.ended_at, rental.started_at + st.last_period * period_s)
        # The provider keeps a reserved rental's unused prepaid time, unless its host failed it, or it was never
        # prepaid whole (the renter could not pay it: the rental ran out at once and pays only the time it ran).
        reserved_until = rental.reserved_until if rental.kind == "reserved" else None
        keeps_prepaid = (
            reserved_until is not None and not rental.host_failure and st.prepaid >= cost_until(rental, reserved_until)
        )
        until = max(end, reserved_until) if keeps_prepaid and reserved_until is not None else end
        owed = owed_at(until)
        budget = st.held + available
        charges = _take(owed, budget)
        ran_out = sum(charges.values()) < sum(owed.values())
        charged = sum(charges.values())
        why = rental.end_reason or "ended"
        if keeps_prepaid and until > end:
            why += "; the unused prepaid time is the provider's (the host did not fail)"
        memo = (
            f"end at {end - rental.started_at:g} s ({why}): {format_amount(charged)} charged; "
            f"{_describe_hosts(rental, until, fees)}; the hold released"
        )
        # Nothing to move (a free rental that held nothing): nothing is posted, and a replay finds nothing again.
        post(_charge_entry(rental, f"charge:{rental.id}:{END}", until, memo, charges, fees, -(st.held - charged)))
    if rental.host_failure and not st.refunded:
        post(_refund(rental, rental.ended_at, st, balances, entries))
    if rental.host_failure and sla is not None and not st.credited:
        post(_sla_credit(rental, now, sla, balances, entries))
    return MeterStep(entries=entries, ran_out=ran_out, owed=0)


def _balances_after(balances: Mapping[str, int], posted: Iterable[LedgerEntry]) -> dict[str, int]:
    after = dict(balances)
    for entry in posted:
        for line in entry.lines:
            after[line.account] = after.get(line.account, 0) + line.amount
    return after


def _refund(
    rental: RentalRecord, ts: float, state: MeterState, balances: Mapping[str, int], posted: Iterable[LedgerEntry]
) -> LedgerEntry | None:
    """Every charge of a rental ended through its host back to its renter. Each account that was paid (a provider, the
    fees) gives back what it received from the rental, at most what it has after ``posted``: what it was paid may have
    left it since (a payout, another rental's SLA credit, a dispute's hold), and a provider's balance never goes below
    zero. The platform pays the rest, from ``external`` as it pays a credit: the renter is refunded every charge."""
    renter, wl = renter_account(rental.account), rental.workload_id
    after = _balances_after(balances, posted)
    lines: list[LedgerLine] = []
    short: dict[str, int] = {}  # agent id -> what the platform pays of its refund
    for (account, host), amount in sorted(state.paid.items()):
        back = max(0, min(amount, after.get(account, 0)))
        after[account] = after.get(account, 0) - back
        if back:
            lines.append(LedgerLine(account=account, amount=-back, host=host, workload=wl))
        if amount > back:
            short[host] = short.get(host, 0) + amount - back
    lines += [LedgerLine(account=EXTERNAL, amount=-amount, host=host, workload=wl) for host, amount in sorted(short.items())]
    total = -sum(line.amount for line in lines)
    if not total:
        return None
    lines.append(LedgerLine(account=renter, amount=total, workload=wl))
    memo = f"refund of {format_amount(total)}: the rental ended through its host ({rental.host_failure})"
    if short:
        memo += f"; the platform pays {format_amount(sum(short.values()))} of it: paid out or spent since it was earned"
    return LedgerEntry(key=f"refund:{rental.id}", ts=ts, kind="refund", memo=memo, lines=lines, rental=rental.id)


def _sla_credit(
    rental: RentalRecord, now: float, sla: SlaTerms, balances: Mapping[str, int], posted: Iterable[LedgerEntry]
) -> LedgerEntry | None:
    """The SLA credit of a rental ended through one of its hosts, capped at its provider's balance after ``posted``."""
    failed = rental.host_failure.split(":", 1)[0]
    host = next((h for h in rental.hosts if h.agent_id == failed), None)
    if host is None or rental.ended_at is None:
        return None
    return sla_credit(
        rental_id=rental.id,
        renter=rental.account,
        workload=rental.workload_id,
        agent_id=host.agent_id,
        provider=host.provider,
        price=price_at(rental, host, rental.ended_at),
        gpus=host.gpus,
        last_heard=rental.ended_at,
        noticed=max(now, rental.ended_at),
        why=rental.host_failure,
        terms=sla,
        provider_balances=_balances_after(balances, posted),
    )

"""The double-entry ledger as the market reads and writes it: account names, balances, credits, statements, and the
figures renters and providers ask for (spend per workload, earnings per host, earnings per calendar period).

Ledger accounts (not the grid's user accounts; a renter or provider has one or two of them):
``renter:<id>`` what a renter has available, ``hold:<id>`` what is held for its running rentals' next period,
``provider:<id>`` what a provider earned, ``platform:fees`` the platform's share, ``external`` where credits come from
and payouts go. Every entry's lines sum to zero, so all balances together are always zero.

``LedgerBook`` keeps every balance in memory (read once from the store by ``load``) and is the one writer of entries:
``post`` appends through the store, which refuses a key it already has (idempotent), and applies the lines only when
the store took the entry. Writes go one at a time under ``lock``, and ``post_computed`` computes entries from the
balances and posts them under that same lock, so a cap computed from a balance is still true when it is posted.
"""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

import msgspec

from common.errors import Conflict, IdlegridError
from management.market.money import format_amount
from master.port import LedgerEntry, LedgerLine

if TYPE_CHECKING:  # the store package's repositories import this module's account names (a cycle when imported first)
    from management.store.ledger import LedgerRepo

FEES = "platform:fees"
EXTERNAL = "external"
PAGE = 1000
# Entries that return money to a renter (docs/disputes.md): a failed run's refund, an SLA credit, a dispute's resolution;
# on a provider's account also a dispute's hold (what it holds is off the earnings until the resolution releases it).
RENTER_REFUNDS = frozenset({"refund", "sla_credit", "dispute_resolve"})
PROVIDER_REFUNDS = RENTER_REFUNDS | {"dispute_hold"}

Period = Literal["day", "week", "month"]
PERIODS: tuple[str, ...] = ("day", "week", "month")


def renter_account(account_id: str) -> str:
    """The ledger account of what renter ``account_id`` has available."""
    return f"renter:{account_id}"


def hold_account(account_id: str) -> str:
    """The ledger account of what is held for renter ``account_id``'s running rentals."""
    return f"hold:{account_id}"


def provider_account(account_id: str) -> str:
    """The ledger account of provider ``account_id``'s earnings."""
    return f"provider:{account_id}"


class InvalidLedgerRequest(IdlegridError):
    """A credit or a statement asked with a value the ledger cannot take (the message names it)."""

    code = "invalid_ledger_request"


class Funds(msgspec.Struct, frozen=True, kw_only=True):
    """A renter's money, in micro-units: what it can spend, and what is held for its running rentals."""

    available: int
    held: int


class StatementLine(msgspec.Struct, frozen=True, kw_only=True):
    """One entry as seen from the statement's accounts: its net ``amount`` on them and their ``balance`` after it."""

    seq: int
    ts: float
    key: str
    kind: str
    memo: str
    rental: str
    workload: str
    amount: int
    balance: int


class Statement(msgspec.Struct, frozen=True, kw_only=True):
    """The entries touching ``accounts`` after seq ``after_seq`` (at most ``limit``), oldest first, with the accounts'
    balance together before the first (``opening``) and after the last (``closing``). ``next_after``: the seq to ask
    from for the next page; ``more``: whether there is one. With a ``period`` (a UTC day, ISO week or month, by its
    label), only the entries of that period, ``opening`` the balance at its start."""

    accounts: list[str]
    period: str = ""
    after_seq: int
    opening: int
    closing: int
    lines: list[StatementLine]
    next_after: int
    more: bool


class WorkloadSpend(msgspec.Struct, frozen=True, kw_only=True):
    """What a renter paid for one workload: charged, refunded (a host failed it: the refund and the SLA credit; a
    dispute's refund), and the difference."""

    workload: str
    charged: int
    refunded: int
    net: int


class HostEarnings(msgspec.Struct, frozen=True, kw_only=True):
    """What one host of a provider earned: ``gross`` charged to renters, the platform's ``fee`` of it, what was
    ``refunded`` to renters from the provider (rentals the host failed, SLA credits, disputes: held, and refunded once
    resolved), and ``net`` = gross - fee - refunded."""

    agent_id: str
    gross: int
    fee: int
    refunded: int
    net: int


class PeriodEarnings(msgspec.Struct, frozen=True, kw_only=True):
    """A provider's earnings in one UTC calendar period (``label``: "2026-11-23", "2026-W47" or "2026-11"), from
    ``start`` (included) to ``end`` (excluded), unix times; figures as in HostEarnings."""

    label: str
    start: float
    end: float
    gross: int
    fee: int
    refunded: int
    net: int


class LedgerBook:
    def __init__(self, repo: LedgerRepo, *, clock: Callable[[], float] = time.time) -> None:
        self._repo = repo
        self._clock = clock
        self._balances: dict[str, int] = defaultdict(int)
        self.lock = asyncio.Lock()

    async def load(self) -> None:
        """Read every balance from the store (at start; again after another writer wrote)."""
        async with self.lock:
            self._balances = defaultdict(int, await self._repo.balances())

    # --- balances ----------------------------------------------------------------------------------------------

    def balance(self, ledger_account: str) -> int:
        return self._balances.get(ledger_account, 0)

    def balance_view(self) -> Mapping[str, int]:
        """Every account's balance, read through as it moves (no copy): for a computation under ``post_computed``."""
        return MappingProxyType(self._balances)

    def balances(self) -> dict[str, int]:
        """Every ledger account with a line, and its balance."""
        return dict(self._balances)

    def funds(self, renter_id: str) -> Funds:
        return Funds(available=self.balance(renter_account(renter_id)), held=self.balance(hold_account(renter_id)))

    def has_funds(self, renter_id: str) -> bool:
        """Whether a renter has money available (the scheduler's ``funded``: without, only free hosts)."""
        return self.balance(renter_account(renter_id)) > 0

    # --- writing -----------------------------------------------------------------------------------------------

    async def post(self, entry: LedgerEntry) -> bool:
        """Append ``entry``; False (nothing changed) when an entry with its key is already in the ledger.
        UnbalancedEntry (from the store) when its lines do not sum to zero."""
        async with self.lock:
            return await self._post(entry)

    async def post_computed(self, compute: Callable[[], Sequence[LedgerEntry]]) -> list[LedgerEntry]:
        """Call ``compute`` (it reads balances) and post what it returns, in order, all under the ledger's lock; returns
        the entries the ledger did not have. One whose key is already there is skipped (and so are the rest: they were
        computed from balances that assumed it)."""
        posted: list[LedgerEntry] = []
        async with self.lock:
            for entry in compute():
                if not await self._post(entry):
                    break
                posted.append(entry)
        return posted

    async def _post(self, entry: LedgerEntry) -> bool:
        return await self._post_seq(entry) is not None

    async def _post_seq(self, entry: LedgerEntry) -> int | None:
        seq = await self._repo.post(entry)
        if seq is not None:
            for line in entry.lines:
                self._balances[line.account] += line.amount
        return seq

    async def credit(
        self, account_id: str, amount: int, memo: str, *, key: str, kind: Literal["credit", "topup"] = "credit"
    ) -> LedgerEntry:
        """Move ``amount`` micro-units from ``external`` to renter ``account_id`` (an operator's ``credit``, or a
        ``topup`` the payment provider collected); returns the entry as stored (with its seq). The same credit asked
        again under the same ``key`` returns the first one and moves nothing; a key that names a different entry is a
        Conflict."""
        entry = credit_entry(account_id, amount, memo, key=key, kind=kind, ts=self._clock())
        lines = entry.lines
        async with self.lock:
            seq = await self._post_seq(entry)
        if seq is not None:
            return msgspec.structs.replace(entry, seq=seq)
        stored = await self._repo.get(key)
        if stored is None or stored.kind != kind or stored.lines != lines:
            raise Conflict(f"key {key!r} already names another ledger entry; choose a new key for this credit")
        return stored

    # --- reading -----------------------------------------------------------------------------------------------

    async def entries(self, ledger_accounts: Iterable[str], *, after_seq: int = 0) -> list[LedgerEntry]:
        """Every entry with a line on one of ``ledger_accounts`` and ``seq > after_seq``, ascending."""
        found: dict[int, LedgerEntry] = {}
        for account in dict.fromkeys(ledger_accounts):
            after = after_seq
            while True:
                page = await self._repo.list(account=account, after_seq=after, limit=PAGE)
                for entry in page:
                    found[entry.seq] = entry
                if len(page) < PAGE:
                    break
                after = page[-1].seq
        return [found[s] for s in sorted(found)]

    async def rental_entries(self, rental_id: str) -> list[LedgerEntry]:
        """Every entry of one rental, ascending."""
        found: list[LedgerEntry] = []
        after = 0
        while True:
            page = await self._repo.list(rental=rental_id, after_seq=after, limit=PAGE)
            found += page
            if len(page) < PAGE:
                return found
            after = page[-1].seq

    async def statement(
        self, ledger_accounts: Sequence[str], after_seq: int = 0, limit: int = 100, period: str = ""
    ) -> Statement:
        """The entries touching ``ledger_accounts`` (together) after ``after_seq``, each with the running balance; with
        a ``period`` label ("2026-12-07", "2026-W50", "2026-12"), those of that UTC period only."""
        if not ledger_accounts:
            raise InvalidLedgerRequest("accounts must name at least one ledger account")
        if limit < 1 or after_seq < 0:
            raise InvalidLedgerRequest(f"limit must be at least 1 and after_seq at least 0 (got {limit}, {after_seq})")
        start, end = period_span(period) if period else (float("-inf"), float("inf"))
        accounts = set(ledger_accounts)
        later = await self.entries(accounts, after_seq=after_seq)
        closing_now = sum(self.balance(a) for a in accounts)
        balance = closing_now - sum(_net(e, accounts) for e in later)
        balance += sum(_net(e, accounts) for e in later if e.ts < start)  # the period's opening
        later = [e for e in later if start <= e.ts < end]
        opening = balance
        lines: list[StatementLine] = []
        for entry in later[:limit]:
            amount = _net(entry, accounts)
            balance += amount
            workload = next((ln.workload for ln in entry.lines if ln.account in accounts and ln.workload), "")
            lines.append(
                StatementLine(
                    seq=entry.seq,
                    ts=entry.ts,
                    key=entry.key,
                    kind=entry.kind,
                    memo=entry.memo,
                    rental=entry.rental,
                    workload=workload,
                    amount=amount,
                    balance=balance,
                )
            )
        return Statement(
            accounts=sorted(accounts),
            period=period,
            after_seq=after_seq,
            opening=opening,
            closing=balance,
            lines=lines,
            next_after=lines[-1].seq if lines else after_seq,
            more=len(later) > limit,
        )

    async def spend_by_workload(self, renter_id: str) -> list[WorkloadSpend]:
        """What renter ``renter_id`` paid per workload (charges out of its hold, less refunds), by workload id."""
        charged: dict[str, int] = defaultdict(int)
        refunded: dict[str, int] = defaultdict(int)
        renter, hold = renter_account(renter_id), hold_account(renter_id)
        for entry in await self.entries([renter, hold]):
            for line in entry.lines:
                if entry.kind == "charge" and line.account == hold and line.host:
                    charged[line.workload] -= line.amount
                elif entry.kind in RENTER_REFUNDS and line.account == renter:
                    refunded[line.workload] += line.amount
        return [
            WorkloadSpend(workload=w, charged=charged[w], refunded=refunded[w], net=charged[w] - refunded[w])
            for w in sorted(set(charged) | set(refunded))
        ]

    async def earnings_by_host(self, provider_id: str) -> list[HostEarnings]:
        """What each host of provider ``provider_id`` earned, by agent id."""
        sums = _earnings(await self.entries([provider_account(provider_id)]), provider_account(provider_id))
        totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
        for (_, host), figures in sums.items():
            for i, value in enumerate(figures):
                totals[host][i] += value
        return [
            HostEarnings(agent_id=host, gross=g, fee=f, refunded=r, net=g - f - r) for host, (g, f, r) in sorted(totals.items())
        ]

    async def payouts(self, provider_id: str, period: str) -> list[PeriodEarnings]:
        """Provider ``provider_id``'s earnings per UTC calendar ``period`` ("day", "week": ISO weeks from Monday, or
        "month"), oldest first; periods with no entry are left out."""
        if period not in PERIODS:
            raise InvalidLedgerRequest(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
        account = provider_account(provider_id)
        entries = await self.entries([account])
        by_period: dict[tuple[float, float, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        for entry in entries:
            span = calendar_period(entry.ts, period)
            for (_, _host), (g, f, r) in _earnings([entry], account).items():
                figures = by_period[span]
                figures[0] += g
                figures[1] += f
                figures[2] += r
        return [
            PeriodEarnings(label=label, start=start, end=end, gross=g, fee=f, refunded=r, net=g - f - r)
            for (start, end, label), (g, f, r) in sorted(by_period.items())
        ]


def credit_entry(
    account_id: str, amount: int, memo: str, *, key: str, kind: Literal["credit", "topup"], ts: float
) -> LedgerEntry:
    """The entry of a credit (pure): ``amount`` from ``external`` to renter ``account_id``, under ``key``.
    InvalidLedgerRequest for an amount that is not positive or a missing key."""
    if amount <= 0:
        raise InvalidLedgerRequest(f"amount must be more than 0, not {format_amount(amount)}")
    if not key:
        raise InvalidLedgerRequest("key must name the credit (the same key is credited once)")
    lines = [
        LedgerLine(account=EXTERNAL, amount=-amount),
        LedgerLine(account=renter_account(account_id), amount=amount),
    ]
    return LedgerEntry(key=key, ts=ts, kind=kind, memo=memo or kind, lines=lines)


def _net(entry: LedgerEntry, accounts: set[str]) -> int:
    return sum(line.amount for line in entry.lines if line.account in accounts)


def _earnings(entries: Iterable[LedgerEntry], account: str) -> dict[tuple[int, str], list[int]]:
    """(entry seq, host) -> [gross, fee, refunded] of the provider ``account`` in ``entries``."""
    out: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for entry in entries:
        hosts = {ln.host for ln in entry.lines if ln.account == account and ln.host}
        for line in entry.lines:
            if line.host not in hosts:
                continue
            figures = out[(entry.seq, line.host)]
            if entry.kind == "charge":
                if line.account == account:
                    figures[0] += line.amount
                elif line.account == FEES:
                    figures[0] += line.amount
                    figures[1] += line.amount
            elif entry.kind in PROVIDER_REFUNDS and line.account == account:
                figures[2] -= line.amount
    return out


def calendar_period(ts: float, period: str) -> tuple[float, float, str]:
    """The UTC calendar day, ISO week (Monday first) or month holding unix time ``ts``: (start, end, label)."""
    t = dt.datetime.fromtimestamp(ts, tz=dt.UTC)
    day = dt.datetime(t.year, t.month, t.day, tzinfo=dt.UTC)
    if period == "day":
        start, end, label = day, day + dt.timedelta(days=1), day.strftime("%Y-%m-%d")
    elif period == "week":
        start = day - dt.timedelta(days=day.weekday())
        year, week, _ = start.isocalendar()
        end, label = start + dt.timedelta(days=7), f"{year}-W{week:02d}"
    else:
        start = dt.datetime(t.year, t.month, 1, tzinfo=dt.UTC)
        end = dt.datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=dt.UTC)
        label = start.strftime("%Y-%m")
    return start.timestamp(), end.timestamp(), label


def period_span(label: str) -> tuple[float, float]:
    """The UTC day ("2026-12-07"), ISO week ("2026-W50") or month ("2026-12") a label names: (start, end), unix times.
    InvalidLedgerRequest for anything else."""
    try:
        if len(label) == 10:
            day = dt.datetime.strptime(label, "%Y-%m-%d").replace(tzinfo=dt.UTC)
            return day.timestamp(), (day + dt.timedelta(days=1)).timestamp()
        if len(label) == 8 and label[4:6] == "-W":
            monday = dt.datetime.fromisocalendar(int(label[:4]), int(label[6:]), 1).replace(tzinfo=dt.UTC)
            return monday.timestamp(), (monday + dt.timedelta(days=7)).timestamp()
        if len(label) == 7:
            first = dt.datetime.strptime(label, "%Y-%m").replace(tzinfo=dt.UTC)
            start, end, _ = calendar_period(first.timestamp(), "month")
            return start, end
    except ValueError:
        pass
    raise InvalidLedgerRequest(f"period must be a UTC day (2026-12-07), ISO week (2026-W50) or month (2026-12), not {label!r}")


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


STATEMENT_COLUMNS = ("seq", "time", "kind", "key", "rental", "workload", "memo", "amount", "balance")


def statement_csv(statement: Statement) -> str:
    """The statement as CSV (a header row, then one row per entry; amounts as decimal strings, times in UTC)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(STATEMENT_COLUMNS)
    for line in statement.lines:
        writer.writerow(
            [
                line.seq,
                _iso(line.ts),
                line.kind,
                line.key,
                line.rental,
                line.workload,
                line.memo,
                format_amount(line.amount),
                format_amount(line.balance),
            ]
        )
    return out.getvalue()

"""The ledger book on a real store, each backend in turn (SQLite, and MongoDB on nx-27017): credits, balances kept in
memory and read back after a restart, idempotent posting, statements with running balances (and as CSV), what a
renter spent per workload and what a provider earned per host and per calendar period."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest

from common.errors import Conflict
from management.market.charges import FeeRate, MeterState, step
from management.market.ledger import (
    EXTERNAL,
    FEES,
    Funds,
    InvalidLedgerRequest,
    LedgerBook,
    calendar_period,
    hold_account,
    provider_account,
    renter_account,
    statement_csv,
)
from management.store import ledger_repo
from management.store.ledger import UnbalancedEntry
from master.records import LedgerEntry, LedgerLine, RentalHost, RentalRecord
from master.store import open_store
from master.store.base import Store
from tests.master.conftest import nx27017_uri, store_url  # noqa: F401  (fixtures: each backend in turn)

# Monday 2026-11-02 00:00 UTC
MONDAY = dt.datetime(2026, 11, 2, tzinfo=dt.UTC).timestamp()
DAY = 86400.0

OpenStore = Callable[[], Awaitable[Store]]


@pytest.fixture
async def open_one(store_url: str) -> AsyncIterator[OpenStore]:  # noqa: F811
    opened: list[Store] = []

    async def open_() -> Store:
        store = open_store(store_url)
        await store.open()
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.close()


async def book_on(open_one: OpenStore, now: float = MONDAY) -> LedgerBook:
    book = LedgerBook(ledger_repo(await open_one()), clock=lambda: now)
    await book.load()
    return book


def rental(rid: str, agent_id: str, started_at: float, **kw) -> RentalRecord:
    host = RentalHost(agent_id=agent_id, provider="acme", gpus=1, price=3_600_000)  # 1000 a second
    return RentalRecord(
        id=rid, workload_id=rid.rsplit("-a", 1)[0], account="alice", kind="on_demand", hosts=[host], started_at=started_at, **kw
    )


async def run(book: LedgerBook, r: RentalRecord, seconds: float, *, failure: str = "") -> None:
    """Meter ``r`` for ``seconds`` and end it, posting every step through the book."""
    ended = msgspec.structs.replace(r, ended_at=r.started_at + seconds, host_failure=failure)
    state = MeterState(rental=r.id)
    fees = {h.agent_id: FeeRate(percent=10.0) for h in r.hosts}

    def compute() -> list[LedgerEntry]:
        now = ended.started_at + seconds
        heard = {h.agent_id: now for h in r.hosts}
        available = book.balance(renter_account(r.account))
        return step(
            ended, now, heartbeats=heard, period_s=60.0, state=state, available=available, fees=fees, balances=book.balances()
        ).entries

    await book.post_computed(compute)


async def test_a_credit_moves_money_from_external_to_the_renter_once_per_key_and_survives_a_restart(open_one):
    book = await book_on(open_one)
    first = await book.credit("alice", 5_000_000, "top-up by the operator", key="credit:alice:1")
    assert first.seq > 0 and first.kind == "credit" and first.memo == "top-up by the operator"
    assert await book.credit("alice", 5_000_000, "the same top-up asked twice", key="credit:alice:1") == first
    with pytest.raises(Conflict, match="credit:alice:1"):
        await book.credit("alice", 1, "another credit under a used key", key="credit:alice:1")
    assert book.funds("alice") == Funds(available=5_000_000, held=0)
    assert book.balance(EXTERNAL) == -5_000_000

    again = await book_on(open_one)
    assert again.funds("alice") == Funds(available=5_000_000, held=0)
    assert again.balance(EXTERNAL) == -5_000_000


async def test_a_credit_of_nothing_or_without_a_key_is_refused_naming_the_field(open_one):
    book = await book_on(open_one)
    with pytest.raises(InvalidLedgerRequest, match="amount"):
        await book.credit("alice", 0, "zero", key="k")
    with pytest.raises(InvalidLedgerRequest, match="key"):
        await book.credit("alice", 10, "no key", key="")
    assert book.balances() == {}


async def test_an_unbalanced_entry_is_refused_whole_and_changes_no_balance(open_one):
    book = await book_on(open_one)
    lines = [LedgerLine(account=EXTERNAL, amount=-10), LedgerLine(account=renter_account("alice"), amount=9)]
    with pytest.raises(UnbalancedEntry):
        await book.post(LedgerEntry(key="bad", ts=MONDAY, kind="adjust", memo="off by one", lines=lines))
    assert book.balances() == {}


async def test_concurrent_posts_of_one_key_apply_it_once(open_one):
    book = await book_on(open_one)
    results = await asyncio.gather(*(book.credit("alice", 7, "same", key="credit:race") for _ in range(8)))
    assert len({r.seq for r in results}) == 1
    assert book.balance(renter_account("alice")) == 7


async def test_a_statement_lists_each_entry_with_the_running_balance_and_pages_on(open_one):
    book = await book_on(open_one)
    await book.credit("alice", 1_000_000, "first", key="c1")
    await book.credit("bob", 3, "someone else", key="c-bob")
    await run(book, rental("wl-a-a1", "agt-1", MONDAY), 150.0)  # 150_000 charged
    await book.credit("alice", 500_000, "second", key="c2")

    whole = await book.statement([renter_account("alice"), hold_account("alice")])
    assert [line.kind for line in whole.lines] == ["credit", "hold", "charge", "credit"]
    assert whole.opening == 0 and whole.closing == 1_000_000 - 150_000 + 500_000
    assert [line.balance for line in whole.lines] == [1_000_000, 1_000_000, 850_000, 1_350_000]
    assert whole.lines[2].workload == "wl-a" and whole.lines[2].rental == "wl-a-a1"
    assert not whole.more

    first = await book.statement([renter_account("alice"), hold_account("alice")], limit=2)
    assert first.more and [line.key for line in first.lines] == ["c1", "hold:wl-a-a1:0"]
    rest = await book.statement([renter_account("alice"), hold_account("alice")], after_seq=first.next_after)
    assert rest.opening == first.closing == 1_000_000
    assert [line.key for line in rest.lines] == ["charge:wl-a-a1:end", "c2"]

    rows = list(csv.reader(io.StringIO(statement_csv(whole))))
    assert rows[0] == ["seq", "time", "kind", "key", "rental", "workload", "memo", "amount", "balance"]
    assert rows[3][2:4] == ["charge", "charge:wl-a-a1:end"] and rows[3][7:] == ["-0.15", "0.85"]
    assert rows[1][1].startswith("2026-11-02T00:00:00") and rows[1][1].endswith("Z")


async def test_a_statement_of_a_period_has_its_entries_and_opens_with_the_balance_at_its_start(open_one):
    times = iter([MONDAY - DAY, MONDAY + DAY, MONDAY + 3 * DAY, MONDAY + 8 * DAY])
    book = LedgerBook(ledger_repo(await open_one()), clock=lambda: next(times))
    await book.load()
    for n, amount in enumerate([100, 20, 3, 4000]):  # Sunday 1 November, Tuesday, Thursday, the next Tuesday
        await book.credit("alice", amount, f"credit {n}", key=f"c{n}")

    week = await book.statement([renter_account("alice")], period="2026-W45")
    assert [line.key for line in week.lines] == ["c1", "c2"]
    assert (week.opening, week.closing, week.period) == (100, 123, "2026-W45")
    assert [line.balance for line in week.lines] == [120, 123]
    day = await book.statement([renter_account("alice")], period="2026-11-03")
    assert [line.key for line in day.lines] == ["c1"] and (day.opening, day.closing) == (100, 120)
    month = await book.statement([renter_account("alice")], period="2026-11")
    assert [line.key for line in month.lines] == ["c0", "c1", "c2", "c3"] and month.opening == 0
    october = await book.statement([renter_account("alice")], period="2026-10")
    assert october.lines == [] and october.opening == october.closing == 0
    assert [line.key for line in (await book.statement([renter_account("alice")], period="2026-11", limit=1)).lines] == ["c0"]
    for bad in ("2026-13", "2026-W60", "yesterday", "2026-11-31"):
        with pytest.raises(InvalidLedgerRequest, match="period"):
            await book.statement([renter_account("alice")], period=bad)


async def test_a_statement_with_no_accounts_or_a_bad_limit_is_refused(open_one):
    book = await book_on(open_one)
    with pytest.raises(InvalidLedgerRequest, match="accounts"):
        await book.statement([])
    with pytest.raises(InvalidLedgerRequest, match="limit"):
        await book.statement([renter_account("alice")], limit=0)


async def test_spend_per_workload_counts_charges_less_refunds(open_one):
    book = await book_on(open_one)
    await book.credit("alice", 10_000_000, "credit", key="c1")
    await run(book, rental("wl-a-a1", "agt-1", MONDAY), 100.0)
    await run(book, rental("wl-a-a2", "agt-1", MONDAY + 200), 50.0)
    await run(book, rental("wl-b-a1", "agt-2", MONDAY), 30.0, failure="agt-2: went offline")
    spend = {s.workload: (s.charged, s.refunded, s.net) for s in await book.spend_by_workload("alice")}
    assert spend == {"wl-a": (150_000, 0, 150_000), "wl-b": (30_000, 30_000, 0)}
    assert sum(book.balances().values()) == 0


async def test_earnings_per_host_and_per_calendar_period_show_gross_fee_refunds_and_net(open_one):
    book = await book_on(open_one)
    await book.credit("alice", 100_000_000, "credit", key="c1")
    await run(book, rental("wl-a-a1", "agt-1", MONDAY + 10), 100.0)  # Monday: 100_000, fee 10_000
    await run(book, rental("wl-b-a1", "agt-2", MONDAY + DAY + 10), 40.0)  # Tuesday: 40_000, fee 4_000
    await run(book, rental("wl-c-a1", "agt-2", MONDAY + 7 * DAY), 20.0, failure="agt-2: GPU fault")  # next week

    hosts = {h.agent_id: (h.gross, h.fee, h.refunded, h.net) for h in await book.earnings_by_host("acme")}
    assert hosts == {"agt-1": (100_000, 10_000, 0, 90_000), "agt-2": (60_000, 6_000, 18_000, 36_000)}
    assert book.balance(provider_account("acme")) == 90_000 + 36_000
    assert book.balance(FEES) == 10_000 + 4_000  # the failed rental's fee went back to the renter too

    days = [(p.label, p.gross, p.fee, p.refunded, p.net) for p in await book.payouts("acme", "day")]
    assert days == [
        ("2026-11-02", 100_000, 10_000, 0, 90_000),
        ("2026-11-03", 40_000, 4_000, 0, 36_000),
        ("2026-11-09", 20_000, 2_000, 18_000, 0),
    ]
    weeks = [(p.label, p.gross, p.net) for p in await book.payouts("acme", "week")]
    assert weeks == [("2026-W45", 140_000, 126_000), ("2026-W46", 20_000, 0)]
    months = await book.payouts("acme", "month")
    assert [(m.label, m.gross, m.net, m.start, m.end) for m in months] == [
        ("2026-11", 160_000, 126_000, MONDAY - DAY, dt.datetime(2026, 12, 1, tzinfo=dt.UTC).timestamp())
    ]
    with pytest.raises(InvalidLedgerRequest, match="period"):
        await book.payouts("acme", "year")


def test_calendar_periods_are_utc_days_iso_weeks_and_months():
    sunday_late = MONDAY - 1
    assert calendar_period(sunday_late, "day")[2] == "2026-11-01"
    assert calendar_period(sunday_late, "week") == (MONDAY - 7 * DAY, MONDAY, "2026-W44")
    december = dt.datetime(2026, 12, 31, 23, 59, tzinfo=dt.UTC).timestamp()
    assert calendar_period(december, "month")[1:] == (dt.datetime(2027, 1, 1, tzinfo=dt.UTC).timestamp(), "2026-12")

"""The dispute rules, pure (management/payments/disputes.py): the window, the host, the amounts a resolution takes, and
a Hypothesis property over the ledger entries: whatever disputes are opened and however they are resolved (or tried
again, or refused), every entry balances, the books stay at zero, no account but ``external`` goes negative, a dispute
holds exactly what it held until its one resolution and nothing after, and the renter never gets back more than it
paid for the host."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import Conflict
from management.market.ledger import EXTERNAL, FEES, provider_account, renter_account
from management.payments.disputes import (
    DisputeRecord,
    InvalidDispute,
    check_window,
    dispute_account,
    disputed_host,
    held_amount,
    hold_entry,
    paid_for_host,
    refund_of,
    resolve_entry,
)
from master.records import LedgerEntry, LedgerLine, RentalHost, RentalRecord

T = 1_700_000_000.0
WEEK = 7 * 86400.0


def rental(*, ended_at: float | None = T, hosts: int = 1) -> RentalRecord:
    return RentalRecord(
        id="wl-1-a1", workload_id="wl-1", account="lab", kind="on_demand", started_at=T - 600, ended_at=ended_at,
        hosts=[RentalHost(agent_id=f"agt-{i}", provider=f"p{i}", gpus=1, price=1) for i in range(hosts)],
    )  # fmt: skip


def test_a_rental_is_disputed_once_ended_and_within_the_window():
    check_window(rental(), T + WEEK, WEEK)
    with pytest.raises(Conflict, match="still running"):
        check_window(rental(ended_at=None), T, WEEK)
    with pytest.raises(Conflict, match="ended 7.0 days ago; a rental is disputed within 7 days"):
        check_window(rental(), T + WEEK + 1, WEEK)


def test_a_rental_of_several_hosts_names_the_disputed_host():
    assert disputed_host(rental(), None) == "agt-0"
    with pytest.raises(InvalidDispute, match="ran on 2 hosts"):
        disputed_host(rental(hosts=2), None)
    with pytest.raises(InvalidDispute, match="did not run on host 'agt-9'"):
        disputed_host(rental(hosts=2), "agt-9")
    assert disputed_host(rental(hosts=2), "agt-1") == "agt-1"


def test_what_is_disputable_is_what_the_provider_kept_of_the_hosts_charges_net_of_refunds():
    def line(account: str, amount: int, host: str = "agt-0") -> LedgerLine:
        return LedgerLine(account=account, amount=amount, host=host)

    charge = LedgerEntry(key="c", ts=T, kind="charge", memo="", lines=[
        line("hold:lab", -1000), line("provider:p0", 900), line(FEES, 100),
        line("hold:lab", -500, "agt-1"), line("provider:p1", 450, "agt-1"), line(FEES, 50, "agt-1"),
    ])  # fmt: skip
    assert paid_for_host([charge], "provider:p0", "agt-0") == (900, 100)
    refund = LedgerEntry(key="r", ts=T, kind="refund", memo="", lines=[
        line("provider:p0", -900), line(FEES, -100), LedgerLine(account="renter:lab", amount=1000),
    ])  # fmt: skip
    assert paid_for_host([charge, refund], "provider:p0", "agt-0") == (0, 0)


@dataclasses.dataclass
class Books:
    entries: list[LedgerEntry] = dataclasses.field(default_factory=list)
    balances: dict[str, int] = dataclasses.field(default_factory=dict)

    def post(self, entry: LedgerEntry | None) -> bool:
        if entry is None:
            return False
        assert sum(ln.amount for ln in entry.lines) == 0, entry.key
        if any(e.key == entry.key for e in self.entries):
            return False
        self.entries.append(entry)
        for ln in entry.lines:
            self.balances[ln.account] = self.balances.get(ln.account, 0) + ln.amount
        return True

    def move(self, key: str, frm: str, to: str, amount: int) -> None:
        lines = [LedgerLine(account=frm, amount=-amount), LedgerLine(account=to, amount=amount)]
        assert self.post(LedgerEntry(key=key, ts=T, kind="adjust", memo="", lines=lines))


OPS = st.one_of(
    st.tuples(st.just("open"), st.integers(0, 5_000_000), st.integers(0, 500_000)),  # disputable, fee
    st.tuples(
        st.just("resolve"), st.integers(0, 9), st.sampled_from(["full", "partial", "none", "bogus"]), st.integers(-10, 6_000_000)
    ),
    st.tuples(st.just("payout"), st.integers(0, 3_000_000)),  # the provider's earnings paid out meanwhile
)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 8_000_000), st.integers(0, 1_000_000), st.lists(OPS, max_size=30))
def test_any_disputes_and_resolutions_keep_the_books_at_zero_and_hold_exactly_until_resolved(earned, fees, ops):
    books = Books()
    books.move("earned", EXTERNAL, provider_account("acme"), earned) if earned else None
    books.move("fees", EXTERNAL, FEES, fees) if fees else None
    disputes: list[DisputeRecord] = []
    for op in ops:
        if op[0] == "open":
            n = len(disputes)
            rec = DisputeRecord(
                id=f"dsp-{n}", rental_id=f"wl-{n}-a1", workload_id=f"wl-{n}", account="lab", agent_id="agt-1",
                provider="acme", reason="x", created_at=T, disputable=op[1], held=0, fee=op[2],
            )  # fmt: skip
            rec.held = held_amount(rec.disputable, books.balances, "acme")
            assert rec.held <= rec.disputable
            books.post(hold_entry(rec, T))
            disputes.append(rec)
        elif op[0] == "resolve" and disputes:
            rec = disputes[op[1] % len(disputes)]
            if rec.state == "resolved":
                continue  # the service refuses a second resolution before any entry (409)
            amount = op[3] if op[2] == "partial" else None
            try:
                refund, fee_back = refund_of(rec, op[2], amount)
            except InvalidDispute:
                assert op[2] == "bogus" or (amount is not None and not 0 < amount <= rec.held)
                continue
            before = books.balances.get(renter_account("lab"), 0)
            entry, returned = resolve_entry(rec, refund, fee_back, books.balances.get(FEES, 0), T, "operator")
            books.post(entry)
            assert not books.post(entry)  # replayed: nothing moves twice
            got = books.balances.get(renter_account("lab"), 0) - before
            assert got == refund + returned <= rec.disputable + rec.fee
            rec.state = "resolved"
        elif op[0] == "payout":
            paid = min(op[1], books.balances.get(provider_account("acme"), 0))
            if paid:
                books.move(f"payout-{len(books.entries)}", provider_account("acme"), EXTERNAL, paid)
        assert sum(books.balances.values()) == 0
        for account, balance in books.balances.items():
            assert account == EXTERNAL or balance >= 0, (account, balance)
        for rec in disputes:
            expected = 0 if rec.state == "resolved" else rec.held
            assert books.balances.get(dispute_account(rec.id), 0) == expected, rec.id


def test_a_full_resolution_takes_no_amount_and_a_partial_one_its_own_within_what_is_held():
    rec = DisputeRecord(
        id="d", rental_id="r", workload_id="w", account="lab", agent_id="a", provider="p", reason="x", created_at=T,
        disputable=900, held=900, fee=100,
    )  # fmt: skip
    assert refund_of(rec, "full", None) == (900, 100)
    assert refund_of(rec, "none", None) == (0, 0)
    assert refund_of(rec, "partial", 900) == (900, 0)
    for resolution, amount in (
        ("partial", 0),
        ("partial", -1),
        ("partial", 901),
        ("partial", None),
        ("full", 5),
        ("maybe", None),
    ):
        with pytest.raises(InvalidDispute):
            refund_of(rec, resolution, amount)
    assert msgspec.json.decode(msgspec.json.encode(rec), type=DisputeRecord) == rec

"""Metering, pure: what a rental costs up to a moment, and the entries a metering step posts for it.

The property tests drive a whole market of one renter through ANY sequence of credits, top-ups opened and the payment
provider's events about them (paid, failed, in another currency, delivered again), rentals starting, time passing,
hosts falling silent, bid changes, ends (normal, through the host, the money running out) and Master restarts
(the metering state rebuilt from the entries alone), applying every step's entries to a model of the ledger (keys
taken once, balances as sums of lines, as master/store's LedgerRepo keeps them). A provider's event goes through the
top-up rules (management/payments/topups.py ``judge``) and its credit is ``credit_entry``'s, as the top-up service
posts it."""

from __future__ import annotations

import dataclasses

import msgspec
from hypothesis import example, given, settings
from hypothesis import strategies as st

from management.market.charges import FeeRate, MeterState, apply, cost_until, state_of, step
from management.market.ledger import EXTERNAL, FEES, credit_entry, hold_account, provider_account, renter_account
from management.market.sla import SlaTerms, sla_key
from management.payments.payouts import due, matured, paid_out, payout_entry, period_label
from management.payments.provider import PaymentEvent, TopupFailed, TopupPaid
from management.payments.records import TopupRecord
from management.payments.topups import Credit, MarkFailed, judge, topup_key
from master.records import LedgerEntry, LedgerLine, PriceChange, RentalHost, RentalRecord

T0 = 1_700_000_000.0
P = 60.0  # metering period
FEE = {"agt-1": FeeRate(percent=10.0, why="platform fee"), "agt-2": FeeRate(percent=5.0, why="reliable host")}


def rental(kind: str = "on_demand", *, price: int = 3_600_000, gpus: int = 2, hosts: int = 1, **kw) -> RentalRecord:
    return RentalRecord(
        id=kw.pop("id", "wl-1-a1"),
        workload_id="wl-1",
        account="alice",
        kind=kind,
        hosts=[RentalHost(agent_id=f"agt-{i + 1}", provider=f"prov-{i + 1}", gpus=gpus, price=price) for i in range(hosts)],
        started_at=kw.pop("started_at", T0),
        **kw,
    )


@dataclasses.dataclass
class Ledger:
    """The model of the ledger the steps post to: an entry's key is taken once; balances are sums of lines."""

    entries: list[LedgerEntry] = dataclasses.field(default_factory=list)
    balances: dict[str, int] = dataclasses.field(default_factory=dict)

    def post(self, entry: LedgerEntry) -> bool:
        assert entry.lines and sum(ln.amount for ln in entry.lines) == 0, f"unbalanced {entry.key}"
        if any(e.key == entry.key for e in self.entries):
            return False
        self.entries.append(msgspec.structs.replace(entry, seq=len(self.entries) + 1))
        for line in entry.lines:
            self.balances[line.account] = self.balances.get(line.account, 0) + line.amount
        return True

    def balance(self, account: str) -> int:
        return self.balances.get(account, 0)

    def charged(self, rental_id: str) -> int:
        """What the providers and the fees received from the rental, refunds taken back (SLA credits apart)."""
        return sum(
            ln.amount
            for e in self.entries
            if e.rental == rental_id and e.kind in ("charge", "refund")
            for ln in e.lines
            if ln.account == FEES or ln.account.startswith("provider:")
        )


def credit(ledger: Ledger, amount: int, key: str) -> None:
    lines = [LedgerLine(account=EXTERNAL, amount=-amount), LedgerLine(account=renter_account("alice"), amount=amount)]
    ledger.post(LedgerEntry(key=key, ts=T0, kind="credit", memo="credit", lines=lines))


def meter(
    ledger: Ledger,
    r: RentalRecord,
    now: float,
    heartbeats: dict[str, float],
    state: MeterState,
    *,
    hold_s: float | None = None,
    reserve_s: float = 0.0,
    sla: SlaTerms | None = None,
) -> bool:
    """One step, posted; asserts that replaying it posts nothing new. Returns whether the money ran out."""

    def once() -> list[LedgerEntry]:
        available = ledger.balance("renter:alice")
        done = step(
            r, now, heartbeats=heartbeats, period_s=P, state=state, available=available, fees=FEE, hold_s=hold_s,
            reserve_s=reserve_s, sla=sla, balances=dict(ledger.balances),
        )  # fmt: skip
        ran_out.append(done.ran_out)
        return done.entries

    ran_out: list[bool] = []
    for entry in once():
        assert ledger.post(entry), f"{entry.key} posted twice"
        apply(state, entry)
    again = once()
    assert [e for e in again if ledger.post(e)] == [], "a replayed step posted something"
    return ran_out[0]


# --- cost ---------------------------------------------------------------------------------------------------------


def test_cost_is_price_times_gpus_times_whole_seconds_over_an_hour_rounded_down():
    r = rental(price=1_000_000, gpus=3)
    assert cost_until(r, T0) == 0
    assert cost_until(r, T0 + 0.999) == 0  # no whole second yet
    assert cost_until(r, T0 + 1.5) == 1_000_000 * 3 * 1 // 3600  # 833
    assert cost_until(r, T0 + 3600) == 3_000_000
    assert cost_until(r, T0 - 5) == 0  # before the start


def test_a_bid_change_prices_every_host_from_its_second_on():
    r = rental("interruptible", price=3_600_000, gpus=1, hosts=2, bid_changes=[PriceChange(at=T0 + 100, price=7_200_000)])
    # per host: 100 s at 1000/s, then 50 s at 2000/s
    assert cost_until(r, T0 + 150) == 2 * (100 * 1000 + 50 * 2000)


# --- steps ---------------------------------------------------------------------------------------------------------


def test_a_rental_holds_a_period_then_charges_each_period_into_the_provider_and_fees_then_releases_the_hold():
    ledger, r, state = Ledger(), rental(price=3_600_000, gpus=2), MeterState(rental="wl-1-a1")  # 2000 a second
    credit(ledger, 1_000_000, "c1")
    meter(ledger, r, T0 + 1, {"agt-1": T0 + 1}, state)
    assert [e.key for e in ledger.entries][1:] == ["hold:wl-1-a1:0"]
    assert ledger.balance(hold_account("alice")) == 120_000  # one period: 60 s x 2000
    meter(ledger, r, T0 + 130, {"agt-1": T0 + 130}, state)
    charge = ledger.entries[-1]
    assert charge.key == "charge:wl-1-a1:2" and charge.kind == "charge"  # periods 1..2 in one entry
    assert "periods 1..2" in charge.memo and "fee 10% (platform fee)" in charge.memo
    assert ledger.balance("provider:prov-1") == 240_000 - 24_000 and ledger.balance(FEES) == 24_000
    assert ledger.balance(hold_account("alice")) == 120_000  # the next period held again
    ended = msgspec.structs.replace(r, ended_at=T0 + 150.7, end_reason="succeeded")
    meter(ledger, ended, T0 + 151, {"agt-1": T0 + 151}, state)
    assert ledger.entries[-1].key == "charge:wl-1-a1:end"
    assert ledger.charged("wl-1-a1") == 150 * 2000
    assert ledger.balance(hold_account("alice")) == 0
    assert ledger.balance(renter_account("alice")) == 1_000_000 - 300_000


def test_a_period_is_charged_only_once_every_host_heartbeated_past_its_end():
    ledger, r, state = Ledger(), rental(hosts=2), MeterState(rental="wl-1-a1")
    credit(ledger, 10_000_000, "c1")
    meter(ledger, r, T0 + 200, {"agt-1": T0 + 200, "agt-2": T0 + 59}, state)
    assert not any(e.key.startswith("charge:") for e in ledger.entries)
    meter(ledger, r, T0 + 200, {"agt-1": T0 + 200, "agt-2": T0 + 61}, state)
    assert ledger.entries[-1].key == "charge:wl-1-a1:1"


def test_when_the_money_runs_out_the_charge_takes_only_what_there_was_and_the_step_says_so():
    ledger, r, state = Ledger(), rental(price=3_600_000, gpus=1), MeterState(rental="wl-1-a1")  # 1000 a second
    credit(ledger, 90_000, "c1")
    assert not meter(ledger, r, T0 + 1, {"agt-1": T0 + 1}, state)
    assert not meter(ledger, r, T0 + 61, {"agt-1": T0 + 61}, state)  # 60_000 charged, 30_000 held
    assert meter(ledger, r, T0 + 91, {"agt-1": T0 + 91}, state)  # 91_000 owed, 90_000 there
    ended = msgspec.structs.replace(r, ended_at=T0 + 95, end_reason="the renter's balance ran out")
    meter(ledger, ended, T0 + 95, {"agt-1": T0 + 95}, state)
    assert ledger.charged("wl-1-a1") == 90_000
    assert ledger.balance(renter_account("alice")) == 0 and ledger.balance(hold_account("alice")) == 0


def test_a_rental_holds_an_hour_of_its_cost_keeps_it_held_at_each_charge_and_returns_the_rest_at_its_end():
    ledger, r, state = Ledger(), rental(price=3_600_000, gpus=1), MeterState(rental="wl-1-a1")  # 1000 a second
    credit(ledger, 5_000_000, "c1")
    meter(ledger, r, T0 + 1, {"agt-1": T0 + 1}, state, hold_s=3600.0)
    hold = ledger.entries[-1]
    assert hold.key == "hold:wl-1-a1:0" and "hold of 3600 s" in hold.memo
    assert ledger.balance(hold_account("alice")) == 3_600_000
    meter(ledger, r, T0 + 130, {"agt-1": T0 + 130}, state, hold_s=3600.0)
    assert ledger.charged("wl-1-a1") == 120_000
    assert ledger.balance(hold_account("alice")) == 3_600_000  # an hour from the last charge, held again
    assert ledger.balance(renter_account("alice")) == 5_000_000 - 120_000 - 3_600_000
    ended = msgspec.structs.replace(r, ended_at=T0 + 150, end_reason="succeeded")
    meter(ledger, ended, T0 + 151, {"agt-1": T0 + 151}, state, hold_s=3600.0)
    assert ledger.charged("wl-1-a1") == 150_000
    assert ledger.balance(hold_account("alice")) == 0  # the unused hold returned
    assert ledger.balance(renter_account("alice")) == 5_000_000 - 150_000


def test_a_hold_is_capped_at_what_the_renter_has_and_is_never_less_than_one_period():
    ledger, r, state = Ledger(), rental(price=3_600_000, gpus=1), MeterState(rental="wl-1-a1")
    credit(ledger, 500_000, "c1")
    meter(ledger, r, T0 + 1, {"agt-1": T0 + 1}, state, hold_s=3600.0)
    assert ledger.balance(hold_account("alice")) == 500_000 and ledger.balance(renter_account("alice")) == 0
    other, st2 = rental(price=3_600_000, gpus=1, id="wl-2-a1"), MeterState(rental="wl-2-a1")
    credit(ledger, 1_000_000, "c2")
    meter(ledger, other, T0 + 1, {"agt-1": T0 + 1}, st2, hold_s=5.0)  # shorter than the period: one period held
    assert st2.held == 60_000


def test_with_a_reserve_the_money_runs_out_while_the_hold_still_pays_every_second_up_to_the_stop():
    ledger, r, state = Ledger(), rental(price=3_600_000, gpus=1), MeterState(rental="wl-1-a1")  # 1000 a second
    credit(ledger, 90_000, "c1")
    assert not meter(ledger, r, T0 + 1, {"agt-1": T0 + 1}, state, hold_s=3600.0, reserve_s=10.0)
    assert not meter(ledger, r, T0 + 79, {"agt-1": T0 + 79}, state, hold_s=3600.0, reserve_s=10.0)
    assert meter(ledger, r, T0 + 81, {"agt-1": T0 + 81}, state, hold_s=3600.0, reserve_s=10.0)  # 81 + 10 s > 90 s
    ended = msgspec.structs.replace(r, ended_at=T0 + 81, end_reason="the renter's balance ran out")
    meter(ledger, ended, T0 + 82, {"agt-1": T0 + 82}, state, hold_s=3600.0, reserve_s=10.0)
    assert ledger.charged("wl-1-a1") == 81_000  # every second it ran
    assert ledger.balance(renter_account("alice")) == 9_000 and ledger.balance(hold_account("alice")) == 0


def test_a_rental_ended_through_its_host_is_refunded_every_charge():
    ledger, r, state = Ledger(), rental(hosts=2), MeterState(rental="wl-1-a1")
    credit(ledger, 10_000_000, "c1")
    meter(ledger, r, T0 + 130, {"agt-1": T0 + 130, "agt-2": T0 + 130}, state)
    failed = msgspec.structs.replace(r, ended_at=T0 + 140, host_failure="agt-2: went offline")
    meter(ledger, failed, T0 + 150, {"agt-1": T0 + 150, "agt-2": T0 + 140}, state)
    refund = ledger.entries[-1]
    assert refund.key == "refund:wl-1-a1" and "agt-2: went offline" in refund.memo
    assert ledger.charged("wl-1-a1") == 0
    assert ledger.balance(renter_account("alice")) == 10_000_000
    assert ledger.balance("provider:prov-1") == ledger.balance("provider:prov-2") == ledger.balance(FEES) == 0


def test_a_refund_after_a_payout_takes_back_only_what_the_provider_still_has_and_the_platform_pays_the_rest():
    ledger, r, state = Ledger(), rental(price=3_600_000, gpus=1), MeterState(rental="wl-1-a1")  # 1000 a second
    credit(ledger, 10_000_000, "c1")
    meter(ledger, r, T0 + 130, {"agt-1": T0 + 130}, state)  # 120_000 charged: 108_000 to the provider after the fee
    ledger.post(payout_entry("prov-1", 110_000, "payout:prov-1:today", T0 + 130, "payout"))
    failed = msgspec.structs.replace(r, ended_at=T0 + 140, host_failure="agt-1: went offline")
    meter(ledger, failed, T0 + 140, {"agt-1": T0 + 140}, state)
    refund = ledger.entries[-1]
    assert refund.key == "refund:wl-1-a1" and "the platform pays 0.11" in refund.memo
    by_account = {ln.account: -ln.amount for ln in refund.lines if ln.amount < 0}
    # 140 s charged: 126_000 to the provider, 110_000 of it paid out; 14_000 to the fees
    assert by_account == {provider_account("prov-1"): 16_000, FEES: 14_000, EXTERNAL: 110_000}
    assert ledger.balance(provider_account("prov-1")) == 0
    assert ledger.balance(renter_account("alice")) == 10_000_000  # every charge back, whoever pays it


SLA = SlaTerms(percent=200, min_downtime_s=600.0, cap_s=3600.0)


def test_a_host_failure_credits_the_renter_its_downtime_on_top_of_the_refund_from_that_hosts_provider():
    ledger, r, state = Ledger(), rental(hosts=2, price=3_600_000, gpus=2), MeterState(rental="wl-1-a1")  # 2000 a second a host
    credit(ledger, 10_000_000, "c1")
    ledger.post(LedgerEntry(key="earned", ts=T0, kind="adjust", memo="earlier earnings", lines=[
        LedgerLine(account=EXTERNAL, amount=-50_000_000), LedgerLine(account=provider_account("prov-2"), amount=50_000_000),
    ]))  # fmt: skip
    meter(ledger, r, T0 + 130, {"agt-1": T0 + 130, "agt-2": T0 + 130}, state, sla=SLA)
    failed = msgspec.structs.replace(r, ended_at=T0 + 140, host_failure="agt-2: went offline")
    meter(ledger, failed, T0 + 140 + 900, {"agt-1": T0 + 1040, "agt-2": T0 + 140}, state, sla=SLA)  # seen 900 s later
    sla_entry = ledger.entries[-1]
    assert sla_entry.key == sla_key("wl-1-a1") and sla_entry.kind == "sla_credit" and "900 s down" in sla_entry.memo
    credited = 3_600_000 * 2 * 1800 // 3600  # 900 s x 200%, at the failing host's price and GPUs
    assert ledger.charged("wl-1-a1") == 0  # the refund returned every charge; the credit is on top
    assert ledger.balance(renter_account("alice")) == 10_000_000 + credited
    assert ledger.balance(provider_account("prov-2")) == 50_000_000 - credited
    assert ledger.balance(provider_account("prov-1")) == 0  # the host that did not fail pays nothing
    assert state_of("wl-1-a1", ledger.entries) == state and state.credited


def test_an_sla_credit_is_at_least_the_minimum_downtime_at_most_the_cap_and_never_more_than_the_provider_has():
    for noticed, earned, expected in (
        (5.0, 10**9, 3_600_000 * 1200 // 3600),  # 5 s down: the 600 s minimum, x 200%
        (86400.0, 10**9, 3_600_000),  # a day down: capped at an hour of the host's cost
        (5.0, 7, 7),  # a provider with 7 micro-units pays 7; its balance never goes below zero
        (5.0, 0, 0),  # nothing: no entry
    ):
        ledger, r, state = Ledger(), rental(price=3_600_000, gpus=1), MeterState(rental="wl-1-a1")
        credit(ledger, 10_000_000, "c1")
        meter(ledger, r, T0, {"agt-1": T0}, state, sla=SLA)
        if earned:
            ledger.post(LedgerEntry(key="earned", ts=T0, kind="adjust", memo="earned", lines=[
                LedgerLine(account=EXTERNAL, amount=-earned), LedgerLine(account=provider_account("prov-1"), amount=earned),
            ]))  # fmt: skip
        failed = msgspec.structs.replace(r, ended_at=T0 + 10, host_failure="agt-1: a GPU became faulty")
        meter(ledger, failed, T0 + 10 + noticed, {"agt-1": T0 + 10}, state, sla=SLA)
        assert ledger.balance(renter_account("alice")) == 10_000_000 + expected, noticed
        assert ledger.balance(provider_account("prov-1")) == earned - expected >= 0
        assert state.credited == (expected > 0)


def test_a_normal_end_credits_nothing():
    ledger, r, state = Ledger(), rental(), MeterState(rental="wl-1-a1")
    credit(ledger, 10_000_000, "c1")
    ended = msgspec.structs.replace(r, ended_at=T0 + 100, end_reason="done")
    meter(ledger, ended, T0 + 5000, {"agt-1": T0 + 100}, state, sla=SLA)
    assert not any(e.kind == "sla_credit" for e in ledger.entries)


def test_a_reserved_rental_prepays_its_period_and_the_provider_keeps_the_unused_part_unless_the_host_failed():
    hour = 3600.0
    for failure, kept in (("", 3_600_000), ("agt-1: a GPU became faulty", 0)):
        ledger, state = Ledger(), MeterState(rental="wl-1-a1")
        r = rental("reserved", price=3_600_000, gpus=1, reserved_until=T0 + hour)
        credit(ledger, 5_000_000, "c1")
        meter(ledger, r, T0 + 1, {"agt-1": T0 + 1}, state)
        assert ledger.entries[-1].key == "prepay:wl-1-a1" and ledger.balance(hold_account("alice")) == 3_600_000
        meter(ledger, r, T0 + 130, {"agt-1": T0 + 130}, state)
        assert ledger.balance(hold_account("alice")) == 3_600_000 - 120_000  # the prepaid stays held
        ended = msgspec.structs.replace(r, ended_at=T0 + 600, host_failure=failure)
        meter(ledger, ended, T0 + 600, {"agt-1": T0 + 600}, state)
        assert ledger.charged("wl-1-a1") == kept
        assert ledger.balance(hold_account("alice")) == 0
        assert ledger.balance(renter_account("alice")) == 5_000_000 - kept


def test_a_reserved_rental_the_renter_cannot_prepay_whole_runs_out_at_once():
    ledger, state = Ledger(), MeterState(rental="wl-1-a1")
    r = rental("reserved", price=3_600_000, gpus=1, reserved_until=T0 + 3600)  # 3.60 to prepay
    credit(ledger, 1_000_000, "c1")
    assert meter(ledger, r, T0, {"agt-1": T0}, state)
    assert ledger.entries[-1].key == "prepay:wl-1-a1" and "the renter had 1.00" in ledger.entries[-1].memo
    ended = msgspec.structs.replace(r, ended_at=T0 + 2, end_reason="the renter's balance ran out")
    meter(ledger, ended, T0 + 2, {"agt-1": T0 + 2}, state)
    assert ledger.charged("wl-1-a1") == 2_000  # the 2 s it ran: never prepaid whole, so nothing is kept
    assert ledger.balance(renter_account("alice")) == 1_000_000 - 2_000 and ledger.balance(hold_account("alice")) == 0


def test_the_state_rebuilt_from_the_entries_is_the_state_the_steps_kept():
    ledger, r, state = Ledger(), rental(hosts=2), MeterState(rental="wl-1-a1")
    credit(ledger, 10_000_000, "c1")
    for t in (1, 61, 125, 300):
        meter(ledger, r, T0 + t, {"agt-1": T0 + t, "agt-2": T0 + t}, state)
    assert state_of("wl-1-a1", ledger.entries) == state


# --- properties --------------------------------------------------------------------------------------------------

KINDS = st.sampled_from(["on_demand", "interruptible", "reserved"])
OPS = st.one_of(
    st.tuples(st.just("credit"), st.integers(1, 5_000_000)),
    st.tuples(st.just("start"), KINDS, st.integers(0, 20_000_000), st.integers(1, 8), st.integers(1, 3)),
    st.tuples(st.just("advance"), st.floats(0.0, 400.0, allow_nan=False)),
    st.tuples(st.just("silence"), st.integers(0, 2)),
    st.tuples(st.just("bid"), st.integers(0, 20_000_000)),
    st.tuples(st.just("end"), st.booleans()),
    st.tuples(st.just("restart")),
    st.tuples(st.just("topup"), st.integers(1, 50_000)),  # a top-up of that many cents opened
    # an event of the provider: its id (a small range, so the same event is delivered again), the top-up it is about,
    # whether it says paid or failed, and whether in the grid's currency; an id seen before is delivered as first sent
    st.tuples(st.just("deliver"), st.integers(0, 6), st.integers(0, 4), st.booleans(), st.booleans()),
    # a payout run (management/payments/payouts.py) with that dispute window, paying each provider what matured
    st.tuples(st.just("payout"), st.sampled_from([0.0, 600.0, 3600.0])),
)


def pay_out(ledger: Ledger, now: float, window_s: float, paid: dict[str, int]) -> None:
    """A payout run's entries, once per provider and day, and the same run again (a rerun after a crash)."""
    for account in sorted(a for a in ledger.balances if a.startswith("provider:")):
        provider = account.removeprefix("provider:")
        entries = [e for e in ledger.entries if any(ln.account == account for ln in e.lines)]
        found = due(
            provider, matured(entries, account, ledger.balance(account), now, window_s), 0, period_label(now, "day"), 10_000
        )
        if found is None:
            continue
        assert 0 < found.amount <= ledger.balance(account)
        entry = payout_entry(provider, found.amount, found.key, now, "payout")
        if ledger.post(entry):
            paid[found.key] = found.amount
        assert not ledger.post(entry)  # run again: nothing moves
        assert ledger.balance(account) >= 0  # a payout never pays more than the provider has


@dataclasses.dataclass
class Payments:
    """The top-ups of the model and the provider's events as first sent (by event number)."""

    topups: dict[str, TopupRecord] = dataclasses.field(default_factory=dict)
    events: dict[int, PaymentEvent] = dataclasses.field(default_factory=dict)
    credited: dict[str, int] = dataclasses.field(default_factory=dict)  # top-up id -> what its one credit moved

    def open(self, cents: int) -> None:
        n = len(self.topups)
        self.topups[f"tu-{n}"] = TopupRecord(
            id=f"tu-{n}", account="alice", amount=cents * 10_000, currency="USD", provider="stripe",
            reference=f"pi_{n}", created_at=T0,
        )  # fmt: skip

    def event(self, number: int, pick: int, paid: bool, in_usd: bool) -> PaymentEvent | None:
        if number not in self.events:
            if not self.topups:
                return None
            topup = sorted(self.topups.values(), key=lambda t: t.id)[pick % len(self.topups)]
            self.events[number] = (
                TopupPaid(
                    event_id=f"evt_{number}", kind="payment_intent.succeeded", reference=topup.reference,
                    topup_id=topup.id, amount=topup.amount, currency="USD" if in_usd else "EUR",
                )
                if paid
                else TopupFailed(
                    event_id=f"evt_{number}", kind="payment_intent.payment_failed", reference=topup.reference,
                    topup_id=topup.id, reason="declined",
                )
            )  # fmt: skip
        return self.events[number]

    def deliver(self, ledger: Ledger, event: PaymentEvent, now: float) -> None:
        topup_id = event.topup_id if isinstance(event, TopupPaid | TopupFailed) else ""
        verdict = judge(event, self.topups.get(topup_id), "USD")
        if isinstance(verdict, Credit):
            entry = credit_entry(verdict.topup.account, verdict.amount, "top-up", key=verdict.key, kind="topup", ts=now)
            if ledger.post(entry):
                assert verdict.topup.id not in self.credited, f"{verdict.topup.id} credited twice"
                self.credited[verdict.topup.id] = verdict.amount
            else:
                assert verdict.topup.id in self.credited  # its key was taken by its first credit: nothing moved
            self.topups[verdict.topup.id] = msgspec.structs.replace(verdict.topup, state="credited")
        elif isinstance(verdict, MarkFailed):
            self.topups[verdict.topup.id] = msgspec.structs.replace(verdict.topup, state="failed")

    def check(self, ledger: Ledger) -> None:
        topup_entries = [e for e in ledger.entries if e.kind == "topup"]
        assert sorted(e.key for e in topup_entries) == sorted(topup_key(t) for t in self.credited)
        into_renter = sum(ln.amount for e in topup_entries for ln in e.lines if ln.account == renter_account("alice"))
        assert into_renter == sum(self.credited.values())
        for topup_id, amount in self.credited.items():
            assert amount == self.topups[topup_id].amount and self.topups[topup_id].state == "credited"


HOLDS = st.sampled_from([None, 60.0, 600.0, 3600.0, 86400.0])  # a rental's hold: one period, ... a day
RESERVES = st.sampled_from([0.0, 10.0, 120.0])


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=40), HOLDS, RESERVES, st.floats(0.0, 90_000.0, allow_nan=False))
# Found in CI (provider:prov-1 at -1): r1's SLA credit took the 1 prov-1 had earned from r2, still running; r2's refund
# then took it back again. A refund takes back at most what the provider has; the platform pays the rest.
@example(
    ops=[("credit", 1), ("start", "on_demand", 1, 3, 1), ("start", "on_demand", 8, 8, 1), ("advance", 60.0),
         ("end", True), ("end", True)],
    hold_s=None, reserve_s=0.0, downtime=0.0,
)  # fmt: skip
# A refund after a payout of the rental's earnings (a dispute window of 0).
@example(
    ops=[("credit", 5_000_000), ("start", "on_demand", 3_600_000, 1, 1), ("advance", 120.0), ("payout", 0.0),
         ("end", True)],
    hold_s=None, reserve_s=0.0, downtime=0.0,
)  # fmt: skip
def test_after_any_sequence_every_entry_balances_no_renter_or_hold_goes_negative_and_replays_post_nothing(
    ops, hold_s, reserve_s, downtime
):
    """Whatever the hold and the reserve. Also: each top-up is credited at most once, its own amount, whichever of its
    events arrive and however often, holds taken or not; a failed payment, another currency or another payment credits
    nothing; an ended rental holds nothing; a rental ended through its host is credited at most once, only then, from
    that host's provider, never past the formula or what the provider had, and no provider goes below zero."""
    ledger = Ledger()
    now = T0
    open_rentals: dict[str, RentalRecord] = {}
    states: dict[str, MeterState] = {}
    silent: dict[str, float] = {}  # agent id -> its last heartbeat, once it fell silent
    count = 0
    payments = Payments()
    failed: set[str] = set()  # rentals ended through a host
    paid: dict[str, int] = {}  # payout key -> amount

    def heartbeats() -> dict[str, float]:
        agents = {h.agent_id for r in open_rentals.values() for h in r.hosts}
        return {a: silent.get(a, now) for a in agents}

    def end(r: RentalRecord, failure: str, reason: str) -> None:
        last = min([now, *(heartbeats()[h.agent_id] for h in r.hosts)])
        ended = msgspec.structs.replace(r, ended_at=max(r.started_at, last), host_failure=failure, end_reason=reason)
        if failure:
            failed.add(r.id)
        meter(ledger, ended, now + downtime, heartbeats(), states[r.id], hold_s=hold_s, reserve_s=reserve_s, sla=SLA)
        assert states[r.id].held == 0, "an ended rental still holds money"
        del open_rentals[r.id]

    def tick() -> None:
        for r in list(open_rentals.values()):
            if meter(ledger, r, now, heartbeats(), states[r.id], hold_s=hold_s, reserve_s=reserve_s):
                end(r, "", "the renter's balance ran out")

    for op in ops:
        if op[0] == "credit":
            credit(ledger, op[1], f"credit-{len(ledger.entries)}")
        elif op[0] == "start" and len(open_rentals) < 2:
            count += 1
            kind, price, gpus, hosts = op[1:]
            extra = {"reserved_until": now + 3600.0} if kind == "reserved" else {}
            r = rental(kind, price=price, gpus=gpus, hosts=hosts, id=f"r{count}", started_at=now, **extra)
            r = msgspec.structs.replace(r, hosts=[msgspec.structs.replace(h, agent_id=f"r{count}-{h.agent_id}") for h in r.hosts])
            open_rentals[r.id], states[r.id] = r, MeterState(rental=r.id)
        elif op[0] == "advance":
            now += op[1]
        elif op[0] == "silence" and open_rentals:
            r = sorted(open_rentals.values(), key=lambda x: x.id)[0]
            host = r.hosts[op[1] % len(r.hosts)]
            silent.setdefault(host.agent_id, now)
        elif op[0] == "bid":
            for r in list(open_rentals.values()):
                if r.kind == "interruptible" and now > r.started_at:
                    changes = [*r.bid_changes, PriceChange(at=now, price=op[1])]
                    open_rentals[r.id] = msgspec.structs.replace(r, bid_changes=changes)
        elif op[0] == "end" and open_rentals:
            r = sorted(open_rentals.values(), key=lambda x: x.id)[0]
            end(r, f"{r.hosts[0].agent_id}: went offline" if op[1] else "", "stopped")
        elif op[0] == "restart":  # a new Master: every state from the entries alone
            states = {rid: state_of(rid, ledger.entries) for rid in states}
        elif op[0] == "topup":
            payments.open(op[1])
        elif op[0] == "deliver":
            event = payments.event(*op[1:])
            if event is not None:
                payments.deliver(ledger, event, now)
                payments.deliver(ledger, event, now)  # delivered again (a retry, a replay): nothing more moves
        elif op[0] == "payout":
            pay_out(ledger, now, op[1], paid)
        tick()
        payments.check(ledger)
        assert sum(ledger.balances.values()) == 0
        assert ledger.balance(renter_account("alice")) >= 0
        assert ledger.balance(hold_account("alice")) >= 0
        for rid, state in states.items():
            assert state.held >= 0, rid
            assert state_of(rid, ledger.entries) == state
        assert ledger.balance(hold_account("alice")) == sum(states[rid].held for rid in open_rentals)
        for account, balance in ledger.balances.items():
            assert account == EXTERNAL or balance >= 0, account
        payouts = [e for e in ledger.entries if e.kind == "payout"]
        assert {e.key: paid_out(e) for e in payouts} == paid  # each payout once, its own amount, out to external
    for rid in states:
        assert ledger.charged(rid) >= 0
    for e in ledger.entries:
        if e.kind == "sla_credit":
            assert e.key == sla_key(e.rental) and e.rental in failed
            (provider_line,) = [ln for ln in e.lines if ln.account.startswith("provider:")]
            assert provider_line.host.startswith(e.rental) and provider_line.host.endswith("agt-1")  # the failing host's
            assert -provider_line.amount <= 20_000_000 * 8 * 2  # at most the cap: an hour of the host's cost


@settings(max_examples=200, deadline=None)
@given(
    price=st.integers(0, 50_000_000),
    gpus=st.integers(1, 16),
    seconds=st.integers(0, 4 * 3600),
    ticks=st.lists(st.floats(0.0, 1.0, allow_nan=False), max_size=12),
    fraction=st.floats(0.0, 0.999, allow_nan=False),
)
def test_a_rental_with_enough_money_is_charged_exactly_price_times_gpus_times_its_whole_seconds(
    price, gpus, seconds, ticks, fraction
):
    ledger, r, state = Ledger(), rental(price=price, gpus=gpus), MeterState(rental="wl-1-a1")
    credit(ledger, price * gpus * 5, "c1")  # five hours' worth
    for t in sorted(ticks):
        now = T0 + t * seconds
        meter(ledger, r, now, {"agt-1": now}, state)
    end = T0 + seconds + fraction
    meter(ledger, msgspec.structs.replace(r, ended_at=end), end, {"agt-1": end}, state)
    assert ledger.charged("wl-1-a1") == price * gpus * seconds // 3600
    assert ledger.balance(hold_account("alice")) == 0


@settings(max_examples=200, deadline=None)
@given(
    funds=st.integers(0, 20_000_000),
    price=st.integers(1, 50_000_000),
    gpus=st.integers(1, 8),
    hold_s=HOLDS,
    gaps=st.lists(st.floats(0.5, 10.0, allow_nan=False), min_size=1, max_size=400),
)
def test_a_rental_stopped_at_the_first_tick_that_says_it_ran_out_pays_its_provider_every_metered_second(
    funds, price, gpus, hold_s, gaps
):
    """Ticks at most the reserve (10 s) apart, as the metering loop's are: however much money, whatever the hold, the
    providers and fees get exactly what the rental cost up to its end, and what the hold kept beyond that returns."""
    ledger, r, state = Ledger(), rental(price=price, gpus=gpus), MeterState(rental="wl-1-a1")
    credit(ledger, funds, "c1")
    now, end = T0, None
    for gap in [0.0, *gaps]:
        now += gap
        if meter(ledger, r, now, {"agt-1": now}, state, hold_s=hold_s, reserve_s=10.0):
            end = now
            break
    end = now if end is None else end
    meter(ledger, msgspec.structs.replace(r, ended_at=end), end, {"agt-1": end}, state, hold_s=hold_s, reserve_s=10.0)
    assert ledger.charged("wl-1-a1") == cost_until(r, end)
    assert ledger.balance(hold_account("alice")) == 0
    assert ledger.balance(renter_account("alice")) == funds - cost_until(r, end)

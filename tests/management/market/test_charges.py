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
from hypothesis import given, settings
from hypothesis import strategies as st

from management.market.charges import FeeRate, MeterState, apply, cost_until, state_of, step
from management.market.ledger import EXTERNAL, FEES, credit_entry, hold_account, renter_account
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
        """What the providers and the fees received from the rental, refunds taken back."""
        return sum(
            ln.amount
            for e in self.entries
            if e.rental == rental_id
            for ln in e.lines
            if ln.account == FEES or ln.account.startswith("provider:")
        )


def credit(ledger: Ledger, amount: int, key: str) -> None:
    lines = [LedgerLine(account=EXTERNAL, amount=-amount), LedgerLine(account=renter_account("alice"), amount=amount)]
    ledger.post(LedgerEntry(key=key, ts=T0, kind="credit", memo="credit", lines=lines))


def meter(ledger: Ledger, r: RentalRecord, now: float, heartbeats: dict[str, float], state: MeterState) -> bool:
    """One step, posted; asserts that replaying it posts nothing new. Returns whether the money ran out."""
    done = step(r, now, heartbeats=heartbeats, period_s=P, state=state, available=ledger.balance("renter:alice"), fees=FEE)
    for entry in done.entries:
        assert ledger.post(entry), f"{entry.key} posted twice"
        apply(state, entry)
    again = step(r, now, heartbeats=heartbeats, period_s=P, state=state, available=ledger.balance("renter:alice"), fees=FEE)
    assert [e for e in again.entries if ledger.post(e)] == [], "a replayed step posted something"
    return done.ran_out


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
)


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


@settings(max_examples=150, deadline=None)
@given(st.lists(OPS, max_size=40))
def test_after_any_sequence_every_entry_balances_no_renter_or_hold_goes_negative_and_replays_post_nothing(ops):
    """Also: each top-up is credited at most once, its own amount, whichever of its events arrive and however often;
    a failed payment, another currency or another payment credits nothing."""
    ledger = Ledger()
    now = T0
    open_rentals: dict[str, RentalRecord] = {}
    states: dict[str, MeterState] = {}
    silent: dict[str, float] = {}  # agent id -> its last heartbeat, once it fell silent
    count = 0
    payments = Payments()

    def heartbeats() -> dict[str, float]:
        agents = {h.agent_id for r in open_rentals.values() for h in r.hosts}
        return {a: silent.get(a, now) for a in agents}

    def end(r: RentalRecord, failure: str, reason: str) -> None:
        last = min([now, *(heartbeats()[h.agent_id] for h in r.hosts)])
        ended = msgspec.structs.replace(r, ended_at=max(r.started_at, last), host_failure=failure, end_reason=reason)
        meter(ledger, ended, now, heartbeats(), states[r.id])
        del open_rentals[r.id]

    def tick() -> None:
        for r in list(open_rentals.values()):
            if meter(ledger, r, now, heartbeats(), states[r.id]):
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
        tick()
        payments.check(ledger)
        assert sum(ledger.balances.values()) == 0
        assert ledger.balance(renter_account("alice")) >= 0
        assert ledger.balance(hold_account("alice")) >= 0
        for rid, state in states.items():
            assert state.held >= 0, rid
            assert state_of(rid, ledger.entries) == state
    for rid in states:
        assert ledger.charged(rid) >= 0


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

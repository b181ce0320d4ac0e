"""Reports as a pure function of records: each figure is read from its one source, each record lands in one row, so the
rows sum to the total along any dimensions, and money agrees with the ledger's lines to the micro-unit."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from management.monitoring.reports import (
    DIMENSIONS,
    KINDS,
    NONE,
    GpuFacts,
    HostFacts,
    InvalidReport,
    ReportInputs,
    build_report,
    parse_dimensions,
    parse_instant,
    restrict,
    split_amount,
    window,
)
from master.records import CommandRecord, LedgerEntry, LedgerLine, RentalHost, RentalRecord, TelemetryRollup

DAY0 = dt.datetime(2026, 11, 20, tzinfo=dt.UTC).timestamp()
HOSTS = {
    "h-acme-1": HostFacts(provider="acme", region="eu-west", enrolled_at=DAY0 - 86400),
    "h-acme-2": HostFacts(provider="acme", region="us-east", enrolled_at=DAY0 - 86400),
    "h-bolt-1": HostFacts(provider="bolt", region="eu-west", enrolled_at=DAY0 - 86400),
}
GPUS = [
    GpuFacts("g-a1-0", "h-acme-1", "premium", "h100-sxm"),
    GpuFacts("g-a1-1", "h-acme-1", "premium", "h100-sxm"),
    GpuFacts("g-a2-0", "h-acme-2", "standard", "a10"),
    GpuFacts("g-b1-0", "h-bolt-1", "standard", "a10"),
]
AGENT_OF = {g.uuid: g.agent_id for g in GPUS}


def rollup(uuid: str, t: float, util: float) -> TelemetryRollup:
    return TelemetryRollup(
        gpu_uuid=uuid,
        agent_id=AGENT_OF[uuid],
        minute=int(t // 60),
        samples=6,
        utilization_avg=util,
        utilization_max=util,
        memory_used_mib_max=0,
    )


def charge(key: str, ts: float, rental: RentalRecord, host: str, provider: str, amount: int, fee: int) -> LedgerEntry:
    lines = [
        LedgerLine(account=f"hold:{rental.account}", amount=-amount, host=host, workload=rental.workload_id),
        LedgerLine(account=f"provider:{provider}", amount=amount - fee, host=host, workload=rental.workload_id),
        LedgerLine(account="platform:fees", amount=fee, host=host, workload=rental.workload_id),
    ]
    return LedgerEntry(key=key, ts=ts, kind="charge", memo="", lines=lines, rental=rental.id)


def refund(key: str, ts: float, rental: RentalRecord, host: str, provider: str, amount: int, fee: int) -> LedgerEntry:
    lines = [
        LedgerLine(account=f"renter:{rental.account}", amount=amount, host=host, workload=rental.workload_id),
        LedgerLine(account=f"provider:{provider}", amount=-(amount - fee), host=host, workload=rental.workload_id),
        LedgerLine(account="platform:fees", amount=-fee, host=host, workload=rental.workload_id),
    ]
    return LedgerEntry(key=key, ts=ts, kind="refund", memo="", lines=lines, rental=rental.id)


def rental(rid: str, host: str, units: list[str], start: float, end: float | None, renter: str = "lab", failure: str = ""):
    provider = HOSTS[host].provider
    return RentalRecord(
        id=rid,
        workload_id=rid.rsplit("-a", 1)[0],
        account=renter,
        kind="on_demand",
        hosts=[RentalHost(agent_id=host, provider=provider, gpus=len(units), price=1_000_000, units=units)],
        started_at=start,
        ended_at=end,
        host_failure=failure,
    )


def inputs(rollups=(), rentals=(), entries=(), commands=()) -> ReportInputs:
    return ReportInputs(
        hosts=HOSTS, gpus=GPUS, rollups=list(rollups), rentals=list(rentals), entries=list(entries), commands=list(commands)
    )


def rows_of(report) -> dict[tuple[str, ...], dict[str, object]]:
    return {row.keys: {c: row.figures.column(c) for c in report.columns} for row in report.rows}


# --- one day, worked by hand -------------------------------------------------------------------------------------


def test_a_rented_gpu_is_sold_and_busy_an_unrented_one_idle_and_money_goes_to_the_hosts_provider_and_day():
    r1 = rental("wl-1-a1", "h-acme-1", ["g-a1-0"], DAY0 + 3600, DAY0 + 3 * 3600)
    telemetry = [rollup("g-a1-0", DAY0 + 3600 + 60 * m, 80.0) for m in range(120)]  # rented: 2 h at 80 %
    telemetry += [rollup("g-b1-0", DAY0 + 60 * m, 0.0) for m in range(60)]  # bolt's GPU: 1 h reported, idle
    entries = [
        charge("charge:wl-1-a1:1", DAY0 + 7200, r1, "h-acme-1", "acme", 1_000_000, 100_000),
        charge("charge:wl-1-a1:end", DAY0 + 3 * 3600, r1, "h-acme-1", "acme", 1_000_000, 100_000),
    ]
    report = build_report(inputs(telemetry, [r1], entries), "summary", ("provider", "day"), DAY0, DAY0 + 86400)
    rows = rows_of(report)
    acme, bolt = rows[("acme", "2026-11-20")], rows[("bolt", "2026-11-20")]
    assert (acme["gpu_hours_available"], acme["gpu_hours_sold"], acme["gpu_hours_idle"]) == (2.0, 2.0, 0.0)
    assert acme["utilization_pct"] == 80.0
    assert (acme["gross"], acme["fees"], acme["provider_net"], acme["platform_net"]) == (2_000_000, 200_000, 1_800_000, 200_000)
    assert (acme["rentals_started"], acme["rentals_ended"], acme["sla_breaches"]) == (1, 1, 0)
    # acme has 3 GPUs registered for the whole day (3 * 1440 GPU-minutes) and reported 120 of them
    assert acme["uptime_pct"] == round(100 * 120 / (3 * 1440), 2)
    assert (bolt["gpu_hours_available"], bolt["gpu_hours_idle"], bolt["gpu_hours_sold"], bolt["gross"]) == (1.0, 1.0, 0.0, 0)


def test_by_tier_and_region_a_rentals_money_follows_the_gpus_it_held_split_exactly():
    r1 = rental("wl-2-a1", "h-acme-1", ["g-a1-0", "g-a1-1"], DAY0, DAY0 + 3600)
    entries = [charge("charge:wl-2-a1:end", DAY0 + 3600, r1, "h-acme-1", "acme", 1_000_001, 100_001)]
    report = build_report(inputs((), [r1], entries), "revenue", ("tier", "region"), DAY0, DAY0 + 86400)
    assert rows_of(report) == {
        ("premium", "eu-west"): {
            "gross": 1_000_001,
            "fees": 100_001,
            "refunded": 0,
            "fees_refunded": 0,
            "provider_net": 900_000,
            "platform_net": 100_001,
        }
    }


def test_a_rental_ended_through_its_host_is_an_sla_breach_of_that_host_and_its_refund_is_counted():
    r1 = rental("wl-3-a1", "h-bolt-1", ["g-b1-0"], DAY0, DAY0 + 1800, failure="h-bolt-1: went offline")
    entries = [
        charge("charge:wl-3-a1:end", DAY0 + 1800, r1, "h-bolt-1", "bolt", 500_000, 50_000),
        refund("refund:wl-3-a1", DAY0 + 1800, r1, "h-bolt-1", "bolt", 500_000, 50_000),
    ]
    failed = CommandRecord(
        id="cmd-1",
        agent_id="h-bolt-1",
        kind="create_container",
        spec={},
        state="failed",
        created_at=DAY0,
        deadline=DAY0 + 60,
        finished_at=DAY0 + 10,
    )
    report = build_report(inputs((), [r1], entries, [failed]), "summary", ("host",), DAY0, DAY0 + 86400)
    [row] = [row for row in report.rows if row.keys == ("h-bolt-1",)]  # the others: registered GPUs, 0 % uptime
    figures = {c: row.figures.column(c) for c in report.columns}
    seen = (figures["sla_breaches"], figures["commands_failed"], figures["refunded"], figures["fees_refunded"])
    assert seen == (1, 1, 450_000, 50_000)
    assert (figures["provider_net"], figures["platform_net"]) == (0, 0)


def test_time_is_cut_at_the_window_and_at_day_boundaries():
    r1 = rental("wl-4-a1", "h-acme-2", ["g-a2-0"], DAY0 - 3600, None)  # started before the window, still running
    report = build_report(inputs((), [r1]), "usage", ("day",), DAY0 + 86400 - 1800, DAY0 + 86400 + 3600)
    sold = {row.keys: row.figures.column("gpu_hours_sold") for row in report.rows}
    assert sold == {("2026-11-20",): 0.5, ("2026-11-21",): 1.0}
    assert report.total.column("rentals_started") == 0  # it started before the window


def test_renter_and_workload_rows_have_no_uptime_and_idle_minutes_have_no_renter():
    r1 = rental("wl-5-a1", "h-acme-1", ["g-a1-0"], DAY0, DAY0 + 120)
    telemetry = [rollup("g-a1-0", DAY0 + 60 * m, 50.0) for m in range(4)]  # 2 rented minutes, then 2 idle
    report = build_report(inputs(telemetry, [r1]), "usage", ("renter",), DAY0, DAY0 + 3600)
    rows = rows_of(report)
    assert rows[("lab",)]["gpu_hours_idle"] == 0.0 and rows[(NONE,)]["gpu_hours_idle"] == round(2 / 60, 4)
    assert all(r["uptime_pct"] is None for r in rows.values())


def test_a_provider_sees_only_its_hosts_and_a_renter_only_its_rentals():
    r1 = rental("wl-6-a1", "h-acme-1", ["g-a1-0"], DAY0, DAY0 + 3600, renter="lab")
    r2 = rental("wl-7-a1", "h-bolt-1", ["g-b1-0"], DAY0, DAY0 + 3600, renter="zoo")
    telemetry = [rollup(u, DAY0 + 60 * m, 10.0) for u in ("g-a1-0", "g-a1-1", "g-b1-0") for m in range(60)]
    entries = [
        charge("c1", DAY0 + 3600, r1, "h-acme-1", "acme", 1_000_000, 0),
        charge("c2", DAY0 + 3600, r2, "h-bolt-1", "bolt", 2_000_000, 0),
    ]
    everything = inputs(telemetry, [r1, r2], entries)
    acme = build_report(restrict(everything, provider="acme"), "summary", ("host",), DAY0, DAY0 + 86400)
    assert [row.keys for row in acme.rows] == [("h-acme-1",), ("h-acme-2",)]
    assert acme.total.gross == 1_000_000
    lab = build_report(restrict(everything, renter="lab"), "summary", ("workload",), DAY0, DAY0 + 86400)
    assert [row.keys for row in lab.rows] == [("wl-6",)]
    assert (lab.total.gross, lab.total.gpu_minutes_available, lab.total.commands_failed) == (1_000_000, 60, 0)


def test_bad_dimensions_and_times_are_refused_naming_what_is_wrong():
    with pytest.raises(InvalidReport, match="'country' is not a dimension"):
        parse_dimensions("provider,country")
    with pytest.raises(InvalidReport, match="at most one of day, week and month"):
        parse_dimensions("day,week")
    with pytest.raises(InvalidReport, match="more than once"):
        parse_dimensions("tier,tier")
    with pytest.raises(InvalidReport, match="from: 'yesterday'"):
        parse_instant("from", "yesterday")
    assert parse_instant("to", "2026-11-20") == DAY0 == parse_instant("to", "2026-11-20T00:00:00Z")
    assert parse_instant("to", str(DAY0)) == DAY0
    with pytest.raises(InvalidReport, match="must be before"):
        window(DAY0, DAY0, DAY0)
    with pytest.raises(InvalidReport, match="at most 93"):
        window(DAY0 - 100 * 86400, DAY0, DAY0)
    assert window(None, None, DAY0) == (DAY0 - 7 * 86400, DAY0)


# --- sums agree, whatever the records ----------------------------------------------------------------------------

ADDITIVE = (
    "gpu_minutes_available",
    "gpu_minutes_idle",
    "utilization_sum",
    "gpu_seconds_sold",
    "gross",
    "fees",
    "refunded",
    "fees_refunded",
    "commands_failed",
    "rentals_started",
    "rentals_ended",
    "sla_breaches",
)
UNITS = {host: [g.uuid for g in GPUS if g.agent_id == host] for host in HOSTS}


@st.composite
def records(draw: st.DrawFn) -> ReportInputs:
    span = 3 * 86400
    rentals, entries = [], []
    for i in range(draw(st.integers(0, 5))):
        host = draw(st.sampled_from(sorted(HOSTS)))
        units = draw(st.lists(st.sampled_from(UNITS[host]), min_size=1, unique=True))
        start = DAY0 + draw(st.integers(-86400, span))
        end = draw(st.none() | st.integers(60, span).map(start.__add__))
        r = rental(f"wl-{i}-a1", host, units, start, end, renter=draw(st.sampled_from(["lab", "zoo"])))
        rentals.append(r)
        provider = HOSTS[host].provider
        for k in range(draw(st.integers(0, 3))):
            amount = draw(st.integers(0, 10_000_000))
            entries.append(charge(f"c-{i}-{k}", start + 3600 * k, r, host, provider, amount, amount // 10))
        if draw(st.booleans()):
            amount = draw(st.integers(0, 10_000_000))
            entries.append(refund(f"r-{i}", start + 60, r, host, provider, amount, amount // 7))
    minutes = st.tuples(st.sampled_from(sorted(AGENT_OF)), st.integers(0, span // 60), st.floats(0, 100))
    drawn = draw(st.lists(minutes, unique_by=lambda t: t[:2], max_size=40))
    telemetry = [rollup(uuid, DAY0 + 60 * minute, util) for uuid, minute, util in drawn]
    return inputs(telemetry, rentals, entries)


@settings(max_examples=60, deadline=None)
@given(records(), st.lists(st.sampled_from(DIMENSIONS), min_size=1, max_size=2, unique=True))
def test_the_rows_sum_to_the_total_and_every_total_is_the_same_whatever_the_dimensions(found, by):
    if sum(d in ("day", "week", "month") for d in by) > 1:
        by = [d for d in by if d not in ("week", "month")] or ["day"]
    start, end = DAY0, DAY0 + 2 * 86400
    report = build_report(found, "summary", tuple(by), start, end)
    plain = build_report(found, "summary", ("provider",), start, end)
    for name in ADDITIVE:
        summed = sum(getattr(row.figures, name) for row in report.rows)
        assert summed == pytest.approx(getattr(report.total, name))
        assert getattr(report.total, name) == pytest.approx(getattr(plain.total, name)), name


@settings(max_examples=60, deadline=None)
@given(records())
def test_revenue_per_provider_and_day_is_the_ledgers_lines_on_that_providers_account_that_day(found):
    start, end = DAY0 - 86400, DAY0 + 5 * 86400
    report = build_report(found, "revenue", ("provider", "day"), start, end)
    expected: dict[tuple[str, str], int] = {}
    for entry in found.entries:
        day = dt.datetime.fromtimestamp(entry.ts, tz=dt.UTC).strftime("%Y-%m-%d")
        for line in entry.lines:
            if line.account.startswith("provider:") and start <= entry.ts < end:
                key = (line.account.removeprefix("provider:"), day)
                expected[key] = expected.get(key, 0) + line.amount
    got = {row.keys: row.figures.column("provider_net") for row in report.rows if row.figures.gross or row.figures.refunded}
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}
    fees = sum(ln.amount for e in found.entries for ln in e.lines if ln.account == "platform:fees" and start <= e.ts < end)
    assert report.total.column("platform_net") == fees


@given(st.integers(-(10**12), 10**12), st.integers(1, 16))
def test_an_amount_split_over_gpus_sums_back_to_it(amount, parts):
    assert sum(split_amount(amount, parts)) == amount


def test_every_kind_names_its_columns():
    assert set(KINDS) == {"usage", "revenue", "reliability", "summary"}


@settings(max_examples=40, deadline=None)
@given(records())
def test_what_each_provider_sees_adds_up_to_what_the_operator_sees(found):
    start, end = DAY0, DAY0 + 3 * 86400
    everything = build_report(found, "summary", ("provider",), start, end).total
    providers = [build_report(restrict(found, provider=p), "summary", ("day",), start, end).total for p in ("acme", "bolt")]
    for name in ("gpu_minutes_available", "gpu_minutes_idle", "gpu_seconds_sold", "gross", "fees", "refunded", "sla_breaches"):
        assert sum(getattr(t, name) for t in providers) == pytest.approx(getattr(everything, name)), name

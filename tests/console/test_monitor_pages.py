"""The alerts, silences and reports pages (management/console/pages/alerts.py, reports.py): their pure parts (façade
answers to rows, the forms read with each problem beside its field, a report's chart series) without a server, and
over plain HTTP on a real Master (a renter's view: its alerts, no silences, its reports, bad input as a 400 page).
The browser journeys on a running grid are test_journey_alerts.py and test_journey_reports.py."""

from __future__ import annotations

import csv
import io

from management.console.pages.alerts import (
    alert_rows,
    parse_duration,
    read_silence_form,
    shown_value,
    silence_rows,
    subject_link,
    transition_rows,
)
from management.console.pages.reports import (
    CHART_SERIES,
    chart_series,
    period_starts,
    read_report_form,
    report_table,
)
from management.monitoring.evaluator import AlertState, AlertTransition
from management.monitoring.rules import AlertRule
from management.monitoring.settings import RuleListing
from management.store import silence_repo
from master.records import SilenceRecord
from tests.console.plain_http import csrf_of, sign_in

DAY = 86400.0
MONDAY = 1794787200.0  # 2026-11-16T00:00:00Z, a Monday (ISO week 47)
HOT = AlertRule(
    name="gpu_overheating", metric="gpu.temperature_c", op=">", threshold=85, for_s=120, severity="critical", summary="hot"
)
RULES = {"gpu_overheating": RuleListing(HOT, "file")}
GPU_LABELS = {"agent_id": "agt-1", "gpu": "GPU-1", "provider": "acme", "renter": "rita", "workload": "wl-9"}


# --- alerts -------------------------------------------------------------------------------------------------------


def test_an_alert_row_says_severity_summary_value_and_how_long_and_links_its_subject_per_role():
    state = AlertState(rule="gpu_overheating", subject="GPU-1", phase="firing", since=1000.0, value=97.0, labels=GPU_LABELS)
    (row,) = alert_rows([state], RULES, "operator", now=1000.0 + 200)
    assert (row.severity, row.summary, row.value, row.lasting) == ("critical", "hot", "97 °C", "3 min")
    assert row.link == "/console/hosts/agt-1"  # a GPU's alert goes to its host's page
    assert row.silence_link == "/console/silences?rule=gpu_overheating&subject=GPU-1"
    (as_renter,) = alert_rows([state], RULES, "renter", now=1200.0)
    assert as_renter.link == "/console/workloads/wl-9"  # the renter's page for it is its workload's
    unknown = AlertState(rule="gone", subject="x", phase="pending", since=1.0, value=1.0)
    assert alert_rows([unknown], RULES, "provider", now=2.0)[0].severity == "-"  # a rule removed meanwhile


def test_subjects_link_where_the_viewer_has_a_page():
    assert subject_link("agt-2", "host", {}, "provider") == "/console/hosts/agt-2"
    assert subject_link("fleet", "fleet", {}, "operator") is None
    assert subject_link("wl-1", "workload", {}, "renter") == "/console/workloads/wl-1"
    assert subject_link("GPU-1", "gpu", {"agent_id": "agt-1"}, "renter") is None  # no workload: no renter page


def test_values_are_shown_in_their_metrics_units():
    assert shown_value(91.4, "gpu.temperature_c") == "91 °C"
    assert shown_value(3.25, "gpu.rented_utilization_pct") == "3.2%"
    assert shown_value(1800, "renter.balance_cover_s") == "30 min"
    assert shown_value(1, "host.offline") == "1"
    assert shown_value(None, "host.offline") == "-"


def test_transitions_are_listed_newest_first_as_given_and_bounded():
    transitions = [
        AlertTransition(
            key=f"k{i}",
            rule="gpu_overheating",
            subject="GPU-1",
            phase="resolved" if i % 2 else "firing",
            at=1000.0 + i,
            since=900.0,
            fired_at=950.0,
            value=None if i % 2 else 90.0,
            severity="critical",
            scope="gpu",
            summary="hot",
            labels=GPU_LABELS,
        )
        for i in range(5)
    ]
    rows = transition_rows(transitions, RULES, "provider", limit=3)
    assert [r.phase for r in rows] == ["firing", "resolved", "firing"]
    assert rows[1].value == "-" and rows[0].value == "90 °C"


def test_the_silence_form_reads_rule_subject_labels_and_a_duration():
    wanted, errors = read_silence_form(
        {"rule": "gpu_overheating", "subject": "GPU-1", "labels": "provider=acme, region=eu-west", "duration": "2h"},
        list(RULES),
    )
    assert not errors and wanted is not None
    assert (wanted.rule, wanted.subject, wanted.duration_s) == ("gpu_overheating", "GPU-1", 7200.0)
    assert wanted.labels == {"provider": "acme", "region": "eu-west"}
    assert [parse_duration(v) for v in ("90", "90m", "45s", "1d", "1.5h", "soon")] == [5400, 5400, 45, 86400, 5400, None]


def test_each_problem_of_the_silence_form_is_kept_beside_its_field():
    _, nothing = read_silence_form({"duration": "1h"}, list(RULES))
    assert "would silence everything" in nothing["rule"]
    _, bad = read_silence_form(
        {"rule": "no_such", "subject": "bad subject!", "labels": "provider", "duration": "forever"}, list(RULES)
    )
    assert set(bad) == {"rule", "subject", "labels", "duration"}
    assert "not one of the alert rules" in bad["rule"] and "'forever'" in bad["duration"]
    _, too_long = read_silence_form({"rule": "gpu_overheating", "duration": "91d"}, list(RULES))
    assert "at most 90 days" in too_long["duration"]


def test_silences_are_listed_soonest_to_expire_first_with_what_they_match():
    silences = [
        SilenceRecord(id="sil-b", expires_at=5000.0, created_at=0.0, created_by="operator", labels={"provider": "acme"}),
        SilenceRecord(id="sil-a", expires_at=4600.0, created_at=0.0, created_by="operator", rule="r", subject="GPU-1"),
    ]
    rows = silence_rows(silences, now=1000.0)
    assert [(r.id, r.matches, r.left) for r in rows] == [
        ("sil-a", "rule r, subject GPU-1", "1 h 00 min"),
        ("sil-b", "provider=acme", "1 h 06 min"),
    ]


# --- reports ------------------------------------------------------------------------------------------------------


def test_the_report_form_defaults_to_usage_by_day_over_the_last_seven_days():
    wanted, errors, typed = read_report_form({}, now=MONDAY)
    assert not errors and wanted is not None
    assert (wanted.kind, wanted.by, wanted.start, wanted.end, wanted.chart) == (
        "usage",
        ("day",),
        MONDAY - 7 * DAY,
        MONDAY,
        "gpu_hours_available",
    )
    assert typed["kind"] == "usage" and typed["by"] == "day"


def test_bad_report_input_is_said_beside_its_field():
    cases = {
        "by": ({"by": "host,planet"}, "'planet' is not a dimension"),
        "kind": ({"kind": "weather"}, "'weather' is not a report"),
        "to": ({"to": "tomorrow"}, "neither unix seconds nor an ISO date"),
        "chart": ({"chart": "happiness"}, "not a figure of any report"),
        "form": ({"colour": "red"}, "colour: not a report field"),
    }
    for field, (query, message) in cases.items():
        wanted, errors, _ = read_report_form(query, now=MONDAY)
        assert wanted is None and message in errors[field], (field, errors)
    _, backwards, _ = read_report_form({"from": "2026-11-20", "to": "2026-11-10"}, now=MONDAY)
    assert "from (2026-11-20T00:00:00Z) must be before to (2026-11-10T00:00:00Z)" in backwards["from"]
    _, too_long, _ = read_report_form({"from": "2026-01-01", "to": "2026-11-10"}, now=MONDAY)
    assert "at most 93" in too_long["from"]


def test_a_chart_of_another_kinds_figure_falls_back_to_the_kinds_first():
    wanted, errors, typed = read_report_form({"kind": "revenue", "chart": "rentals_started"}, now=MONDAY)
    assert not errors and wanted is not None and wanted.chart == typed["chart"] == "gross"


def report_body(by: list[str], rows: list[dict], column: str = "gross") -> dict:
    return {"by": by, "columns": [*by, column], "rows": rows, "total": {column: "9.00"}}


def test_a_time_dimension_charts_each_group_over_the_periods_drawn_at_their_middles():
    rows = [
        {"provider": "acme", "day": "2026-11-16", "gross": "1.50"},
        {"provider": "acme", "day": "2026-11-18", "gross": "2.00"},
        {"provider": "zeta", "day": "2026-11-18", "gross": "0.25"},
    ]
    series = chart_series(report_body(["provider", "day"], rows), "gross", MONDAY, MONDAY + 7 * DAY)
    assert series.time and series.money and series.period == "day"
    assert series.labels == ["2026-11-16", "2026-11-18"]
    assert series.x == [MONDAY + DAY / 2, MONDAY + 2.5 * DAY]
    assert series.names == ["acme", "zeta"]  # the largest first
    assert series.values == [[1.5, 2.0], [None, 0.25]]
    assert (series.low, series.high) == (MONDAY, MONDAY + 7 * DAY)
    assert series.points[:2] == ["2026-11-16 acme: 1.50", "2026-11-16 zeta: -"]


def test_groups_beyond_the_largest_are_summed_as_others():
    rows = [{"host": f"h{i}", "week": "2026-W47", "gross": str(i + 1)} for i in range(CHART_SERIES + 3)]
    series = chart_series(report_body(["host", "week"], rows), "gross", MONDAY, MONDAY + 7 * DAY)
    assert len(series.names) == CHART_SERIES + 1 and series.names[-1] == "3 others"
    assert series.values[-1] == [1.0 + 2.0 + 3.0] and series.cut == 3
    assert period_starts(MONDAY, MONDAY + 7 * DAY, "week") == {"2026-W47": MONDAY}


def test_without_a_time_dimension_each_row_is_a_bar_named_by_its_dimensions():
    rows: list[dict[str, str | None]] = [
        {"tier": "t1", "region": "eu", "gross": "1.00"},
        {"tier": "t2", "region": "us", "gross": None},
    ]
    series = chart_series(report_body(["tier", "region"], rows), "gross", MONDAY, MONDAY + DAY)
    assert not series.time and series.labels == ["t1 / eu", "t2 / us"] and series.values == [[1.0, None]]
    assert series.points == ["t1 / eu: 1.00", "t2 / us: -"]  # money as the table writes it


def test_the_table_has_the_rows_then_the_total():
    table = report_table(report_body(["provider", "day"], [{"provider": "acme", "day": "2026-11-16", "gross": "9.00"}]))
    assert table.columns == ["provider", "day", "gross"]
    assert table.rows == [["acme", "2026-11-16", "9.00"]]
    assert table.total == ["TOTAL", "", "9.00"]


# --- over plain HTTP, as the renter rita ----------------------------------------------------------------------------


async def test_a_renter_has_alerts_and_reports_but_no_silences(console):
    await sign_in(console)
    alerts = await console.get("/console/alerts")
    page = await alerts.text()
    assert alerts.status == 200 and "No alert is firing" in page
    assert 'href="/console/silences"' not in page and 'href="/console/reports"' in page
    refused = await console.get("/console/silences")
    assert refused.status == 403
    token = await csrf_of(console, "/console/alerts")
    form = {"rule": "gpu_overheating", "duration": "1h", "csrf_token": token}
    posted = await console.post("/console/silences", data=form, headers={"Origin": console.origin}, allow_redirects=False)
    assert posted.status == 403 and "may not write silences" in await posted.text()
    assert await silence_repo(console.master.store).list(active_at=None) == []


async def test_bad_report_input_is_a_400_page_naming_it_and_the_csv_is_the_reports(console):
    await sign_in(console)
    bad = await console.get("/console/reports", params={"by": "day,planet"})
    assert bad.status == 400 and "&#39;planet&#39; is not a dimension" in await bad.text()
    backwards = await console.get("/console/reports", params={"from": "2026-11-20", "to": "2026-11-10"})
    assert backwards.status == 400 and "must be before to" in await backwards.text()
    shown = await console.get("/console/reports", params={"kind": "usage", "by": "tier"})
    assert shown.status == 200 and "No row: nothing was recorded in this window that is yours" in await shown.text()
    filed = await console.get("/console/reports/usage.csv", params={"by": "tier,day"})
    assert filed.status == 200 and filed.content_type == "text/csv"
    header, *rows = csv.reader(io.StringIO(await filed.text()))
    assert header[:3] == ["tier", "day", "gpu_hours_available"] and rows == []
    wrong = await console.get("/console/reports/weather.csv", params={"by": "day"})
    assert wrong.status == 400 and "is not a report" in await wrong.text()

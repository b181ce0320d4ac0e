"""Reports in the console: the grid's figures along the dimensions a person picks (management/monitoring/reports.py),
over a window (the last 7 days by default), as a table with its total, a uPlot chart of one figure, and a "Download
CSV" link to the same report as a file. The operator's report has every row, a provider's its own hosts', a renter's
its own rentals' (auth.report_owners decides; the façade cuts the report).

The top half is pure (the form read into a request, the report's JSON into table rows and a chart's series), tested
without a server. Bad input (an unknown kind or dimension, ``from`` after ``to``) is shown on the page beside its field.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from management.access_control import Action, Resource, report_owners
from management.client.api import AnswerJson
from management.console.assets import vendor_available
from management.console.forms import FormErrors, FormFields, text
from management.console.nav import NavItem
from management.console.rendering import TemplateContext, page
from management.console.session import signed_in
from management.http.keys import SERVICES_KEY
from management.market.ledger import calendar_period
from management.monitoring.report_render import report_csv
from management.monitoring.reports import (
    DIMENSIONS,
    KINDS,
    MONEY_COLUMNS,
    TIME_DIMENSIONS,
    InvalidReport,
    iso_day,
    parse_dimensions,
    parse_instant,
    window,
)
from management.views.reports import report_view

DEFAULT_KIND = "usage"
DEFAULT_BY = "day"
CHART_SERIES = 6  # groups drawn as their own line at most; the rest are summed into "others"
CHART_BARS = 40  # rows drawn as bars at most (without a time dimension)
FIELDS = ("kind", "by", "from", "to", "chart")


# --- pure: the form to a request, a report to rows and a chart ----------------------------------------------------


@dataclass(frozen=True)
class ReportRequest:
    kind: str
    by: tuple[str, ...]
    start: float
    end: float
    chart: str  # the figure drawn


def read_report_form(fields: FormFields, now: float) -> tuple[ReportRequest | None, FormErrors, dict[str, str]]:
    """The report form (a query string) read: the request, the problems beside their fields, and what was typed."""
    typed = {name: text(fields, name, max_length=100) for name in FIELDS}
    typed["kind"] = typed["kind"] or DEFAULT_KIND
    typed["by"] = typed["by"] or DEFAULT_BY
    errors = FormErrors()
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        errors.add("form", f"{', '.join(unknown)}: not a report field; use {', '.join(FIELDS)}")
    kind = typed["kind"]
    if kind not in KINDS:
        errors.add("kind", f"kind: {kind[:40]!r} is not a report; use one of {', '.join(KINDS)}")
    by: tuple[str, ...] = ()
    try:
        by = parse_dimensions(typed["by"])
    except InvalidReport as exc:
        errors.add("by", str(exc))
    start = end = None
    for name in ("from", "to"):
        if typed[name]:
            try:
                value = parse_instant(name, typed[name])
            except InvalidReport as exc:
                errors.add(name, str(exc))
            else:
                start, end = (value, end) if name == "from" else (start, value)
    if "from" not in errors and "to" not in errors:
        try:
            start, end = window(start, end, now)
        except InvalidReport as exc:
            errors.add("from", str(exc))
    columns = KINDS.get(kind, ())
    chart = typed["chart"]
    if chart and not any(chart in figures for figures in KINDS.values()):
        errors.add("chart", f"chart: {chart[:40]!r} is not a figure of any report; use one of {', '.join(columns)}")
    elif columns and chart not in columns:  # none chosen, or one of the kind chosen before: the kind's first
        chart = typed["chart"] = columns[0]
    if errors:
        return None, errors, typed
    assert start is not None and end is not None
    return ReportRequest(kind=kind, by=by, start=start, end=end, chart=chart), errors, typed


def cell(value: Any) -> str:
    """A figure as the table shows it: "-" for none, numbers as the API gives them."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) >= 1e-4 or value == 0 else f"{value:.6f}"
    return str(value)


def number(value: Any) -> float | None:
    """A figure as a number for a chart (money is a decimal string); None for none."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def figure_text(value: float | None, money: bool) -> str:
    """A charted figure as the table writes it: money with at least two decimals ("1.50"), others as ``cell``."""
    if value is None or not money:
        return cell(value)
    whole, _, decimals = f"{value:.6f}".partition(".")
    return f"{whole}.{decimals.rstrip('0').ljust(2, '0')}"


@dataclass
class ChartSeries:
    """What static/report-chart.js draws: ``x`` (period starts, unix seconds, or 0..n-1 with ``labels``) and one
    list of values per series, in ``names`` order."""

    title: str
    time: bool
    x: list[float]
    labels: list[str]
    names: list[str]
    values: list[list[float | None]]
    span: float = 0.0  # a period's length (the first's), so that a bar is never wider than its period
    low: float = 0.0  # the x axis's range on a time axis: the window, widened to the periods it touches
    high: float = 0.0
    cut: int = 0  # groups (or rows) left out of the chart, summed into "others" (or not drawn)
    money: bool = False
    period: str = ""  # day, week or month: the x axis's unit, when over time
    points: list[str] = field(default_factory=list)  # "label: value" for the chart's aria-label


def period_starts(start: float, end: float, period: str) -> dict[str, float]:
    """Each ``period`` (day, week, month) touching ``[start, end)``: its label -> its first second."""
    starts: dict[str, float] = {}
    t = start
    while t < end:
        first, after, label = calendar_period(t, period)
        starts[label] = first
        t = after
    return starts


def chart_series(report: AnswerJson, chart: str, start: float, end: float) -> ChartSeries:
    """The figure ``chart`` of a report (its JSON) as series: over time when a time dimension is among its ``by``
    (one series per combination of the other dimensions, the largest CHART_SERIES), else one bar per row."""
    by: list[str] = list(report["by"])
    rows: list[AnswerJson] = report["rows"]
    title = chart.replace("_", " ")
    money = chart in MONEY_COLUMNS
    periods = [d for d in by if d in TIME_DIMENSIONS]
    if not periods:
        shown = rows[:CHART_BARS]
        labels = [" / ".join(str(r[d]) for d in by) for r in shown]
        values = [number(r.get(chart)) for r in shown]
        return ChartSeries(
            title=title,
            time=False,
            x=[float(i) for i in range(len(shown))],
            labels=labels,
            names=[title],
            values=[values],
            cut=len(rows) - len(shown),
            money=money,
            points=[f"{label}: {figure_text(v, money)}" for label, v in zip(labels, values, strict=True)],
        )
    period = periods[0]
    others = [d for d in by if d != period]
    starts = period_starts(start, end, period)
    xs = sorted({starts[r[period]] for r in rows if r[period] in starts})
    index = {x: i for i, x in enumerate(xs)}
    groups: dict[str, list[float | None]] = {}
    for r in rows:
        if r[period] not in starts:
            continue
        name = " / ".join(str(r[d]) for d in others) or title
        values = groups.setdefault(name, [None] * len(xs))
        value = number(r.get(chart))
        if value is not None:
            i = index[starts[r[period]]]
            values[i] = (values[i] or 0.0) + value
    ranked = sorted(groups, key=lambda name: -sum(v or 0.0 for v in groups[name]))
    kept, rest = ranked[:CHART_SERIES], ranked[CHART_SERIES:]
    series = [groups[name] for name in kept]
    if rest:
        summed: list[float | None] = [None] * len(xs)
        for name in rest:
            for i, v in enumerate(groups[name]):
                if v is not None:
                    summed[i] = (summed[i] or 0.0) + v
        kept, series = [*kept, f"{len(rest)} others"], [*series, summed]
    labels_of = {v: k for k, v in starts.items()}
    named = list(zip(kept, series, strict=True))
    points = [f"{labels_of[x]} {name}: {figure_text(vals[i], money)}" for i, x in enumerate(xs) for name, vals in named]
    # Each period is drawn at its middle, on an axis spanning the whole window (and the periods it touches).
    ends = [calendar_period(x, period)[1] for x in xs]
    return ChartSeries(
        title=title,
        time=True,
        x=[(x + end_of) / 2 for x, end_of in zip(xs, ends, strict=True)],
        labels=[labels_of[x] for x in xs],
        names=kept,
        values=series,
        span=ends[0] - xs[0] if xs else 0.0,
        low=min([start, *xs]),
        high=max([end, *ends]),
        cut=len(rest),
        money=money,
        period=period,
        points=points[:60],
    )


@dataclass(frozen=True)
class ReportTable:
    columns: list[str]
    rows: list[list[str]]
    total: list[str]


def report_table(report: AnswerJson) -> ReportTable:
    by: list[str] = list(report["by"])
    columns: list[str] = list(report["columns"])
    figures = columns[len(by) :]
    return ReportTable(
        columns=columns,
        rows=[[cell(r.get(c)) for c in columns] for r in report["rows"]],
        total=["TOTAL", *([""] * (len(by) - 1)), *(cell(report["total"].get(c)) for c in figures)],
    )


def report_query(wanted: ReportRequest) -> str:
    """The query naming this report (for the CSV link), with the window as unix seconds: the same rows."""
    return urlencode({"by": ",".join(wanted.by), "from": seconds_text(wanted.start), "to": seconds_text(wanted.end)})


def seconds_text(ts: float) -> str:
    """Unix seconds as text that reads back as the same instant (to the millisecond)."""
    return f"{ts:.3f}".rstrip("0").rstrip(".")


# --- the pages --------------------------------------------------------------------------------------------------


async def reports_page(request: web.Request) -> web.StreamResponse:
    scope = await signed_in(request, Resource.REPORTS, Action.READ)
    # A whole second for "now": the CSV link names the same window exactly, so the file has the table's rows.
    wanted, errors, typed = read_report_form(request.query, math.floor(time.time()))
    context: TemplateContext = {
        "kinds": list(KINDS),
        "dimensions": list(DIMENSIONS),
        "figures": {kind: list(columns) for kind, columns in KINDS.items()},
        "typed": typed,
        "errors": errors,
        "report": None,
        "charts_available": vendor_available(),
    }
    if wanted is None:
        return await page(request, "reports/reports.html", status=400, title="Reports", **context)
    provider, renter = report_owners(scope)
    report, currency = await request.app[SERVICES_KEY].reports.report(
        wanted.kind, wanted.by, wanted.start, wanted.end, provider=provider, renter=renter
    )
    body = msgspec.to_builtins(report_view(report, currency))
    series = chart_series(body, wanted.chart, wanted.start, wanted.end)
    return await page(
        request,
        "reports/reports.html",
        title=f"{wanted.kind.capitalize()} report",
        **{**context, "report": body},
        wanted=wanted,
        table=report_table(body),
        series=series,
        series_json=msgspec.json.encode(series).decode(),
        covers=f"{iso_day(wanted.start)} to {iso_day(wanted.end)}",
        csv_link=f"/console/reports/{wanted.kind}.csv?{report_query(wanted)}",
    )


async def report_csv_file(request: web.Request) -> web.StreamResponse:
    """The report as CSV (the API's own rendering), for the page's "Download CSV" link: same query, same rows."""
    scope = await signed_in(request, Resource.REPORTS, Action.READ)
    kind = request.match_info["kind"]
    wanted, errors, _ = read_report_form({**request.query, "kind": kind}, time.time())
    if wanted is None:
        raise web.HTTPBadRequest(text="; ".join(errors.values()))
    provider, renter = report_owners(scope)
    report, _ = await request.app[SERVICES_KEY].reports.report(
        wanted.kind, wanted.by, wanted.start, wanted.end, provider=provider, renter=renter
    )
    name = f"report-{wanted.kind}-{'-'.join(wanted.by)}.csv"
    return web.Response(
        text=report_csv(report), content_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{name}"'}
    )


NAV = [
    NavItem("operator", "Reports", "/console/reports", 17),
    NavItem("provider", "Reports", "/console/reports", 25),
    NavItem("renter", "Reports", "/console/reports", 42),
]


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/console/reports", reports_page)
    router.add_get("/console/reports/{kind}.csv", report_csv_file)

"""A report as the API answers it in JSON (management/monitoring/reports.py says what each figure is): one object
per row, its dimensions then its figures; money as decimal strings in the grid's currency, hours and percentages as
numbers. Its CSV twin is management/monitoring/report_render.py's; the console reads this answer too."""

from __future__ import annotations

import msgspec

from management.monitoring.report_render import figure_cells
from management.monitoring.reports import Report, iso_day

Cell = str | int | float | None


class ReportView(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A report: ``columns`` names every row's keys (its dimensions, then its figures); money as decimal strings."""

    kind: str
    by: list[str]
    start: str = msgspec.field(name="from")
    end: str = msgspec.field(name="to")
    currency: str
    columns: list[str]
    rows: list[dict[str, Cell]]
    total: dict[str, Cell]


def report_view(report: Report, currency: str) -> ReportView:
    return ReportView(
        kind=report.kind,
        by=list(report.by),
        start=iso_day(report.start),
        end=iso_day(report.end),
        currency=currency,
        columns=[*report.by, *report.columns],
        rows=[
            {**dict(zip(report.by, row.keys, strict=True)), **figure_cells(row.figures, report.columns)} for row in report.rows
        ],
        total=figure_cells(report.total, report.columns),
    )

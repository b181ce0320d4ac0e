"""A report as the API answers it: JSON (one object per row, dimensions then figures) or CSV (a header row, then one
row per report row; money as decimal strings in the grid's currency, hours and percentages as numbers)."""

from __future__ import annotations

import csv
import io
from typing import Any

from management.market.money import format_amount
from management.monitoring.reports import MONEY_COLUMNS, Figures, Report, iso_day


def _figures(figures: Figures, columns: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in columns:
        value = figures.column(name)
        out[name] = format_amount(int(value)) if name in MONEY_COLUMNS and value is not None else value
    return out


def report_json(report: Report, currency: str) -> dict[str, Any]:
    return {
        "kind": report.kind,
        "by": list(report.by),
        "from": iso_day(report.start),
        "to": iso_day(report.end),
        "currency": currency,
        "columns": [*report.by, *report.columns],
        "rows": [dict(zip(report.by, row.keys, strict=True)) | _figures(row.figures, report.columns) for row in report.rows],
        "total": _figures(report.total, report.columns),
    }


def report_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*report.by, *report.columns])
    for row in report.rows:
        figures = _figures(row.figures, report.columns)
        writer.writerow([*row.keys, *("" if figures[c] is None else figures[c] for c in report.columns)])
    return out.getvalue()

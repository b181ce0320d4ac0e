"""A report as CSV (a header row, then one row per report row; money as decimal strings in the grid's currency, hours
and percentages as numbers), and each row's figures as cells, which the JSON answer (management/views/reports.py)
shares."""

from __future__ import annotations

import csv
import io

from management.market.money import format_amount
from management.monitoring.reports import MONEY_COLUMNS, Figures, Report


def figure_cells(figures: Figures, columns: tuple[str, ...]) -> dict[str, str | float | None]:
    """A row's figures by column: money as a decimal string, the rest as numbers (None: no figure)."""
    out: dict[str, str | float | None] = {}
    for name in columns:
        value = figures.column(name)
        out[name] = format_amount(int(value)) if name in MONEY_COLUMNS and value is not None else value
    return out


def report_csv(report: Report) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*report.by, *report.columns])
    for row in report.rows:
        figures = figure_cells(row.figures, report.columns)
        writer.writerow([*row.keys, *("" if figures[c] is None else figures[c] for c in report.columns)])
    return out.getvalue()

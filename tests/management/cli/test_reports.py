"""``idlegrid report`` against a real Master with its API (in a thread of this process), read as a stranger reads it:
a heading that says what the table covers, one line per row, a TOTAL line; ``--csv`` for a spreadsheet; a mistake
answered with what to type instead. The records are those of tests/management/monitoring/test_api_reports.py."""

from __future__ import annotations

import asyncio
import csv
import io

from tests.management.cli.test_accounts import idlegrid, served  # noqa: F401  # the served Master and the CLI runner
from tests.management.hosts import api_key
from tests.management.monitoring.test_api_reports import D1, DAY, day_of, seed

WINDOW = ("--from", day_of(D1), "--to", day_of(D1 + 2 * DAY))


def in_master(served, coro):  # noqa: F811
    return asyncio.run_coroutine_threadsafe(coro, served.loop).result(timeout=30)


def test_the_operator_reads_revenue_by_provider_and_day_as_a_table_with_its_total(idlegrid, served):  # noqa: F811
    in_master(served, seed(served.server.master))
    lines = idlegrid("report", "revenue", "--by", "provider,day", *WINDOW).splitlines()
    assert lines[0] == (
        f"revenue by provider, day, from {day_of(D1)}T00:00:00Z to {day_of(D1 + 2 * DAY)}T00:00:00Z (money in USD)"
    )
    assert lines[1].split() == ["PROVIDER", "DAY", "GROSS", "FEES", "REFUNDED", "FEES_REFUNDED", "PROVIDER_NET", "PLATFORM_NET"]
    assert [line.split() for line in lines[2:]] == [
        ["acme", day_of(D1), "12.00", "1.20", "0.00", "0.00", "10.80", "1.20"],
        ["acme", day_of(D1 + DAY), "16.000001", "1.60", "0.00", "0.00", "14.400001", "1.60"],
        ["bolt", day_of(D1 + DAY), "1.00", "0.10", "0.90", "0.10", "0.00", "0.00"],
        ["TOTAL", "29.000001", "2.90", "0.90", "0.10", "25.200001", "2.80"],
    ]


def test_a_provider_exports_its_usage_as_csv_and_a_mistake_says_what_to_type(idlegrid, served):  # noqa: F811
    master = served.server.master
    in_master(served, seed(master))
    key = in_master(served, api_key(master, "provider", "bolt"))["Authorization"].removeprefix("Bearer ")
    text = idlegrid("report", "usage", "--by", "host", "--csv", *WINDOW, "--api-key", key)
    header, *rows = list(csv.reader(io.StringIO(text)))
    assert header == ["host", "gpu_hours_available", "gpu_hours_sold", "gpu_hours_idle", "utilization_pct", "uptime_pct"]
    assert [row[0] for row in rows] == ["agt-b1"]  # its own host only
    assert float(rows[0][2]) == 1.0  # zoo's hour on it
    wrong = idlegrid("report", "usage", "--by", "provider,colour", "--api-key", key, ok=False)
    assert wrong.strip() == (
        "idlegrid report: 400 bad_request: by: 'colour' is not a dimension; use provider, host, tier, model, region, "
        "renter, workload, day, week, month"
    )

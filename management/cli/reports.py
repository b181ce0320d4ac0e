"""``idlegrid report KIND --by provider,day [--from WHEN] [--to WHEN] [--csv | --json]``: a report along dimensions.

KIND: usage (GPU-hours available, sold and idle, utilization, uptime), revenue (gross, fees, refunds, nets), reliability
(uptime, failed commands, rentals started and ended, SLA breaches) or summary (all of them). A provider's key sees its
own hosts' rows, a renter's its own rentals', the operator's every row (docs/monitoring.md, "Reports").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from management.cli.connection import api_client, connection_options, table
from management.client.api import AnswerJson

Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]
KINDS = ("usage", "revenue", "reliability", "summary")


def add_parser(sub: argparse._SubParsersAction, make: Parser) -> None:
    p = make(
        sub,
        "report",
        "a report along dimensions (usage, revenue, reliability)",
        "A report of the grid's figures along one to three dimensions: provider, host, tier, model, region, renter, "
        "workload, and one of day, week, month. Examples:\n"
        "  idlegrid report revenue --by provider,day --from 2026-11-01 --to 2026-12-01\n"
        "  idlegrid report usage --by tier,region --csv > usage.csv",
    )
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=f"one of {', '.join(KINDS)}")
    p.add_argument("--by", required=True, metavar="DIMS", help="comma-separated dimensions, e.g. provider,day")
    p.add_argument("--from", dest="start", metavar="WHEN", help="an ISO date or time, or unix seconds (default: a week ago)")
    p.add_argument("--to", dest="end", metavar="WHEN", help="an ISO date or time, or unix seconds (default: now)")
    p.add_argument("--csv", action="store_true", help="print CSV for a spreadsheet (default: a table)")
    connection_options(p)
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    client = api_client(args)[0]
    if args.csv:
        text = client.report(args.kind, args.by, start=args.start, end=args.end, csv=True)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    body = client.report(args.kind, args.by, start=args.start, end=args.end)
    print(json.dumps(body, indent=2) if args.json else render(body))
    return 0


def render(body: AnswerJson) -> str:
    """The report as a table: a heading saying what it covers, one line per row, then the total."""
    by, columns = body["by"], body["columns"]
    figures = columns[len(by) :]
    heading = f"{body['kind']} by {', '.join(by)}, from {body['from']} to {body['to']} (money in {body['currency']})"
    if not body["rows"]:
        return f"{heading}\nnothing recorded in this window"
    rows = [[row[c] for c in columns] for row in body["rows"]]
    rows.append(["TOTAL", *([""] * (len(by) - 1)), *(body["total"][c] for c in figures)])
    return heading + "\n" + table([c.upper() for c in columns], rows)

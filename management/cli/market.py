"""The market on the command line: ``idlegrid offers search``, ``rent``, ``bid``, ``balance``, ``ledger``, ``spend``,
``earnings``, ``payouts`` and the operator's ``credit``.

Tables by default, the API's JSON with ``--json``; the API and the key are found as every other command finds them
(management/cli/connection.py). Money is shown and taken as decimal amounts in the grid's currency ("2.50").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import IdlegridError
from management.cli.connection import api_client, connection_options, table, when
from management.cli.hosts import duration_s
from management.cli.templates import LINK_SILENT_EXIT, add_launch_options, link_wait_s, print_links_when_up
from management.cli.workloads import DISK_HELP, BadSpec, cost_line, restart_options, spec_from, storage_options
from management.client.api import AnswerJson, BodyJson

Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]


def period_s(text: str) -> float:
    """A reserved period: a duration as ``host price`` takes one (``7d``, ``12h``), never "none"."""
    value = duration_s(text)
    if value is None:
        raise argparse.ArgumentTypeError("a reserved period needs a length, e.g. 7d or 12h")
    return value


def add_parsers(sub: argparse._SubParsersAction, make: Parser) -> None:
    offers = make(sub, "offers", "search the market's offers", "Search the GPUs on offer (see docs/offers.md).")
    o_sub = offers.add_subparsers(dest="offers_command", required=True, metavar="{search}")
    search = make(
        o_sub,
        "search",
        "search offers with the query language",
        "Search offers: conditions 'field op value' separated by spaces, e.g.\n"
        "  idlegrid offers search 'gpu_ram>=24 num_gpus>=2 model in [h100-sxm,a100-sxm] price<=2.5 reliability>0.9'\n"
        "Fields include model, tier, region, num_gpus, gpu_ram (GiB), price and min_bid (per GPU-hour), reliability, "
        "cuda, inet_down/inet_up (Mbps), verified. Sorted by score (price and reputation together) unless --sort.",
    )
    search.add_argument("query", nargs="?", default="", metavar="QUERY", help="conditions (default: every offer)")
    search.add_argument("--sort", metavar="FIELD", help="sort by this field, '-FIELD' descending (default: -score)")
    search.add_argument("--limit", type=int, default=20, metavar="N", help="offers to show (default %(default)s)")
    connection_options(search)
    search.set_defaults(func=run_search)

    rent = make(
        sub,
        "rent",
        "rent an offer: run a workload on that host",
        "Rent an offer (a host, by the id 'offers search' shows): the workload runs there. On demand at the listed price "
        "by default; --bid PRICE rents it interruptible at your bid (it may be preempted by on-demand rentals or higher "
        "bids, and resumes when a GPU at your bid frees up); --reserved DURATION prepays that long at the host's "
        "reserved discount. Example:\n  idlegrid rent agt-1234 --image python:3.11 --gpus 1 -- python -m http.server",
    )
    rent.add_argument("offer_id", metavar="OFFER", help="the offer's id (its host)")
    rent.add_argument("--name", default=None, help="workload name (default: rent-<offer>)")
    rent.add_argument("--image", help="container image (default: the --template's; one of the two is needed)")
    rent.add_argument("--gpus", type=int, metavar="N", help="GPUs, 1..16 (default 1)")
    kind = rent.add_mutually_exclusive_group()
    kind.add_argument("--bid", metavar="PRICE", help="rent interruptible at this price per GPU-hour (default: on demand)")
    kind.add_argument(
        "--reserved",
        type=duration_s,
        metavar="DURATION",
        help="prepay this long (e.g. 7d) at the reserved price (default: not reserved)",
    )
    rent.add_argument(
        "--max-price", metavar="PRICE", help="refuse to pay more than this per GPU-hour, on demand or reserved (default: no cap)"
    )
    rent.add_argument("--env", action="append", metavar="KEY=VALUE", help="environment variable, repeatable (default: none)")
    rent.add_argument("--port", action="append", type=int, metavar="PORT", help="port to expose, repeatable (default: none)")
    rent.add_argument("--max-duration-s", type=float, metavar="SECONDS", help="stop it after this long (default: no limit)")
    rent.add_argument("--disk", type=float, metavar="GIB", help=DISK_HELP)
    rent.add_argument("--account", help="account it belongs to; operator keys only (default: the key's own)")
    rent.add_argument(
        "--allow-process-runtime", action="store_true", default=None, help="it may run sandboxed as a host process (default: no)"
    )
    add_launch_options(rent)
    restart_options(rent)
    storage_options(rent)
    rent.add_argument("container_command", nargs="*", metavar="COMMAND", help="command to run, after '--' (default: the image's)")
    connection_options(rent)
    rent.set_defaults(func=run_rent)

    bid = make(
        sub,
        "bid",
        "raise or lower an interruptible workload's bid",
        "Change the bid per GPU-hour of an interruptible workload; a running one pays the new bid from now on.",
    )
    bid.add_argument("workload_id", metavar="WORKLOAD", help="the workload's id, wl-…")
    bid.add_argument("price", metavar="PRICE", help="the new bid per GPU-hour, e.g. 0.85")
    connection_options(bid)
    bid.set_defaults(func=run_bid)

    for name, help_text, description, func in (
        ("balance", "show an account's balance", "Show a renter's available and held money (what runs now costs).", run_balance),
        ("spend", "a renter's spend per workload", "What each workload of a renter cost, refunds included.", run_spend),
        (
            "earnings",
            "a provider's earnings per host",
            "What each host of a provider earned, fees and refunds included.",
            run_earnings,
        ),
    ):
        p = make(sub, name, help_text, description)
        p.add_argument("account_id", nargs="?", metavar="ACCOUNT", help="the account (default: the key's own)")
        connection_options(p)
        p.set_defaults(func=func)

    payouts = make(sub, "payouts", "a provider's payout statement per period", "Earnings per day, week or month (UTC).")
    payouts.add_argument("account_id", nargs="?", metavar="ACCOUNT", help="the provider (default: the key's own account)")
    payouts.add_argument("--period", choices=("day", "week", "month"), default="day", help="(default %(default)s)")
    connection_options(payouts)
    payouts.set_defaults(func=run_payouts)

    ledger = make(
        sub, "ledger", "an account's ledger entries", "Every ledger entry of an account, oldest first, with the balance after it."
    )
    ledger.add_argument("account_id", nargs="?", metavar="ACCOUNT", help="the account (default: the key's own)")
    ledger.add_argument("--after", type=int, default=0, metavar="SEQ", help="entries after this sequence number (default 0)")
    ledger.add_argument("--limit", type=int, default=100, metavar="N", help="entries to show (default %(default)s)")
    ledger.add_argument("--csv", action="store_true", help="print CSV for a spreadsheet (default: a table)")
    ledger.add_argument(
        "--period",
        default="",
        metavar="PERIOD",
        help="a statement of one UTC day (2026-12-07), ISO week (2026-W50) or month (2026-12) (default: every entry)",
    )
    connection_options(ledger)
    ledger.set_defaults(func=run_ledger)

    credit = make(sub, "credit", "credit a renter's balance (operator)", "Add money to an account's balance (operator only).")
    credit.add_argument("account_id", metavar="ACCOUNT", help="the account to credit")
    credit.add_argument("amount", metavar="AMOUNT", help="how much, e.g. 100 or 25.50")
    credit.add_argument("--memo", default="", help="why, shown in the ledger (default: none)")
    connection_options(credit)
    credit.set_defaults(func=run_credit)


# --- running -------------------------------------------------------------------------------------------------------


def _out(args: argparse.Namespace, answer: Any, human: Callable[[Any], str]) -> int:
    import json

    print(json.dumps(answer, indent=2) if args.json else human(answer))
    return 0


def _own(client: Any, args: argparse.Namespace) -> str:
    return str(args.account_id or client.whoami()["account"])


def offer_rows(offers: Sequence[AnswerJson]) -> str:
    return table(
        ["OFFER", "MODEL", "GPUS", "VRAM", "TIER", "PRICE/GPU-H", "MIN BID", "RELIABILITY", "REGION", "NET DOWN", "SCORE"],
        [
            [
                o["id"],
                o["model"] or "?",
                f"{o['num_gpus']}/{o['total_gpus']}",
                f"{o['gpu_ram']:g} GiB",
                o["tier"],
                o["price"],
                o["min_bid"],
                f"{o['reliability']:.3f}",
                o["region"] or None,
                f"{o['inet_down']:g} Mbps" if o.get("inet_down") is not None else None,
                f"{o['score']:.3f}",
            ]
            for o in offers
        ],
    )


def run_search(args: argparse.Namespace) -> int:
    client = api_client(args)[0]
    result = client.search_offers(args.query, sort=args.sort, limit=args.limit)

    def human(r: AnswerJson) -> str:
        if not r["offers"]:
            why = r.get("emptied_by")
            return "no offers" + (f": {why['sentence']}" if why else "")
        more = f"\n({r['total']} offers match; showing {len(r['offers'])})" if r["total"] > len(r["offers"]) else ""
        return offer_rows(r["offers"]) + more

    return _out(args, result, human)


def terms_line(terms: AnswerJson) -> str:
    """How a workload pays, in one line: "on demand at 2.50 USD per GPU-hour (listed by the host)"."""
    return str(terms.get("summary", ""))


def run_rent(args: argparse.Namespace) -> int:
    args.file = None
    if args.name is None:
        args.name = ("rent-" + "".join(c if c.isalnum() else "-" for c in args.offer_id.lower()))[:63].rstrip("-")
    for unset in ("replicas", "priority", "project", "model", "tier"):
        setattr(args, unset, None)
    spec = spec_from(args)
    spec.pop("account", None)
    rental: BodyJson = {"kind": "on_demand"}
    if args.bid is not None:
        rental = {"kind": "interruptible", "bid": args.bid}
    elif args.reserved is not None:
        rental = {"kind": "reserved", "reserved_s": args.reserved}
    if args.max_price is not None:
        if rental["kind"] == "interruptible":
            raise BadSpec("--max-price is for on-demand and reserved rentals; an interruptible one pays its --bid")
        rental["max_price"] = args.max_price
    spec["rental"] = rental
    client = api_client(args)[0]
    workload = client.rent_offer(args.offer_id, spec, account=args.account)

    def human(w: AnswerJson) -> str:
        cost = cost_line(client, w)
        return f"rented {args.offer_id}: workload {w['id']} ({w['name']}) is {w['state']}\n{terms_line(w['rental'])}" + (
            f"\n{cost}" if cost else ""
        )

    status = _out(args, workload, human)
    if not args.json and not print_links_when_up(client, workload, link_wait_s(args)):
        return LINK_SILENT_EXIT
    return status


def run_bid(args: argparse.Namespace) -> int:
    workload = api_client(args)[0].change_bid(args.workload_id, args.price)
    return _out(args, workload, lambda w: f"{w['id']}: {terms_line(w['rental'])}")


def run_balance(args: argparse.Namespace) -> int:
    client = api_client(args)[0]
    funds = client.balance(_own(client, args))

    def human(f: AnswerJson) -> str:
        lines = [
            f"account:    {f['account']}",
            f"available:  {f['available']} {f['currency']}",
            f"held:       {f['held']} {f['currency']}  (held for running rentals; what is not used returns)",
            f"running:    {f['running_per_hour']} {f['currency']} per hour",
        ]
        if f.get("unbilled") not in (None, "0", "0.00"):
            lines.append(f"ran:        {f['unbilled']} {f['currency']} since the last charge (taken from the hold)")
        lines.append(f"runway:     {runway(f.get('covers_s'))}")
        if f.get("warning"):
            lines.append(f"warning:    {f['warning']}")
        return "\n".join(lines)

    return _out(args, funds, human)


def runway(covers_s: float | None) -> str:
    """The balance's runway (the API's ``covers_s``) for people: "about 2 h 05 min, then running work is stopped
    (nothing destroyed)"; "as long as nothing runs" when nothing costs anything (as the console's billing page says)."""
    if covers_s is None:
        return "as long as nothing runs"
    s = int(covers_s)
    if s >= 86400:
        said = f"{s // 86400} d {s % 86400 // 3600} h"
    elif s >= 3600:
        said = f"{s // 3600} h {s % 3600 // 60:02d} min"
    else:
        said = f"{s // 60} min" if s >= 60 else f"{s} s"
    return f"about {said}, then running work is stopped (nothing destroyed)"


def run_ledger(args: argparse.Namespace) -> int:
    client = api_client(args)[0]
    account = _own(client, args)
    if args.csv:
        text = client.ledger(account, after=args.after, limit=args.limit, csv=True, period=args.period)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return 0
    statement = client.ledger(account, after=args.after, limit=args.limit, period=args.period)

    def human(s: AnswerJson) -> str:
        if not s["lines"]:
            return "no ledger entries"
        return table(
            ["SEQ", "WHEN", "KIND", "AMOUNT", "BALANCE", "WORKLOAD", "MEMO"],
            [
                [line["seq"], when(line["ts"]), line["kind"], line["amount"], line["balance"], line["workload"], line["memo"]]
                for line in s["lines"]
            ],
        ) + (f"\n(more: --after {s['next_after']})" if s["more"] else "")

    return _out(args, statement, human)


def _statement(args: argparse.Namespace, which: str, render: Callable[[Any], str], **query: str) -> int:
    client = api_client(args)[0]
    return _out(args, client.statement(_own(client, args), which, **query), render)


def run_spend(args: argparse.Namespace) -> int:
    return _statement(
        args,
        "spend",
        lambda s: (
            table(
                ["WORKLOAD", "CHARGED", "REFUNDED", "NET"],
                [[r["workload"], r["charged"], r["refunded"], r["net"]] for r in s["items"]],
            )
            if s["items"]
            else "nothing spent yet"
        ),
    )


def run_earnings(args: argparse.Namespace) -> int:
    return _statement(
        args,
        "earnings",
        lambda s: (
            table(
                ["HOST", "GROSS", "FEES", "REFUNDED", "NET"],
                [[r["agent_id"], r["gross"], r["fee"], r["refunded"], r["net"]] for r in s["items"]],
            )
            if s["items"]
            else "nothing earned yet"
        ),
    )


def run_payouts(args: argparse.Namespace) -> int:
    return _statement(
        args,
        "payouts",
        lambda s: (
            table(
                ["PERIOD", "GROSS", "FEES", "REFUNDED", "NET"],
                [[r["label"], r["gross"], r["fee"], r["refunded"], r["net"]] for r in s["items"]],
            )
            if s["items"]
            else "nothing earned yet"
        ),
        period=args.period,
    )


def run_credit(args: argparse.Namespace) -> int:
    answer = api_client(args)[0].credit(args.account_id, args.amount, memo=args.memo)
    return _out(
        args, answer, lambda a: f"credited {args.account_id}: available {a['balance']['available']} {a['balance']['currency']}"
    )


__all__ = ["IdlegridError", "add_parsers", "offer_rows", "period_s"]

"""``idlegrid dispute ...``: disputes of rentals (docs/disputes.md).

  idlegrid dispute open --rental RENTAL --reason TEXT [--host AGENT]   a renter disputes its ended rental
  idlegrid dispute list [--rental RENTAL] [--state STATE]              disputes the key may see, newest first
  idlegrid dispute show ID                                             one dispute and its evidence
  idlegrid dispute answer ID --text TEXT                               the disputed host's provider answers
  idlegrid dispute resolve ID --full | --partial AMOUNT | --none [--note TEXT]   the operator resolves it

Opening a dispute holds what the renter paid for the host off the provider's earnings until the operator resolves it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from management.cli.connection import Parser, api_client, connection_options, show, table, when
from management.client.api import AnswerJson


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``dispute`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    dispute = parser(sub, "dispute", "dispute a rental", "Disputes of rentals: open, answer, resolve, read.")
    d_sub = dispute.add_subparsers(dest="dispute_command", required=True, metavar="{open,list,show,answer,resolve}")
    opened = parser(
        d_sub,
        "open",
        "dispute an ended rental",
        "Dispute your ended rental within the grid's dispute window (7 days by default). The evidence is attached at "
        "once, and what you paid for the host is held off its provider's earnings until an operator resolves it.",
    )
    opened.add_argument("--rental", required=True, metavar="RENTAL", help="the rental's id, e.g. wl-1a2b-a1")
    opened.add_argument("--reason", required=True, metavar="TEXT", help="what went wrong")
    opened.add_argument(
        "--host", metavar="AGENT", help="the disputed host (default: the rental's only host; needed when it ran on several)"
    )
    connection_options(opened)
    opened.set_defaults(func=_run_open)
    listing = parser(d_sub, "list", "disputes", "Your disputes, those about your hosts, or (operator) all; newest first.")
    listing.add_argument("--rental", metavar="RENTAL", help="one rental's (default: every rental)")
    listing.add_argument(
        "--state",
        choices=("open", "answered", "resolved", "unresolved"),
        help="only those in this state; unresolved: open or answered (default: every state)",
    )
    connection_options(listing)
    listing.set_defaults(func=_run_list)
    shown = parser(d_sub, "show", "one dispute", "One dispute: the amounts, the answer, the resolution and the evidence.")
    shown.add_argument("dispute_id", metavar="ID")
    connection_options(shown)
    shown.set_defaults(func=_run_show)
    answer = parser(
        d_sub, "answer", "answer a dispute", "Your side of a dispute about one of your hosts (it replaces one before)."
    )
    answer.add_argument("dispute_id", metavar="ID")
    answer.add_argument("--text", required=True, metavar="TEXT", help="the provider's answer")
    connection_options(answer)
    answer.set_defaults(func=_run_answer)
    resolve = parser(
        d_sub,
        "resolve",
        "resolve a dispute (operator)",
        "Resolve a dispute once: --full returns everything held and the platform's fee to the renter; --partial AMOUNT "
        "returns that much of what is held and the rest to the provider; --none returns it all to the provider.",
    )
    resolve.add_argument("dispute_id", metavar="ID")
    how = resolve.add_mutually_exclusive_group(required=True)
    how.add_argument("--full", action="store_true", help="a full refund (no default: one of --full, --partial, --none)")
    how.add_argument("--partial", metavar="AMOUNT", help="refund this much of what is held, e.g. 1.50 (no default)")
    how.add_argument("--none", action="store_true", help="no refund (no default: one of the three)")
    resolve.add_argument("--note", default="", metavar="TEXT", help="why, for the record (default: none)")
    connection_options(resolve)
    resolve.set_defaults(func=_run_resolve)


def _dispute(d: AnswerJson) -> str:
    lines = [
        f"dispute {d['id']} of rental {d['rental']} on {d['agent_id']} ({d['provider']}): {d['state']}",
        f"renter:     {d['account']}, opened {when(d['created_at'])}: {d['reason']}",
        f"paid:       {d['disputable']} (fee {d['fee']}); held from the provider: {d['held']}",
    ]
    if d.get("answer"):
        lines.append(f"answer:     {d['answer']} ({when(d['answered_at'])})")
    if d.get("resolution"):
        lines.append(
            f"resolved:   {d['resolution']} by {d['resolved_by']} {when(d['resolved_at'])}: {d['refunded']} refunded, "
            f"{d['released']} released to the provider" + (f"; {d['note']}" if d.get("note") else "")
        )
    ev = d.get("evidence")
    if ev:
        lines.append(f"evidence:   {ev['seconds']} s metered; ended: {ev['end_reason'] or '-'}")
        if ev.get("host_failure"):
            lines.append(f"            through the host: {ev['host_failure']}")
        lines.append(
            f"            {len(ev['charges'])} ledger entries, {len(ev['faults'])} faults, {len(ev['exits'])} exits, "
            f"{len(ev['verification'])} verifications, {ev['telemetry']['minutes']} minutes of telemetry"
        )
    return "\n".join(lines)


def _rows(items: Sequence[AnswerJson]) -> str:
    if not items:
        return "no dispute"
    return table(
        ["DISPUTE", "RENTAL", "HOST", "RENTER", "STATE", "HELD", "REFUNDED", "OPENED"],
        [
            [d["id"], d["rental"], d["agent_id"], d["account"], d["state"], d["held"], d["refunded"], when(d["created_at"])]
            for d in items
        ],
    )


def _run_open(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.open_dispute(args.rental, args.reason, agent_id=args.host), _dispute)


def _run_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    every = {"items": client.list("/api/v1/disputes", rental=args.rental, state=args.state)}  # the list is paged: every page
    return show(args, every, lambda body: _rows(body["items"]))


def _run_show(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.dispute(args.dispute_id), _dispute)


def _run_answer(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.answer_dispute(args.dispute_id, args.text), _dispute)


def _run_resolve(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    resolution = "full" if args.full else "none" if args.none else "partial"
    return show(args, client.resolve_dispute(args.dispute_id, resolution, amount=args.partial, note=args.note), _dispute)

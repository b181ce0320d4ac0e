"""``idlegrid billing ...``: money in through the grid's payment provider (docs/payments.md).

  idlegrid billing topup --amount N [--account ACCOUNT]   open a top-up; prints where to pay it
  idlegrid billing topups [--account ACCOUNT]             the newest top-ups and their states

A top-up is paid on the payment provider's own step (Stripe's payment element, with the client secret printed once;
no card number ever passes through the grid or this command). The balance grows when the provider's signed webhook
says the money arrived: ``idlegrid balance`` then shows it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from management.cli.connection import Parser, api_client, connection_options, show, table, when
from management.client.api import AnswerJson


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``billing`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    billing = parser(sub, "billing", "top up your balance", "Money in: top up a renter's balance through the payment provider.")
    b_sub = billing.add_subparsers(dest="billing_command", required=True, metavar="{topup,topups}")
    topup = parser(
        b_sub,
        "topup",
        "open a top-up",
        "Open a top-up of AMOUNT in the grid's currency (e.g. --amount 25 or --amount 25.50), within the grid's bounds. "
        "Prints the payment provider's client secret (or page) to pay it with; the balance is credited once the "
        "provider confirms the payment.",
    )
    topup.add_argument("--amount", required=True, metavar="AMOUNT", help="how much, e.g. 25 or 25.50")
    topup.add_argument("--account", metavar="ACCOUNT", help="whose balance (an operator's choice; default: your own)")
    connection_options(topup)
    topup.set_defaults(func=_run_topup)
    listing = parser(b_sub, "topups", "your top-ups", "The newest top-ups, their amounts and states.")
    listing.add_argument(
        "--account", metavar="ACCOUNT", help="one account's (an operator's filter; default: every account the key may see)"
    )
    connection_options(listing)
    listing.set_defaults(func=_run_topups)


def _started(answer: AnswerJson) -> str:
    topup = answer["topup"]
    lines = [f"top-up {topup['id']} of {topup['amount']} {topup['currency']} opened ({topup['state']})"]
    if answer.get("url"):
        lines.append(f"pay it at: {answer['url']}")
    if answer.get("client_secret"):
        lines.append(f"pay it on {topup['provider']}'s payment element with client secret: {answer['client_secret']}")
    lines.append("your balance is credited when the payment provider confirms the payment (idlegrid balance)")
    return "\n".join(lines)


def _rows(items: Sequence[AnswerJson]) -> str:
    if not items:
        return "no top-up"
    return table(
        ["TOPUP", "ACCOUNT", "AMOUNT", "STATE", "CREDITED", "CREATED", "WHY"],
        [
            [
                t["id"],
                t["account"],
                f"{t['amount']} {t['currency']}",
                t["state"],
                t["credited"],
                when(t["created_at"]),
                t["reason"],
            ]
            for t in items
        ],
    )


def _run_topup(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.create_topup(args.amount, account=args.account), _started)


def _run_topups(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.topups(account=args.account), lambda body: _rows(body["items"]))

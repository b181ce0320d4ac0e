"""``idlegrid billing ...``: money in and out through the grid's payment provider (docs/payments.md).

  idlegrid billing topup --amount N [--account ACCOUNT]   open a top-up; prints where to pay it
  idlegrid billing topups [--account ACCOUNT]             the newest top-ups and their states
  idlegrid billing settings [--account ACCOUNT]           saved payment method, auto top-up, spend caps
  idlegrid billing payment-method --token TOKEN           save the provider's token of a card for auto top-ups
  idlegrid billing auto-topup --threshold T --amount N    top up N when the balance falls below T (at most hourly)
  idlegrid billing auto-topup --off                       stop auto top-ups
  idlegrid billing caps --cap hour:5 --cap month:100:hard --cap project=train:hour:2:hard   set spend caps
  idlegrid billing caps --none                            remove them
  idlegrid billing payout-account [--connect]             a provider's payout account (--connect: make it, onboard)
  idlegrid billing payouts [--account ACCOUNT]            payouts of matured earnings
  idlegrid billing payout-run                             the payout run, now (operator)
  idlegrid billing reconcile                              reconcile payouts with the payment provider, now (operator)

A top-up is paid on the payment provider's own step (Stripe's payment element, with the client secret printed once;
no card number ever passes through the grid or this command). The balance grows when the provider's signed webhook
says the money arrived: ``idlegrid balance`` then shows it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from common.errors import IdlegridError
from management.cli.connection import Parser, api_client, connection_options, show, table, when
from management.client.api import AnswerJson, Json


class BadBillingRequest(IdlegridError):
    """A billing command given arguments that do not make a request (the message says the form)."""

    code = "bad_request"


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``billing`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    billing = parser(sub, "billing", "top up your balance", "Money in: top up a renter's balance through the payment provider.")
    b_sub = billing.add_subparsers(
        dest="billing_command",
        required=True,
        metavar="{topup,topups,settings,payment-method,auto-topup,caps,payout-account,payouts,payout-run,reconcile}",
    )
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
    settings = parser(b_sub, "settings", "your billing settings", "The saved payment method, auto top-up and spend caps.")
    settings.add_argument("--account", metavar="ACCOUNT", help="whose (an operator's choice; default: your own)")
    connection_options(settings)
    settings.set_defaults(func=_run_settings)
    method = parser(
        b_sub,
        "payment-method",
        "save a payment method for auto top-ups",
        "Save the payment provider's token of a payment method (Stripe: a pm_ id its payment element made; never a "
        "card number) for auto top-ups. It replaces one saved before.",
    )
    method.add_argument("--token", required=True, metavar="TOKEN", help="the provider's token, e.g. pm_...")
    method.add_argument("--account", metavar="ACCOUNT", help="whose (an operator's choice; default: your own)")
    connection_options(method)
    method.set_defaults(func=_run_payment_method)
    auto = parser(
        b_sub,
        "auto-topup",
        "set auto top-up",
        "Charge AMOUNT to the saved payment method whenever the balance left (available and held, less what ran "
        "since the last charges) falls below THRESHOLD, at most once an hour; --off stops it.",
    )
    auto.add_argument(
        "--threshold",
        metavar="AMOUNT",
        help="top up when the balance falls below this, e.g. 10 (no default: needed unless --off)",
    )
    auto.add_argument(
        "--amount", metavar="AMOUNT", help="how much each auto top-up charges, e.g. 25 (no default: needed unless --off)"
    )
    auto.add_argument("--off", action="store_true", help="turn auto top-up off (default: set it on)")
    auto.add_argument("--account", metavar="ACCOUNT", help="whose (an operator's choice; default: your own)")
    connection_options(auto)
    auto.set_defaults(func=_run_auto_topup)
    caps = parser(
        b_sub,
        "caps",
        "set spend caps",
        "Replace your spend caps. Each --cap is [project=NAME:]WINDOW:LIMIT[:hard], WINDOW hour (the last hour) or "
        "month (this UTC month): a soft cap raises an alert; a hard one also stops running work in its scope (SIGTERM, "
        "its grace, its checkpoint; nothing is destroyed) and starts no new paid work until it allows. --none removes "
        "them all.",
    )
    caps.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="CAP",
        help="e.g. hour:5, month:100:hard; repeat for several (no default: at least one, or --none)",
    )
    caps.add_argument("--none", action="store_true", help="remove every cap (default: off)")
    caps.add_argument("--account", metavar="ACCOUNT", help="whose (an operator's choice; default: your own)")
    connection_options(caps)
    caps.set_defaults(func=_run_caps)
    _add_payout_parsers(b_sub, parser)


def _add_payout_parsers(b_sub: argparse._SubParsersAction, parser: Parser) -> None:
    account = parser(
        b_sub,
        "payout-account",
        "your payout account",
        "A provider's payout account on the payment provider: whether it can take transfers, and what matured "
        "(earnings older than the dispute window) is payable now. --connect makes it (once) and prints the provider's "
        "onboarding link, where the bank and identity details are given (never to the grid).",
    )
    account.add_argument(
        "--connect", action="store_true", help="make the account, or get a fresh onboarding link (default: read it)"
    )
    account.add_argument(
        "--return-url", metavar="URL", help="where the onboarding sends the browser back (default: the console's statements page)"
    )
    account.add_argument("--account", metavar="ACCOUNT", help="whose (an operator's choice; default: your own)")
    connection_options(account)
    account.set_defaults(func=_run_payout_account)
    listing = parser(b_sub, "payouts", "your payouts", "Payouts of matured earnings, newest first, and their states.")
    listing.add_argument(
        "--account", metavar="ACCOUNT", help="one provider's (an operator's filter; default: every account the key may see)"
    )
    connection_options(listing)
    listing.set_defaults(func=_run_payouts)
    run = parser(
        b_sub,
        "payout-run",
        "run the payout run now (operator)",
        "Finish unfinished payouts, then pay each onboarded provider's matured earnings for this period, once.",
    )
    connection_options(run)
    run.set_defaults(func=_run_payout_run)
    reconcile = parser(
        b_sub,
        "reconcile",
        "reconcile payouts now (operator)",
        "Compare the ledger's payouts with the payment provider's transfers; each difference is listed, recorded as an "
        "event and raises the payout_unreconciled alert.",
    )
    connection_options(reconcile)
    reconcile.set_defaults(func=_run_reconcile)


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


def _settings(answer: AnswerJson) -> str:
    cur = answer["currency"]
    method = answer.get("payment_method")
    auto = answer.get("auto_topup")
    lines = [
        f"account:         {answer['account']}",
        f"payment method:  {method['label'] if method else 'none saved'}",
        (
            f"auto top-up:     {auto['amount']} {cur} when the balance falls below {auto['threshold']} {cur} (at most hourly)"
            if auto
            else "auto top-up:     off"
        ),
    ]
    if answer.get("last_auto_topup_at"):
        lines.append(f"last auto try:   {when(answer['last_auto_topup_at'])}")
    for cap in answer.get("caps") or []:
        where = f"project {cap['project']}" if cap["scope"] == "project" else "account"
        kind = "hard (work stopped)" if cap["hard"] else "soft (alert)"
        spent = f"; {cap['spent']} spent" if cap.get("spent") is not None else ""
        reached = ", REACHED" if cap.get("reached") else ""
        lines.append(f"cap:             {cap['limit']} {cur} per {cap['window']}, {where}, {kind}{spent}{reached}")
    return "\n".join(lines)


def _run_settings(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.billing_settings(account=args.account), _settings)


def _run_payment_method(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.save_payment_method(args.token, account=args.account), _settings)


def _run_auto_topup(args: argparse.Namespace) -> int:
    if args.off == (args.threshold is not None or args.amount is not None) or (
        not args.off and (args.threshold is None or args.amount is None)
    ):
        raise BadBillingRequest("give --threshold and --amount, or --off")
    client, _ = api_client(args)
    answer = client.set_auto_topup(args.threshold or "0", args.amount or "0", enabled=not args.off, account=args.account)
    return show(args, answer, _settings)


def cap_of(text: str) -> dict[str, Json]:
    """One --cap: ``[project=NAME:]WINDOW:LIMIT[:hard]`` as the API takes it; SystemExit saying the form otherwise."""
    parts = text.split(":")
    cap: dict[str, Json] = {}
    if parts and parts[0].startswith("project="):
        cap |= {"scope": "project", "project": parts.pop(0).removeprefix("project=")}
    hard = len(parts) == 3 and parts[2] == "hard"
    if len(parts) not in (2, 3) or (len(parts) == 3 and not hard) or parts[0] not in ("hour", "month"):
        raise BadBillingRequest(f"--cap {text!r} is not [project=NAME:]hour|month:LIMIT[:hard]")
    return cap | {"window": parts[0], "limit": parts[1], "hard": hard}


def _run_caps(args: argparse.Namespace) -> int:
    if args.none == bool(args.cap):
        raise BadBillingRequest("give one --cap or more, or --none")
    caps = [cap_of(text) for text in args.cap]
    client, _ = api_client(args)
    return show(args, client.set_spend_caps(caps, account=args.account), _settings)


def _payout_account(answer: AnswerJson) -> str:
    state = "can take payouts" if answer["payouts_enabled"] else "onboarding not finished: no payout until it is"
    lines = [
        f"account:   {answer['account']}",
        f"payout to: {answer['provider']} {answer['reference']} ({state})",
        f"payable:   {answer['payable']} {answer['currency']} (earnings past the dispute window)",
    ]
    if answer.get("onboarding_url"):
        lines.append(f"onboard at: {answer['onboarding_url']} (until {when(answer['onboarding_expires_at'])})")
    return "\n".join(lines)


def _run_payout_account(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    if args.connect:
        return show(args, client.connect_payout_account(account=args.account, return_url=args.return_url), _payout_account)
    if args.return_url is not None:
        raise BadBillingRequest("--return-url goes with --connect")
    return show(args, client.payout_account(account=args.account), _payout_account)


def _payout_rows(items: Sequence[AnswerJson]) -> str:
    if not items:
        return "no payout"
    return table(
        ["PAYOUT", "ACCOUNT", "PERIOD", "AMOUNT", "STATE", "TRANSFER", "PAID"],
        [
            [p["id"], p["account"], p["period"], f"{p['amount']} {p['currency']}", p["state"], p["transfer"], when(p["paid_at"])]
            for p in items
        ],
    )


def _run_payouts(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.payouts(account=args.account), lambda body: _payout_rows(body["items"]))


def _run_payout_run(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.run_payouts(), lambda body: _payout_rows(body["items"]))


def _reconciliation(answer: AnswerJson) -> str:
    head = f"{answer['payouts']} payouts in the ledger, {answer['transfers']} transfers on the payment provider"
    if not answer["differences"]:
        return f"{head}: they agree"
    rows = [[d["kind"], d["key"], d["ledger"], d["provider"], d["reference"]] for d in answer["differences"]]
    return f"{head}: {len(rows)} differences (alert payout_unreconciled)\n" + table(
        ["DIFFERENCE", "PAYOUT", "LEDGER", "PROVIDER", "TRANSFER"], rows
    )


def _run_reconcile(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.reconcile_payouts(), _reconciliation)

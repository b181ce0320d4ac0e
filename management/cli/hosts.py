"""``idlegrid host ...``: a provider's hosts from the command line: their prices, and draining them.

  idlegrid host price set HOST --on-demand 2.50 [--min-bid 0.80] [--reserved-discount 0.2] [--max-duration 7d]
  idlegrid host price default --on-demand 1.20 [...same flags] [--provider ACME (operator)]
  idlegrid host price show [HOST]      the price in force on HOST, or every price record the key may see
  idlegrid host price clear HOST       HOST goes back to its provider's default (or the grid's)
  idlegrid host drain HOST / undrain HOST
  idlegrid host show HOST              the host, its GPUs, and whether each reached a container (the GPU self-test)

Amounts are decimal numbers per GPU-hour in the grid's currency, passed to the API as text (never floats). The API
and key come from the same places as for ``idlegrid account`` (management/cli/connection.py). Tables by default,
``--json`` for the API's JSON.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from management.cli.connection import Parser, api_client, connection_options, show, table, when
from management.cli.verify import add_verification_parsers
from management.client.api import AnswerJson, BodyJson

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)\Z")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float | None:
    """``7d``, ``12h``, ``90m``, ``3600s`` or ``3600`` in seconds; ``none`` for no limit."""
    if text.strip().lower() == "none":
        return None
    match = _DURATION.match(text.strip().lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: write e.g. 7d, 12h, 90m, 3600s, or none")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def _terms_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--on-demand", required=True, metavar="AMOUNT", help="price per GPU-hour on demand, e.g. 2.50 (0: free)")
    p.add_argument(
        "--min-bid", metavar="AMOUNT", help="lowest bid per GPU-hour for interruptible rentals (default: not interruptible)"
    )
    p.add_argument(
        "--reserved-discount",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="off on-demand for a prepaid reserved period, 0 to 0.9 (default: %(default)s)",
    )
    p.add_argument(
        "--max-duration",
        type=duration_s,
        metavar="DURATION",
        help="the longest rental taken, at least 1h: 7d, 12h, 3600s (default: no limit)",
    )


def _terms(args: argparse.Namespace) -> BodyJson:
    return {
        "on_demand": args.on_demand,
        "min_bid": args.min_bid,
        "reserved_discount": args.reserved_discount,
        "max_duration_s": args.max_duration,
    }


def _longest(value: object) -> str:
    if not isinstance(value, int | float):
        return "none"
    seconds = int(value)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _discount(value: object) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) else "-"


def _host_price_rows(prices: Sequence[AnswerJson]) -> str:
    return table(
        ["HOST", "PROVIDER", "SOURCE", "ON DEMAND", "MIN BID", "RESERVED", "DISCOUNT", "MAX DURATION", "CURRENCY"],
        [
            [
                p["agent_id"],
                p["provider"],
                p["source"],
                p["on_demand"],
                p["min_bid"] if p["min_bid"] is not None else "on demand only",
                p["reserved"],
                _discount(p["reserved_discount"]),
                _longest(p["max_duration_s"]),
                p["currency"],
            ]
            for p in prices
        ],
    )


def _record_rows(records: Sequence[AnswerJson]) -> str:
    return table(
        ["PROVIDER", "HOST", "ON DEMAND", "MIN BID", "RESERVED", "DISCOUNT", "MAX DURATION", "CURRENCY", "UPDATED"],
        [
            [
                r["provider"],
                r["agent_id"] or "(default)",
                r["on_demand"],
                r["min_bid"] if r["min_bid"] is not None else "on demand only",
                r["reserved"],
                _discount(r["reserved_discount"]),
                _longest(r["max_duration_s"]),
                r["currency"],
                when(r["updated_at"]),
            ]
            for r in records
        ],
    )


def _listing(body: AnswerJson) -> str:
    grid = body["grid_default"]
    bid = grid["min_bid"] if grid["min_bid"] is not None else "on demand only"
    head = f"grid default: {grid['on_demand']} {body['currency']} per GPU-hour on demand, min bid {bid}"
    if not body["items"]:
        return head + "\nno prices set: every host costs its provider's default, else the grid default"
    return head + "\n\n" + _record_rows(body["items"])


def _agent_rows(agent: AnswerJson) -> str:
    return table(["HOST", "PROVIDER", "STATE", "DRAINED"], [[agent["id"], agent["provider"], agent["state"], agent["drained"]]])


def host_text(agent: AnswerJson) -> str:
    """A host for its provider: state and runtime, then each GPU with its self-test; a failed one's reason and fix."""
    head = f"{agent['id']} ({agent['provider']}): {agent['state']}, runtime {agent['runtime'] or 'none'}"
    head += f", isolation {agent['isolation'] or 'none'}"
    reach = {r["uuid"]: r for r in agent.get("gpu_selftest") or []}
    rows = []
    for gpu in agent["gpus"]:
        tested = reach.get(gpu["uuid"])
        verdict = "not tested" if tested is None else "reaches a container" if tested["reachable"] else "DOES NOT REACH"
        verified = gpu["verification"]["label"] if gpu.get("verification") else "-"
        rows.append([gpu["uuid"], gpu["model"] or "-", gpu["state"], "yes" if gpu["offered"] else "no", verdict, verified])
    text = head + "\n\n" + table(["GPU", "MODEL", "STATE", "OFFERED", "SELF-TEST", "VERIFICATION"], rows)
    for gpu in agent["gpus"]:  # an AMD card's partition modes: shown, not sold (docs/gpus.md)
        if split := gpu.get("partition"):
            modes = ", ".join(mode for mode in (split["compute"], split["memory"]) if mode)
            text += f"\n{gpu['uuid']} partition modes: {modes} (reported, not sold)"
    for uuid, tested in reach.items():
        if not tested["reachable"]:
            text += f"\n\n{uuid} is not offered: {tested['detail']}\n  fix: {tested['fix']}"
    for card in agent.get("unoffered_gpus") or []:  # seen on the host's bus, read by no library (docs/gpus.md)
        named = card["name"] or card["device_id"] or card["vendor"]
        text += f"\n\n{card['vendor']} card {named} at {card['pci_bus_id']} is not offered: {card['reason']}"
        if card["fix"]:
            text += f"\n  fix: {card['fix']}"
    return text


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``host`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    host = parser(sub, "host", "a provider's hosts: prices, drain", "Set and show hosts' prices; drain and undrain hosts.")
    h_sub = host.add_subparsers(dest="host_command", required=True, metavar="{show,price,drain,undrain,verify,verifications}")
    add_verification_parsers(h_sub, parser)  # measured verification (management/cli/verify.py)

    shown_host = parser(
        h_sub,
        "show",
        "a host, its GPUs and their self-test",
        "One of your hosts: its state and runtime, its GPUs, whether each is offered, and the agent's GPU self-test "
        "(whether each GPU reached a container of the runtime; the reason and the fix when not).",
    )
    shown_host.add_argument("host", metavar="HOST", help="the host's agent id")
    connection_options(shown_host)
    shown_host.set_defaults(func=_run_host_show)

    price = parser(
        h_sub,
        "price",
        "hosts' prices per GPU-hour",
        "A host's own price, else its provider's default, else the grid's default is the price in force.",
    )
    p_sub = price.add_subparsers(dest="price_command", required=True, metavar="{set,default,show,clear}")
    set_one = parser(p_sub, "set", "set a host's own price", "Set the price of one of your hosts (an operator: any host).")
    set_one.add_argument("host", metavar="HOST", help="the host's agent id")
    _terms_options(set_one)
    connection_options(set_one)
    set_one.set_defaults(func=_run_set)

    default = parser(
        p_sub, "default", "set a provider's default price", "Set the price of every host of yours without one of its own."
    )
    _terms_options(default)
    default.add_argument("--provider", metavar="ID", help="the provider (an operator's key must name one; default: yours)")
    connection_options(default)
    default.set_defaults(func=_run_default)

    shown = parser(
        p_sub,
        "show",
        "show prices",
        "With HOST: the price in force on it and where it comes from (anyone may read it). Without: your price records.",
    )
    shown.add_argument("host", nargs="?", metavar="HOST", help="a host's agent id (default: list your records)")
    shown.add_argument("--provider", metavar="ID", help="an operator's filter of the list (default: every provider)")
    connection_options(shown)
    shown.set_defaults(func=_run_show)

    clear = parser(p_sub, "clear", "remove a host's own price", "The host goes back to its provider's default (or the grid's).")
    clear.add_argument("host", metavar="HOST", help="the host's agent id")
    connection_options(clear)
    clear.set_defaults(func=_run_clear)

    for name, what in (("drain", "take no new work; what runs stays"), ("undrain", "take work again")):
        maintain = parser(h_sub, name, f"{name} a host: {what}", f"{name.capitalize()} one of your hosts: {what}.")
        maintain.add_argument("host", metavar="HOST", help="the host's agent id")
        connection_options(maintain)
        maintain.set_defaults(func=_run_drain if name == "drain" else _run_undrain)


def _run_set(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.set_host_price(args.host, _terms(args)), lambda p: _host_price_rows([p]))


def _run_default(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.set_default_price(_terms(args), provider=args.provider), lambda r: _record_rows([r]))


def _run_show(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    if args.host is not None:
        return show(args, client.host_price(args.host), lambda p: _host_price_rows([p]))
    return show(args, client.prices(provider=args.provider), _listing)


def _run_clear(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.clear_host_price(args.host), lambda p: _host_price_rows([p]))


def _run_drain(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.drain(args.host), _agent_rows)


def _run_undrain(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.undrain(args.host), _agent_rows)


def _run_host_show(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.agent(args.host), host_text)

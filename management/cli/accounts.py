"""``idlegrid whoami`` and ``idlegrid account ...``: accounts and API keys from the command line (where the API and
the key come from, and how answers print: ``management.cli.connection``)."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Callable, Sequence
from typing import Any

from common.errors import ConfigError
from management.cli.connection import (
    Parser,
    api_client,
    connection_options,
    mapping_text,
    show,
    table,
    when,
)
from management.client.api import AnswerJson, BodyJson

ROLES = ("operator", "provider", "renter")


def _account_rows(accounts: Sequence[AnswerJson]) -> str:
    return table(
        ["ID", "ROLE", "NAME", "SHARE", "GPU QUOTA", "TIER QUOTAS", "STATUS", "CREATED"],
        [
            [
                a["id"],
                a["role"],
                a["name"] or None,
                f"{a['share']:g}",
                a["gpu_quota"] if a["gpu_quota"] is not None else "none",
                mapping_text(a["tier_quotas"]),
                "disabled" if a["disabled"] else "enabled",
                when(a["created_at"]),
            ]
            for a in accounts
        ],
    )


def _key_rows(keys: Sequence[AnswerJson]) -> str:
    return table(
        ["KEY ID", "NAME", "CREATED", "LAST USED", "REVOKED"],
        [[k["key_id"], k["name"], when(k["created_at"]), when(k["last_used"]), when(k["revoked_at"])] for k in keys],
    )


# --- parsing -------------------------------------------------------------------------------------------


def _pairs(kind: Callable[[str], Any]) -> Callable[[str], tuple[str, Any]]:
    def parse(text: str) -> tuple[str, Any]:
        name, sep, value = text.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
        try:
            return name, kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None

    return parse


def _quota(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of GPUs, or 'none'") from None


def _settings_options(p: argparse.ArgumentParser, *, creating: bool) -> None:
    unchanged = "unchanged" if not creating else None
    p.add_argument("--name", metavar="TEXT", help=f"display name (default: {unchanged or 'none'})")
    p.add_argument("--share", type=float, metavar="WEIGHT", help=f"fair-share weight (default: {unchanged or '1'})")
    p.add_argument(
        "--gpu-quota",
        type=_quota,
        metavar="N",
        help=f"GPUs held at once, or 'none' for no limit (default: {unchanged or 'none'})",
        # On update an absent --gpu-quota (unchanged) must differ from 'none' (no limit): absent leaves no attribute.
        default=None if creating else argparse.SUPPRESS,
    )
    p.add_argument(
        "--tier-quota",
        type=_pairs(int),
        action="append",
        metavar="TIER=N",
        help=f"GPUs of a tier held at once, repeatable; replaces all tier quotas (default: {unchanged or 'none'})",
    )
    p.add_argument(
        "--project-share",
        type=_pairs(float),
        action="append",
        metavar="PROJECT=WEIGHT",
        help=f"a project's weight within the account's share, repeatable; replaces all (default: {unchanged or 'none'})",
    )


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``whoami`` and ``account`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    who = parser(
        sub,
        "whoami",
        "show the account, role and key the CLI calls the API as",
        "Show the account, role and API key the CLI calls the API as, and where it found the key.\n" + _SOURCES,
    )
    connection_options(who)
    who.set_defaults(func=_run_whoami)

    p = parser(
        sub, "account", "accounts and their API keys", "Create, list and change accounts, and manage API keys.\n" + _SOURCES
    )
    a_sub = p.add_subparsers(dest="account_command", required=True, metavar="{create,list,get,update,password,key}")
    create = parser(
        a_sub,
        "create",
        "create an account (operator)",
        "Create an account. Its id is permanent: a provider's id is what its hosts and join tokens name.",
    )
    create.add_argument("account_id", metavar="ID", help="lowercase letters, digits and '-', e.g. acme-gpu")
    create.add_argument("--role", required=True, choices=ROLES, help="what the account does on the grid")
    _settings_options(create, creating=True)
    connection_options(create)
    create.set_defaults(func=_run_create)

    listing = parser(a_sub, "list", "list accounts", "List accounts in id order (a non-operator sees its own).")
    listing.add_argument("--role", choices=ROLES, help="only accounts with this role (default: all)")
    connection_options(listing)
    listing.set_defaults(func=_run_list)

    get = parser(a_sub, "get", "show one account", "Show one account and its scheduling settings.")
    get.add_argument("account_id", metavar="ID", help="the account's id")
    connection_options(get)
    get.set_defaults(func=_run_get)

    update = parser(
        a_sub,
        "update",
        "change an account (operator)",
        "Change an account; what no option names is left as it is. A disabled account's keys are refused at once.",
    )
    update.add_argument("account_id", metavar="ID", help="the account's id")
    _settings_options(update, creating=False)
    update.add_argument(
        "--role", choices=ROLES, help="a new role; the account's keys take it on their next call (default: unchanged)"
    )
    state = update.add_mutually_exclusive_group()
    state.add_argument(
        "--disable",
        dest="disabled",
        action="store_const",
        const=True,
        help="refuse every key of the account (default: unchanged)",
    )
    state.add_argument(
        "--enable", dest="disabled", action="store_const", const=False, help="accept its keys again (default: unchanged)"
    )
    connection_options(update)
    update.set_defaults(func=_run_update)

    password = parser(
        a_sub,
        "password",
        "set an account's console password",
        "Set the password an account signs in to the web console with (at least 12 characters). The operator sets "
        "anyone's; an account sets its own, giving its current password once it has one. Every console session of the "
        "account ends. The password is asked for twice (it is never an option: options show in the process list).",
    )
    password.add_argument("account_id", metavar="ACCOUNT", help="the account whose password to set")
    password.add_argument(
        "--stdin",
        action="store_true",
        help="read the new password from the first line of standard input (then the current one, when --current is "
        "given, from the second) instead of asking (default: ask on the terminal)",
    )
    password.add_argument(
        "--current",
        action="store_true",
        help="also ask for the current password (needed to change one's own; default: not asked)",
    )
    connection_options(password)
    password.set_defaults(func=_run_password)

    keys = parser(a_sub, "key", "an account's API keys", "Create, list and revoke API keys. Any account manages its own.")
    k_sub = keys.add_subparsers(dest="key_command", required=True, metavar="{create,list,revoke}")
    k_create = parser(
        k_sub,
        "create",
        "create an API key (shown once)",
        "Create an API key for an account and print it; it is shown this once (only its hash is stored).",
    )
    k_create.add_argument("account_id", metavar="ACCOUNT", help="the account the key belongs to")
    k_create.add_argument("--name", required=True, metavar="TEXT", help="what the key is for, e.g. ci or laptop")
    connection_options(k_create)
    k_create.set_defaults(func=_run_key_create)
    k_list = parser(
        k_sub, "list", "list an account's API keys", "List an account's keys, oldest first: never the keys themselves."
    )
    k_list.add_argument("account_id", metavar="ACCOUNT", help="the account whose keys to list")
    connection_options(k_list)
    k_list.set_defaults(func=_run_key_list)
    k_revoke = parser(
        k_sub, "revoke", "revoke an API key at once", "Revoke an API key by its key id; it is refused from the next call on."
    )
    k_revoke.add_argument("key_id", metavar="KEY_ID", help="the key's public id (key-...), as key list shows it")
    connection_options(k_revoke)
    k_revoke.set_defaults(func=_run_key_revoke)


_SOURCES = (
    "The API key is taken from --api-key, else --key-file, else $IDLEGRID_API_KEY, else api_key in "
    "~/.config/idlegrid/cli.toml, else "
    "the local Master's operator key file; the API URL from --api, else $IDLEGRID_API, else api in that file."
)


# --- running -------------------------------------------------------------------------------------------


def _settings(args: argparse.Namespace) -> BodyJson:
    found: BodyJson = {}
    for name in ("name", "share"):
        if getattr(args, name) is not None:
            found[name] = getattr(args, name)
    if "gpu_quota" in vars(args):  # None: no limit (sent as null on update, left out on create)
        found["gpu_quota"] = args.gpu_quota
    if args.tier_quota is not None:
        found["tier_quotas"] = dict(args.tier_quota)
    if args.project_share is not None:
        found["project_shares"] = dict(args.project_share)
    return found


def _run_whoami(args: argparse.Namespace) -> int:
    client, credentials = api_client(args)
    me = client.whoami()
    if args.json:
        return show(args, me, str)
    key = f"{me['key_id'] or '(a legacy key: no key id)'} ({me['key_name']})"
    lines = [
        ("account", f"{me['account']} ({me['role']})"),
        ("key", key),
        ("api", credentials.api),
        ("key from", credentials.key_source),
    ]
    print("\n".join(f"{label:<9} {value}" for label, value in lines))
    return 0


def _run_create(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.create_account(args.account_id, args.role, **_settings(args)), lambda a: _account_rows([a]))


def _run_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.list("/api/v1/accounts", role=args.role), _account_rows)


def _run_get(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.account(args.account_id), lambda a: _account_rows([a]))


def _run_update(args: argparse.Namespace) -> int:
    changes = _settings(args)
    if args.role is not None:
        changes["role"] = args.role
    if args.disabled is not None:
        changes["disabled"] = args.disabled
    if not changes:
        raise ConfigError(
            "nothing to change: name at least one of --name, --share, --gpu-quota, --tier-quota, "
            "--project-share, --role, --disable, --enable"
        )
    client, _ = api_client(args)
    return show(args, client.update_account(args.account_id, changes), lambda a: _account_rows([a]))


def _run_key_create(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    issued = client.create_api_key(args.account_id, args.name)
    if args.json:
        return show(args, issued, str)
    print(f"API key for {issued['account']} ({issued['name']}), key id {issued['key_id']}:\n\n  {issued['key']}\n")
    print("It is shown this once: store it now (e.g. api_key in ~/.config/idlegrid/cli.toml, mode 0600).")
    return 0


def _run_key_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.list(f"/api/v1/accounts/{args.account_id}/keys"), _key_rows)


def _run_key_revoke(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.revoke_api_key(args.key_id), lambda k: f"revoked {k['key_id']} ({k['name']}) of {k['account']}")


def _read_passwords(args: argparse.Namespace) -> tuple[str, str | None]:
    """The new password (and the current one with --current): from standard input with --stdin, else asked twice."""
    if args.stdin:
        lines = sys.stdin.read().splitlines()
        wanted = 2 if args.current else 1
        if len(lines) < wanted:
            what = "the new password, then the current one," if args.current else "the new password"
            raise ConfigError(f"--stdin: expected {what} one a line; got {len(lines)} line(s)")
        return lines[0], (lines[1] if args.current else None)
    current = getpass.getpass("current password: ") if args.current else None
    new = getpass.getpass(f"new password for {args.account_id}: ")
    if getpass.getpass("the same again: ") != new:
        raise ConfigError("the two passwords differ; nothing was changed")
    return new, current


def _run_password(args: argparse.Namespace) -> int:
    new, current = _read_passwords(args)
    client, credentials = api_client(args)
    account = client.set_password(args.account_id, new, current_password=current)
    if args.json:
        return show(args, account, str)
    console = credentials.api.rstrip("/") + "/console/"
    print(f"password set for {account['id']} ({account['role']}): sign in to the console at {console}")
    return 0

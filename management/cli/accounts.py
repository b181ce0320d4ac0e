"""``idlegrid whoami`` and ``idlegrid account ...``: accounts and API keys from the command line.

Where the API and the key come from, first found wins:
  API URL:  --api, then IDLEGRID_API, then ``api`` in the CLI config file, then http://127.0.0.1:7000
  API key:  --api-key, then --key-file, then IDLEGRID_API_KEY, then ``api_key`` in the CLI config file, then the local
            Master's operator key file (--operator-token-file, .idlegrid/master/operator.token by default)
The CLI config file is ``$XDG_CONFIG_HOME/idlegrid/cli.toml`` (``~/.config/idlegrid/cli.toml``); keep it 0600.
Output is a table for people; ``--json`` prints the API's JSON for scripts.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError

DEFAULT_API = "http://127.0.0.1:7000"
DEFAULT_OPERATOR_KEY = Path(".idlegrid/master/operator.token")
API_ENV = "IDLEGRID_API"
API_KEY_ENV = "IDLEGRID_API_KEY"
ROLES = ("operator", "provider", "renter")

Parser = Callable[..., argparse.ArgumentParser]


# --- where the API and the key come from ---------------------------------------------------------------


def cli_config_path(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".config")
    return Path(base) / "idlegrid" / "cli.toml"


def _read_cli_config(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as fh:
            found = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the CLI config file {path}: {exc}") from None
    unknown = sorted(set(found) - {"api", "api_key"})
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(unknown)}; it takes api and api_key")
    for name, value in found.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {name} must be a non-empty string")
    return found


@dataclass(frozen=True)
class Credentials:
    api: str
    api_key: str
    key_source: str  # where the key was found, for messages


def resolve_credentials(
    args: argparse.Namespace, env: Mapping[str, str], *, key_option: str = "--api-key KEY or --key-file FILE"
) -> Credentials:
    """``key_option``: how the calling command takes a key, for the message when none is found."""
    config_path = cli_config_path(env)
    config = _read_cli_config(config_path)
    api = args.api or env.get(API_ENV) or config.get("api") or DEFAULT_API
    if args.api_key:
        return Credentials(api, args.api_key, "--api-key")
    key_file: Path | None = getattr(args, "key_file", None)
    if key_file is not None:
        from management.client import read_key_file

        return Credentials(api, read_key_file(key_file), str(key_file))
    if env.get(API_KEY_ENV):
        return Credentials(api, env[API_KEY_ENV], API_KEY_ENV)
    if config.get("api_key"):
        return Credentials(api, config["api_key"], str(config_path))
    token_file: Path = args.operator_token_file
    try:
        key = token_file.read_text().strip()
    except OSError:
        key = ""
    if not key:
        raise ConfigError(
            f"no API key: pass {key_option}, set {API_KEY_ENV}, put api_key in {config_path}, "
            f"or run where the Master's operator key file {token_file} is readable"
        )
    return Credentials(api, key, str(token_file))


# --- output --------------------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; None shows as '-'."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def when(value: object) -> str | None:
    """An API timestamp to the second: "2026-11-22 21:40:05Z"."""
    return value[:19].replace("T", " ") + "Z" if isinstance(value, str) else None


def mapping_text(value: Mapping[str, object]) -> str:
    """``{"a": 1, "b": 2}`` as "a=1,b=2" (sorted); "-" for none."""
    return ",".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"


def _account_rows(accounts: Sequence[Mapping[str, Any]]) -> str:
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


def _key_rows(keys: Sequence[Mapping[str, Any]]) -> str:
    return table(
        ["KEY ID", "NAME", "CREATED", "LAST USED", "REVOKED"],
        [[k["key_id"], k["name"], when(k["created_at"]), when(k["last_used"]), when(k["revoked_at"])] for k in keys],
    )


def show(args: argparse.Namespace, body: Any, human: Callable[[Any], str]) -> int:
    """The API's JSON with ``--json``, else ``human(body)``: how every `idlegrid` command that reads prints."""
    print(json.dumps(body, indent=2, sort_keys=True) if args.json else human(body))
    return 0


# --- parsing -------------------------------------------------------------------------------------------


def connection_options(p: argparse.ArgumentParser) -> None:
    """The options every command that calls the API takes (account, key and workload commands alike)."""
    p.add_argument(
        "--api", metavar="URL", help=f"management API URL (default: ${API_ENV}, the CLI config file, else {DEFAULT_API})"
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help=f"API key (default: --key-file, ${API_KEY_ENV}, the CLI config file, else the operator key file)",
    )
    p.add_argument(
        "--key-file", type=Path, metavar="FILE", help="file holding the API key: keeps it out of shell history (default: none)"
    )
    p.add_argument(
        "--operator-token-file",
        type=Path,
        default=DEFAULT_OPERATOR_KEY,
        metavar="FILE",
        help="the local Master's operator key, used when no other key is given (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON instead of a table (default: a table)")


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
    """``whoami`` and ``account`` on the command line's subcommands; ``parser`` makes one (as management/cli.py does)."""
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


def api_client(args: argparse.Namespace) -> tuple[Any, Credentials]:
    """A client for the API and key ``connection_options`` found, and where they came from."""
    from management.client import ApiClient

    credentials = resolve_credentials(args, os.environ)
    return ApiClient(credentials.api, credentials.api_key), credentials


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {}
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

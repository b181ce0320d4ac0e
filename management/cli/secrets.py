"""``idlegrid secret ...``: an account's secrets for its workloads (storage credentials, tokens for env).

  idlegrid secret create NAME [--from-env VAR | --from-file PATH]   the value from stdin by default; shown never again
  idlegrid secret list                                              names, sizes, creation times; never values
  idlegrid secret delete NAME

A value is never taken as an argument (it would show in the process list and the shell's history). A workload uses
a secret by name: ``--storage-credentials NAME`` for its object storage, ``${secret:NAME}`` as an env value
(docs/storage.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from common.errors import ConfigError
from management.cli.connection import Parser, api_client, connection_options, show, table, when
from management.client.api import AnswerJson


def _rows(secrets: Sequence[AnswerJson]) -> str:
    if not secrets:
        return "no secret"
    return table(["NAME", "BYTES", "CREATED"], [[s["name"], s["size"], when(s["created_at"])] for s in secrets])


def _value(args: argparse.Namespace) -> str:
    """The value from the variable, the file or stdin, with one trailing newline dropped (what `echo` adds)."""
    if args.from_env:
        if args.from_env not in os.environ:
            raise ConfigError(f"--from-env {args.from_env}: that variable is not set")
        value = os.environ[args.from_env]
    elif args.from_file:
        try:
            value = Path(args.from_file).read_text()
        except OSError as exc:
            raise ConfigError(f"--from-file {args.from_file}: {exc.strerror}") from None
    else:
        if sys.stdin.isatty():
            print("value (end with Ctrl-D):", file=sys.stderr)
        value = sys.stdin.read()
    value = value.removesuffix("\n")
    if not value:
        raise ConfigError("the secret's value is empty")
    return value


def add_parsers(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``secret`` on the command line's subcommands; ``parser`` makes one (as management/cli/main.py does)."""
    secret = parser(
        sub,
        "secret",
        "your secrets for workloads",
        "Named values your workloads use (storage credentials, tokens); a value is never shown again.",
    )
    s_sub = secret.add_subparsers(dest="secret_command", required=True, metavar="{create,list,delete}")
    create = parser(s_sub, "create", "store a secret", "Store a secret; its value comes from stdin unless told otherwise.")
    create.add_argument("name", metavar="NAME")
    source = create.add_mutually_exclusive_group()
    source.add_argument("--from-env", metavar="VAR", help="take the value from this environment variable (default: stdin)")
    source.add_argument("--from-file", metavar="PATH", help="take the value from this file (default: stdin)")
    connection_options(create)
    create.set_defaults(func=_run_create)
    listing = parser(s_sub, "list", "your secrets", "Your secrets by name (never their values).")
    connection_options(listing)
    listing.set_defaults(func=_run_list)
    delete = parser(s_sub, "delete", "delete a secret", "Delete a secret (workloads that name it can no longer start).")
    delete.add_argument("name", metavar="NAME")
    connection_options(delete)
    delete.set_defaults(func=_run_delete)


def _run_create(args: argparse.Namespace) -> int:
    value = _value(args)
    client, _ = api_client(args)
    return show(args, client.create_secret(args.name, value), lambda b: f"secret {b['name']} stored ({b['size']} bytes)")


def _run_list(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    return show(args, client.secrets(), lambda b: _rows(b["items"]))


def _run_delete(args: argparse.Namespace) -> int:
    client, _ = api_client(args)
    client.delete_secret(args.name)
    print(f"secret {args.name} deleted")
    return 0

"""What every ``idlegrid`` command that calls the API shares: where the API and the key come from, the options that
say so, the client they make, and how answers print.

Where the API and the key come from, first found wins:
  API URL:  --api, then IDLEGRID_API, then ``api`` in the CLI config file, then http://127.0.0.1:7000
  API key:  --api-key, then --key-file, then IDLEGRID_API_KEY, then ``api_key`` in the CLI config file, then the local
            Master's operator key file (--operator-token-file, .idlegrid/master/operator.token by default)
The CLI config file is ``$XDG_CONFIG_HOME/idlegrid/cli.toml`` (``~/.config/idlegrid/cli.toml``); keep it 0600.
Output is a table for people; ``--json`` prints the API's JSON for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
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


def resolve_api(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    """The API's URL: --api, then IDLEGRID_API, then the CLI config file's ``api``, then the default."""
    return str(args.api or env.get(API_ENV) or _read_cli_config(cli_config_path(env)).get("api") or DEFAULT_API)


def resolve_credentials(
    args: argparse.Namespace, env: Mapping[str, str], *, key_option: str = "--api-key KEY or --key-file FILE"
) -> Credentials:
    """``key_option``: how the calling command takes a key, for the message when none is found."""
    config_path = cli_config_path(env)
    config = _read_cli_config(config_path)
    api = resolve_api(args, env)
    if args.api_key:
        return Credentials(api, args.api_key, "--api-key")
    key_file: Path | None = getattr(args, "key_file", None)
    if key_file is not None:
        from management.client.api import read_key_file

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


def show(args: argparse.Namespace, body: Any, human: Callable[[Any], str]) -> int:
    """The API's JSON with ``--json``, else ``human(body)``: how every `idlegrid` command that reads prints."""
    print(json.dumps(body, indent=2, sort_keys=True) if args.json else human(body))
    return 0


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


def api_client(args: argparse.Namespace) -> tuple[Any, Credentials]:
    """A client for the API and key ``connection_options`` found, and where they came from."""
    from management.client.api import ApiClient

    credentials = resolve_credentials(args, os.environ)
    return ApiClient(credentials.api, credentials.api_key), credentials

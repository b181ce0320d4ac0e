"""``idlegrid access``: run an Access relay. Also ``python -m access``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from common.errors import IdlegridError
from common.heap import tune_for_daemon
from common.logs import setup_logging

DESCRIPTION = (
    "Run an Access relay: accept agents over mutually authenticated WebSockets, check their certificates "
    "and every frame, rate-limit them, and relay them over one link to the Master; serve enrollment, the "
    "speed test, /healthz and /metrics over HTTPS. Settings come from --config FILE (TOML), "
    "IDLEGRID_ACCESS_<SETTING> environment variables and these flags, in that order."
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("access", help="run an Access relay", description=DESCRIPTION)
    _add_arguments(p)
    p.set_defaults(func=run)


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML configuration file")
    p.add_argument("--relay-id", help="this relay's name, as in its certificate (default relay-1)")
    p.add_argument("--region", help="the region this relay serves (default local)")
    p.add_argument(
        "--master-url",
        action="append",
        help="wss:// URL of the Master's relay link (default wss://127.0.0.1:7100/link); once per Master of an HA pair",
    )
    p.add_argument("--public-url", help="wss:// URL agents reach this relay at, if not its bind address")
    p.add_argument("--host", help="address both servers bind to (default 127.0.0.1)")
    p.add_argument("--agent-port", type=int, help="port agents connect to over wss with their certificate (default 7200)")
    p.add_argument("--http-port", type=int, help="HTTPS port: enrollment, speed test, /healthz, /metrics (default 7201)")
    p.add_argument("--http-public-url", help="https:// URL renters reach the HTTPS port at (tunnels), if not its bind address")
    p.add_argument(
        "--tunnel-bytes-per-s", type=int, help="a tunnel's bandwidth each way when its ticket names none (default 32 MiB/s)"
    )
    p.add_argument("--max-tunnels", type=int, help="tunnels open on this relay at once (default 256)")
    p.add_argument("--max-tunnels-per-agent", type=int, help="tunnels open to one agent through this relay (default 16)")
    p.add_argument("--cert", help="this relay's certificate (role access)")
    p.add_argument("--key", help="this relay's private key")
    p.add_argument("--ca", help="the platform CA certificate")
    p.add_argument("--log-level", help="debug, info, warning or error (default info)")


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """Flags as config settings; None means the flag was not given."""
    return {
        "relay_id": args.relay_id,
        "region": args.region,
        "master_url": args.master_url[0] if args.master_url else None,
        "master_urls": args.master_url if args.master_url and len(args.master_url) > 1 else None,
        "public_url": args.public_url,
        "agent_host": args.host,
        "http_host": args.host,
        "agent_port": args.agent_port,
        "http_port": args.http_port,
        "http_public_url": args.http_public_url,
        "tunnel_bytes_per_s": args.tunnel_bytes_per_s,
        "max_tunnels": args.max_tunnels,
        "max_tunnels_per_agent": args.max_tunnels_per_agent,
        "cert_file": args.cert,
        "key_file": args.key,
        "ca_file": args.ca,
        "log_level": args.log_level,
    }


def run(args: argparse.Namespace) -> int:
    from access.config import load_access_config
    from access.daemon import serve

    config = load_access_config(args.config, overrides=overrides(args))
    setup_logging("access", config.log_level)
    tune_for_daemon()
    # asyncio's own loop, not uvloop (common/loop.py) as the other daemons: the relay resets unwanted connections
    # in its listening socket's accept() (access/relay.py, GatedListener), which uvloop bypasses (libuv accepts),
    # and uvloop's 256 KiB TLS read buffer per connection costs more memory per agent (bench/HISTORY.md).
    asyncio.run(serve(config))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m access", description=DESCRIPTION)
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except IdlegridError as exc:
        print(f"access: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130

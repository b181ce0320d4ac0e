"""``idlegrid agent``: run the provider agent, or enroll this host (``idlegrid agent enroll``). The command line's
entry point (management/cli/main.py) adds these subcommands beside the relay's (access/cli.py)."""

from __future__ import annotations

import argparse
import asyncio
import ssl
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.errors import ConfigError, EnrollmentError
from common.heap import tune_for_daemon
from common.logs import setup_logging
from common.loop import run as run_loop

LOG_LEVELS = ("debug", "info", "warning", "error")

Parser = Callable[[argparse._SubParsersAction, str, str, str], argparse.ArgumentParser]


def _log_level(p: argparse.ArgumentParser, shown_default: str, **kwargs: Any) -> None:
    p.add_argument("--log-level", choices=LOG_LEVELS, help=f"how much the daemon logs (default {shown_default})", **kwargs)


def _agent_common(p: argparse.ArgumentParser, *, suppress: bool) -> None:
    """Options of both ``agent`` and ``agent enroll``, so they work before or after ``enroll``. On the
    subcommand they default to SUPPRESS: one given before ``enroll`` is not reset by the subcommand's default."""
    from agent.config import AgentConfig

    d = AgentConfig()
    extra: dict[str, Any] = {"default": argparse.SUPPRESS} if suppress else {}
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML configuration file (default: none)", **extra)
    p.add_argument(
        "--state-dir",
        metavar="DIR",
        help=f"where the agent keeps its key, certificate and ledger (default {d.state_dir})",
        **extra,
    )
    p.add_argument("--region", metavar="NAME", help="the region this host is in (default: none; the relay's region)", **extra)
    _log_level(p, d.log_level, **extra)


def add_parser(sub: argparse._SubParsersAction, parser: Parser) -> None:
    """``idlegrid agent`` and ``idlegrid agent enroll``; ``parser(sub, name, help, description)`` makes each, in the
    command line's help format."""
    from agent.config import AgentConfig

    d = AgentConfig()
    p = parser(
        sub,
        "agent",
        "run the provider agent, or enroll this host (agent enroll)",
        "Run the provider agent: dial out to an Access relay, report GPUs, run renters' containers.\n"
        "Enroll the host once first:\n"
        "  idlegrid agent enroll --token TOKEN --access https://RELAY:PORT --ca-file ca.crt\n"
        "Settings come from --config FILE (TOML), IDLEGRID_AGENT_<SETTING> environment variables and these "
        "flags, in that order.",
    )
    _agent_common(p, suppress=False)
    p.add_argument(
        "--access",
        action="append",
        dest="access_urls",
        metavar="URL",
        help="a relay to connect to, repeatable: its wss:// agent URL, or the https:// URL the host enrolled "
        "through (default: the relays recorded at enrollment)",
    )
    p.add_argument(
        "--dns-domain",
        metavar="DOMAIN",
        help="find relays by DNS: SRV _idlegrid._tcp.REGION.DOMAIN; --access is then the fallback (default: none)",
    )
    p.add_argument(
        "--dns-nameserver",
        action="append",
        dest="dns_nameservers",
        metavar="ADDRESS",
        help="nameserver to ask for relays, repeatable (default: the system resolver)",
    )
    p.add_argument("--dns-port", type=int, metavar="PORT", help=f"port of the nameservers (default {d.dns_port})")
    p.add_argument(
        "--simulate",
        metavar="SPEC",
        help="simulate GPUs instead of NVML, e.g. h100:8 or a10:2,t4:1, reported as simulated (default: none, NVML)",
    )
    p.add_argument(
        "--runtime",
        choices=["docker", "process"],
        help=f"container runtime (default {d.runtime}; process: a sandboxed host process, for demos and tests)",
    )
    p.add_argument("--docker-socket", metavar="PATH", help=f"Docker/Podman API socket (default {d.docker_socket})")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth measurement (default: measure it)")
    p.set_defaults(func=run)
    agent_sub = p.add_subparsers(dest="agent_command", metavar="{enroll}")
    e = parser(
        agent_sub,
        "enroll",
        "enroll this host with a one-time join token",
        "Generate this host's key locally, send a CSR with a one-time join token through an Access "
        "relay's HTTPS endpoint, and store the certificate. Only the CSR leaves the host.\n"
        "  idlegrid agent enroll --token TOKEN --access https://RELAY:PORT --ca-file ca.crt",
    )
    _agent_common(e, suppress=True)
    e.add_argument(
        "--token", required=True, metavar="TOKEN", help="one-time join token from the operator (idlegrid token create)"
    )
    e.add_argument(
        "--access",
        required=True,
        dest="enroll_url",
        metavar="URL",
        help="the relay's https:// URL (its enrollment endpoint); a wss:// URL is read as the same host and port",
    )
    e.add_argument("--ca-file", type=Path, required=True, metavar="FILE", help="the platform CA certificate (ca.crt) to trust")
    e.add_argument(
        "--connect",
        action="append",
        metavar="URL",
        help="wss:// relay URL(s) to connect to afterwards, repeatable (default: the one the relay announces)",
    )
    e.set_defaults(func=run_enroll)


def relay_url(url: str, scheme: str) -> str:
    """``url`` with the scheme of the use it is put to: wss:// to connect, https:// to enroll. A relay's URL may
    be given with either scheme, or none (``HOST:PORT``); the host and port are kept."""
    text = url.strip()
    if "://" not in text:
        text = f"{scheme}://{text}"
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("wss", "https", "ws", "http") or not parts.hostname:
        raise ConfigError(f"{url!r} is not a relay URL; expected wss://HOST:PORT or https://HOST:PORT")
    if parts.scheme in ("ws", "http"):
        raise ConfigError(f"{url!r}: relays only speak TLS; use wss:// or https://")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{url!r} has a bad port") from None
    netloc = parts.hostname if port is None else f"{parts.hostname}:{port}"
    if ":" in (parts.hostname or "") and port is not None:  # IPv6 literal
        netloc = f"[{parts.hostname}]:{port}"
    return urllib.parse.urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


def _agent_access_urls(args: argparse.Namespace, state_dir: Path) -> list[str] | None:
    """The relays to dial: wss:// URLs as given; an https:// URL the host enrolled through stands for the relays
    recorded at enrollment (its agent URL is on another port), any other https:// URL for wss:// on that port."""
    if not args.access_urls:
        return None
    from agent.identity import AgentIdentity

    enrolled_through, recorded = "", []
    if (state_dir / "identity.json").exists():
        identity = AgentIdentity.load(state_dir)
        enrolled_through, recorded = identity.http_url.rstrip("/"), identity.access_urls
    urls: list[str] = []
    for given in args.access_urls:
        as_https = relay_url(given, "https")
        if given.strip().startswith("https://") and recorded and as_https == relay_url(enrolled_through, "https"):
            urls.extend(recorded)
        else:
            urls.append(relay_url(given, "wss"))
    return list(dict.fromkeys(urls))


def _check_simulate(spec: str | None) -> None:
    if spec is None:
        return
    from agent.simulate import parse_simulate_spec

    try:
        parse_simulate_spec(spec)
    except ValueError as exc:
        raise ConfigError(f"--simulate: {exc}") from None


def _check_ca_file(path: Path) -> None:
    """The CA file must hold a PEM certificate; a wrong file is named in one line, not a TLS library traceback."""
    if not path.exists():
        return  # enroll() says what to do about a missing one
    try:
        ssl.create_default_context(cafile=str(path))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--ca-file {path} is not a PEM certificate ({getattr(exc, 'reason', None) or exc})") from None


def _agent_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "state_dir": getattr(args, "state_dir", None),
        "region": getattr(args, "region", None),
        "log_level": getattr(args, "log_level", None),
        "simulate": getattr(args, "simulate", None),
        "dns_domain": getattr(args, "dns_domain", None),
        "dns_nameservers": getattr(args, "dns_nameservers", None),
        "dns_port": getattr(args, "dns_port", None),
        "runtime": getattr(args, "runtime", None),
        "docker_socket": getattr(args, "docker_socket", None),
        "measure_bandwidth": False if getattr(args, "no_bandwidth", False) else None,
    }


def _not_enrolled_hint(state_dir: Path, default_state_dir: str) -> str:
    where = "" if str(state_dir) == default_state_dir else f" --state-dir {state_dir}"
    return (
        f"this host is not enrolled yet ({state_dir / 'identity.json'} is missing); enroll it once with:\n"
        f"  idlegrid agent enroll{where} --token TOKEN --access https://RELAY:PORT --ca-file ca.crt\n"
        "(the token from the operator's `idlegrid token create`, the relay's URL and the platform CA from the operator)"
    )


def run(args: argparse.Namespace) -> int:
    from agent.config import AgentConfig, load_agent_config
    from agent.daemon import serve

    _check_simulate(args.simulate)
    config = load_agent_config(getattr(args, "config", None), overrides=_agent_overrides(args))
    if not (config.state_path / "identity.json").exists():
        raise ConfigError(_not_enrolled_hint(config.state_path, AgentConfig().state_dir))
    urls = _agent_access_urls(args, config.state_path)
    if urls is not None:
        config.access_urls = urls
    setup_logging("agent", config.log_level)
    tune_for_daemon()
    run_loop(serve(config))
    return 0


def run_enroll(args: argparse.Namespace) -> int:
    from agent.config import load_agent_config
    from agent.enroll import enroll

    config = load_agent_config(getattr(args, "config", None), overrides=_agent_overrides(args))
    connect = [relay_url(url, "wss") for url in args.connect] if args.connect else None
    enroll_url = relay_url(args.enroll_url, "https")
    _check_ca_file(args.ca_file)
    try:
        identity = asyncio.run(
            enroll(
                config.state_path,
                token=args.token,
                access_http_url=enroll_url,
                ca_file=args.ca_file,
                region=config.region,
                access_urls=connect or config.access_urls,
            )
        )
    except EnrollmentError as exc:
        if exc.code == "unreachable" and args.enroll_url.strip().startswith("wss://"):
            # A relay's agent port (wss) and its enrollment port (https) differ unless a proxy joins them.
            raise EnrollmentError(
                f"{exc}; {args.enroll_url} looks like a relay's agent URL: enroll through its https:// URL "
                "(the relay's HTTPS port, 7201 by default)",
                code=exc.code,
            ) from None
        raise
    print(f"enrolled as {identity.agent_id}; credentials in {config.state_path} (key 0600)")
    print(f"start it with: idlegrid agent --state-dir {config.state_path}")
    return 0

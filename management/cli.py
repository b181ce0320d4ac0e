"""``idlegrid``: the one command line. This module is the entry point, the one place that composes every part."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from common.errors import IdlegridError
from common.heap import tune_for_daemon
from common.logs import setup_logging


def _master_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "master",
        help="run the Master (control plane) and the management API",
        description="Run the Master: relay link endpoint, registry, command ledger, and the operator API.",
    )
    p.add_argument("--config", type=Path, help="TOML configuration file")
    p.add_argument("--state-dir", help="where the store, keys and operator token live (default .idlegrid/master)")
    p.add_argument("--host", help="address to bind (default 127.0.0.1)")
    p.add_argument("--link-port", type=int, help="port of the relay link endpoint (default 7100)")
    p.add_argument("--api-port", type=int, help="port of the management API (default 7000)")
    p.add_argument("--store-url", help="sqlite:///PATH (default) or mongodb://HOST:PORT/DB")
    p.add_argument("--heartbeat-s", type=float, help="agent heartbeat interval in seconds (default 5)")
    p.set_defaults(func=_run_master)


def _run_master(args: argparse.Namespace) -> int:
    from management.server import serve_master
    from master.config import load_master_config

    config = load_master_config(
        args.config,
        overrides={
            "state_dir": args.state_dir,
            "host": args.host,
            "link_port": args.link_port,
            "api_port": args.api_port,
            "store_url": args.store_url,
            "heartbeat_s": args.heartbeat_s,
        },
    )
    setup_logging("master", config.log_level)
    tune_for_daemon()
    asyncio.run(serve_master(config))
    return 0


def _agent_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="run the provider agent, or enroll this host",
        description="Run the provider agent: dial out to an Access relay, report GPUs, run renters' containers.",
    )
    p.add_argument("--config", type=Path, help="TOML configuration file")
    p.add_argument("--state-dir", help="where the agent keeps its key, certificate and ledger (default .idlegrid/agent)")
    p.add_argument("--access", action="append", dest="access_urls", help="wss://HOST:PORT of an Access relay (repeatable)")
    p.add_argument("--region", help="the region this host is in")
    p.add_argument("--dns-domain", help="find relays by DNS: SRV _idlegrid._tcp.REGION.DOMAIN (--access is then the fallback)")
    p.add_argument(
        "--dns-nameserver",
        action="append",
        dest="dns_nameservers",
        metavar="ADDRESS",
        help="nameserver to ask for relays (repeatable; default: the system resolver)",
    )
    p.add_argument("--dns-port", type=int, help="port of the nameservers (default 53)")
    p.add_argument("--simulate", help="simulate GPUs instead of NVML, e.g. h100:8 or a10:2,t4:1 (reported as simulated)")
    p.add_argument(
        "--runtime", choices=["docker", "process"], help="container runtime (default docker; process: demos and tests)"
    )
    p.add_argument("--docker-socket", help="Docker/Podman API socket (default /var/run/docker.sock)")
    p.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth measurement")
    p.set_defaults(func=_run_agent)
    agent_sub = p.add_subparsers(dest="agent_command")
    e = agent_sub.add_parser(
        "enroll",
        help="enroll this host with a join token",
        description="Generate this host's key locally, send a CSR with a one-time join token through "
        "an Access relay's HTTPS endpoint, and store the certificate.",
    )
    e.add_argument("--token", required=True, help="one-time join token from the operator")
    e.add_argument("--access", required=True, dest="enroll_url", help="https://HOST:PORT of an Access relay")
    e.add_argument("--ca-file", type=Path, required=True, help="the platform CA certificate (ca.crt) to trust")
    e.add_argument("--connect", action="append", help="wss://HOST:PORT relay(s) to connect to afterwards")
    e.set_defaults(func=_run_enroll)


def _agent_overrides(args: argparse.Namespace) -> dict:
    return {
        "state_dir": args.state_dir,
        "access_urls": args.access_urls,
        "region": args.region,
        "simulate": args.simulate,
        "dns_domain": args.dns_domain,
        "dns_nameservers": args.dns_nameservers,
        "dns_port": args.dns_port,
        "runtime": args.runtime,
        "docker_socket": args.docker_socket,
        "measure_bandwidth": False if args.no_bandwidth else None,
    }


def _run_agent(args: argparse.Namespace) -> int:
    from agent.config import load_agent_config
    from agent.daemon import serve

    config = load_agent_config(args.config, overrides=_agent_overrides(args))
    setup_logging("agent", config.log_level)
    tune_for_daemon()
    asyncio.run(serve(config))
    return 0


def _run_enroll(args: argparse.Namespace) -> int:
    from agent.config import load_agent_config
    from agent.enroll import enroll

    config = load_agent_config(args.config, overrides=_agent_overrides(args))
    identity = asyncio.run(
        enroll(
            config.state_path,
            token=args.token,
            access_http_url=args.enroll_url,
            ca_file=args.ca_file,
            region=config.region,
            access_urls=args.connect or config.access_urls,
        )
    )
    print(f"enrolled as {identity.agent_id}; credentials in {config.state_path} (key 0600)")
    return 0


def _ca_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "ca",
        help="platform CA: create it, issue relay certificates",
        description="Manage the platform certificate authority kept in the Master's state directory.",
    )
    ca_sub = p.add_subparsers(dest="ca_command", required=True)
    init = ca_sub.add_parser("init", help="create the CA, the Master's certificate and the command-signing key")
    init.add_argument("--state-dir", default=".idlegrid/master", help="the Master's state directory")
    init.set_defaults(func=_run_ca_init)
    issue = ca_sub.add_parser("issue-access", help="issue an Access relay's certificate")
    issue.add_argument("--state-dir", default=".idlegrid/master", help="the Master's state directory")
    issue.add_argument("--relay-id", required=True, help="the relay's name, e.g. relay-eu-1")
    issue.add_argument("--out", type=Path, required=True, help="directory for <relay-id>.crt/.key and ca.crt")
    issue.add_argument("--name", action="append", help="DNS name the relay is reached at (default localhost)")
    issue.add_argument("--ip", action="append", help="IP address the relay is reached at (default 127.0.0.1)")
    issue.set_defaults(func=_run_ca_issue)


def _run_ca_init(args: argparse.Namespace) -> int:
    from master.authority import Authority

    authority = Authority.open(Path(args.state_dir))
    print(f"CA: {authority.ca_file}\nMaster certificate: {authority.cert_file}\nsigning key id: {authority.signer.key_id}")
    return 0


def _run_ca_issue(args: argparse.Namespace) -> int:
    from common.pki import Role
    from master.authority import Authority

    authority = Authority.open(Path(args.state_dir))
    cert, key, ca = authority.write_server_identity(
        args.out, Role.ACCESS, args.relay_id, names=args.name or ["localhost"], ips=args.ip or ["127.0.0.1"]
    )
    print(f"certificate: {cert}\nkey: {key}\nCA: {ca}")
    return 0


def _token_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("token", help="join tokens for providers' hosts")
    t_sub = p.add_subparsers(dest="token_command", required=True)
    create = t_sub.add_parser("create", help="create a one-time join token bound to a provider account")
    create.add_argument("--provider", required=True, help="provider account the enrolled host will belong to")
    create.add_argument("--ttl-s", type=float, default=3600.0, help="seconds until the token expires (default 3600)")
    create.add_argument("--api", default="http://127.0.0.1:7000", help="management API URL")
    create.add_argument(
        "--operator-token-file",
        type=Path,
        default=Path(".idlegrid/master/operator.token"),
        help="file holding the operator API key",
    )
    create.set_defaults(func=_run_token_create)


def _run_token_create(args: argparse.Namespace) -> int:
    body = _api_call(
        args.api, args.operator_token_file, "POST", "/api/v1/tokens", {"provider": args.provider, "ttl_s": args.ttl_s}
    )
    print(body["token"])
    return 0


def _api_call(api: str, token_file: Path, method: str, path: str, payload: dict | None = None) -> dict:
    try:
        key = token_file.read_text().strip()
    except OSError as exc:
        raise IdlegridError(f"cannot read the operator API key from {token_file}: {exc.strerror}", code="bad_request") from None
    request = urllib.request.Request(
        api.rstrip("/") + path,
        method=method,
        data=json.dumps(payload).encode() if payload is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        error = json.loads(exc.read() or b"{}").get("error", {})
        raise IdlegridError(f"{exc.code}: {error.get('message', exc.reason)}", code=error.get("code", "api_error")) from None
    except urllib.error.URLError as exc:
        raise IdlegridError(f"cannot reach the management API at {api}: {exc.reason}", code="unreachable") from None


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a whole grid locally: Master, two relays, simulated agents",
        description="Start one Master, two Access relays in two regions and simulated agents with a mix "
        "of GPU models, each a separate process, on the embedded store. Ctrl-C stops everything.",
    )
    p.add_argument("--state-dir", type=Path, default=Path(".idlegrid/demo"), help="where every process keeps its state")
    p.add_argument("--api-port", type=int, default=7000, help="port of the management API (default 7000)")
    p.add_argument("--agents", type=int, default=8, help="number of simulated agents (default 8)")
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from management.demo import run_demo

    return asyncio.run(run_demo(args.state_dir, api_port=args.api_port, agents=args.agents))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="idlegrid", description="idlegrid: a decentralized GPU marketplace.")
    sub = parser.add_subparsers(dest="command", required=True)
    _master_parser(sub)
    from access.cli import add_parser as add_access_parser

    add_access_parser(sub)
    _agent_parser(sub)
    _ca_parser(sub)
    _token_parser(sub)
    _demo_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except IdlegridError as exc:
        print(f"idlegrid {args.command}: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)  # e.g. agent.errors.CertificateRevoked: 3, "enroll again"
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

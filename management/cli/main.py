"""``idlegrid``: the one command line. This module is the entry point, the one place that composes every part."""

from __future__ import annotations

import argparse
import errno
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from common.errors import ConfigError, IdlegridError
from management.cli.connection import DEFAULT_API, DEFAULT_OPERATOR_KEY

# Exit statuses: what a service manager or a script can tell apart. An error class may carry its own
# ``exit_code`` (a revoked agent certificate does: re-enrolling, not restarting, is the cure).
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_DEMO_DIR = Path(".idlegrid/demo")
ERRNO_PREFIX = re.compile(r"^\[Errno \d+\] ")
# The daemons' commands: their parsers import the daemon's settings (or the local grid) for the defaults their help
# shows, so a command line builds them only when it names them; otherwise each is its name and this help line alone,
# and `idlegrid --help` or `idlegrid workload list` imports no daemon (docs/cli.md, "Starting fast"). A test holds
# these lines to the parsers' own.
DAEMON_HELP = {
    "master": "run the Master (control plane) and the management API",
    "access": "run an Access relay",
    "agent": "run the provider agent, or enroll this host (agent enroll)",
    "demo": "run a whole grid locally: Master, two relays, simulated agents",
}


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions are wrapped line by line; a line indented by two spaces (an example command) is kept as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            if line.startswith("  "):
                lines.append(indent + line)
            else:
                lines.append(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent))
        return "\n".join(lines)


def _parser(sub: argparse._SubParsersAction, name: str, help_text: str, description: str) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=description, formatter_class=HelpFormatter)
    return parser


def _log_level(p: argparse.ArgumentParser, shown_default: str = "info", **kwargs: Any) -> None:
    p.add_argument("--log-level", choices=LOG_LEVELS, help=f"how much the daemon logs (default {shown_default})", **kwargs)


def _version() -> str:
    from importlib import metadata  # slow to import: only for --version and backups

    try:
        return metadata.version("idlegrid")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


# --- master ---------------------------------------------------------------------------------------


def _master_parser(sub: argparse._SubParsersAction) -> None:
    from master.config import MasterConfig

    d = MasterConfig()
    p = _parser(
        sub,
        "master",
        DAEMON_HELP["master"],
        "Run the Master: the relay link endpoint, registry, command ledger and the management API.\n"
        "Settings come from --config FILE (TOML), IDLEGRID_MASTER_<SETTING> environment variables and these "
        "flags, in that order.",
    )
    p.add_argument("--config", type=Path, metavar="FILE", help="TOML configuration file (default: none)")
    p.add_argument(
        "--state-dir", metavar="DIR", help=f"where the store, CA, keys and operator API key live (default {d.state_dir})"
    )
    p.add_argument("--host", metavar="ADDRESS", help=f"address to bind (default {d.host})")
    p.add_argument("--link-port", type=int, metavar="PORT", help=f"port of the relay link endpoint (default {d.link_port})")
    p.add_argument("--api-port", type=int, metavar="PORT", help=f"port of the management API (default {d.api_port})")
    p.add_argument(
        "--links-port", type=int, metavar="PORT", help=f"port of the workloads' links, [links] port (default {d.links_port})"
    )
    p.add_argument(
        "--store-url", metavar="URL", help="sqlite:///PATH or mongodb://HOST:PORT/DB (default: SQLite in the state directory)"
    )
    p.add_argument(
        "--heartbeat-s", type=float, metavar="SECONDS", help=f"agent heartbeat interval in seconds (default {d.heartbeat_s:g})"
    )
    _log_level(p, d.log_level)
    p.set_defaults(func=_run_master)
    _master_backup_parsers(p)


def _run_master(args: argparse.Namespace) -> int:
    import msgspec

    from common.heap import share_the_interpreter_quickly, tune_for_daemon
    from common.logs import setup_logging
    from common.loop import run as run_loop
    from management.app import serve_master
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
            "log_level": args.log_level,
        },
    )
    if args.links_port is not None:  # a key of the [links] table, which the flat overrides cannot reach
        config = msgspec.structs.replace(config, links=msgspec.structs.replace(config.links, port=args.links_port))
    setup_logging("master", config.log_level)
    tune_for_daemon(freeze_survivors=True)  # its heap is its agents' state, alive as long as it is
    share_the_interpreter_quickly()  # its store works on a thread of its own
    run_loop(serve_master(config))
    return 0


# --- master backup / restore (master/backup.py, docs/backup.md) ------------------------------------


def _master_backup_parsers(p: argparse.ArgumentParser) -> None:
    """``master backup`` and ``master restore``. Their options default to SUPPRESS, so --state-dir or --config given
    before the subcommand (``idlegrid master --state-dir DIR backup``) is not reset by the subcommand's default."""
    quiet = argparse.SUPPRESS  # each option's default
    master_sub = p.add_subparsers(dest="master_command", metavar="{backup,restore}")
    b = _parser(
        master_sub,
        "backup",
        "back the Master's store and keys up into one archive, while it runs",
        "Write one archive (tar.gz, 0600) of the Master's state: a consistent copy of its SQLite store, taken while "
        "the Master runs and writes, its CA and keys (pki/), the operator key and console session key, and a "
        "manifest with checksums. A Master on MongoDB: back its store up with mongodump and its keys with "
        "--pki-only (docs/backup.md).\n"
        "  idlegrid master backup --state-dir /var/lib/idlegrid/master --out master-backup.tar.gz",
    )
    b.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the Master's TOML configuration, for its state_dir and store_url (default: none)",
        default=quiet,
    )
    b.add_argument(
        "--state-dir", metavar="DIR", help="the Master's state directory (default: as the Master finds it)", default=quiet
    )
    b.add_argument(
        "--store-url", metavar="URL", help="the Master's store URL (default: SQLite in the state directory)", default=quiet
    )
    b.add_argument("--out", type=Path, required=True, metavar="FILE", help="the archive to write (refused if it exists)")
    b.add_argument("--force", action="store_true", help="replace --out if it exists (default: refuse)")
    b.add_argument(
        "--pki-only",
        action="store_true",
        help="only the keys and secrets, no store: a Master on MongoDB (default: the store too)",
    )
    b.set_defaults(func=_run_master_backup)
    r = _parser(
        master_sub,
        "restore",
        "restore a backup into a new state directory (the Master stopped)",
        "Check a backup's checksums and schema version, then write its store and keys into --state-dir with the "
        "modes they had. Refused into a directory that is not empty (unless --force) and while a Master runs on it. "
        "Start the Master on that directory afterwards; an older schema is migrated then, as on any start.\n"
        "  idlegrid master restore --from master-backup.tar.gz --state-dir /var/lib/idlegrid/master",
    )
    r.add_argument("--from", dest="archive", type=Path, required=True, metavar="FILE", help="the archive to restore")
    r.add_argument(
        "--state-dir", metavar="DIR", help="the directory to restore into (default: as the Master finds it)", default=quiet
    )
    r.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the Master's TOML configuration, for its state_dir (default: none)",
        default=quiet,
    )
    r.add_argument(
        "--force", action="store_true", help="replace the store and keys in a directory that is not empty (default: refuse)"
    )
    r.set_defaults(func=_run_master_restore)


def _backup_config(args: argparse.Namespace) -> Any:
    from master.config import load_master_config

    return load_master_config(
        getattr(args, "config", None),
        overrides={"state_dir": getattr(args, "state_dir", None), "store_url": getattr(args, "store_url", None)},
    )


def _run_master_backup(args: argparse.Namespace) -> int:
    from master.backup import create_backup
    from master.store import sqlite_path

    config = _backup_config(args)
    store_url = config.resolved_store_url()
    store_path: Path | None = None
    if not args.pki_only:
        if not store_url.startswith("sqlite:"):
            raise ConfigError(
                "the store is not SQLite: back it up with mongodump (docs/backup.md) and this state directory's keys "
                "with --pki-only"
            )
        store_path = Path(sqlite_path(store_url))
    manifest = create_backup(config.state_path, args.out, store_path=store_path, idlegrid_version=_version(), force=args.force)
    what = f"store (schema version {manifest.schema_version}) and " if store_path is not None else ""
    print(f"backed up {what}{len(manifest.files) - (store_path is not None)} key and secret files to {args.out}")
    return 0


def _run_master_restore(args: argparse.Namespace) -> int:
    from master.backup import restore_backup

    config = _backup_config(args)
    manifest = restore_backup(args.archive, config.state_path, force=args.force)
    what = "store and keys" if manifest.store == "sqlite" else "keys (no store: restore it with mongorestore)"
    print(f"restored the {what} of {args.archive} (idlegrid {manifest.idlegrid_version}) into {config.state_path}")
    print(f"start the Master with: idlegrid master --state-dir {config.state_path}")
    return 0


# --- ca, token --------------------------------------------------------------------------------------


def _ca_parser(sub: argparse._SubParsersAction) -> None:
    p = _parser(
        sub,
        "ca",
        "platform CA: create it, issue relay certificates",
        "Manage the platform certificate authority kept in the Master's state directory.",
    )
    ca_sub = p.add_subparsers(dest="ca_command", required=True, metavar="{init,issue-access,issue-lighthouse}")
    init = _parser(
        ca_sub,
        "init",
        "create the CA, the Master's certificate and the command-signing key",
        "Create the platform CA, the Master's certificate and the command-signing key in the Master's state "
        "directory (the Master does this itself on its first start). Private keys are written 0600.",
    )
    init.add_argument(
        "--state-dir", default=".idlegrid/master", metavar="DIR", help="the Master's state directory (default %(default)s)"
    )
    init.set_defaults(func=_run_ca_init)
    issue = _parser(
        ca_sub,
        "issue-access",
        "issue an Access relay's certificate",
        "Issue a relay's certificate (role access) signed by the platform CA, and write it with its key and the CA "
        "certificate to --out.",
    )
    issue.add_argument(
        "--state-dir", default=".idlegrid/master", metavar="DIR", help="the Master's state directory (default %(default)s)"
    )
    issue.add_argument("--relay-id", required=True, metavar="ID", help="the relay's name, e.g. relay-eu-1")
    issue.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="directory for RELAY-ID.crt, RELAY-ID.key and ca.crt"
    )
    issue.add_argument(
        "--name", action="append", metavar="DNS_NAME", help="DNS name the relay is reached at, repeatable (default localhost)"
    )
    issue.add_argument(
        "--ip", action="append", metavar="ADDRESS", help="IP address the relay is reached at, repeatable (default 127.0.0.1)"
    )
    issue.set_defaults(func=_run_ca_issue)
    lighthouse = _parser(
        ca_sub,
        "issue-lighthouse",
        "make a gang-overlay lighthouse for a relay's host",
        "Write a Nebula lighthouse and relay (docs/overlay.md) to --out: a fresh key, its certificate from the grid's "
        "overlay CA (in the Master's state directory), the CA and nebula.json. Run it beside the Access relay with "
        "'nebula -config OUT/nebula.json', apply the printed iptables rule there (each replica's relayed bandwidth), "
        "and list the lighthouse in the Master's [overlay] lighthouses.",
    )
    lighthouse.add_argument(
        "--state-dir", default=".idlegrid/master", metavar="DIR", help="the Master's state directory (default %(default)s)"
    )
    lighthouse.add_argument("--address", required=True, metavar="IP", help="its overlay address, in the range's first block")
    lighthouse.add_argument("--port", type=int, default=4242, metavar="UDP", help="the UDP port it listens on (default 4242)")
    lighthouse.add_argument("--out", type=Path, required=True, metavar="DIR", help="directory for its files")
    lighthouse.set_defaults(func=_run_ca_issue_lighthouse)


def _run_ca_issue_lighthouse(args: argparse.Namespace) -> int:
    from master.config import MasterConfig
    from master.overlay import OverlayAuthority, write_lighthouse

    authority = OverlayAuthority.open(Path(args.state_dir), MasterConfig().overlay)
    try:
        rules = write_lighthouse(authority, address=args.address, port=args.port, out=args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/nebula.json; run: nebula -config {args.out.resolve()}/nebula.json")
    for rule in rules:
        print("bound each replica's relayed bandwidth: iptables " + " ".join(rule))
    print(f'then in the Master\'s config: [[overlay.lighthouses]] address = "{args.address}", endpoints = ["HOST:{args.port}"]')
    return 0


def _run_ca_init(args: argparse.Namespace) -> int:
    from master.authority import Authority

    authority = Authority.open(Path(args.state_dir))
    print(f"CA: {authority.ca_file}\nMaster certificate: {authority.cert_file}\nsigning key id: {authority.signer.key_id}")
    return 0


def _run_ca_issue(args: argparse.Namespace) -> int:
    from common.pki import CertRole
    from master.authority import Authority

    authority = Authority.open(Path(args.state_dir))
    cert, key, ca = authority.write_server_identity(
        args.out, CertRole.ACCESS, args.relay_id, names=args.name or ["localhost"], ips=args.ip or ["127.0.0.1"]
    )
    print(f"certificate: {cert}\nkey: {key}\nCA: {ca}")
    return 0


def _token_parser(sub: argparse._SubParsersAction) -> None:
    p = _parser(sub, "token", "join tokens for providers' hosts", "Create one-time join tokens that enroll providers' hosts.")
    t_sub = p.add_subparsers(dest="token_command", required=True, metavar="{create}")
    create = _parser(
        t_sub,
        "create",
        "create a one-time join token bound to a provider account",
        "Create a one-time join token bound to a provider account and print it; the host that enrolls with it "
        "belongs to that provider. The API stores only its hash.",
    )
    create.add_argument("--provider", required=True, metavar="ACCOUNT", help="provider account the enrolled host will belong to")
    create.add_argument(
        "--ttl-s", type=float, default=3600.0, metavar="SECONDS", help="seconds until the token expires (default %(default)g)"
    )
    create.add_argument("--api", default=DEFAULT_API, metavar="URL", help="management API URL (default %(default)s)")
    create.add_argument(
        "--operator-token-file",
        type=Path,
        default=DEFAULT_OPERATOR_KEY,
        metavar="FILE",
        help="file holding the operator API key (default %(default)s)",
    )
    create.set_defaults(func=_run_token_create)


def _run_token_create(args: argparse.Namespace) -> int:
    from management.client.api import ApiClient

    client = ApiClient.with_key_file(args.api, args.operator_token_file)
    print(client.create_join_token(args.provider, ttl_s=args.ttl_s)["token"])
    return 0


# --- demo -----------------------------------------------------------------------------------------


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    from management.devgrid.demo import DEFAULT_AGENTS, DEFAULT_API_PORT

    p = _parser(
        sub,
        "demo",
        DAEMON_HELP["demo"],
        "Start one Master, two Access relays in two regions and simulated agents with a mix of GPU models, each "
        "a separate process, on the embedded store. It prints the API, the operator key, the relays' URLs and "
        "the CA file once every agent is ready. Ctrl-C stops agents, relays, then the Master.\n"
        "Started again on the same --state-dir, it reuses the ports, the agents and their enrollment.",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_DEMO_DIR,
        metavar="DIR",
        help="where every process keeps its state (default %(default)s)",
    )
    p.add_argument(
        "--api-port",
        type=int,
        metavar="PORT",
        help=f"port of the management API (default: the port of the last run on this state directory, else {DEFAULT_API_PORT})",
    )
    p.add_argument(
        "--agents", type=int, default=DEFAULT_AGENTS, metavar="N", help="number of simulated agents (default %(default)s)"
    )
    p.add_argument(
        "--no-container-host",
        dest="container_host",
        action="store_false",
        help="start no container host (default: one more host, on a Podman service of the demo's own, where podman, "
        "runc and busybox-static are installed)",
    )
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from management.devgrid.demo import run_demo

    if args.agents < 1:
        raise ConfigError("--agents must be at least 1")
    return run_demo(args.state_dir, api_port=args.api_port, agents=args.agents, container_host=args.container_host)


# --- the command ----------------------------------------------------------------------------------


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (argparse's own action wants it at build)."""

    def __init__(self, option_strings: list[str], dest: str, **_: Any) -> None:
        help_text = "show program's version number and exit"
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help_text)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"idlegrid {_version()}")
        parser.exit()


def _add_daemon(sub: argparse._SubParsersAction, name: str, only: str | None) -> None:
    """The daemon's whole parser when ``only`` is None or names it; else its name and help line (DAEMON_HELP)."""
    if only is not None and only != name:
        sub.add_parser(name, help=DAEMON_HELP[name])
    elif name == "master":
        _master_parser(sub)
    elif name == "access":
        from access.cli import add_parser as add_access_parser

        add_access_parser(sub)
    elif name == "agent":
        from agent.cli import add_parser as add_agent_parser

        add_agent_parser(sub, _parser)
    else:
        _demo_parser(sub)


def named_command(argv: list[str]) -> str:
    """The command a command line names: its first word that is not an option ("" for none). ``idlegrid`` itself
    takes no option with a value, so that word is the command."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; given ``only``, the command a command line names (``named_command``), the daemons'
    parsers but its own are their name and help line alone, so that building them imports no daemon."""
    parser = argparse.ArgumentParser(
        prog="idlegrid",
        description="idlegrid: a decentralized GPU marketplace. Run a daemon (master, access, agent), manage the "
        "platform CA, join tokens, accounts and API keys, or run the whole grid locally (demo).",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="{master,access,agent,ca,token,account,whoami,demo,workload,offers,rent,bid,"
        "balance,ledger,spend,earnings,payouts,credit,billing,dispute,host,report,alert,ssh-key,ssh-config,secret,endpoint}",
    )
    _add_daemon(sub, "master", only)
    _add_daemon(sub, "access", only)
    _add_daemon(sub, "agent", only)
    _ca_parser(sub)
    _token_parser(sub)
    from management.cli.accounts import add_parsers as add_account_parsers

    add_account_parsers(sub, _parser)
    _add_daemon(sub, "demo", only)
    from management.cli.workloads import add_parser as add_workload_parser

    add_workload_parser(sub, _parser)
    from management.cli.market import add_parsers as add_market_parsers

    add_market_parsers(sub, _parser)
    from management.cli.billing import add_parsers as add_billing_parsers

    add_billing_parsers(sub, _parser)
    from management.cli.disputes import add_parsers as add_dispute_parsers

    add_dispute_parsers(sub, _parser)
    from management.cli.hosts import add_parsers as add_host_parsers

    add_host_parsers(sub, _parser)
    from management.cli.reports import add_parser as add_report_parser

    add_report_parser(sub, _parser)
    from management.cli.alerts import add_parsers as add_alert_parsers

    add_alert_parsers(sub, _parser)
    from management.cli.templates import add_parsers as add_template_parsers

    add_template_parsers(sub, _parser)
    from management.cli.ssh import add_parsers as add_ssh_parsers

    add_ssh_parsers(sub, _parser)
    from management.cli.secrets import add_parsers as add_secret_parsers

    add_secret_parsers(sub, _parser)
    from management.cli.endpoints import add_parsers as add_endpoint_parsers

    add_endpoint_parsers(sub, _parser)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    words = [args.command]
    for attr in (
        "agent_command",
        "ca_command",
        "token_command",
        "workload_command",
        "account_command",
        "key_command",
        "offers_command",
        "host_command",
        "price_command",
        "alert_command",
        "rule_command",
        "webhook_command",
        "ssh_key_command",
        "secret_command",
        "billing_command",
        "dispute_command",
        "endpoint_command",
        "endpoint_keys_command",
        "master_command",
    ):
        if getattr(args, attr, None):
            words.append(getattr(args, attr))
    return " ".join(words)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # What follows "--" is a container's command, whole: argparse would give a second positional (``rent OFFER -- CMD``)
    # nothing of it once the first took its place.
    tail: list[str] | None = None
    if "--" in argv:
        at = argv.index("--")
        argv, tail = argv[:at], argv[at + 1 :]
    parser = build_parser(named_command(argv))
    args = parser.parse_args(argv)
    if tail is not None:
        if not hasattr(args, "container_command"):
            parser.error(f"'--' takes a container's command; 'idlegrid {_command_name(args)}' runs none")
        args.container_command = tail
    name = _command_name(args)
    try:
        return int(args.func(args))
    except IdlegridError as exc:
        print(f"idlegrid {name}: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", EXIT_ERROR))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            # One line, not a traceback: the address comes from the error itself ("... on address (HOST, PORT) ...").
            print(f"idlegrid {name}: cannot listen: {ERRNO_PREFIX.sub('', str(exc))}", file=sys.stderr)
            return EXIT_ERROR
        raise
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        # A daemon's error that says how the process must end (e.g. a revoked certificate), whatever its base class.
        exit_code = getattr(exc, "exit_code", None)
        if isinstance(exit_code, int) and not isinstance(exit_code, bool):
            print(f"idlegrid {name}: {exc}", file=sys.stderr)
            return exit_code
        raise


if __name__ == "__main__":
    sys.exit(main())

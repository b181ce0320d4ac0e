"""SSH to workloads from the command line (docs/ssh.md): ``idlegrid ssh-key add|list|delete``, ``idlegrid ssh-config``,
``idlegrid workload proxy`` (an OpenSSH ProxyCommand) and ``idlegrid workload ssh``.

The image needs no SSH server: ``workload proxy`` asks the API for an ``ssh`` tunnel and bridges its standard input and
output to it; the SSH server at the other end is the host's agent, which runs sessions, SFTP and ``-L`` forwards in the
container. Host keys come from the Master (``GET /api/v1/workloads/{id}/ssh``), so ``ssh`` verifies the host it reaches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from common.errors import IdlegridError
from common.tunnel import MAX_TUNNEL_PAYLOAD, Op
from management.cli.connection import API_ENV, API_KEY_ENV, api_client, connection_options, show, table, when
from management.client.api import AnswerJson

if TYPE_CHECKING:  # the tunnel client (websockets) is imported by the proxy that opens one, not by every command line
    from management.client.tunnel import TunnelGrant

DEFAULT_PUBLIC_KEYS = ("~/.ssh/id_ed25519.pub", "~/.ssh/id_ecdsa.pub", "~/.ssh/id_rsa.pub")
SERVER_ALIVE_S = 60  # ssh's keepalive: an idle terminal is not closed as an idle tunnel
_HOST = re.compile(r"^(?P<workload>wl-[A-Za-z0-9]+)(?:\.r(?P<replica>[0-9]{1,4}))?\Z")


class BadSshRequest(IdlegridError):
    code = "bad_request"


def parse_host(host: str) -> tuple[str, int]:
    """``wl-1a2b`` -> (``wl-1a2b``, 0); ``wl-1a2b.r2`` -> (``wl-1a2b``, 2): the names ``ssh-config`` gives replicas."""
    found = _HOST.match(host)
    if found is None:
        raise BadSshRequest(f"{host!r} is not a workload: give its id (wl-…), or wl-….rN for replica N")
    return found["workload"], int(found["replica"] or 0)


def self_command() -> str:
    """How a ProxyCommand runs this CLI: ``idlegrid`` when it is on the PATH, else this Python with the module."""
    return "idlegrid" if shutil.which("idlegrid") else f"{shlex.quote(sys.executable)} -m management.cli"


# --- parsers ----------------------------------------------------------------------------------------------------------


def add_parsers(sub: argparse._SubParsersAction, parser: Callable[..., argparse.ArgumentParser]) -> None:
    keys = parser(
        sub,
        "ssh-key",
        "your SSH public keys (for SSH to your workloads)",
        "Add, list and delete the SSH public keys that may log in to your workloads through the grid (no SSH server "
        "is needed in the image). Any account manages its own; an operator anyone's.",
    )
    k_sub = keys.add_subparsers(dest="ssh_key_command", required=True, metavar="{add,list,delete}")
    add = parser(k_sub, "add", "register an SSH public key", "Register a public key (an OpenSSH .pub file, or - for stdin).")
    add.add_argument(
        "public_key_file",  # not "key_file": that is --key-file's, the API key's file (connection_options)
        nargs="?",
        metavar="FILE",
        help="the public key file, or - for standard input (default: ~/.ssh/id_ed25519.pub, id_ecdsa.pub or id_rsa.pub)",
    )
    add.add_argument("--name", default="", metavar="TEXT", help="what to call it (default: the key's comment)")
    add.add_argument("--account", metavar="ID", help="an operator: the account to add it to (default: your own)")
    connection_options(add)
    add.set_defaults(func=run_key_add)
    listing = parser(k_sub, "list", "list SSH public keys", "List SSH public keys, oldest first.")
    listing.add_argument("--account", metavar="ID", help="an operator: one account's keys (default: all you may see)")
    connection_options(listing)
    listing.set_defaults(func=run_key_list)
    delete = parser(k_sub, "delete", "delete an SSH public key", "Delete an SSH public key by its id (sshk-…).")
    delete.add_argument("key_id", metavar="KEY_ID", help="the key's id, as ssh-key list shows it")
    connection_options(delete)
    delete.set_defaults(func=run_key_delete)

    config = parser(
        sub,
        "ssh-config",
        "print ~/.ssh/config and known_hosts lines for a workload",
        "Print a Host block for ~/.ssh/config (ssh, scp, sftp, rsync and VS Code Remote-SSH then reach the workload "
        "by its id) and the known_hosts lines of its host keys, as the Master published them. Example:\n"
        "  idlegrid ssh-config wl-1a2b >> ~/.ssh/config\n"
        "  idlegrid ssh-config wl-1a2b --known-hosts >> ~/.ssh/known_hosts\n"
        "  ssh wl-1a2b",
    )
    config.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    config.add_argument(
        "--known-hosts", action="store_true", help="print only the known_hosts lines (default: the Host block too)"
    )
    config.add_argument(
        "--proxy-command",
        metavar="CMD",
        help="the command that runs this CLI in the ProxyCommand (default: idlegrid, or this Python's -m management.cli)",
    )
    connection_options(config)
    config.set_defaults(func=run_ssh_config)


def add_workload_parsers(
    w_sub: argparse._SubParsersAction,
    make: Callable[..., argparse.ArgumentParser],
    connection: Callable[[argparse.ArgumentParser], None],
) -> None:
    proxy = make(
        w_sub,
        "proxy",
        "bridge ssh to a workload (an OpenSSH ProxyCommand)",
        "Open an SSH tunnel to a running workload and bridge it to standard input and output: the ProxyCommand of "
        "ssh, scp and sftp. The SSH server is the grid's, not the image's. Example:\n"
        "  ssh -o ProxyCommand='idlegrid workload proxy %h' wl-1a2b",
    )
    proxy.add_argument("host", metavar="ID", help="the workload's id, wl-… (wl-….rN: replica N)")
    connection(proxy)
    proxy.set_defaults(func=run_proxy)
    ssh = make(
        w_sub,
        "ssh",
        "open an SSH session in a workload (OpenSSH's ssh)",
        "Run OpenSSH's ssh to a running workload through the grid, its host key checked against the one the Master "
        "published; a command after the id (or after '--') runs instead of a shell.",
    )
    ssh.add_argument("host", metavar="ID", help="the workload's id, wl-… (wl-….rN: replica N)")
    ssh.add_argument("container_command", nargs="*", metavar="COMMAND", help="a command to run (default: a shell)")
    ssh.add_argument("-i", "--identity", metavar="FILE", help="the private key ssh uses (default: ssh's own choice)")
    connection(ssh)
    ssh.set_defaults(func=run_ssh)


# --- keys -------------------------------------------------------------------------------------------------------------


def _read_public_key(name: str | None) -> str:
    if name == "-":
        return sys.stdin.read()
    candidates = [name] if name else list(DEFAULT_PUBLIC_KEYS)
    for candidate in candidates:
        path = Path(candidate).expanduser()
        if path.is_file():
            return path.read_text()
    if name:
        raise BadSshRequest(f"cannot read {name}: no such file")
    raise BadSshRequest(f"no public key at {', '.join(DEFAULT_PUBLIC_KEYS)}: name one, or make one with ssh-keygen -t ed25519")


def _key_rows(body: AnswerJson) -> str:
    rows = [[k["id"], k["account"], k["name"], k["fingerprint"], when(k["created_at"])] for k in body["items"]]
    return table(["ID", "ACCOUNT", "NAME", "FINGERPRINT", "ADDED"], rows)


def run_key_add(args: argparse.Namespace) -> int:
    client = api_client(args)[0]
    key = client.add_ssh_key(_read_public_key(args.public_key_file), name=args.name, account=args.account)
    return show(args, key, lambda k: f"added {k['id']} ({k['name']}) {k['fingerprint']} for {k['account']}")


def run_key_list(args: argparse.Namespace) -> int:
    return show(args, api_client(args)[0].ssh_keys(account=args.account), _key_rows)


def run_key_delete(args: argparse.Namespace) -> int:
    api_client(args)[0].delete_ssh_key(args.key_id)
    print(f"deleted {args.key_id}")
    return 0


# --- ssh-config -------------------------------------------------------------------------------------------------------


def host_block(hosts: Sequence[str], proxy: str) -> str:
    """The ``~/.ssh/config`` block for ``hosts`` (a workload's replicas) through ``proxy`` (the CLI's command)."""
    return "\n".join(
        [
            f"Host {' '.join(hosts)}",
            f"    ProxyCommand {proxy} workload proxy %h",
            f"    ServerAliveInterval {SERVER_ALIVE_S}",
            "    StrictHostKeyChecking yes",
            "",
        ]
    )


def known_hosts_lines(answer: AnswerJson) -> list[str]:
    return [r["known_hosts"] for r in answer["replicas"] if r.get("known_hosts")]


def run_ssh_config(args: argparse.Namespace) -> int:
    answer = api_client(args)[0].workload_ssh(args.workload_id)
    lines = known_hosts_lines(answer)
    if args.known_hosts:
        if not lines:
            raise BadSshRequest(f"workload {args.workload_id} has no published host key yet: is it running?")
        print("\n".join(lines))
        return 0
    hosts = [r["host"] for r in answer["replicas"]] or [answer["workload"]]
    print(host_block(hosts, args.proxy_command or self_command()), end="")
    print("# known_hosts lines (idlegrid ssh-config " + args.workload_id + " --known-hosts >> ~/.ssh/known_hosts):")
    for line in lines or ["(none published yet: the workload runs nowhere now)"]:
        print(f"#   {line}")
    return 0


# --- proxy and ssh ----------------------------------------------------------------------------------------------------


def run_proxy(args: argparse.Namespace) -> int:
    from common.loop import run as run_loop
    from management.cli.access import grant_of

    workload_id, replica = parse_host(args.host)
    client = api_client(args)[0]
    grant = grant_of(client.open_tunnel(workload_id, {"kind": "ssh", "replica": replica}))
    return run_loop(bridge(grant))  # uvloop, as the daemons: every byte of the session passes through here


async def bridge(grant: TunnelGrant) -> int:
    """Standard input to the tunnel, the tunnel to standard output, until either ends."""
    from management.client.tunnel import Tunnel, TunnelClosed

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(0), "rb", buffering=0))
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, out)
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    async with await Tunnel.open(grant) as tunnel:

        async def up() -> None:
            while data := await reader.read(MAX_TUNNEL_PAYLOAD):
                await tunnel.send(Op.DATA, 0, data)
            await tunnel.send(Op.EOF)

        sending = asyncio.ensure_future(up())
        try:
            while (frame := await tunnel.receive()) is not None:
                if frame.op is Op.DATA:
                    writer.write(frame.payload)
                    await writer.drain()
                elif frame.op is Op.ERROR:
                    raise TunnelClosed(frame.payload.decode("utf-8", "replace"))
                elif frame.op is Op.EXIT:
                    break
            if tunnel.close_code not in (None, 1000):
                raise TunnelClosed(tunnel.why())
        finally:
            sending.cancel()
            await asyncio.gather(sending, return_exceptions=True)
            transport.close()
    return 0


def run_ssh(args: argparse.Namespace) -> int:
    workload_id, replica = parse_host(args.host)
    client, credentials = api_client(args)
    answer = client.workload_ssh(workload_id)
    mine = [r for r in answer["replicas"] if r["replica"] == replica and r.get("known_hosts")]
    if not mine:
        raise BadSshRequest(f"workload {workload_id} replica {replica} has no published host key: is it running?")
    ssh = shutil.which("ssh")
    if ssh is None:
        raise BadSshRequest("no ssh on the PATH: install OpenSSH's client (Debian: openssh-client)")
    with tempfile.TemporaryDirectory(prefix="idlegrid-ssh-") as folder:
        known = Path(folder) / "known_hosts"
        known.write_text(mine[0]["known_hosts"] + "\n")
        argv = [
            ssh,
            "-o",
            f"ProxyCommand={shlex.quote(sys.executable)} -m management.cli workload proxy %h",
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ServerAliveInterval={SERVER_ALIVE_S}",
        ]
        if args.identity:
            argv += ["-i", args.identity, "-o", "IdentitiesOnly=yes"]
        argv += [args.host, *args.container_command]
        # The proxy finds the same API and key through the environment (never on a command line others can read).
        env = {**os.environ, API_ENV: credentials.api, API_KEY_ENV: credentials.api_key}
        return subprocess.run(argv, env=env, check=False).returncode

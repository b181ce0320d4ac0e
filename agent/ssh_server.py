"""The platform's SSH end (docs/ssh.md): an SSH server for one connection, on the agent's side of an ``ssh`` tunnel,
whose sessions run in a container that has no SSH server of its own.

The bytes of the renter's ``ssh`` (through ``idlegrid workload proxy`` and the relay) reach ``serve_ssh`` on one end
of a socket pair; ``asyncssh`` terminates SSH there and each thing a client asks for maps to the container runtime:

- a shell or a command: ``runtime.exec`` in the container (a terminal when the client asked for one, resized with
  it), its output and exit status back;
- the ``sftp`` subsystem (also what OpenSSH's ``scp`` speaks): ``ContainerFiles`` (agent/ssh_files.py), every
  operation a small command run in the container, so paths resolve inside the container, as its user, and never on
  the host;
- ``direct-tcpip`` (``ssh -L``): ``runtime.connect`` to the container's port.

Who gets in: only a client holding a key whose fingerprint the ticket names (the keys of the account the Master gave
the ticket to: the workload's owner, or an operator). No password, no keyboard-interactive, no agent or X11
forwarding, no remote (``-R``) forwarding. The server proves itself with the workload's host key (agent/ssh_host_keys.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from agent.runtime.base import STDERR, ContainerRuntime, ExecSession
from agent.ssh_files import ContainerFiles
from agent.ssh_library import asyncssh
from common.errors import RuntimeFailure

log = logging.getLogger(__name__)
# asyncssh logs every channel it opens and closes at INFO: the tunnel's own opened/closed lines (agent/tunnel.py) say
# what a provider needs, so only its warnings and errors reach the agent's log.
logging.getLogger("asyncssh").setLevel(logging.WARNING)

READ_BYTES = 64 * 1024
LOGIN_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
SHELL = ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"]
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "0.0.0.0", ""})
_TERM = re.compile(r"^[A-Za-z0-9._+-]{1,64}\Z")
EXIT_NO_EXEC = 126  # as a shell answers a command it could not run
MAX_CHANNELS = 16  # sessions and -L connections at once on one SSH connection: each holds a process or a socket


@dataclass(frozen=True)
class ContainerTarget:
    """The container an SSH connection reaches, and which of its ports ``ssh -L`` may open."""

    runtime: ContainerRuntime
    container: str
    workload: str
    declared_ports: Sequence[int] = ()
    # On a runtime whose containers have a network of their own (docker), every port of the container is the renter's
    # to reach; elsewhere (the process runtime may share the host's network) only the declared ones.
    any_port: bool = False


@dataclass
class ChannelBudget:
    """How many sessions and forwards one SSH connection holds at once: a client cannot open channels without bound,
    each a process in the container or a connection to it (the tunnel limits count connections, not channels)."""

    limit: int = MAX_CHANNELS
    used: int = 0

    def full(self) -> bool:
        return self.used >= self.limit

    def take(self) -> bool:
        if self.full():
            return False
        self.used += 1
        return True

    def give(self) -> None:
        self.used = max(0, self.used - 1)

    def refusal(self) -> str:
        return f"this SSH connection has {self.used} sessions and forwards open, the most one may; close one"


def forward_refusal(target: ContainerTarget, host: str, port: int) -> str | None:
    """Why ``ssh -L`` may not reach ``host:port`` in ``target``, or None when it may. The destination is always the
    container itself (``localhost``): the host's loopback, other tenants and the platform are no renter's to reach."""
    if host.lower() not in LOCAL_HOSTS:
        return f"only the container itself (localhost) can be reached through this SSH end, not {host[:80]!r}"
    if not 1 <= port <= 65535:
        return f"port {port} is not a TCP port"
    if not target.any_port and port not in target.declared_ports:
        named = ", ".join(map(str, target.declared_ports)) or "none"
        return f"port {port} is not a port workload {target.workload} declared (declared: {named})"
    return None


def session_command(command: str | None, term: str | None) -> list[str]:
    """What runs for a session: the client's command through ``/bin/sh -c`` (as sshd runs it through the user's
    shell), or a login shell (bash where the image has it); ``TERM`` set for a terminal."""
    prefix = f"export TERM={term}; " if term is not None and _TERM.match(term) else ""
    if command:
        return ["/bin/sh", "-c", prefix + command]
    if prefix:
        return ["/bin/sh", "-c", prefix + SHELL[2]]
    return list(SHELL)


class _Gate(asyncssh.SSHServer):
    """Authentication and forwarding decisions for one connection."""

    def __init__(self, target: ContainerTarget, fingerprints: Sequence[str], budget: ChannelBudget) -> None:
        self._target = target
        self._fingerprints = frozenset(fingerprints)
        self._budget = budget

    def begin_auth(self, username: str) -> bool:
        return True  # every login needs a key

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return key.get_fingerprint("sha256") in self._fingerprints

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Callable[[asyncssh.SSHReader[bytes], asyncssh.SSHWriter[bytes]], Awaitable[None]]:
        why = forward_refusal(self._target, dest_host, dest_port)
        if why is not None:
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED, why)
        if self._budget.full():
            raise asyncssh.ChannelOpenError(asyncssh.OPEN_RESOURCE_SHORTAGE, self._budget.refusal())
        return functools.partial(_forward, self._target, self._budget, dest_port)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no -R: nothing listens on a provider's host for a renter


async def _forward(
    target: ContainerTarget,
    budget: ChannelBudget,
    port: int,
    reader: asyncssh.SSHReader[bytes],
    writer: asyncssh.SSHWriter[bytes],
) -> None:
    """One ``ssh -L`` connection: the channel's bytes to the container's port and back."""
    if not budget.take():
        writer.close()
        return
    try:
        await _pipe_to_port(target, port, reader, writer)
    finally:
        budget.give()


async def _pipe_to_port(
    target: ContainerTarget, port: int, reader: asyncssh.SSHReader[bytes], writer: asyncssh.SSHWriter[bytes]
) -> None:
    try:
        theirs_r, theirs_w = await asyncio.wait_for(target.runtime.connect(target.container, port), CONNECT_TIMEOUT_S)
    except (RuntimeFailure, OSError, TimeoutError) as exc:
        log.info("ssh forward refused", extra={"workload": target.workload, "port": port, "why": str(exc)})
        writer.close()
        return

    async def up() -> None:
        while data := await reader.read(READ_BYTES):
            theirs_w.write(data)
            await theirs_w.drain()
        if theirs_w.can_write_eof():
            theirs_w.write_eof()

    async def down() -> None:
        while data := await theirs_r.read(READ_BYTES):
            writer.write(data)
            await writer.drain()
        writer.write_eof()

    tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
    try:
        await asyncio.gather(*tasks)
    except (OSError, asyncssh.Error):
        pass
    finally:
        for task in tasks:
            task.cancel()
        theirs_w.close()
        writer.close()


async def run_session(target: ContainerTarget, budget: ChannelBudget, process: asyncssh.SSHServerProcess[bytes]) -> None:
    """A shell or a command: an exec in the container, bridged to the channel; its exit status is the session's."""
    if not budget.take():
        process.stderr.write(f"idlegrid: {budget.refusal()}\r\n".encode())
        process.exit(1)
        return
    try:
        code = await _run_command(target, process)
    finally:
        budget.give()
    with contextlib.suppress(OSError, asyncssh.Error):  # the client may have gone already
        process.exit(code)


async def _run_command(target: ContainerTarget, process: asyncssh.SSHServerProcess[bytes]) -> int:
    term = process.get_terminal_type()
    cols, rows = process.get_terminal_size()[:2]
    argv = session_command(process.command, term)
    try:
        session = await target.runtime.exec(target.container, argv, tty=term is not None, cols=cols or 80, rows=rows or 24)
    except RuntimeFailure as exc:
        process.stderr.write(f"idlegrid: {exc}\r\n".encode())
        return EXIT_NO_EXEC
    feeding = asyncio.ensure_future(_feed(process, session, terminal=term is not None))
    code = 255
    try:
        while (output := await session.read()) is not None:
            channel, data = output
            out = process.stderr if channel == STDERR and term is None else process.stdout
            out.write(data)
            await out.drain()
        code = await session.wait()
    except (OSError, asyncssh.Error):
        pass  # the client went away: the command is stopped below
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        await session.close()
    return code


async def _feed(process: asyncssh.SSHServerProcess[bytes], session: ExecSession, *, terminal: bool) -> None:
    """The client's input to the command. On a terminal the client's end of input is not passed on, as OpenSSH's
    sshd does not either (a terminal's input cannot be closed): ``ssh -tt host cmd </dev/null`` runs ``cmd`` to its
    end rather than typing EOF into it. (Podman also drops what a command printed last when input reaches it just as
    it ends.)"""
    while True:
        try:
            data = await process.stdin.read(READ_BYTES)
        except asyncssh.TerminalSizeChanged as change:
            await session.resize(max(1, min(change.width, 1000)), max(1, min(change.height, 1000)))
            continue
        if not data:
            if not terminal:
                with contextlib.suppress(OSError):
                    await session.close_stdin()
            return
        try:
            await session.write(data)
        except OSError:
            return  # the command no longer reads its input; its output and status still come


async def serve_ssh(sock: socket.socket, target: ContainerTarget, host_key: bytes, fingerprints: Sequence[str]) -> None:
    """Serve one SSH connection on ``sock`` until it ends. ``host_key``: the workload's, in OpenSSH's format;
    ``fingerprints``: the keys that may log in."""
    key = asyncssh.import_private_key(host_key)
    budget = ChannelBudget()
    try:
        conn = await asyncssh.run_server(
            sock,
            server_factory=lambda: _Gate(target, fingerprints, budget),
            server_host_keys=[key],
            process_factory=functools.partial(run_session, target, budget),
            sftp_factory=lambda chan: ContainerFiles(chan, target.runtime, target.container),
            allow_scp=False,  # OpenSSH's scp speaks SFTP; a legacy "scp -t" is a command, run in the container
            encoding=None,
            line_editor=False,
            agent_forwarding=False,
            x11_forwarding=False,
            login_timeout=LOGIN_TIMEOUT_S,
        )
    except (OSError, asyncssh.Error) as exc:
        log.info("ssh connection ended before login", extra={"workload": target.workload, "why": str(exc)})
        return
    await conn.wait_closed()

"""Serving renter tunnels: the agent's half of renter access (common/tunnel.py).

On a ``TunnelOpen`` from the Master the agent checks the ticket (a command-signing key it trusts signed it, for this
agent, on the relay it is linked through, not expired), checks that the container named runs here for the ticket's
workload, then dials a data WebSocket of its own to that relay (``/tunnel/<ticket id>``, mutual TLS, the ticket in
``X-Idlegrid-Ticket``) and serves one kind over it:

- ``logs``: the container's output as DATA/STDERR frames, then EXIT and close 1000 when it ends;
- ``exec``: a command in the container; DATA is its input, EOF closes its input, RESIZE its terminal; its output
  comes back as DATA/STDERR and its exit status as EXIT;
- ``port``: one TCP connection to the container's port per stream the renter OPENs;
- ``ssh``: an SSH connection whose server end is this agent (agent/ssh_server.py, docs/ssh.md): DATA on stream 0 carries
  its bytes both ways; shells, commands, SFTP and ``ssh -L`` reach the container through the runtime.

The decisions (which frame a renter may send for which kind, the streams of a port tunnel) are pure code below;
the asyncio part only moves bytes, awaiting every send so a slow renter slows the container's side down rather
than filling memory. Bulk bytes never travel on the control link.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.frames import CloseCode

from agent.runtime.base import STDERR, ContainerRuntime, ExecSession
from agent.ssh_host_keys import HostKeys
from agent.ssh_server import ContainerTarget, serve_ssh
from common.containers import LABEL_COMMAND_ID, LABEL_PORTS, LABEL_WORKLOAD_ID, ContainerInfo
from common.errors import IdlegridError, ProtocolError, RuntimeFailure
from common.pki import CommandVerifier
from common.tunnel import (
    AGENT_PATH_PREFIX,
    HEADER,
    MAX_TUNNEL_PAYLOAD,
    TICKET_HEADER,
    TICKET_ID_PREFIX,
    Op,
    Ticket,
    TicketBody,
    TicketRefused,
    TunnelFrame,
    TunnelKind,
    chunks,
    decode_frame,
    decode_resize,
    encode_frame,
    encode_ticket,
    exit_payload,
    verify_at_agent,
)
from common.wire import CLOSE_TUNNEL_BAD_FRAME, CLOSE_TUNNEL_IDLE, CLOSE_TUNNEL_LIMIT

log = logging.getLogger(__name__)

RUNNING = "running"
STOPPING_REASON = "agent stopping"
MAX_CLOSE_REASON_BYTES = 123
STREAM_QUEUE_FRAMES = 4  # renter -> container frames a port stream holds while its connection catches up
_TICKET_ID = re.compile(rf"^{re.escape(TICKET_ID_PREFIX)}[A-Za-z0-9_-]{{1,120}}\Z")


class TunnelRefusal(IdlegridError):
    """This agent will not serve a tunnel, or a frame within one; the message says why."""

    code = "tunnel_refused"


# --- settings and the relay ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TunnelLimits:
    """From agent/config.py: how many tunnels at once (on this host, for one account, for one workload: a renter
    shares the host's slots with its co-tenants), how many TCP streams each, how long a dial may take, and how long a
    tunnel may carry nothing before it is closed (0: never)."""

    max_tunnels: int = 16
    max_streams: int = 32
    dial_timeout_s: float = 10.0
    max_per_account: int = 8
    max_per_workload: int = 6
    idle_timeout_s: float = 900.0


@dataclass(frozen=True)
class RelayLink:
    """The relay the control link is on now: the tunnel is dialled there, on the same host and port."""

    relay_id: str  # the identity in the relay's certificate: what the Master puts in the ticket
    url: str  # the control link's URL, wss://HOST:PORT[/...]
    ssl: ssl.SSLContext  # the agent's client context (its certificate, the platform CA)
    address: str | None = None  # the address DNS gave, when the URL's host is only its name


def tunnel_url(link_url: str, ticket_id: str) -> str:
    """``wss://<the relay's agent host:port>/tunnel/<ticket id>``; refuses an id that is no ticket id."""
    if not _TICKET_ID.match(ticket_id):
        raise TunnelRefusal(f"ticket id {ticket_id[:80]!r} is not of the form {TICKET_ID_PREFIX}<hex>")
    parts = urlsplit(link_url)
    if parts.scheme not in ("wss", "ws") or not parts.netloc:
        raise TunnelRefusal(f"the relay link URL {link_url!r} is not a WebSocket URL")
    return urlunsplit((parts.scheme, parts.netloc, AGENT_PATH_PREFIX + ticket_id, "", ""))


def check_relay(ticket: Ticket, link: RelayLink | None) -> None:
    """The ticket must name the relay the agent is linked through now: the renter's end meets it there."""
    if link is None:
        raise TunnelRefusal(f"ticket {ticket.body.id} arrived while no relay link is up")
    if ticket.body.relay_id != link.relay_id:
        raise TunnelRefusal(
            f"ticket {ticket.body.id} is for relay {ticket.body.relay_id!r}, this agent is linked through {link.relay_id!r}"
        )


def check_container(ticket: Ticket, info: ContainerInfo | None) -> None:
    """The container the ticket names runs here, was made by idlegrid, for the ticket's workload; ``logs`` also
    reads a container that ended (what it printed before it crashed is what the renter wants); a ``port`` tunnel
    goes only to a port the workload declared (the create command's ports, kept in a label), whatever the ticket
    says: the ports of the host and of other containers are no renter's to reach."""
    body = ticket.body
    gone = f"container {body.container} of workload {body.workload} does not run on this host"
    if info is None or LABEL_COMMAND_ID not in info.labels or info.labels.get(LABEL_WORKLOAD_ID) != body.workload:
        raise TunnelRefusal(gone)
    if body.kind != TunnelKind.LOGS.value and info.state != RUNNING:
        raise TunnelRefusal(f"container {body.container} of workload {body.workload} is {info.state}, not running")
    if body.kind == TunnelKind.PORT.value:
        declared = declared_ports(info)
        if body.port not in declared:
            named = ", ".join(map(str, declared)) or "none"
            raise TunnelRefusal(
                f"port {body.port} is not a port workload {body.workload} declared (declared: {named}); "
                "a tunnel reaches only the ports in the workload's spec"
            )


def declared_ports(info: ContainerInfo) -> list[int]:
    """The ports the container's workload declared; none when the label is absent or not a list of ports."""
    ports = []
    for text in filter(None, info.labels.get(LABEL_PORTS, "").split(",")):
        if not text.isdigit() or not 1 <= int(text) <= 65535:
            return []  # not written by this agent: trust none of it
        ports.append(int(text))
    return ports


def check_command(ticket: Ticket) -> None:
    """An exec command's arguments reach the runtime as C strings: a NUL would cut one short, silently running
    something other than what was asked."""
    for n, arg in enumerate(ticket.body.command):
        if "\0" in arg:
            raise TunnelRefusal(f"command[{n}] holds a NUL byte, which no argument can carry; nothing was run")


def tunnel_count_refusal(opening: TicketBody, open_now: list[TicketBody], limits: TunnelLimits) -> str | None:
    """Why ``opening`` may not have a slot while ``open_now`` are served, or None when it may. The workload's and the
    account's limits come first (they say what the renter can do about it), then the host's, which holds whatever
    the other two allow."""
    idle = f" (a tunnel idle for {limits.idle_timeout_s:g} s is closed)" if limits.idle_timeout_s > 0 else ""
    of_workload = sum(1 for b in open_now if b.workload == opening.workload)
    if of_workload >= limits.max_per_workload:
        return (
            f"workload {opening.workload} has {of_workload} tunnels open on this host, the most one workload may; close one{idle}"
        )
    of_account = sum(1 for b in open_now if b.account == opening.account)
    if of_account >= limits.max_per_account:
        return f"account {opening.account} has {of_account} tunnels open on this host, the most one account may; close one{idle}"
    if len(open_now) >= limits.max_tunnels:
        return f"this host has {len(open_now)} tunnels open, the most it allows; close one or try later"
    return None


# --- frames from the renter -------------------------------------------------------------------------------------

RENTER_OPS: dict[TunnelKind, frozenset[Op]] = {
    TunnelKind.LOGS: frozenset({Op.CLOSE}),
    TunnelKind.EXEC: frozenset({Op.DATA, Op.EOF, Op.RESIZE, Op.CLOSE}),
    TunnelKind.PORT: frozenset({Op.OPEN, Op.DATA, Op.EOF, Op.CLOSE}),
    TunnelKind.SSH: frozenset({Op.DATA, Op.EOF, Op.CLOSE}),
}


def renter_frame(kind: TunnelKind, message: str | bytes) -> TunnelFrame:
    """One message from the renter's end, checked against what ``kind`` allows; ``ProtocolError`` says why not."""
    if isinstance(message, str):
        raise ProtocolError("a tunnel carries binary frames, not text")
    frame = decode_frame(message)
    if frame.op not in RENTER_OPS[kind]:
        raise ProtocolError(f"a renter may not send {frame.op.name} in a {kind.value} tunnel")
    if kind is not TunnelKind.PORT and frame.stream != 0:
        raise ProtocolError(f"a {kind.value} tunnel uses stream 0 only, got stream {frame.stream}")
    return frame


def output_frames(channel: int, data: bytes) -> list[bytes]:
    """Container output as frames: STDERR for standard error, DATA otherwise, each at most MAX_TUNNEL_PAYLOAD."""
    op = Op.STDERR if channel == STDERR else Op.DATA
    return [encode_frame(op, 0, piece) for piece in chunks(data) if piece]


class StreamPhase(enum.Enum):
    OPEN = "open"
    RENTER_DONE = "renter sent EOF"  # no more bytes from the renter; the container's side may go on
    CONTAINER_DONE = "container sent EOF"
    CLOSED = "closed"


@dataclass
class PortStreams:
    """The streams of one ``port`` tunnel: which are open, which half is done; no I/O.

    A stream is OPENed by the renter, once at a time per id, at most ``max_streams`` together. EOF from either side
    half-closes it; once both sides sent EOF (or either sent CLOSE) it is over and its id may be used again."""

    max_streams: int
    phases: dict[int, StreamPhase] = field(default_factory=dict)
    opened: int = 0  # in the tunnel's life

    def open(self, stream: int) -> None:
        if stream in self.phases:
            raise ProtocolError(f"OPEN of stream {stream}, which is open already")
        if len(self.phases) >= self.max_streams:
            raise TunnelRefusal(f"this tunnel has {len(self.phases)} connections open, the most it allows")
        self.phases[stream] = StreamPhase.OPEN
        self.opened += 1

    def is_open(self, stream: int) -> bool:
        return stream in self.phases

    def renter_data(self, stream: int) -> None:
        """DATA from the renter: only on a stream it opened and did not end."""
        phase = self.phases.get(stream)
        if phase is None:
            raise ProtocolError(f"DATA on stream {stream}, which is not open")
        if phase in (StreamPhase.RENTER_DONE, StreamPhase.CLOSED):
            raise ProtocolError(f"DATA on stream {stream} after its EOF")

    def eof(self, stream: int, *, from_renter: bool) -> bool:
        """One side is done sending; whether the stream is now over (both sides are)."""
        phase = self.phases.get(stream)
        if phase is None:
            raise ProtocolError(f"EOF on stream {stream}, which is not open")
        mine, other = (
            (StreamPhase.RENTER_DONE, StreamPhase.CONTAINER_DONE)
            if from_renter
            else (StreamPhase.CONTAINER_DONE, StreamPhase.RENTER_DONE)
        )
        if phase is other:
            self.phases[stream] = StreamPhase.CLOSED
            return True
        if phase is StreamPhase.OPEN:
            self.phases[stream] = mine
        return False

    def close(self, stream: int) -> bool:
        """The stream is over; whether it was open."""
        return self.phases.pop(stream, None) is not None


# --- one tunnel -----------------------------------------------------------------------------------------------


@dataclass
class TunnelReport:
    """What the close line says about a tunnel."""

    bytes_in: int = 0  # renter -> container payload bytes
    bytes_out: int = 0  # container -> renter payload bytes
    ended: str = ""
    streams: int = 0


class _Ended(Exception):
    """The tunnel is over for the reason given (and, with a code, the WebSocket closes with it)."""

    def __init__(self, reason: str, code: int = CloseCode.NORMAL_CLOSURE) -> None:
        super().__init__(reason)
        self.reason, self.code = reason, code


class TunnelSession:
    """One tunnel on one data WebSocket, from the first frame to the close."""

    def __init__(
        self,
        ticket: Ticket,
        ws: ClientConnection,
        runtime: ContainerRuntime,
        limits: TunnelLimits,
        *,
        host_keys: HostKeys | None = None,
        declared: list[int] | None = None,
    ) -> None:
        self.ticket = ticket
        self.host_keys = host_keys  # kind ssh: the workloads' host keys
        self.declared = declared or []  # kind ssh: the ports the workload declared (what ``ssh -L`` may reach)
        self.kind = TunnelKind(ticket.body.kind)
        self.ws = ws
        self.runtime = runtime
        self.limits = limits
        self.report = TunnelReport()
        self.last_active = time.monotonic()  # a frame sent or received: what keeps the tunnel from being idle

    async def send(self, message: bytes) -> None:
        """Awaited: websockets holds it back while the relay does not take bytes (the renter reads slowly)."""
        self.report.bytes_out += len(message) - HEADER.size
        self.last_active = time.monotonic()
        await self.ws.send(message)
        self.last_active = time.monotonic()

    async def receive(self) -> TunnelFrame:
        message = await self.ws.recv()
        frame = renter_frame(self.kind, message)
        self.report.bytes_in += len(frame.payload)
        self.last_active = time.monotonic()
        return frame

    async def _idle_watch(self) -> None:
        """Ends the tunnel once no frame has gone either way for ``idle_timeout_s``: a forgotten follow-logs or
        terminal must not hold one of the host's slots, which its co-tenants share, for ever."""
        timeout = self.limits.idle_timeout_s
        while (idle := time.monotonic() - self.last_active) < timeout:
            await asyncio.sleep(timeout - idle)
        raise _Ended(f"idle for {timeout:g} s (no byte either way); ask for a new tunnel", CLOSE_TUNNEL_IDLE)

    async def _serve_kind(self) -> None:
        if self.kind is TunnelKind.LOGS:
            await self._serve_logs()
        elif self.kind is TunnelKind.EXEC:
            await self._serve_exec()
        elif self.kind is TunnelKind.SSH:
            await self._serve_ssh()
        else:
            await self._serve_port()

    async def serve(self) -> None:
        """Serve until the tunnel ends; the WebSocket is closed with the right code on every way out."""
        code: int = CloseCode.NORMAL_CLOSURE
        reason = ""
        try:
            if self.limits.idle_timeout_s > 0:
                await _race(self._serve_kind(), self._idle_watch(), "the idle watch ended")  # it ends only by raising
            else:
                await self._serve_kind()
            self.report.ended = "completed"
        except _Ended as ended:
            self.report.ended, code, reason = ended.reason, ended.code, ended.reason
        except ProtocolError as exc:
            self.report.ended, code, reason = f"bad frame from the renter: {exc}", CLOSE_TUNNEL_BAD_FRAME, str(exc)
        except ConnectionClosed as exc:
            self.report.ended = _why_closed(exc)
        except RuntimeFailure as exc:
            self.report.ended = f"runtime failure: {exc}"
            with contextlib.suppress(ConnectionClosed):
                await self.send(encode_frame(Op.ERROR, 0, str(exc).encode()[:MAX_TUNNEL_PAYLOAD]))
        except OSError as exc:  # the container's side failed under us (a pipe or socket gone)
            self.report.ended, code, reason = f"I/O error: {exc}", CloseCode.INTERNAL_ERROR, "the agent's side failed"
        except Exception as exc:  # a fault here ends this tunnel only, never the agent; the traceback is logged
            log.exception("tunnel %s failed", self.ticket.body.id)
            self.report.ended = f"internal error: {type(exc).__name__}"
            code, reason = CloseCode.INTERNAL_ERROR, "the agent's side failed"
        except asyncio.CancelledError:
            self.report.ended, code, reason = STOPPING_REASON, CloseCode.GOING_AWAY, STOPPING_REASON
            await _close(self.ws, code, reason)
            raise
        await _close(self.ws, code, reason)

    async def _renter_gone(self) -> None:
        """Read (and refuse) what the renter sends where it may send nothing; return when it leaves."""
        while True:
            frame = await self.receive()
            if frame.op is Op.CLOSE:
                return

    # logs ------------------------------------------------------------------------------------------

    async def _serve_logs(self) -> None:
        body = self.ticket.body
        output = self.runtime.logs(body.container, tail=body.tail, follow=body.follow)
        await _race(self._pump_logs(output), self._renter_gone(), "the renter left")

    async def _pump_logs(self, output: AsyncIterator[tuple[int, bytes]]) -> None:
        try:
            async for channel, data in output:
                for message in output_frames(channel, data):
                    await self.send(message)
        finally:
            closer = getattr(output, "aclose", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        await self.send(encode_frame(Op.EXIT, 0, exit_payload(0)))

    # exec ------------------------------------------------------------------------------------------

    async def _serve_exec(self) -> None:
        body = self.ticket.body
        cols, rows = (body.cols or 80), (body.rows or 24)
        session = await self.runtime.exec(body.container, list(body.command), tty=body.tty, cols=cols, rows=rows)
        try:
            await _race(self._exec_output(session), self._exec_input(session), "the renter left")
        finally:
            await session.close()

    async def _exec_output(self, session: ExecSession) -> None:
        while (output := await session.read()) is not None:
            for message in output_frames(*output):
                await self.send(message)
        code = await session.wait()
        await self.send(encode_frame(Op.EXIT, 0, exit_payload(code)))

    async def _exec_input(self, session: ExecSession) -> None:
        stdin_open, stdin_gone = True, False
        while True:
            frame = await self.receive()
            if frame.op is Op.CLOSE:
                return
            if frame.op is Op.RESIZE:
                try:
                    size = decode_resize(frame.payload)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    raise ProtocolError(f"RESIZE payload is not {{cols, rows}}: {exc}") from None
                await session.resize(size.cols, size.rows)
            elif not stdin_open:
                raise ProtocolError(f"{frame.op.name} after EOF on the command's input")
            elif frame.op is Op.EOF:
                stdin_open = False
                with contextlib.suppress(OSError):  # the command ended first: its EXIT is on its way
                    await session.close_stdin()
            elif stdin_gone:
                continue  # the command no longer reads; what it printed and its EXIT still come
            else:
                try:
                    await session.write(frame.payload)
                except OSError:
                    stdin_gone = True

    # ssh -------------------------------------------------------------------------------------------

    async def _serve_ssh(self) -> None:
        """The SSH server runs on one end of a socket pair; the tunnel's DATA frames are the other end's bytes."""
        body = self.ticket.body
        if self.host_keys is None:
            raise RuntimeFailure("this agent serves no SSH (it has no host keys)")
        target = ContainerTarget(
            runtime=self.runtime,
            container=body.container,
            workload=body.workload,
            declared_ports=self.declared,
            any_port=self.runtime.name == "docker",  # a container of its own network: each of its ports is the renter's
        )
        ours, theirs = socket.socketpair()
        server = asyncio.ensure_future(serve_ssh(theirs, target, self.host_keys.openssh_private(body.workload), body.ssh_keys))
        try:
            reader, writer = await asyncio.open_connection(sock=ours)
        except BaseException:
            ours.close()
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
            theirs.close()
            raise
        try:
            await _race(self._ssh_out(reader), self._ssh_in(writer), "the renter left")
        finally:
            writer.close()
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
            theirs.close()

    async def _ssh_out(self, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(MAX_TUNNEL_PAYLOAD):
            await self.send(encode_frame(Op.DATA, 0, data))
        await self.send(encode_frame(Op.EXIT, 0, exit_payload(0)))  # the SSH connection ended

    async def _ssh_in(self, writer: asyncio.StreamWriter) -> None:
        while True:
            frame = await self.receive()
            if frame.op is Op.CLOSE:
                return
            if frame.op is Op.EOF:
                if writer.can_write_eof():
                    writer.write_eof()
                continue
            writer.write(frame.payload)
            await writer.drain()  # a slow SSH end holds the renter back

    # port ------------------------------------------------------------------------------------------

    async def _serve_port(self) -> None:
        streams = PortStreams(self.limits.max_streams)
        tasks: dict[int, tuple[asyncio.Queue[bytes | None], asyncio.Task[None]]] = {}

        def finished(stream: int) -> Callable[[asyncio.Task[None]], None]:
            def forget(task: asyncio.Task[None]) -> None:
                if stream in tasks and tasks[stream][1] is task:
                    del tasks[stream]
                    streams.close(stream)

            return forget

        try:
            while True:
                frame = await self.receive()
                stream = frame.stream
                if frame.op is Op.OPEN:
                    try:
                        streams.open(stream)
                    except TunnelRefusal as exc:
                        await self._stream_error(stream, str(exc))
                        continue
                    queue: asyncio.Queue[bytes | None] = asyncio.Queue(STREAM_QUEUE_FRAMES)
                    task = asyncio.create_task(self._port_stream(stream, streams, queue))
                    task.add_done_callback(finished(stream))
                    tasks[stream] = (queue, task)
                elif frame.op is Op.CLOSE:
                    entry = tasks.pop(stream, None)
                    streams.close(stream)
                    if entry is not None:
                        entry[1].cancel()
                elif stream not in tasks or tasks[stream][1].done():
                    continue  # the stream ended on the container's side while this was on its way: nothing to do
                elif frame.op is Op.EOF:
                    streams.eof(stream, from_renter=True)
                    await tasks[stream][0].put(None)
                else:
                    streams.renter_data(stream)
                    await tasks[stream][0].put(frame.payload)  # awaited: a slow container port holds the renter back
        finally:
            self.report.streams = streams.opened
            for _, task in tasks.values():
                task.cancel()
            if tasks:
                await asyncio.gather(*(task for _, task in tasks.values()), return_exceptions=True)

    async def _stream_error(self, stream: int, message: str) -> None:
        await self.send(encode_frame(Op.ERROR, stream, message.encode()[:MAX_TUNNEL_PAYLOAD]))
        await self.send(encode_frame(Op.CLOSE, stream))

    async def _port_stream(self, stream: int, streams: PortStreams, queue: asyncio.Queue[bytes | None]) -> None:
        """One TCP connection to the container's port: renter bytes in from ``queue``, its bytes out as DATA."""
        body = self.ticket.body
        try:
            reader, writer = await asyncio.wait_for(self.runtime.connect(body.container, body.port), self.limits.dial_timeout_s)
        except (RuntimeFailure, OSError, TimeoutError) as exc:
            why = str(exc) or f"no answer within {self.limits.dial_timeout_s:g} s"
            await self._stream_error(stream, f"cannot connect to port {body.port} of container {body.container}: {why}")
            return
        # Both ways at once; the stream is over when both sides sent EOF, or either way fails.
        writing = asyncio.create_task(_drain_into(queue, writer))
        reading = asyncio.create_task(self._copy_out(stream, streams, reader))
        reason = b""
        try:
            done, _ = await asyncio.wait({reading, writing}, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if (error := task.exception()) is not None:
                    raise error
        except OSError as exc:
            reason = f"connection to port {body.port} failed: {exc}".encode()[:MAX_TUNNEL_PAYLOAD]
        finally:
            for task in (reading, writing):
                task.cancel()
            writer.close()
        await self.send(encode_frame(Op.CLOSE, stream, reason))

    async def _copy_out(self, stream: int, streams: PortStreams, reader: asyncio.StreamReader) -> None:
        while data := await reader.read(MAX_TUNNEL_PAYLOAD):
            await self.send(encode_frame(Op.DATA, stream, data))
        await self.send(encode_frame(Op.EOF, stream))
        streams.eof(stream, from_renter=False)


async def _drain_into(queue: asyncio.Queue[bytes | None], writer: asyncio.StreamWriter) -> None:
    """Write what the renter sent until its EOF (``None``), then half-close the connection."""
    while (data := await queue.get()) is not None:
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof():
        writer.write_eof()


async def _race(work: Coroutine[Any, Any, None], renter: Coroutine[Any, Any, None], renter_left: str) -> None:
    """Run the container side (``work``) and the renter side together; when ``work`` ends the tunnel is done, when
    the renter's side ends first the renter left."""
    work_task = asyncio.ensure_future(work)
    renter_task = asyncio.ensure_future(renter)
    try:
        done, _ = await asyncio.wait({work_task, renter_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work_task, renter_task):
            task.cancel()
        await asyncio.gather(work_task, renter_task, return_exceptions=True)
    if work_task in done:
        work_task.result()  # its error, if any
        return
    renter_task.result()  # ConnectionClosed or ProtocolError
    raise _Ended(renter_left)


def _why_closed(exc: ConnectionClosed) -> str:
    frame = exc.rcvd or exc.sent
    if frame is None:
        return "the relay connection was lost"
    return f"the relay closed the tunnel ({frame.code}{': ' + frame.reason if frame.reason else ''})"


async def _close(ws: ClientConnection, code: int, reason: str) -> None:
    """Close with ``reason`` cut to what a close frame carries (123 bytes), on a character boundary."""
    raw = reason.encode()
    if len(raw) > MAX_CLOSE_REASON_BYTES:
        reason = raw[: MAX_CLOSE_REASON_BYTES - 3].decode(errors="ignore") + "..."
    with contextlib.suppress(ConnectionClosed, OSError):
        await ws.close(code, reason)


# --- all tunnels of this agent ------------------------------------------------------------------------------


class TunnelServer:
    """Every tunnel this agent serves, each its own task: the control loop only hands tickets over."""

    def __init__(
        self,
        agent_id: str,
        verifier: CommandVerifier,
        runtime: ContainerRuntime,
        limits: TunnelLimits | None = None,
        *,
        clock: Callable[[], float] = time.time,
        host_keys: HostKeys | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.host_keys = host_keys  # the workloads' SSH host keys; None: no ``ssh`` tunnel is served
        self.verifier = verifier
        self.runtime = runtime
        self.limits = limits or TunnelLimits()
        self._clock = clock
        self._tunnels: dict[str, asyncio.Task[None]] = {}
        self._bodies: dict[str, TicketBody] = {}  # of the tunnels in ``_tunnels``: whose they are
        self._refusals: set[asyncio.Task[None]] = set()  # dialled only to tell the renter why not
        self._closing = False

    @property
    def active(self) -> int:
        return len(self._tunnels)

    def open(self, ticket: Ticket, link: RelayLink | None) -> bool:
        """Check ``ticket`` and start serving its tunnel; whether it was taken. A ticket that does not check out is
        logged and dropped: nothing is dialled for it."""
        body = ticket.body
        try:
            if self._closing:
                raise TunnelRefusal(STOPPING_REASON)
            verify_at_agent(ticket, self.verifier, self.agent_id, self._clock())
            check_relay(ticket, link)
            assert link is not None
            url = tunnel_url(link.url, body.id)
            if body.id in self._tunnels:
                raise TunnelRefusal(f"tunnel {body.id} is open already")
        except (TicketRefused, TunnelRefusal) as exc:
            log.warning("tunnel refused", extra={"ticket": body.id, "kind": body.kind, "why": str(exc)})
            return False
        why = tunnel_count_refusal(body, list(self._bodies.values()), self.limits)
        if why is not None:
            log.warning("tunnel refused", extra={"ticket": body.id, "kind": body.kind, "why": why})
            if len(self._refusals) < self.limits.max_tunnels:  # tell the renter, within bounds
                task = asyncio.create_task(self._refuse(ticket, link, url, why))
                self._refusals.add(task)
                task.add_done_callback(self._refusals.discard)
            return False
        task = asyncio.create_task(self._serve(ticket, link, url), name=f"tunnel-{body.id}")
        self._tunnels[body.id] = task
        self._bodies[body.id] = body
        task.add_done_callback(lambda _: (self._tunnels.pop(body.id, None), self._bodies.pop(body.id, None)))
        return True

    async def close(self) -> None:
        """Stop every tunnel (each closes 1001, going away) and wait for them."""
        self._closing = True
        tasks = [*self._tunnels.values(), *self._refusals]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _dial(self, ticket: Ticket, link: RelayLink, url: str) -> ClientConnection:
        options: dict[str, object] = {"host": link.address} if link.address else {}
        return await connect(
            url,
            ssl=link.ssl,
            additional_headers={TICKET_HEADER: encode_ticket(ticket)},
            open_timeout=self.limits.dial_timeout_s,
            max_size=HEADER.size + MAX_TUNNEL_PAYLOAD,
            compression=None,
            **options,  # type: ignore[arg-type]
        )

    async def _refuse(self, ticket: Ticket, link: RelayLink, url: str, why: str) -> None:
        with contextlib.suppress(OSError, TimeoutError, InvalidHandshake, InvalidURI, ConnectionClosed):
            ws = await self._dial(ticket, link, url)
            with contextlib.suppress(ConnectionClosed):
                await ws.send(encode_frame(Op.ERROR, 0, why.encode()))
            await _close(ws, CLOSE_TUNNEL_LIMIT, why)

    async def _serve(self, ticket: Ticket, link: RelayLink, url: str) -> None:
        body = ticket.body
        started = time.monotonic()
        report = TunnelReport()
        fields = {"ticket": body.id, "kind": body.kind, "workload": body.workload, "container": body.container}
        ws: ClientConnection | None = None
        try:
            try:
                info = await asyncio.wait_for(self.runtime.inspect(body.container), self.limits.dial_timeout_s)
                check_container(ticket, info)
                check_command(ticket)
                refusal = None
            except (TunnelRefusal, RuntimeFailure) as exc:
                refusal = str(exc)
            except TimeoutError:
                refusal = f"the {self.runtime.name} runtime did not answer within {self.limits.dial_timeout_s:g} s"
            try:
                ws = await self._dial(ticket, link, url)
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
                report.ended = f"could not reach relay {body.relay_id}: {exc or type(exc).__name__}"
                return
            if refusal is not None:
                # The ticket is good but the container is not here: the renter learns why rather than waiting.
                report.ended = refusal
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(encode_frame(Op.ERROR, 0, refusal.encode()))
                await _close(ws, CloseCode.NORMAL_CLOSURE, refusal)
                return
            log.info("tunnel opened", extra={**fields, "relay": body.relay_id, "account": body.account})
            declared = declared_ports(info) if info is not None else []
            session = TunnelSession(ticket, ws, self.runtime, self.limits, host_keys=self.host_keys, declared=declared)
            report = session.report
            await session.serve()
        except asyncio.CancelledError:
            report.ended = report.ended or STOPPING_REASON
            if ws is not None:  # serve() closes its own; this is for a stop that came before it began
                await _close(ws, CloseCode.GOING_AWAY, STOPPING_REASON)
            raise
        finally:
            log.info(
                "tunnel closed",
                extra={
                    **fields,
                    "bytes_in": report.bytes_in,
                    "bytes_out": report.bytes_out,
                    "streams": report.streams,
                    "duration_s": round(time.monotonic() - started, 3),
                    "why": report.ended,
                },
            )

"""The agent-facing WebSocket server: mutual TLS, one ``AgentConnection`` per certificate, frames checked and relayed.

Whose frames an agent sends is decided here, from its certificate, never from anything in the frames.
No frame an agent sends can take the relay down: bad ones get an ``error`` frame and the connection lives.

What a connection may cost, stage by stage (limits in ``AccessConfig``):

- TCP accept: the listening socket itself turns away an address holding too many connections or opening them
  too fast, and everyone once too many openings are in flight; a reset costs no TLS work.
- Opening (TLS, then the WebSocket upgrade): one deadline for both, from accept; the socket is shut when it passes,
  whatever the peer is dribbling. Too many openings at once: 503; a certificate reconnecting too often: 429; both
  with a jittered ``Retry-After``.
- Session: frames are budgeted per connection; an agent that keeps flooding after ``rate_limited`` answers is
  cut off (1008), one that falls silent is dropped (4010), one that stops reading is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import logging
import math
import random
import socket
import ssl
import struct
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from access.config import AccessConfig
from access.metrics import RelayMetrics
from access.ratelimit import AddressGate, Admission, FrameBudget, KeyedRateLimiter
from access.tunnel_ends import AgentTunnelEnd
from access.tunnels import CLOSE_TIMEOUT_S, PING_INTERVAL_S, TRANSPORT_MAX_BYTES, TunnelExchange
from access.upstream import MasterLink
from common.errors import PKIError, ProtocolError
from common.pki import CertRole, Identity, identity_of, load_cert, peer_identity, verify_issued_by
from common.tokenbucket import TokenBucket
from common.tunnel import AGENT_PATH_PREFIX, TICKET_HEADER
from common.wire import (
    CLOSE_FLOOD,
    CLOSE_POLICY,
    CLOSE_REPLACED,
    CLOSE_REVOKED,
    CLOSE_SILENT,
    HARD_FRAME_BYTES,
    AgentConnected,
    AgentFrame,
    Config,
    DirectoryNews,
    ErrorCode,
    RelayDirectory,
    RenewResponse,
    ReportPace,
    WorkerCall,
    decode_agent_frame,
    decode_master_frame,
    encode,
    error_frame,
)

log = logging.getLogger(__name__)


SWEEP_INTERVAL_S = 5.0
WELCOME_PREFIX = b'{"type":"welcome"'
ADMISSION_WAIT_MAX_S = 300.0  # the longest Retry-After an agent honours (its retry_after_max_s)
# Past this many openings in flight per allowed one (max_handshakes), new TCP connections are reset at accept:
# the 503 needs a finished TLS handshake to be said, so it cannot bound what unfinished ones hold.
OPENINGS_CEILING_FACTOR = 4
# One accept() call resets at most this many refused connections before letting the event loop run others.
MAX_RESETS_PER_ACCEPT = 64
REFUSAL_LOG_INTERVAL_S = 10.0
FLOOD_CLOSE_GRACE_S = 1.0
# The codec writes the type tag first, so a renewal answer is told apart without decoding every frame.
RENEW_RESPONSE_PREFIX = b'{"type":"renew_response"'


@dataclass(frozen=True)
class Refusal:
    reason: str  # metrics label
    message: str  # close reason the agent sees (a WebSocket close reason holds at most 123 bytes)
    code: int = CLOSE_POLICY  # close code the agent sees: CLOSE_REVOKED tells it that retrying cannot help


def refusal_for(identity: Identity, revoked: set[str], now: float) -> Refusal | None:
    """Why a certificate may not hold a session here, if it may not."""
    if identity.role is not CertRole.AGENT:
        return Refusal("wrong_role", f"certificate role {identity.role.value!r} cannot connect as an agent")
    if identity.serial in revoked:
        return Refusal("revoked", "certificate revoked", CLOSE_REVOKED)
    if identity.not_after <= now:
        return Refusal("expired", "certificate expired; renew it")
    return None


class OpeningTracker:
    """Connections accepted but not yet sessions (TLS or WebSocket handshake in progress), by socket descriptor.

    An opening begins at TCP accept and ends when its session starts or its socket closes; the listener's sockets
    say when they close, which covers a failed TLS handshake (asyncio tells its protocol nothing then). A
    descriptor is reused only after its socket closed, so it names one opening at a time. Entries older than
    ``max_age_s`` are forgotten as a safety net: the opening deadline has shut them by then. An opening's deadline
    timer is cancelled when it ends, so the timer does not keep its socket around.
    """

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        # insertion order is start order
        self._started: dict[int, tuple[socket.socket, float, asyncio.Handle | None]] = {}

    def begin(self, fd: int, sock: socket.socket, now: float, deadline: asyncio.Handle | None = None) -> None:
        self._started[fd] = (sock, now, deadline)

    def end(self, fd: int) -> None:
        entry = self._started.pop(fd, None)
        if entry is not None and entry[2] is not None:
            entry[2].cancel()

    def holds(self, fd: int, sock: socket.socket) -> bool:
        """Whether ``sock`` is still opening (and not a later socket that got the same descriptor)."""
        entry = self._started.get(fd)
        return entry is not None and entry[0] is sock

    def count(self, now: float) -> int:
        while self._started:
            fd, (_, started, _) = next(iter(self._started.items()))
            if now - started <= self.max_age_s:
                break
            self.end(fd)
        return len(self._started)


class AcceptedSocket(socket.socket):
    """A connection the listener let in. Says when it closes, however that happens: asyncio closes the socket
    when its transport ends, and one that is only ever garbage-collected is reported by its finalizer."""

    def __init__(self, fd: int, on_close: Callable[[], None]) -> None:
        super().__init__(fileno=fd)
        self.descriptor = fd  # fileno() turns -1 once closed; this names the opening for good
        self._closed_hook = weakref.finalize(self, on_close)  # runs at most once

    def close(self) -> None:
        self._closed_hook()
        super().close()


class GatedListener(socket.socket):
    """The agent port's listening socket, deciding at TCP accept, before any TLS work, who may start opening.

    asyncio accepts through ``sock.accept()``: the one place before the TLS handshake where the client's
    address is known. A refused connection is reset (RST: the client knows at once, no TIME_WAIT here).
    """

    admit: Callable[[str], bool]
    on_accept: Callable[[AcceptedSocket], None]
    on_close: Callable[[int, str], None]

    @classmethod
    def bind_to(cls, host: str, port: int) -> GatedListener:
        family, _, _, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        plain = socket.create_server(address, family=family)  # bound, SO_REUSEADDR; asyncio sets the backlog
        return cls(fileno=plain.detach())

    def accept(self) -> tuple[socket.socket, Any]:
        for _ in range(MAX_RESETS_PER_ACCEPT):
            fd, address = self._accept_descriptor()  # BlockingIOError when none is waiting: asyncio stops there
            host = str(address[0]) if isinstance(address, tuple) else str(address)
            if self.admit(host):
                sock = AcceptedSocket(fd, functools.partial(self.on_close, fd, host))
                self.on_accept(sock)
                return sock, address
            _reset(fd)
        raise BlockingIOError("reset a run of refused connections; the event loop comes back for the rest")

    def _accept_descriptor(self) -> tuple[int, Any]:
        """The raw descriptor and address, before any socket object is made for a connection that may be reset.

        ``socket.socket._accept`` is what ``accept`` itself calls; typeshed does not list it."""
        return self._accept()  # type: ignore[attr-defined]


def _reset(fd: int) -> None:
    with socket.socket(fileno=fd) as refused, contextlib.suppress(OSError):
        refused.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def retry_after(base_s: float, rng: random.Random | None = None) -> str:
    """A ``Retry-After`` value: whole seconds between ``base_s`` and twice that, so told agents come back spread out."""
    return str(math.ceil(base_s * (1.0 + (rng or random).random())))


class RefusalLog:
    """Logs a recurring refusal at most once per interval, with how many went unlogged: a flood of connections
    must not become a flood of log lines."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._unlogged: dict[str, int] = {}

    def note(self, reason: str, message: str, now: float, **extra: Any) -> None:
        if now - self._last.get(reason, -math.inf) < self.interval_s:
            self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
            return
        self._last[reason] = now
        log.warning(message, extra={"reason": reason, "unlogged_since_last": self._unlogged.pop(reason, 0), **extra})


# --- one agent frame, sans I/O: what the relay does with it ---------------------------------------------------


@dataclass(frozen=True)
class Forward:
    kind: str  # relay it upstream under the certificate's agent id
    frame: AgentFrame | None = field(default=None, compare=False)  # as decoded here: what a fold holds (access/fold.py)


@dataclass(frozen=True)
class Answer:
    error: ProtocolError  # send an ``error`` frame back; relay nothing
    quiet: bool = False  # rate limiting would log once per dropped frame; the metric says enough


@dataclass(frozen=True)
class Ignore:
    error: ProtocolError  # a bad frame over the sender's budget: answering each one would echo a flood back


@dataclass(frozen=True)
class CutOff:
    reason: str  # kept flooding after being told to slow down: disconnect


FrameVerdict = Forward | Answer | Ignore | CutOff


def judge_frame(
    message: bytes | str, budget: FrameBudget, now: float, max_bytes: int, worker_budget: FrameBudget | None = None
) -> FrameVerdict:
    """Decode and validate one agent message and charge it to its sender's budget (a ``worker_call`` to
    ``worker_budget`` when given: an endpoint's workers' calls have a budget of their own). Never raises."""
    try:
        frame = decode_agent_frame(message, max_bytes)
    except ProtocolError as exc:
        admission = budget.admit(now)
        if admission is Admission.CUT_OFF:
            return CutOff("bad frames far over the rate limit")
        return Answer(exc) if admission is Admission.PASS else Ignore(exc)
    kind = type(frame).__struct_config__.tag
    assert isinstance(kind, str)
    if worker_budget is not None and isinstance(frame, WorkerCall):
        budget = worker_budget
    admission = budget.admit(now, must_pass=not frame.rate_limited)  # declared with the frame (common/wire.py)
    if admission is Admission.PASS:
        return Forward(kind, frame)
    if admission is Admission.CUT_OFF:
        return CutOff("frames far over the rate limit")
    limit = f"{budget.frames.rate:g}/s, burst {budget.frames.burst:g}"
    return Answer(
        ProtocolError(f"{kind} frame dropped: over the rate limit of {limit}", code=ErrorCode.RATE_LIMITED.value), quiet=True
    )


@dataclass(eq=False)
class AgentConnection:
    """One agent's connection, named by its certificate."""

    identity: Identity
    connection: ServerConnection
    remote: str
    budget: FrameBudget
    worker_budget: FrameBudget | None = None  # its endpoint workers' calls (``worker_call``), apart from ``budget``
    open: bool = True  # False once the relay decided to close it: nothing more is relayed
    last_frame: float = 0.0  # monotonic time of the last message (frame) the agent sent
    ping: asyncio.Future[float] | None = None  # the pong awaited for a ping to a silent agent, while one is out
    ping_sent: float = 0.0
    pace_told: int = -1  # the relay's pace epoch this agent was told (-1: not welcomed yet, its welcome tells it)
    directory_told: int = -1  # the relay's directory epoch this agent was told (-1: not welcomed yet, its welcome tells it)

    @property
    def agent_id(self) -> str:
        return self.identity.id

    # Frames posted for this agent in this turn of the event loop and not yet written (``post``, ``flush``).
    outbox: list[bytes] = field(default_factory=list)
    outbox_bytes: int = 0

    def post(self, data: bytes) -> bool:
        """Queue one frame for this agent; the frames posted within one turn of the event loop are written together,
        in order, as one write (one TLS record, one syscall) at the next turn (``flush``): not a window, so a lone
        control frame goes at once. False when the connection is no longer open (nothing is written then)."""
        if self.connection.protocol.state is not State.OPEN:
            return False
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self.flush)
        self.outbox.append(data)
        self.outbox_bytes += len(data)
        return True

    def flush(self) -> int:
        """Write what ``post`` queued as one write; how many frames it wrote (0: none waited, or the connection is
        no longer open, when they are dropped as a send on a closing connection was)."""
        frames, self.outbox, self.outbox_bytes = self.outbox, [], 0
        connection = self.connection
        if not frames or connection.protocol.state is not State.OPEN or connection.transport.is_closing():
            return 0
        protocol = connection.protocol
        for data in frames:
            protocol.send_text(data)
        # websockets writes each frame by itself (``send_data``): joined, they are one TLS record and one syscall.
        connection.transport.write(b"".join(protocol.data_to_send()))
        return len(frames)

    def backlog(self) -> int:
        transport = self.connection.transport
        return (transport.get_write_buffer_size() if transport is not None else 0) + self.outbox_bytes


class AgentGateway:
    """Accepts agents, checks them, relays their frames to the Master and the Master's frames to them."""

    def __init__(
        self, config: AccessConfig, ssl_context: ssl.SSLContext, link: MasterLink, metrics: RelayMetrics, tunnels: TunnelExchange
    ) -> None:
        self.config = config
        self.sessions: dict[str, AgentConnection] = {}
        self.revoked: set[str] = set()
        self._ssl = ssl_context
        self._link = link
        self._metrics = metrics
        self._opening = OpeningTracker(config.handshake_timeout_s + 1.0)
        self._addresses = AddressGate(config.max_connections_per_ip, config.connect_rate_per_ip, config.connect_burst_per_ip)
        self._reconnects = KeyedRateLimiter(config.reconnect_rate_per_agent, config.reconnect_burst_per_agent)
        # Tunnel connections (``/tunnel/<id>``) are not reconnects of the control session: their own limit.
        self._tunnel_openings = KeyedRateLimiter(config.tunnel_open_rate_per_agent, config.tunnel_open_burst_per_agent)
        self._tunnels = tunnels
        self._refusals = RefusalLog()
        metrics.track_openings(lambda: self._opening.count(time.monotonic()))
        self._server: Server | None = None
        self._closers: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._ca_cert: x509.Certificate | None = None  # the platform CA, read when a renewed certificate first needs checking
        # A connection that stops reading is cut off rather than allowed to stall the Master link: sends
        # do not wait below this much unsent data (websockets' write_limit), and past it the agent is dropped.
        self._max_backlog = 4 * config.max_frame_bytes
        # New sessions the Master admits here per second (its report_pace frame; None: no limit): after a restart,
        # agents come back at a pace it can take, while agents already in keep their sessions and go first.
        self._admission: TokenBucket | None = None
        # The intervals the Master asks for now (a config frame; None until it first paced agents), and an epoch
        # bumped with each change: each agent is told with its next frame (``_tell_pace``), not all at once.
        self._pace_frame: bytes | None = None
        self._pace_epoch = 0
        self._paced = False  # the pace now is not the Master's defaults (which every welcome carries)
        # The relay directory the Master last announced (a relay_directory frame; None until it first did), and its
        # epoch: like the pace, each agent is told with its next frame (``directory``).
        self._directory_frame: bytes | None = None
        self._directory_epoch = 0
        self._admission_slot = 0.0  # monotonic time of the last token promised to a refused agent
        link.attach(self)

    @property
    def agent_count(self) -> int:
        return len(self.sessions)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the agent server is not started")
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        listener = GatedListener.bind_to(self.config.agent_host, self.config.agent_port)
        listener.admit, listener.on_accept, listener.on_close = self._admit_address, self._opening_began, self._socket_closed
        # open_timeout bounds TLS (as ssl_handshake_timeout) and the upgrade each; _opening_began bounds the two together.
        self._server = await serve(
            self._serve_agent,
            sock=listener,
            ssl=self._ssl,
            max_size=HARD_FRAME_BYTES,
            max_queue=8,
            compression=None,
            write_limit=self._max_backlog,
            open_timeout=self.config.handshake_timeout_s,
            # No keepalive pings on a schedule: agents heartbeat every few seconds, and the sweep pings only the
            # silent ones (thousands of agents would otherwise cost a ping and a pong each every idle_timeout_s / 2).
            ping_interval=None,
            process_request=self._process_request,
        )
        self._sweeper = asyncio.create_task(self._sweep(), name="session-sweep")

    async def stop(self) -> None:
        """Stop accepting and close every agent connection (1001, going away); each says goodbye upstream."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._closers):
            with contextlib.suppress(Exception):
                await task

    # --- opening ----------------------------------------------------------------------------------

    def _admit_address(self, host: str) -> bool:
        """At TCP accept: may this address start one more opening? Called by the listener, before TLS."""
        now = time.monotonic()
        reason = self._addresses.admit(host)
        if reason is None and self._opening.count(now) >= OPENINGS_CEILING_FACTOR * self.config.max_handshakes:
            self._addresses.release(host)
            reason = "openings_full"
        if reason is None:
            return True
        self._metrics.refuse(reason)
        self._refusals.note(reason, "connection reset at accept", now, remote=host, held=self._addresses.holding(host))
        return False

    def _opening_began(self, sock: AcceptedSocket) -> None:
        """One deadline for the whole opening, from accept: asyncio's and websockets' run one after the other."""
        deadline = asyncio.get_running_loop().call_later(self.config.handshake_timeout_s, self._end_slow_opening, sock)
        self._opening.begin(sock.descriptor, sock, time.monotonic(), deadline)

    def _end_slow_opening(self, sock: AcceptedSocket) -> None:
        if not self._opening.holds(sock.descriptor, sock):
            return  # a session by now, or closed
        self._opening.end(sock.descriptor)
        self._metrics.refuse("slow_opening")
        self._refusals.note("slow_opening", "opening took longer than the handshake time limit; shut it", time.monotonic())
        # Shutting the socket makes asyncio read EOF and tear down whatever stage the opening is in.
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def _socket_closed(self, fd: int, host: str) -> None:
        self._opening.end(fd)
        self._addresses.release(host)

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """After TLS, before the upgrade: the last cheap moment to say no, and the first to say when to come back."""
        if self._opening.count(time.monotonic()) > self.config.max_handshakes:
            self._opening.end(_descriptor(connection))
            return self._refuse_opening(
                connection,
                http.HTTPStatus.SERVICE_UNAVAILABLE,
                "busy",
                self.config.retry_after_s,
                "too many connections opening; retry after the time in Retry-After\n",
            )
        agent_id = _certificate_name(connection)  # None: unreadable, and _admit refuses it with a reason
        tunnel = is_tunnel_path(request.path)
        if not tunnel and agent_id not in self.sessions and self._admission is not None:
            now = time.monotonic()
            if not self._admission.allow(now):
                return self._refuse_opening(
                    connection,
                    http.HTTPStatus.SERVICE_UNAVAILABLE,
                    "admission",
                    self._admission_wait(self._admission.rate, now),
                    "the Master is admitting agents at its pace; retry after the time in Retry-After\n",
                )
        limiter = self._tunnel_openings if tunnel else self._reconnects
        if agent_id is not None and not limiter.allow(agent_id):
            wait = max(self.config.retry_after_s, limiter.retry_after_s(agent_id))
            what = "opens tunnels" if tunnel else "reconnects"
            return self._refuse_opening(
                connection,
                http.HTTPStatus.TOO_MANY_REQUESTS,
                "tunnel_rate" if tunnel else "reconnect_rate",
                wait,
                f"this certificate {what} too often; retry after the time in Retry-After\n",
            )
        return None

    def _refuse_opening(
        self, connection: ServerConnection, status: http.HTTPStatus, reason: str, wait_s: float, text: str
    ) -> Response:
        self._metrics.refuse(reason)
        self._refusals.note(reason, f"opening refused with {status.value}", time.monotonic(), remote=_remote(connection))
        response = connection.respond(status, text)
        response.headers["Retry-After"] = retry_after(wait_s)
        return response

    async def _serve_agent(self, connection: ServerConnection) -> None:
        self._opening.end(_descriptor(connection))
        if connection.request is not None and is_tunnel_path(connection.request.path):
            await self._serve_tunnel(connection, connection.request)
            return
        session = await self._admit(connection)
        if session is None:
            return
        if not self._link.is_up:  # it would otherwise take the Master's silence for a lost hello
            self._post(session, self._link.status_frame())
        try:
            await self._relay_frames(session)
        except ConnectionClosed:
            pass
        finally:
            self._release(session)

    async def _serve_tunnel(self, connection: ServerConnection, request: Request) -> None:
        """An agent's data connection for one tunnel: the same certificate checks as a session, then the exchange."""
        identity = await self._checked_identity(connection)
        if identity is None:
            return
        # Tunnel messages are frames of at most 64 KiB: no need to take the control path's 4 MiB from this peer.
        connection.protocol.max_message_size = TRANSPORT_MAX_BYTES
        # Unlike control sessions (the sweep watches their heartbeats), a tunnel may be silent for long: ping it.
        connection.ping_interval = connection.ping_timeout = PING_INTERVAL_S
        connection.close_timeout = CLOSE_TIMEOUT_S  # then a peer that answers no ping is dropped, not waited for
        connection.start_keepalive()
        end = AgentTunnelEnd(connection, _remote(connection))
        ticket_id = request.path.partition("?")[0][len(AGENT_PATH_PREFIX) :]
        await self._tunnels.admit(end, request.headers.get(TICKET_HEADER, ""), identity=identity, path_id=ticket_id)

    async def _checked_identity(self, connection: ServerConnection) -> Identity | None:
        """The certificate's identity if it may connect here; otherwise the connection is closed saying why."""
        remote = _remote(connection)
        try:
            identity = peer_identity(connection.transport.get_extra_info("ssl_object"))
        except PKIError as exc:
            await self._refuse(connection, Refusal("bad_certificate", str(exc)[:120]), remote)
            return None
        refusal = refusal_for(identity, self.revoked, time.time())
        if refusal is not None:
            await self._refuse(connection, refusal, remote, identity)
            return None
        return identity

    async def _admit(self, connection: ServerConnection) -> AgentConnection | None:
        identity = await self._checked_identity(connection)
        if identity is None:
            return None
        remote = _remote(connection)
        now = time.monotonic()
        budget = FrameBudget(self.config.rate_per_agent, self.config.burst, self.config.flood_limit, now)
        worker_budget = FrameBudget(
            self.config.worker_call_rate_per_agent, self.config.worker_call_burst, self.config.flood_limit, now
        )
        session = AgentConnection(identity, connection, remote, budget, worker_budget, last_frame=now)
        older = self.sessions.get(identity.id)
        self.sessions[identity.id] = session
        if older is not None:
            log.info("agent connected again; closing its older connection", extra={"agent": identity.id, "remote": remote})
            self._close_later(older, CLOSE_REPLACED, "replaced by a newer connection from the same agent")
        self._link.agent_connected(
            AgentConnected(agent_id=identity.id, serial=identity.serial, cert_not_after=identity.not_after, remote=remote)
        )
        self._metrics.agents.set(len(self.sessions))
        self._metrics.session_opened()
        log.info("agent connected", extra={"agent": identity.id, "serial": identity.serial, "remote": remote})
        return session

    async def _refuse(
        self, connection: ServerConnection, refusal: Refusal, remote: str, identity: Identity | None = None
    ) -> None:
        self._metrics.refuse(refusal.reason)
        log.warning(
            "agent refused: %s",
            refusal.message,
            extra={
                "reason": refusal.reason,
                "remote": remote,
                "agent": identity.id if identity else None,
                "serial": identity.serial if identity else None,
            },
        )
        await connection.close(refusal.code, refusal.message)

    def _release(self, session: AgentConnection) -> None:
        session.open = False
        close = session.connection.close_code
        self._metrics.session_closed(close)
        if self.sessions.get(session.agent_id) is not session:
            return  # replaced by a newer connection, which now speaks for this agent
        del self.sessions[session.agent_id]
        self._link.agent_disconnected(session.agent_id, f"connection closed ({close})" if close else "connection lost")
        self._metrics.agents.set(len(self.sessions))
        log.info("agent disconnected", extra={"agent": session.agent_id, "close_code": close, "remote": session.remote})

    # --- agent -> master ---------------------------------------------------------------------------

    async def _relay_frames(self, session: AgentConnection) -> None:
        """Until the connection closes; silence is the sweep's business (``_sweep``), not a timer per frame."""
        while True:
            # decode=False: the bytes go upstream untouched, so never decode text to str and back.
            message = await session.connection.recv(decode=False)
            session.last_frame = time.monotonic()
            if not session.open:
                # Closing: read and discard until the agent's close frame arrives. Not reading would leave it
                # behind whatever the agent still sends, and the close would wait out close_timeout.
                continue
            try:
                await self._on_message(session, message)
            except ConnectionClosed:
                raise
            except Exception:  # a relay bug on one frame must not end this agent's session, let alone others'
                log.exception("failed to relay a frame", extra={"agent": session.agent_id})

    async def _on_message(self, session: AgentConnection, message: bytes) -> None:
        budget, workers = session.budget, session.worker_budget
        match judge_frame(message, budget, session.last_frame, self.config.max_frame_bytes, workers):  # stamped on receipt
            case Forward(kind, frame):
                if session.pace_told != self._pace_epoch and session.pace_told >= 0:
                    await self._tell_pace(session)
                if session.directory_told != self._directory_epoch and session.directory_told >= 0:
                    await self._tell_directory(session)
                # Waits while the buffer is full of frames that must be kept (backpressure: this agent is not
                # read meanwhile); gives up only if the connection ends, and an agent resends results until acked.
                if await self._link.forward(
                    session.agent_id, kind, message, until=session.connection.connection_lost_waiter, decoded=frame
                ):
                    self._metrics.frame_in(kind)
            case Answer(error, quiet):
                await self._answer_error(session, error, quiet=quiet)
            case Ignore(error):
                self._metrics.frame_error(error.code)
            case CutOff(reason):
                self._cut_off_flood(session, reason)

    def _drop_silent(self, session: AgentConnection) -> None:
        """Pongs keep a connection alive but say nothing of the agent: heartbeats do."""
        log.info("agent sent nothing for %g s; disconnecting it", self.config.max_silence_s, extra={"agent": session.agent_id})
        self._metrics.refuse("silent")
        self._close_later(session, CLOSE_SILENT, f"no frame for {self.config.max_silence_s:g} s")

    def _cut_off_flood(self, session: AgentConnection, reason: str) -> None:
        """Reading a flood forever would spend the relay on one agent; it reconnects (within its reconnect
        limit) with a fresh budget, and resends any command result that was not acked."""
        log.warning("agent kept sending far over its rate limit; disconnecting it: %s", reason, extra={"agent": session.agent_id})
        self._metrics.refuse("flood")
        self._close_later(session, CLOSE_FLOOD, "over the rate limit for too long")
        # A flooder that does not read will not see the close frame either, and the closing handshake would
        # have the relay read its flood until close_timeout: it gets a moment to read it, then the socket goes.
        asyncio.get_running_loop().call_later(FLOOD_CLOSE_GRACE_S, _abort, session.connection)

    async def _answer_error(self, session: AgentConnection, exc: ProtocolError, *, quiet: bool = False) -> None:
        self._metrics.frame_error(exc.code)
        if not quiet:  # rate limiting would log once per dropped frame; the metric says enough
            log.info("bad frame from agent: %s", exc, extra={"agent": session.agent_id, "code": exc.code})
        self._post(session, error_frame(exc))

    # --- master -> agent ---------------------------------------------------------------------------

    async def deliver(self, agent_id: str, frame: bytes) -> bool:
        """Send a frame from the Master to the agent if it is connected here and keeping up."""
        session = self.sessions.get(agent_id)
        if session is None or not session.open:
            return False
        if not self._post(session, frame):
            return False
        self._metrics.frame_out(frame)
        if frame.startswith(WELCOME_PREFIX):
            session.pace_told = self._pace_epoch
            session.directory_told = self._directory_epoch  # the welcome carries the directory, as new as any news before it
            if self._paced and self._pace_frame is not None:
                self._post(session, self._pace_frame)  # the welcome's intervals are the defaults: the pace overrides them
        if frame.startswith(RENEW_RESPONSE_PREFIX):
            self._adopt_renewed_certificate(session, frame)
        return True

    def _post(self, session: AgentConnection, frame: bytes) -> bool:
        """Every frame to an agent goes this way: posted, never awaited, so the frames that the Master's messages of
        one read bring an agent are written together at the next turn of the loop (``AgentConnection.post``), and a
        lone one at once. An agent that does not read what it is sent (its unsent bytes past ``_max_backlog``) is cut
        off rather than let grow the relay's memory."""
        if session.backlog() + len(frame) > self._max_backlog:
            self._cut_off_slow(session, session.backlog())
            return False
        return session.post(frame)

    def _adopt_renewed_certificate(self, session: AgentConnection, frame: bytes) -> None:
        """The Master just renewed this agent's certificate over this session: the session now lives as long as it.

        Otherwise a renewed agent would be cut off when its old certificate expires, though the Master
        vouched for it on the mutually authenticated link. The certificate is checked all the same.
        """
        try:
            response = decode_master_frame(frame)
            if not isinstance(response, RenewResponse) or not response.cert_pem:
                return
            cert = load_cert(response.cert_pem.encode())
            verify_issued_by(cert, self._platform_ca())
            identity = identity_of(cert)
        except (ProtocolError, PKIError, OSError) as exc:
            log.warning("renewed certificate not adopted: %s", exc, extra={"agent": session.agent_id})
            return
        if identity.role is not CertRole.AGENT or identity.id != session.agent_id or identity.serial in self.revoked:
            log.warning(
                "renewed certificate names someone else or is revoked; not adopted",
                extra={"agent": session.agent_id, "named": identity.uri, "serial": identity.serial},
            )
            return
        log.info(
            "certificate renewed; the session now ends with the new one",
            extra={"agent": session.agent_id, "serial": identity.serial, "not_after": identity.not_after},
        )
        session.identity = identity

    def _platform_ca(self) -> x509.Certificate:
        if self._ca_cert is None:
            with open(self.config.ca_file, "rb") as f:
                self._ca_cert = load_cert(f.read())
        return self._ca_cert

    async def broadcast(self, frame: bytes) -> int:
        """Send a frame of the relay's own (``relay_status``) to every agent here; how many it reached."""
        sent = await asyncio.gather(*(self.deliver(agent_id, frame) for agent_id in list(self.sessions)))
        return sum(sent)

    def _admission_wait(self, rate: float, now: float) -> float:
        """Seconds a refused agent is told to wait: each one gets the next free slot at the admission rate, after
        those told before it, so a storm comes back spread over as long as the Master needs, not as a second herd."""
        self._admission_slot = max(self._admission_slot, now) + 1.0 / rate
        return min(ADMISSION_WAIT_MAX_S, max(1.0, self._admission_slot - now))

    async def pace(self, pace: ReportPace) -> None:
        """The Master's report pace: the admission bucket, and the intervals passed on to every agent here."""
        if pace.admit_per_s > 0:
            burst = max(1, pace.admit_burst)
            if self._admission is None:
                self._admission = TokenBucket(pace.admit_per_s, burst, time.monotonic())
            elif (self._admission.rate, self._admission.burst) != (pace.admit_per_s, burst):
                self._admission.retune(pace.admit_per_s, burst, time.monotonic())  # not a fresh burst at each change
        else:
            self._admission = None
        told = encode(Config(heartbeat_s=pace.heartbeat_s, telemetry_s=pace.telemetry_s))
        if told == self._pace_frame or (self._pace_frame is None and pace.factor == 1.0):
            return  # nothing new for the agents
        self._pace_frame, self._paced = told, pace.factor != 1.0
        self._pace_epoch += 1
        log.info(
            "report pace changed; each agent is told with its next frame",
            extra={"factor": pace.factor, "telemetry_s": pace.telemetry_s, "agents": len(self.sessions)},
        )

    async def _tell_pace(self, session: AgentConnection) -> None:
        """The pace now, to one agent that has not been told it, as it sends a frame: a change reaches the agents
        within one heartbeat interval, spread over it. Sent to all at once, ten thousand config frames held the
        Master link's reader (and the commands behind it) for hundreds of milliseconds at every change."""
        session.pace_told = self._pace_epoch
        if self._pace_frame is not None:
            self._post(session, self._pace_frame)

    async def directory(self, news: DirectoryNews) -> None:
        """The relay directory changed: each agent here is told with its next frame (a heartbeat comes every few
        seconds), not all at once. Sent by the Master to each agent through the link, 5,000 directory frames (1.2 MB)
        held every command behind them for seconds in a reconnect storm (bench/HISTORY.md, "The minute's write, the
        storm's window and the hellos")."""
        self._directory_frame = encode(RelayDirectory(relays=news.relays))
        self._directory_epoch += 1

    async def _tell_directory(self, session: AgentConnection) -> None:
        session.directory_told = self._directory_epoch
        if self._directory_frame is not None:
            self._post(session, self._directory_frame)

    async def revoke(self, serials: Iterable[str]) -> None:
        """Remember revoked serials and cut off every session and tunnel holding one, at once."""
        revoked_now = set(serials)
        self.revoked.update(revoked_now)
        self._tunnels.revoke(revoked_now)
        for session in list(self.sessions.values()):
            if session.open and session.identity.serial in self.revoked:
                log.warning(
                    "certificate revoked; disconnecting the agent",
                    extra={"agent": session.agent_id, "serial": session.identity.serial},
                )
                self._metrics.refuse("revoked")
                self._close_later(session, CLOSE_REVOKED, "certificate revoked")

    async def _sweep(self) -> None:
        """Every few seconds, over every session: expired certificates, silent agents, unanswered pings.

        Certificates are short-lived: one that expires mid-session ends the session. An agent silent for
        ``idle_timeout_s`` is pinged, and dropped if the pong does not come within half that (its connection is
        dead); one silent for ``max_silence_s`` is dropped, pongs or not. While the Master link is down agents wait
        for a welcome that cannot come, which is not silence: their clocks start again.
        """
        config = self.config
        period = min(SWEEP_INTERVAL_S, config.max_silence_s / 4, config.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            try:
                self._sweep_once(time.time(), time.monotonic())
            except Exception:  # a bug here must not end the sweeping for good
                log.exception("session sweep failed")

    def _sweep_once(self, now: float, clock: float) -> None:
        config = self.config
        link_up = self._link.is_up
        for session in list(self.sessions.values()):
            if not session.open:
                continue
            if session.identity.not_after <= now:
                log.info("certificate expired; disconnecting the agent", extra={"agent": session.agent_id})
                self._metrics.refuse("expired")
                self._close_later(session, CLOSE_POLICY, "certificate expired; renew it")
                continue
            if not link_up:
                session.last_frame = clock
                continue
            silent = clock - session.last_frame
            if silent >= config.max_silence_s:
                self._drop_silent(session)
            elif silent < config.idle_timeout_s:
                continue
            elif session.ping_sent <= session.last_frame:
                self._ping(session, clock)  # silent for a while: is anybody there?
            elif session.ping is None or not session.ping.done():
                if clock - session.ping_sent >= config.idle_timeout_s / 2:
                    log.info("agent did not answer a ping; its connection is gone", extra={"agent": session.agent_id})
                    self._metrics.refuse("no_pong")
                    session.open = False
                    _abort(session.connection)
            elif clock - session.ping_sent >= config.idle_timeout_s:
                self._ping(session, clock)  # answered, still silent: ask again until max_silence_s

    def _ping(self, session: AgentConnection, clock: float) -> None:
        session.ping_sent = clock
        session.ping = None
        task = asyncio.create_task(self._send_ping(session), name=f"ping-{session.agent_id}")
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def _send_ping(self, session: AgentConnection) -> None:
        try:
            session.ping = asyncio.ensure_future(await session.connection.ping())  # a future already: done() is read
        except ConnectionClosed:
            pass

    def _cut_off_slow(self, session: AgentConnection, backlog: int) -> None:
        """Drop an agent that does not read what it is sent. No closing handshake: it would not read that
        either. What it missed is not lost: the Master resends unacknowledged commands after it reconnects."""
        log.warning("agent is not reading its frames; disconnecting it", extra={"agent": session.agent_id, "backlog": backlog})
        self._metrics.refuse("too_slow")
        session.open = False
        if session.connection.transport is not None:
            session.connection.transport.abort()

    def _close_later(self, session: AgentConnection, code: int, reason: str) -> None:
        """Close without waiting for the closing handshake, so one dead peer holds nobody else up."""
        session.open = False
        session.flush()  # what was posted before the close goes before it, as it did when each frame was sent at once
        task = asyncio.create_task(session.connection.close(code, reason), name=f"close-{session.agent_id}")
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)


def is_tunnel_path(path: str) -> bool:
    """Whether a request on the agent port is a tunnel's data connection; any other path is the control session."""
    return path.startswith(AGENT_PATH_PREFIX)


def _abort(connection: ServerConnection) -> None:
    if connection.transport is not None and not connection.transport.is_closing():
        connection.transport.abort()


def _descriptor(connection: ServerConnection) -> int:
    sock = connection.transport.get_extra_info("socket") if connection.transport is not None else None
    return sock.fileno() if sock is not None else -1


def _certificate_name(connection: ServerConnection) -> str | None:
    try:
        return peer_identity(connection.transport.get_extra_info("ssl_object")).id
    except (PKIError, AttributeError):
        return None


def _remote(connection: ServerConnection) -> str:
    address = connection.remote_address
    return f"{address[0]}:{address[1]}" if address else ""

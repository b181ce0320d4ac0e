"""The agent-facing WebSocket server: mutual TLS, one ``AgentSession`` per certificate, frames checked and relayed.

Whose frames an agent sends is decided here, from its certificate, never from anything in the frames.
No frame an agent sends can take the relay down: bad ones get an ``error`` frame and the connection lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from access.config import AccessConfig
from access.metrics import RelayMetrics
from access.ratelimit import TokenBucket
from access.upstream import MasterLink
from common.errors import PKIError, ProtocolError
from common.pki import Identity, Role, peer_identity
from common.wire import HARD_FRAME_BYTES, AgentConnected, ErrorCode, decode_agent_frame, error_frame

log = logging.getLogger(__name__)

CLOSE_POLICY = 4003  # this certificate may not be here: wrong role, revoked, expired
CLOSE_REPLACED = 4008  # the same agent connected again; the newer connection wins

# Frames the relay never holds back: the agent resends results until acked anyway, but refusing them
# would only delay the Master's view of what really happened to a command.
NEVER_RATE_LIMITED = frozenset({"command_ack", "command_result"})
SWEEP_INTERVAL_S = 5.0
# Frames from the Master are delivered one at a time on the link's reader; one agent must not hold it long.
DELIVER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Refusal:
    reason: str  # metrics label
    message: str  # close reason the agent sees (a WebSocket close reason holds at most 123 bytes)


def refusal_for(identity: Identity, revoked: set[str], now: float) -> Refusal | None:
    """Why a certificate may not hold a session here, if it may not."""
    if identity.role is not Role.AGENT:
        return Refusal("wrong_role", f"certificate role {identity.role.value!r} cannot connect as an agent")
    if identity.serial in revoked:
        return Refusal("revoked", "certificate revoked")
    if identity.not_after <= now:
        return Refusal("expired", "certificate expired; renew it")
    return None


class OpeningTracker:
    """Connections accepted but not yet sessions: TLS or WebSocket handshake still in progress.

    Counting starts at TCP accept, when websockets creates the connection object, before TLS. asyncio
    tells no one when a TLS handshake fails, so an entry older than the handshake time limit is taken
    as finished: by then asyncio has aborted it.
    """

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._started: dict[ServerConnection, float] = {}  # insertion order is start order

    def begin(self, connection: ServerConnection, now: float) -> None:
        self._started[connection] = now

    def end(self, connection: ServerConnection) -> None:
        self._started.pop(connection, None)

    def count(self, now: float) -> int:
        while self._started:
            connection, started = next(iter(self._started.items()))
            if now - started <= self.max_age_s:
                break
            del self._started[connection]
        return len(self._started)


@dataclass(eq=False)
class AgentSession:
    """One agent's connection, named by its certificate."""

    identity: Identity
    connection: ServerConnection
    remote: str
    bucket: TokenBucket
    open: bool = True  # False once the relay decided to close it: nothing more is relayed

    @property
    def agent_id(self) -> str:
        return self.identity.id

    async def send(self, data: bytes) -> bool:
        try:
            await self.connection.send(data, text=True)
            return True
        except ConnectionClosed:
            return False

    def backlog(self) -> int:
        transport = self.connection.transport
        return transport.get_write_buffer_size() if transport is not None else 0


class AgentGateway:
    """Accepts agents, checks them, relays their frames to the Master and the Master's frames to them."""

    def __init__(self, config: AccessConfig, ssl_context: ssl.SSLContext, link: MasterLink, metrics: RelayMetrics) -> None:
        self.config = config
        self.sessions: dict[str, AgentSession] = {}
        self.revoked: set[str] = set()
        self._ssl = ssl_context
        self._link = link
        self._metrics = metrics
        self._opening = OpeningTracker(config.handshake_timeout_s + 1.0)
        self._server: Server | None = None
        self._closers: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        # A connection that stops reading is cut off rather than allowed to stall the Master link: sends
        # do not wait below this much unsent data (websockets' write_limit), and past it the agent is dropped.
        self._max_backlog = 4 * config.max_frame_bytes
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
        idle = self.config.idle_timeout_s
        self._server = await serve(
            self._serve_agent, self.config.agent_host, self.config.agent_port, ssl=self._ssl,
            max_size=HARD_FRAME_BYTES, max_queue=8, compression=None, write_limit=self._max_backlog,
            open_timeout=self.config.handshake_timeout_s, ping_interval=idle / 2, ping_timeout=idle / 2,
            process_request=self._process_request, create_connection=self._create_connection,
        )
        self._sweeper = asyncio.create_task(self._sweep_expired(), name="expiry-sweep")

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

    def _create_connection(self, *args: Any, **kwargs: Any) -> ServerConnection:
        """websockets calls this at TCP accept, before TLS: the moment an opening starts costing."""
        connection = ServerConnection(*args, **kwargs)
        self._opening.begin(connection, time.monotonic())
        connection.connection_lost_waiter.add_done_callback(lambda _: self._opening.end(connection))
        return connection

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if self._opening.count(time.monotonic()) > self.config.max_handshakes:
            self._opening.end(connection)
            self._metrics.refuse("busy")
            log.warning("too many connections opening at once; refusing one", extra={"remote": _remote(connection)})
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "too many connections opening; retry with backoff\n")
        return None

    async def _serve_agent(self, connection: ServerConnection) -> None:
        self._opening.end(connection)
        session = await self._admit(connection)
        if session is None:
            return
        try:
            await self._relay_frames(session)
        except ConnectionClosed:
            pass
        finally:
            self._release(session)

    async def _admit(self, connection: ServerConnection) -> AgentSession | None:
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
        session = AgentSession(identity, connection, remote,
                               TokenBucket(self.config.rate_per_agent, self.config.burst, time.monotonic()))
        older = self.sessions.get(identity.id)
        self.sessions[identity.id] = session
        if older is not None:
            log.info("agent connected again; closing its older connection", extra={"agent": identity.id, "remote": remote})
            self._close_later(older, CLOSE_REPLACED, "replaced by a newer connection from the same agent")
        self._link.agent_connected(
            AgentConnected(agent_id=identity.id, serial=identity.serial, cert_not_after=identity.not_after, remote=remote)
        )
        self._metrics.agents.set(len(self.sessions))
        log.info("agent connected", extra={"agent": identity.id, "serial": identity.serial, "remote": remote})
        return session

    async def _refuse(self, connection: ServerConnection, refusal: Refusal, remote: str,
                      identity: Identity | None = None) -> None:
        self._metrics.refuse(refusal.reason)
        log.warning("agent refused: %s", refusal.message, extra={
            "reason": refusal.reason, "remote": remote, "agent": identity.id if identity else None,
            "serial": identity.serial if identity else None,
        })
        await connection.close(CLOSE_POLICY, refusal.message)

    def _release(self, session: AgentSession) -> None:
        session.open = False
        if self.sessions.get(session.agent_id) is not session:
            return  # replaced by a newer connection, which now speaks for this agent
        del self.sessions[session.agent_id]
        close = session.connection.close_code
        self._link.agent_disconnected(session.agent_id, f"connection closed ({close})" if close else "connection lost")
        self._metrics.agents.set(len(self.sessions))
        log.info("agent disconnected", extra={"agent": session.agent_id, "close_code": close, "remote": session.remote})

    # --- agent -> master ---------------------------------------------------------------------------

    async def _relay_frames(self, session: AgentSession) -> None:
        while True:
            # decode=False: the bytes go upstream untouched, so never decode text to str and back.
            message = await session.connection.recv(decode=False)
            if not session.open:
                return
            try:
                await self._on_message(session, message)
            except ConnectionClosed:
                raise
            except Exception:  # a relay bug on one frame must not end this agent's session, let alone others'
                log.exception("failed to relay a frame", extra={"agent": session.agent_id})

    async def _on_message(self, session: AgentSession, message: bytes) -> None:
        try:
            frame = decode_agent_frame(message, self.config.max_frame_bytes)
        except ProtocolError as exc:
            await self._answer_error(session, exc)
            return
        kind = type(frame).__struct_config__.tag
        assert isinstance(kind, str)
        now = time.monotonic()
        if kind in NEVER_RATE_LIMITED:
            session.bucket.charge(now)  # counted against the agent's budget all the same
        elif not session.bucket.allow(now):
            limit = f"{self.config.rate_per_agent:g}/s, burst {self.config.burst}"
            await self._answer_error(session, ProtocolError(f"{kind} frame dropped: over the rate limit of {limit}",
                                                            code=ErrorCode.RATE_LIMITED.value), quiet=True)
            return
        # Waits while the buffer is full of frames that must be kept (backpressure: this agent is not
        # read meanwhile); gives up only if the connection ends, and an agent resends results until acked.
        if await self._link.forward(session.agent_id, kind, message, until=session.connection.connection_lost_waiter):
            self._metrics.frame_in()

    async def _answer_error(self, session: AgentSession, exc: ProtocolError, *, quiet: bool = False) -> None:
        self._metrics.frame_error(exc.code)
        if not quiet:  # rate limiting would log once per dropped frame; the metric says enough
            log.info("bad frame from agent: %s", exc, extra={"agent": session.agent_id, "code": exc.code})
        await session.send(error_frame(exc))

    # --- master -> agent ---------------------------------------------------------------------------

    async def deliver(self, agent_id: str, frame: bytes) -> bool:
        """Send a frame from the Master to the agent if it is connected here and keeping up."""
        session = self.sessions.get(agent_id)
        if session is None or not session.open:
            return False
        if session.backlog() + len(frame) > self._max_backlog:
            self._cut_off_slow(session, session.backlog())
            return False
        try:
            # Below write_limit a send does not wait; the timeout only guards against the unexpected.
            sent = await asyncio.wait_for(session.send(frame), DELIVER_TIMEOUT_S)
        except TimeoutError:
            self._cut_off_slow(session, session.backlog())
            return False
        if not sent:
            return False
        self._metrics.frame_out()
        return True

    async def revoke(self, serials: Iterable[str]) -> None:
        """Remember revoked serials and cut off every session holding one, at once."""
        self.revoked.update(serials)
        for session in list(self.sessions.values()):
            if session.open and session.identity.serial in self.revoked:
                log.warning("certificate revoked; disconnecting the agent",
                            extra={"agent": session.agent_id, "serial": session.identity.serial})
                self._metrics.refuse("revoked")
                self._close_later(session, CLOSE_POLICY, "certificate revoked")

    async def _sweep_expired(self) -> None:
        """Certificates are short-lived: one that expires mid-session ends the session."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            now = time.time()
            for session in list(self.sessions.values()):
                if session.open and session.identity.not_after <= now:
                    log.info("certificate expired; disconnecting the agent", extra={"agent": session.agent_id})
                    self._metrics.refuse("expired")
                    self._close_later(session, CLOSE_POLICY, "certificate expired; renew it")

    def _cut_off_slow(self, session: AgentSession, backlog: int) -> None:
        """Drop an agent that does not read what it is sent. No closing handshake: it would not read that
        either. What it missed is not lost: the Master resends unacknowledged commands after it reconnects."""
        log.warning("agent is not reading its frames; disconnecting it", extra={"agent": session.agent_id, "backlog": backlog})
        self._metrics.refuse("too_slow")
        session.open = False
        if session.connection.transport is not None:
            session.connection.transport.abort()

    def _close_later(self, session: AgentSession, code: int, reason: str) -> None:
        """Close without waiting for the closing handshake, so one dead peer holds nobody else up."""
        session.open = False
        task = asyncio.create_task(session.connection.close(code, reason), name=f"close-{session.agent_id}")
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)


def _remote(connection: ServerConnection) -> str:
    address = connection.remote_address
    return f"{address[0]}:{address[1]}" if address else ""

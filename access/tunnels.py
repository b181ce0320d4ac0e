"""The meeting point of renters' tunnels: ``TunnelExchange`` admits both ends of a tunnel, joins them and pipes
bytes between them (common/tunnel.py says what a tunnel is and what its ticket holds).

A renter's end arrives on the relay's HTTPS port (``GET /tunnel``), the agent's on the agent port
(``/tunnel/<ticket id>``, mutual TLS), each with the ticket in the ``X-Idlegrid-Ticket`` header. Each end is let in
once per ticket; the first waits for the other until the ticket expires (plus ``tunnel_grace_s``). Once joined,
every binary message goes to the other end untouched, at most ``bytes_per_s`` each way, the sender not read while
the receiver has not taken the last message (backpressure all the way to both TCP connections). When one end
goes, the other is closed with its reason.

The exchange does not know HTTP or WebSocket libraries: both servers hand it a ``TunnelEnd``
(access/tunnel_ends.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from cryptography import x509

from access.metrics import RelayMetrics
from common.pki import Identity
from common.tokenbucket import TokenBucket
from common.tunnel import HEADER, MAX_TUNNEL_PAYLOAD, Ticket, TicketBody, TicketRefused, decode_ticket, verify_at_relay
from common.wire import (
    CLOSE_REVOKED,
    CLOSE_TICKET_REFUSED,
    CLOSE_TUNNEL_BAD_FRAME,
    CLOSE_TUNNEL_LIMIT,
    CLOSE_TUNNEL_PEER_GONE,
    CLOSE_TUNNEL_UNMET,
)

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = HEADER.size + MAX_TUNNEL_PAYLOAD  # one tunnel frame
# Both servers let messages up to twice that through their parsers, so the exchange (not the library's 1009)
# answers a message a little over the limit; anything larger is cut off by the library itself.
TRANSPORT_MAX_BYTES = 2 * MAX_MESSAGE_BYTES
# A bucket holds at least one whole message, and this much of a second at the tunnel's rate.
BURST_S = 0.05
# Closing handshakes of both ends, together; past this the transports are aborted.
CLOSE_TIMEOUT_S = 5.0
MAX_REASON_BYTES = 123  # a WebSocket close reason
# Both ends are pinged this often (the renter's client pings the relay as often): a host or a renter that
# vanished without a close would otherwise hold its tunnel, and its peer, until the other side gave up.
PING_INTERVAL_S = 20.0


class Side(str, enum.Enum):
    RENTER = "renter"
    AGENT = "agent"

    @property
    def other(self) -> Side:
        return Side.AGENT if self is Side.RENTER else Side.RENTER


class State(str, enum.Enum):
    WAITING = "waiting"  # one end is here, the other not yet
    JOINED = "joined"  # bytes flow both ways
    CLOSED = "closed"  # both ends are (being) closed; the ticket stays used until it expires


@dataclass(frozen=True)
class Closed:
    """How an end's connection ended: its close code (1006: lost without one) and reason."""

    code: int
    reason: str = ""


class TunnelEnd(Protocol):
    """One end's WebSocket, as the exchange needs it."""

    side: Side
    remote: str

    async def receive(self) -> bytes | str | Closed:
        """The next message (text as ``str``), or how the connection ended."""
        ...

    async def send(self, message: bytes) -> bool:
        """Send a binary message, waiting while the peer is behind; False once the connection is gone."""
        ...

    async def close(self, code: int, reason: str) -> None: ...

    def abort(self) -> None:
        """Drop the connection without a closing handshake."""
        ...


@dataclass(frozen=True)
class Ending:
    """Why a tunnel ends: the end that ended it (None: the relay), and the code and reason it ended with.

    ``close_it``: the relay must still close ``by`` itself with that code (a bad frame, a revoked certificate);
    otherwise ``by`` closed on its own and only the other end is closed."""

    by: Side | None
    code: int
    reason: str
    close_it: bool = False


@dataclass(eq=False)
class Tunnel:
    body: TicketBody
    bytes_per_s: int
    state: State = State.WAITING
    ends: dict[Side, TunnelEnd] = field(default_factory=dict)
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    over: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    ending: Ending | None = None
    agent_serial: str = ""
    arrived: float = field(default_factory=time.monotonic)
    joined_at: float = 0.0
    bytes_to: Counter[Side] = field(default_factory=Counter)
    unmet_timer: asyncio.TimerHandle | None = None

    def end(self, ending: Ending) -> None:
        """The first ending counts; the tunnel's supervisor closes the ends."""
        if self.ending is None:
            self.ending = ending
            self.over.set()


@dataclass
class _TicketUse:
    expires_at: float
    sides: set[Side] = field(default_factory=set)
    over: str = ""  # why the tunnel ended, once it has


@dataclass(frozen=True)
class Refusal:
    reason: str  # metrics label
    message: str  # close reason
    code: int = CLOSE_TICKET_REFUSED


def close_reason(text: str) -> str:
    """``text`` cut to what a WebSocket close frame carries, on a character boundary."""
    raw = text.encode()
    if len(raw) <= MAX_REASON_BYTES:
        return text
    return raw[: MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."


def frame_problem(message: bytes | str, side: Side) -> str:
    """Why a message may not pass through a tunnel (a text message, or one larger than a frame)."""
    if isinstance(message, str):
        return f"the {side.value} sent a text message; a tunnel carries binary frames only"
    return f"the {side.value} sent a {len(message)}-byte message; a tunnel frame is at most {MAX_MESSAGE_BYTES}"


class TunnelExchange:
    """Tunnels by ticket id, from the first end's arrival until both ends are closed."""

    def __init__(
        self,
        *,
        relay_id: str,
        ca_cert: x509.Certificate,
        metrics: RelayMetrics,
        default_bytes_per_s: int,
        max_tunnels: int,
        max_tunnels_per_agent: int,
        grace_s: float,
    ) -> None:
        self.relay_id = relay_id
        self._ca_cert = ca_cert
        self._metrics = metrics
        self.default_bytes_per_s = default_bytes_per_s
        self.max_tunnels = max_tunnels
        self.max_tunnels_per_agent = max_tunnels_per_agent
        self.grace_s = grace_s
        self.tunnels: dict[str, Tunnel] = {}
        self._per_agent: Counter[str] = Counter()
        self._used: dict[str, _TicketUse] = {}
        self._expiries: list[tuple[float, str]] = []  # heap: when each used ticket may be forgotten
        metrics.track_tunnels(lambda: len(self.tunnels))

    # --- arrival ----------------------------------------------------------------------------------

    async def admit(self, end: TunnelEnd, ticket_text: str, *, identity: Identity | None = None, path_id: str = "") -> None:
        """Serve one end until its tunnel is over. ``identity``: the agent's certificate (agent ends);
        ``path_id``: the ticket id in the agent's path. Refusals close ``end`` with a code and a reason."""
        now = time.time()
        self._forget_expired(now)
        checked = self._check(end.side, ticket_text, identity, path_id, now)
        if isinstance(checked, Refusal):
            await self._refuse(end, checked)
            return
        body = checked.body
        tunnel = self.tunnels.get(body.id)
        if tunnel is None:
            over = self._over_cap(body)
            if over is not None:
                await self._refuse(end, over)
                return
            tunnel = self._open(body, end, now)
            if identity is not None:
                tunnel.agent_serial = identity.serial
            await self._supervise(tunnel)
        elif tunnel.ending is not None:  # over, its ends still closing
            by = tunnel.ending.by.value if tunnel.ending.by is not None else "relay"
            await self._refuse(end, Refusal("over", f"tunnel {body.id} is over: the {by} ended it", CLOSE_TUNNEL_PEER_GONE))
        else:
            self._join(tunnel, end)
            if identity is not None:
                tunnel.agent_serial = identity.serial
            await tunnel.finished.wait()

    def _check(self, side: Side, text: str, identity: Identity | None, path_id: str, now: float) -> Ticket | Refusal:
        try:
            ticket = decode_ticket(text)
        except TicketRefused as exc:
            return Refusal("ticket", close_reason(str(exc)))
        body = ticket.body
        try:
            verify_at_relay(ticket, self._ca_cert, self.relay_id, now)
        except TicketRefused as exc:
            return Refusal("ticket", close_reason(str(exc)))
        if identity is not None and identity.id != body.agent_id:
            return Refusal("wrong_agent", close_reason(f"ticket {body.id} is for agent {body.agent_id}, not {identity.id}"))
        if side is Side.AGENT and path_id != body.id:
            return Refusal("ticket", close_reason(f"the path names tunnel {path_id!r}, the ticket {body.id}"))
        use = self._used.get(body.id)
        if use is not None and side in use.sides:
            return Refusal("used", close_reason(f"ticket {body.id} was used already by the {side.value}"))
        if use is not None and use.over:
            return Refusal("over", close_reason(use.over), CLOSE_TUNNEL_PEER_GONE)
        return ticket

    def _over_cap(self, body: TicketBody) -> Refusal | None:
        if len(self.tunnels) >= self.max_tunnels:
            return Refusal("relay_limit", f"this relay has {len(self.tunnels)} tunnels open, its limit", CLOSE_TUNNEL_LIMIT)
        if self._per_agent[body.agent_id] >= self.max_tunnels_per_agent:
            message = f"agent {body.agent_id} has {self.max_tunnels_per_agent} tunnels open here, its limit"
            return Refusal("agent_limit", close_reason(message), CLOSE_TUNNEL_LIMIT)
        return None

    async def _refuse(self, end: TunnelEnd, refusal: Refusal) -> None:
        self._metrics.tunnel_refused(refusal.reason)
        log.info(
            "tunnel end refused: %s",
            refusal.message,
            extra={"side": end.side.value, "reason": refusal.reason, "remote": end.remote},
        )
        await _close_within(end, refusal.code, refusal.message)

    def _mark_used(self, body: TicketBody, side: Side) -> None:
        use = self._used.get(body.id)
        if use is None:
            use = self._used[body.id] = _TicketUse(body.expires_at)
            heapq.heappush(self._expiries, (body.expires_at, body.id))
        use.sides.add(side)

    def _forget_expired(self, now: float) -> None:
        """A ticket past its expiry is refused as expired: it no longer needs remembering as used."""
        while self._expiries and self._expiries[0][0] <= now:
            _, ticket_id = heapq.heappop(self._expiries)
            self._used.pop(ticket_id, None)

    def _open(self, body: TicketBody, end: TunnelEnd, now: float) -> Tunnel:
        tunnel = Tunnel(body, body.bytes_per_s or self.default_bytes_per_s)
        self.tunnels[body.id] = tunnel
        self._per_agent[body.agent_id] += 1
        self._mark_used(body, end.side)
        tunnel.ends[end.side] = end
        tunnel.pumps.append(asyncio.create_task(self._pump(tunnel, end), name=f"tunnel-{body.id}-{end.side.value}"))
        wait_s = max(0.0, body.expires_at + self.grace_s - now)
        tunnel.unmet_timer = asyncio.get_running_loop().call_later(wait_s, self._unmet, tunnel)
        log.info("tunnel waiting for its %s", end.side.other.value, extra={**_fields(body), "side": end.side.value})
        return tunnel

    def _join(self, tunnel: Tunnel, end: TunnelEnd) -> None:
        self._mark_used(tunnel.body, end.side)
        tunnel.ends[end.side] = end
        tunnel.pumps.append(asyncio.create_task(self._pump(tunnel, end), name=f"tunnel-{tunnel.body.id}-{end.side.value}"))
        if tunnel.unmet_timer is not None:
            tunnel.unmet_timer.cancel()
        tunnel.state = State.JOINED
        tunnel.joined_at = time.monotonic()
        tunnel.joined.set()
        self._metrics.tunnel_opened(tunnel.body.kind)
        log.info("tunnel joined", extra={**_fields(tunnel.body), "waited_s": round(tunnel.joined_at - tunnel.arrived, 3)})

    def _unmet(self, tunnel: Tunnel) -> None:
        if tunnel.state is State.WAITING:
            missing = Side.AGENT if Side.RENTER in tunnel.ends else Side.RENTER
            self._metrics.tunnel_refused("unmet")
            tunnel.end(Ending(None, CLOSE_TUNNEL_UNMET, f"the {missing.value} did not arrive before the ticket expired"))

    # --- bytes ------------------------------------------------------------------------------------

    async def _pump(self, tunnel: Tunnel, src: TunnelEnd) -> None:
        """Messages from ``src`` to the other end until ``src`` ends or sends what a tunnel may not carry.

        Before the other end arrives, at most one message is read and held: reading is what tells the relay
        that a waiting end went away."""
        try:
            await self._pipe(tunnel, src)
        except Exception:  # a relay bug must end this tunnel, not leave it hanging
            log.exception("tunnel pump failed", extra={**_fields(tunnel.body), "side": src.side.value})
            tunnel.end(Ending(None, 1011, "the relay failed; ask for a new tunnel"))

    async def _pipe(self, tunnel: Tunnel, src: TunnelEnd) -> None:
        to = src.side.other
        bucket = TokenBucket(tunnel.bytes_per_s, max(MAX_MESSAGE_BYTES, tunnel.bytes_per_s * BURST_S), time.monotonic())
        meter = self._metrics.tunnel_bytes_to_agent if to is Side.AGENT else self._metrics.tunnel_bytes_to_renter
        while True:
            message = await src.receive()
            if isinstance(message, Closed):
                tunnel.end(Ending(src.side, message.code, message.reason))
                return
            if isinstance(message, str) or len(message) > MAX_MESSAGE_BYTES:
                self._metrics.tunnel_refused("bad_frame")
                tunnel.end(
                    Ending(src.side, CLOSE_TUNNEL_BAD_FRAME, close_reason(frame_problem(message, src.side)), close_it=True)
                )
                return
            await tunnel.joined.wait()
            wait_s = bucket.wait_s(time.monotonic(), len(message))
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            bucket.charge(time.monotonic(), len(message))
            if not await tunnel.ends[to].send(message):
                return  # the other end is gone: its own pump reads how, and ends the tunnel
            tunnel.bytes_to[to] += len(message)
            meter.inc(len(message))
            # A send below the write buffer's limit does not wait, nor does a receive with messages queued:
            # without this, one busy tunnel would hold the event loop from agents' control frames.
            await asyncio.sleep(0)

    # --- the end ----------------------------------------------------------------------------------

    async def _supervise(self, tunnel: Tunnel) -> None:
        """Run by the first end's handler: wait for the tunnel to be over, close both ends, let go of it."""
        try:
            await tunnel.over.wait()
        finally:
            if tunnel.ending is None:  # cancelled: the server is stopping
                tunnel.end(Ending(None, 1001, "the relay is shutting down"))
            await self._close(tunnel)

    async def _close(self, tunnel: Tunnel) -> None:
        ending = tunnel.ending
        assert ending is not None
        tunnel.state = State.CLOSED
        if tunnel.unmet_timer is not None:
            tunnel.unmet_timer.cancel()
        closes = []
        for side, end in tunnel.ends.items():
            if side is ending.by:
                if ending.close_it:
                    closes.append(_close_within(end, ending.code, ending.reason))
            elif ending.by is None or ending.code == 1000:
                closes.append(_close_within(end, ending.code, ending.reason))
            else:
                reason = ending.reason or f"the {ending.by.value} went away ({ending.code})"
                closes.append(_close_within(end, CLOSE_TUNNEL_PEER_GONE, close_reason(reason)))
        try:
            await asyncio.shield(asyncio.gather(*closes))
        finally:
            for pump in tunnel.pumps:
                pump.cancel()
            self._release(tunnel, ending)

    def _release(self, tunnel: Tunnel, ending: Ending) -> None:
        body = tunnel.body
        if self.tunnels.get(body.id) is tunnel:
            del self.tunnels[body.id]
            self._per_agent[body.agent_id] -= 1
            if self._per_agent[body.agent_id] <= 0:
                del self._per_agent[body.agent_id]
        use = self._used.get(body.id)
        if use is not None:
            by = ending.by.value if ending.by is not None else "relay"
            use.over = close_reason(f"tunnel {body.id} is over: the {by} ended it ({ending.code})")
        tunnel.finished.set()
        now = time.monotonic()
        log.info(
            "tunnel closed",
            extra={
                **_fields(body),
                "state_reached": "joined" if tunnel.joined_at else "waiting",
                "ended_by": ending.by.value if ending.by is not None else "relay",
                "close_code": ending.code,
                "close_reason": ending.reason,
                "bytes_to_agent": tunnel.bytes_to[Side.AGENT],
                "bytes_to_renter": tunnel.bytes_to[Side.RENTER],
                "duration_s": round(now - (tunnel.joined_at or tunnel.arrived), 3),
            },
        )

    def revoke(self, serials: Iterable[str]) -> None:
        """End every tunnel whose agent end holds a revoked certificate."""
        revoked = set(serials)
        for tunnel in list(self.tunnels.values()):
            if tunnel.agent_serial and tunnel.agent_serial in revoked:
                self._metrics.tunnel_refused("certificate")
                tunnel.end(Ending(Side.AGENT, CLOSE_REVOKED, "certificate revoked", close_it=True))

    async def close_all(self) -> None:
        """Stopping: end every tunnel (1001) and wait until each is closed."""
        tunnels = list(self.tunnels.values())
        for tunnel in tunnels:
            tunnel.end(Ending(None, 1001, "the relay is shutting down"))
        for tunnel in tunnels:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tunnel.finished.wait(), CLOSE_TIMEOUT_S)


async def _close_within(end: TunnelEnd, code: int, reason: str) -> None:
    """Close ``end``; one that does not finish the closing handshake in time is dropped."""
    try:
        await asyncio.wait_for(end.close(code, reason), CLOSE_TIMEOUT_S)
    except (TimeoutError, OSError):
        end.abort()


def _fields(body: TicketBody) -> dict[str, object]:
    """What the tunnel's log lines say of it (never the ticket itself)."""
    return {"tunnel": body.id, "kind": body.kind, "workload": body.workload, "agent": body.agent_id, "account": body.account}

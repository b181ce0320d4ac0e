"""The relay's one link to the Master: mutual TLS as role ``access``, every agent multiplexed on it.

Agent frames and the relay's ``agent_connected``/``agent_disconnected`` notices go through one ``FrameBuffer`` (a shell
over the grid's one lane queue, ``common.lanes.LaneQueue``; docs/overload.md, "One queue type"), up
or down, in three lanes, each in arrival order: control (notices, acks, results, events), then hellos, then
telemetry (heartbeats and telemetry), so a command result never waits behind heartbeats, nor behind the hellos of
thousands of agents coming back at once (issue 29). The Master learns of an agent before its frames and of its
departure after its control frames; an agent's telemetry still waiting when it leaves is let go (the Master would
ignore it). The telemetry lane is bounded in bytes: while it holds ``coalesce_bytes`` or more (and always while the
Master is unreachable) only the latest heartbeat and telemetry per agent wait, past ``telemetry_bytes`` the oldest
are evicted, every one counted. Acks, results, hellos and events are never dropped; when those alone fill the
buffer, agents are made to wait (backpressure) instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import ssl
import sys
from collections.abc import Callable, Collection, Iterable
from typing import Any, Protocol

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK, InvalidHandshake, InvalidURI

from access.config import AccessConfig
from access.fold import ReportFolder
from access.metrics import RelayMetrics
from common.errors import IdlegridError, ProtocolError
from common.lanes import Drop, Lane, LaneBounds, LaneQueue, Pushed, Replace
from common.wire import (
    CLOSE_NOT_LEADER,
    FOLDED_KINDS,
    HARD_FRAME_BYTES,
    LANE_OF_KIND,
    PROTOCOL_VERSIONS,
    TELEMETRY_KINDS,
    AccessHello,
    AccessStats,
    AccessWelcome,
    AgentConnected,
    AgentDisconnected,
    DirectoryNews,
    EnrollRequest,
    EnrollResponse,
    Error,
    ErrorCode,
    Heartbeat,
    Hello,
    LinkFrame,
    Relay,
    RelayStatus,
    ReportFold,
    ReportPace,
    Revocations,
    Telemetry,
    decode_link_frame,
    decode_link_message,
    encode,
    error_frame,
    negotiate,
    tag_of,
)

log = logging.getLogger(__name__)

# Each kind's lane is declared with its frame (common/wire.py, ``LANE_OF_KIND``): only the newest of TELEMETRY_KINDS says
# anything the Master needs, so older ones may be replaced while they wait; hellos go after control, before telemetry.
CONNECTED, DISCONNECTED, FOLD, HELLO = tag_of(AgentConnected), tag_of(AgentDisconnected), tag_of(ReportFold), tag_of(Hello)
WELCOME_TIMEOUT_S = 10.0
FLUSH_POLL_S = 0.02


class MasterUnavailable(IdlegridError):
    code = "master_unavailable"


# --- the buffer (a LaneQueue and two wake-up events) ---------------------------------------------

_UNBOUNDED = sys.maxsize  # the relay bounds control and hellos in frames (``buffer_frames``), not in bytes
# Read per frame, so kept as module constants: reading a member off its enum class costs about 150 ns in Python 3.11.
_CONTROL, _TELEMETRY = Lane.CONTROL, Lane.TELEMETRY
_FULL, _DROPPED, _FORGOTTEN = Pushed.FULL, Pushed.DROPPED, Drop.FORGOTTEN
_DROP_REASON = {Drop.REPLACED: "superseded", Drop.EVICTED: "evicted", Drop.FORGOTTEN: "forgotten"}  # metric labels


def send_delay(now: float, last_sent: float, window_s: float, *, control_waiting: bool) -> float:
    """How long the link's sender waits before it takes what waits: the rest of the batch window since its last
    message, or nothing when a control frame waits (a control frame queued during that wait cuts it short too)."""
    return 0.0 if control_waiting else max(0.0, last_sent + window_s - now)


class Outbound(msgspec.Struct, gc=False):
    """One link frame waiting to go to the Master, encoded already (a struct made in C: one per frame)."""

    agent_id: str
    kind: str  # the agent frame's type, or agent_connected / agent_disconnected
    data: bytes


class FrameBuffer:
    """Link frames in send order (control, then hellos, then telemetry) on a ``LaneQueue`` (common/lanes.py): at most
    ``limit`` of them (notices may exceed it: they are tiny and few), at most ``telemetry_bytes`` of telemetry, an
    agent's newer heartbeat or telemetry replacing its waiting one (queued last) while ``coalesce`` is set or the
    telemetry lane holds ``coalesce_bytes``.

    The sender ``take``s the oldest entries (``peek``: the head alone), sends them, then calls ``done``; a failed
    send (``send_failed``) leaves them at the head. What this adds to the queue: the relay's names for it, the
    waits of agents for room (``put``) and of the sender for frames (``ready``), and the notices' rules.
    """

    def __init__(
        self,
        limit: int,
        on_drop: Callable[[str], None] = lambda reason: None,
        *,
        telemetry_bytes: int = 4 * 1024 * 1024,
        coalesce_bytes: int = 512 * 1024,
    ) -> None:
        self.limit = limit
        self._on_drop = on_drop  # told "superseded", "evicted" or "forgotten" for each heartbeat/telemetry let go
        self.telemetry_shed = 0  # heartbeats/telemetry let go (superseded or evicted), in all: told to the Master
        self.on_shed: Callable[[], None] = lambda: None  # told of each one, after on_drop (the link resets its fold)
        bounds = LaneBounds(
            control_bytes=_UNBOUNDED,
            admission_bytes=_UNBOUNDED,
            telemetry_bytes=telemetry_bytes,
            coalesce_bytes=coalesce_bytes,
            items=limit,
        )
        self.queue: LaneQueue[Outbound] = LaneQueue(bounds, replace=Replace.LAST, on_drop=self._dropped)
        # Replace a waiting heartbeat/telemetry with its newer one. Off while the Master link is up, so
        # that a momentary backlog loses no telemetry sample; on while it is down.
        self.queue.coalesce = True
        self._space = asyncio.Event()
        self._ready = asyncio.Event()
        self._control = asyncio.Event()  # set when a control frame is queued: it cuts the sender's batch window short

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def coalesce(self) -> bool:
        return self.queue.coalesce

    @coalesce.setter
    def coalesce(self, on: bool) -> None:
        self.queue.coalesce = on

    def offer(self, entry: Outbound, *, force: bool = False) -> bool:
        """Queue ``entry`` without waiting; False only when it must be kept but there is no room."""
        kind = entry.kind
        lane = LANE_OF_KIND.get(kind, _CONTROL)
        key = (entry.agent_id, kind) if lane is _TELEMETRY and kind != FOLD else None  # a fold replaces no other
        pushed = self.queue.push(entry, lane, len(entry.data), key, source=entry.agent_id, force=force)
        if pushed is _FULL:
            return False
        if pushed is not _DROPPED:  # a heartbeat with no room is let go: the next one will say the same
            self._ready.set()
            if lane is _CONTROL:
                self._control.set()
        return True

    @property
    def telemetry_size(self) -> int:
        """Bytes of heartbeats and telemetry waiting."""
        return self.queue.bytes(Lane.TELEMETRY)

    def _dropped(self, why: Drop) -> None:
        if why is not _FORGOTTEN:
            # An agent leaving says nothing about overload: the Master paces every agent down for shed telemetry
            # (master/pacing.py), not for forgotten.
            self.telemetry_shed += 1
            self._on_drop(_DROP_REASON[why])
            self.on_shed()
            return
        self._on_drop(_DROP_REASON[why])

    async def put(self, entry: Outbound, until: asyncio.Future[Any] | None = None) -> bool:
        """Queue ``entry``, waiting for room if it must be kept and the buffer is full of what must be kept.

        Gives up, returning False, if ``until`` (say, the sender's connection closing) completes first,
        so a closed or stopping connection is never stuck here.
        """
        while not self.offer(entry):
            self._space.clear()
            if until is None:
                await self._space.wait()
                continue
            if until.done():
                return False
            room = asyncio.ensure_future(self._space.wait())
            try:
                await asyncio.wait({room, until}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                room.cancel()
        return True

    def cancel_connect(self, agent_id: str) -> bool:
        """Withdraw the agent's ``agent_connected`` notice if nothing followed it and it is not being sent.

        An agent that connects and leaves while the Master is away then costs nothing in the buffer.
        """
        if not self.queue.withdraw_last(agent_id, lambda entry: entry.kind == CONNECTED):
            return False
        self._space.set()
        return True

    def peek(self) -> Outbound | None:
        """The oldest waiting entry, now being sent (``take`` of one)."""
        batch = self.take(1, 0)
        return batch[0] if batch else None

    def take(self, max_frames: int, max_bytes: int) -> list[Outbound]:
        """The oldest waiting entries, in order, now being sent: at most ``max_frames`` and, past the first,
        ``max_bytes`` of data in all. A take not yet reported ``done`` is given back first (taken again)."""
        return self.queue.take(max_frames, max_bytes)

    async def ready(self) -> None:
        """Until something waits to be sent."""
        while not len(self.queue):
            self._ready.clear()
            await self._ready.wait()

    @property
    def control_waiting(self) -> bool:
        """Whether a control frame waits (commands' acks and results, endpoint workers' calls: each one someone waits
        for)."""
        return self.queue.bytes(_CONTROL) > 0

    async def control_or(self, delay_s: float) -> None:
        """Until ``delay_s`` has passed or a control frame waits, whichever comes first."""
        if self.control_waiting:
            return
        self._control.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay_s):
                await self._control.wait()

    def send_failed(self) -> None:
        """What was taken did not go out (the link dropped): it stays at the head, no longer being sent."""
        self.queue.give_back()

    def done(self) -> None:
        """What was taken was sent: take it out."""
        self.queue.done()
        self._space.set()

    def withdraw_connects(self, keep: Collection[str]) -> dict[str, str]:
        """Withdraw the ``agent_connected`` notices of agents not in ``keep``; then, per agent, the kind of
        its first waiting entry, in queue order (what a fresh Master link must be told first).

        Only while nothing is being sent (between links).
        """
        if self.queue.discard(lambda entry: entry.kind == CONNECTED and entry.agent_id not in keep):
            self._space.set()
        first: dict[str, str] = {}
        for entry in self.queue.in_order():
            first.setdefault(entry.agent_id, entry.kind)
        return first

    @property
    def mark(self) -> int:
        """A point in the stream: ``sent_through(mark)`` is true once everything queued before it has left."""
        return self.queue.pushed

    def sent_through(self, mark: int) -> bool:
        """Whether no entry queued before ``mark`` is still waiting (sent, or superseded by a newer one)."""
        return self.queue.sent_through(mark)

    def entries(self) -> list[Outbound]:
        """Every waiting entry (those being sent included), in send order; for tests and diagnostics."""
        return self.queue.in_order()

    def kinds(self) -> list[tuple[str, str]]:
        """(agent id, kind) of every waiting entry, in send order; for tests and diagnostics."""
        return [(e.agent_id, e.kind) for e in self.queue.in_order()]

    def discard_folds(self) -> int:
        """Let go of the folds waiting (not being sent), counted as shed: for a Master that does not take them."""
        gone = self.queue.discard(lambda entry: entry.kind == FOLD)
        for _ in range(gone):
            self._dropped(Drop.EVICTED)
        if gone:
            self._space.set()
        return gone

    def forget_telemetry(self, agent_id: str) -> None:
        """Let go of the agent's waiting heartbeat and telemetry (it left; the Master would ignore them now).

        Counted as ``forgotten``, not as shed: the Master slows every agent down for shed telemetry (master/pacing.py),
        and an agent leaving says nothing about overload."""
        gone = False
        for kind in TELEMETRY_KINDS:
            gone = self.queue.forget((agent_id, kind)) or gone
        if gone:
            self._space.set()


# --- the link --------------------------------------------------------------------------------


class AgentSide(Protocol):
    """What the link needs from the agent-facing server."""

    @property
    def agent_count(self) -> int: ...

    async def deliver(self, agent_id: str, frame: bytes) -> bool: ...

    async def revoke(self, serials: Iterable[str]) -> None: ...

    async def broadcast(self, frame: bytes) -> int: ...

    async def pace(self, pace: ReportPace) -> None: ...

    async def directory(self, news: DirectoryNews) -> None: ...


def not_leader(connection: ClientConnection | None) -> str | None:
    """The leader's link URL a Master that does not lead closed ``connection`` with ("" when it knows none), or None
    when it was not closed for that reason (docs/ha.md)."""
    if connection is None or connection.close_code != CLOSE_NOT_LEADER:
        return None
    return connection.close_reason or ""


def full_jitter(attempt: int, initial_s: float, max_s: float) -> float:
    """A delay drawn from [0, min(max_s, initial_s * 2**attempt)]: relays restarting together do not retry in step."""
    return random.uniform(0.0, min(max_s, initial_s * 2 ** min(attempt, 32)))


class MasterLink:
    """Keeps one WebSocket to the Master open (reconnecting forever) and moves frames both ways."""

    def __init__(self, config: AccessConfig, ssl_context: ssl.SSLContext, metrics: RelayMetrics, *, public_url: str = "") -> None:
        self.config = config
        self.public_url = public_url
        self.http_url = ""  # https:// URL renters reach this relay's tunnels at, told to the Master in the hello
        self.buffer = FrameBuffer(
            config.buffer_frames,
            on_drop=metrics.drop,
            telemetry_bytes=config.telemetry_buffer_bytes,
            coalesce_bytes=min(config.telemetry_coalesce_bytes, config.telemetry_buffer_bytes),
        )
        self.pace: ReportPace | None = None  # what the Master last said of report intervals and admission
        # Heartbeats and telemetry folded into one report_fold per fold_interval_s, while the Master linked now takes
        # folds (its access_welcome says so) and folding is on (fold_interval_s > 0): access/fold.py.
        self.folder = ReportFolder(config.fold_max_samples, config.link_batch_bytes)
        self._folding = False
        self.buffer.on_shed = self.folder.reset  # a fold shed on the way: the Master may lack what it said
        self._ssl = ssl_context
        self._metrics = metrics
        self._agents: AgentSide | None = None
        self._sessions: dict[str, AgentConnected] = {}  # agents connected here now
        self._pending: dict[str, asyncio.Future[EnrollResponse]] = {}
        self._connection: ClientConnection | None = None
        self._batches = False  # whether the Master linked now takes several frames per message
        self._up = asyncio.Event()
        self._stopping = False
        self._wake = asyncio.Event()  # cuts a reconnect delay short on stop or flush
        self._flushing = False  # a flush is waiting: redial at once rather than after a backoff
        self._status_changed = asyncio.Event()
        self._told = ""  # the Master link's state as last told to every agent here: "up", "down" or not yet
        self._tasks: list[asyncio.Task[None]] = []
        metrics.track_buffer(lambda: len(self.buffer), lambda: self.buffer.telemetry_size)
        metrics.master_link_up.set(0)

    def attach(self, agents: AgentSide) -> None:
        self._agents = agents

    @property
    def is_up(self) -> bool:
        return self._up.is_set()

    async def wait_up(self, timeout: float) -> None:
        await asyncio.wait_for(self._up.wait(), timeout)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self._agents is None:
            raise RuntimeError("MasterLink.attach() the agent side before start()")
        self._tasks = [
            asyncio.create_task(self._run(), name="master-link"),
            asyncio.create_task(self._report_stats(), name="access-stats"),
            asyncio.create_task(self._tell_agents(), name="relay-status"),
        ]
        if self.config.fold_interval_s > 0:
            self._tasks.append(asyncio.create_task(self._fold_every_interval(), name="report-fold"))

    @property
    def folding(self) -> bool:
        """Whether agents' heartbeats and telemetry go to the Master in folds now."""
        return self._folding

    async def flush(self, timeout_s: float) -> bool:
        """Send the Master everything buffered until now, redialling at once if the link is down; whether it
        all went within ``timeout_s``. Frames queued meanwhile are not waited for (agents keep talking)."""
        self._send_fold()
        mark = self.buffer.mark
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._flushing = True
        self._wake.set()  # cut a reconnect delay short
        try:
            while not self.buffer.sent_through(mark) and loop.time() < deadline:
                await asyncio.sleep(FLUSH_POLL_S)
        finally:
            self._flushing = False
        return self.buffer.sent_through(mark)

    async def stop(self, drain_timeout_s: float = 0.0) -> None:
        """Flush what is buffered for up to ``drain_timeout_s`` (redialling if the link is down), then close it."""
        if drain_timeout_s > 0 and len(self.buffer):
            await self.flush(drain_timeout_s)
        if len(self.buffer):
            log.warning("stopping with %d frames not delivered to the Master", len(self.buffer))
        self._stopping = True
        self._wake.set()
        if self._connection is not None:
            await self._connection.close(1001, "relay shutting down")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_pending("the relay is shutting down")

    # --- what the agent side calls ---------------------------------------------------------------

    def agent_connected(self, notice: AgentConnected) -> None:
        self._sessions[notice.agent_id] = notice
        self.buffer.offer(Outbound(notice.agent_id, CONNECTED, encode(notice)), force=True)

    def agent_disconnected(self, agent_id: str, reason: str) -> None:
        notice = self._sessions.pop(agent_id, None)
        if notice is None:
            return
        if self.buffer.cancel_connect(agent_id):
            return  # the Master never heard of this visit, so it needs no goodbye either
        self.buffer.forget_telemetry(agent_id)  # sent after the goodbye, the Master would ignore it
        self.folder.forget(agent_id)
        goodbye = AgentDisconnected(agent_id=agent_id, reason=reason)
        self.buffer.offer(Outbound(agent_id, DISCONNECTED, encode(goodbye)), force=True)

    async def forward(
        self,
        agent_id: str,
        kind: str,
        frame: bytes,
        until: asyncio.Future[Any] | None = None,
        decoded: msgspec.Struct | None = None,
    ) -> bool:
        """Queue an agent's frame (its JSON, untouched) under the certificate's agent id; may wait for room. A heartbeat
        or telemetry (``decoded``: the frame as the relay decoded it) goes into the fold while folding.

        False when ``until`` completed before there was room: the frame was not queued.
        """
        if self._folding and kind in FOLDED_KINDS and isinstance(decoded, (Heartbeat, Telemetry)):
            if self.folder.add(agent_id, decoded, len(frame)):
                self._send_fold()  # full: it goes now, not at the interval's end
            return True
        if kind == HELLO:
            self.folder.renew(agent_id)  # a new session with the Master: its next heartbeat in full
        data = encode(Relay(agent_id=agent_id, frame=msgspec.Raw(frame)))
        return await self.buffer.put(Outbound(agent_id, kind, data), until)

    def _send_fold(self) -> None:
        """The waiting fold into the buffer's telemetry lane (bounded there like any telemetry)."""
        fold = self.folder.take()
        if fold is not None:
            self.buffer.offer(Outbound("", FOLD, encode(fold)))
            self._metrics.fold_sent(len(fold.alive) + len(fold.reports))

    async def _fold_every_interval(self) -> None:
        while True:
            await asyncio.sleep(self.config.fold_interval_s)
            try:
                self._send_fold()
            except Exception:  # a bug here must not end folding for good
                log.exception("sending a report fold failed")

    def _unfold(self) -> None:
        """Folding stops (the link went down): what waits in the fold goes into the buffer as the agents' own frames,
        where it waits (and is coalesced) as unfolded frames do."""
        self._folding = False
        for agent_id, frame in self.folder.unfold():
            kind = tag_of(type(frame))
            data = encode(Relay(agent_id=agent_id, frame=msgspec.Raw(encode(frame))))
            self.buffer.offer(Outbound(agent_id, kind, data))

    async def enroll(self, request: EnrollRequest, timeout_s: float) -> EnrollResponse:
        """Ask the Master to enroll; ``MasterUnavailable`` when the link is down, ``TimeoutError`` when it is slow."""
        connection = self._connection
        if not self.is_up or connection is None:
            raise MasterUnavailable("the Master is unreachable from this relay right now; retry in a few seconds")
        future: asyncio.Future[EnrollResponse] = asyncio.get_running_loop().create_future()
        self._pending[request.req_id] = future
        try:
            await connection.send(encode(request), text=True)
            return await asyncio.wait_for(future, timeout_s)
        except ConnectionClosed:
            raise MasterUnavailable("the link to the Master closed while enrolling; retry in a few seconds") from None
        finally:
            self._pending.pop(request.req_id, None)

    # --- connection loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        """Dial the Masters until stopped: the one a standby's refusal names next (docs/ha.md), else the next in
        ``master_urls``; a backoff only once every Master was tried in a row without a link coming up."""
        urls = self.config.masters
        index = 0  # the Master dialled when no refusal names one
        tried = 0  # dials since the last link up, or the last backoff
        attempt = 0  # backoffs since the last link up
        follow = ""  # the leader a refusal named: dialled next, once
        standby_answered = False  # a standby refused since the last backoff: a takeover is under way, retry soon
        last_refusal: tuple[str, str] | None = None
        while not self._stopping:
            url = follow or urls[index % len(urls)]
            followed, follow = bool(follow), ""
            opened: ClientConnection | None = None
            try:
                async with connect(
                    url,
                    ssl=self._ssl,
                    max_size=HARD_FRAME_BYTES,
                    compression=None,
                    open_timeout=self.config.handshake_timeout_s,
                    ping_interval=self.config.idle_timeout_s / 2,
                    ping_timeout=self.config.idle_timeout_s / 2,
                ) as connection:
                    opened = connection
                    await self._open(connection, url)
                    attempt = tried = 0
                    await self._serve(connection)
            except (OSError, ssl.SSLError, InvalidHandshake, InvalidURI, ConnectionClosed, TimeoutError, ProtocolError) as exc:
                if not self._stopping and not_leader(opened) is None:
                    # The first failures say what is wrong; after that, one line in ten is enough.
                    level = logging.WARNING if attempt < 3 or attempt % 10 == 0 else logging.DEBUG
                    log.log(
                        level, "master link down: %s", exc or type(exc).__name__, extra={"master_url": url, "attempt": attempt}
                    )
            except Exception:  # a bug here must not end reconnection for good
                log.exception("master link failed", extra={"master_url": url})
            finally:
                if not self.is_up and not self._stopping:
                    self._metrics.link_dial("failed")  # one that came up was counted in _open
                self._down()
            if self._stopping:
                return
            leader = not_leader(opened)
            if leader is not None:
                standby_answered = True
                # Redials come fast while a takeover is under way: each (Master, leader named) is told once.
                level = logging.DEBUG if (url, leader) == last_refusal else logging.INFO
                last_refusal = (url, leader)
                log.log(level, "master link refused: not the leader", extra={"master_url": url, "leader": leader or "unknown"})
                if leader and leader != url and not followed:
                    follow = leader
                    continue  # at once: the leader is known
            if not followed:
                index += 1
            tried += 1
            if tried < len(urls) and not self._flushing:
                continue  # the next Master at once: this one is down or standing by
            tried = 0
            if self._flushing:  # a stopping relay has seconds left to hand its buffer over: no backoff
                delay = self.config.backoff_initial_s
            elif standby_answered:  # a Master is up and a leader is at most a lease away: no growing backoff
                delay = full_jitter(0, self.config.backoff_initial_s, self.config.backoff_max_s)
            else:
                delay = full_jitter(attempt, self.config.backoff_initial_s, self.config.backoff_max_s)
                attempt += 1
            standby_answered = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            if not self._stopping:
                self._wake.clear()

    async def _open(self, connection: ClientConnection, url: str) -> None:
        """Hello, welcome, revocations, then tell the new Master link about every agent it must know."""
        hello = AccessHello(
            versions=list(PROTOCOL_VERSIONS),
            relay_id=self.config.relay_id,
            region=self.config.region,
            public_url=self.public_url,
            http_url=self.http_url,
            directory_news=True,
            folds=self.config.fold_interval_s > 0,
            batches=True,
        )
        await connection.send(encode(hello), text=True)
        welcome = decode_link_frame(await asyncio.wait_for(connection.recv(), WELCOME_TIMEOUT_S))
        if not isinstance(welcome, AccessWelcome):
            raise ProtocolError(
                f"the Master answered access_hello with {type(welcome).__name__}, not access_welcome",
                code=ErrorCode.UNEXPECTED_FRAME.value,
            )
        negotiate([welcome.version])
        self._batches = welcome.batches
        self.folder.reset()  # whatever an earlier link was told, this Master has none of it
        if not welcome.folds and self.buffer.discard_folds():
            log.warning("this Master takes no report folds: the folds waiting for it were let go")
        assert self._agents is not None
        await self._agents.revoke(welcome.revoked_serials)
        for notice in self._announcements(revoked=set(welcome.revoked_serials)):
            await connection.send(encode(notice), text=True)
        self._connection = connection
        self.buffer.coalesce = False
        self._folding = welcome.folds and self.config.fold_interval_s > 0
        self._up.set()
        self._status_changed.set()
        self._metrics.master_link_up.set(1)
        self._metrics.link_dial("up")
        log.info(
            "master link up",
            extra={"master_url": url, "agents": len(self._sessions), "buffered": len(self.buffer)},
        )

    def _announcements(self, revoked: set[str]) -> list[AgentConnected]:
        """``agent_connected`` for each agent here that the Master must know before the buffer flushes.

        The Master forgets a relay's agents when its link drops and takes frames only from agents it
        believes are on that link. Only agents connected here now are announced: one that left during
        the outage may be on another relay by now, and announcing it would take it from there. Its
        waiting frames still go; the Master ignores them and the agent resends results until acked.
        """
        first = self.buffer.withdraw_connects(keep=self._sessions.keys())
        return [
            notice
            for agent_id, notice in self._sessions.items()
            if first.get(agent_id) != CONNECTED and notice.serial not in revoked
        ]

    async def _serve(self, connection: ClientConnection) -> None:
        """Send and receive until either side stops; whichever failed decides what is logged."""
        tasks = {
            asyncio.create_task(self._pump(connection, self._batches), name="master-link-send"),
            asyncio.create_task(self._receive_all(connection), name="master-link-receive"),
        }
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                    await task

    async def _receive_all(self, connection: ClientConnection) -> None:
        """Each message of the Master's in turn: one frame, or (to a relay whose hello said ``batches``) a JSON array of
        them, handled in order as if sent one by one; a bad frame in a batch costs only itself. Read as bytes: msgspec
        decodes UTF-8 itself, so websockets need not decode every message to a str first."""
        while True:
            try:
                message = await connection.recv(decode=False)
            except ConnectionClosedOK:
                return
            if message[:1] != b"[":
                await self._receive(connection, message)
                continue
            for frame in decode_link_message(message):
                if isinstance(frame, ProtocolError):
                    await self._refuse_frame(connection, frame)
                else:
                    await self._handle(frame)

    async def _pump(self, connection: ClientConnection, batches: bool) -> None:
        """Send the buffer in order; an entry leaves it only once the send went through.

        To a Master that takes batches, what waits goes as one JSON array per message, and under load at most one
        message per ``link_batch_window_s``: thousands of agents' heartbeats then cost the relay and the Master a few
        hundred WebSocket messages a second instead of thousands. A frame on an idle link goes at once, and so does a
        control frame whatever the window (``send_delay``), with everything waiting behind it: a command's result or
        an endpoint worker's call held for the window added up to 10 ms to each round trip through the relay.
        """
        loop = asyncio.get_running_loop()
        config = self.config
        max_frames = config.link_batch_frames if batches else 1
        window = config.link_batch_window_s if max_frames > 1 else 0.0
        last_sent = -math.inf
        while True:
            await self.buffer.ready()
            rest = send_delay(loop.time(), last_sent, window, control_waiting=self.buffer.control_waiting)
            if rest > 0:
                await self.buffer.control_or(rest)
            batch = self.buffer.take(max_frames, config.link_batch_bytes)
            if not batch:
                continue  # superseded meanwhile
            if len(batch) == 1:
                data = batch[0].data
            else:
                data = b"[" + b",".join([entry.data for entry in batch]) + b"]"
            await connection.send(data, text=True)
            last_sent = loop.time()
            self.buffer.done()
            self._metrics.link_message(len(batch))

    def _down(self) -> None:
        was_up = self.is_up
        self._connection = None
        self.buffer.send_failed()
        self.buffer.coalesce = True
        self._unfold()
        self._up.clear()
        self._metrics.master_link_up.set(0)
        self._fail_pending("the link to the Master went down while enrolling; retry in a few seconds")
        if was_up and not self._stopping:
            log.warning("master link lost; buffering agent frames", extra={"buffered": len(self.buffer)})
            self._status_changed.set()

    def status_frame(self) -> bytes:
        """``relay_status`` as an agent here should hear it now: whether its frames reach the Master or wait here."""
        return encode(RelayStatus(master_link="up" if self.is_up else "down", buffered=len(self.buffer)))

    async def _tell_agents(self) -> None:
        """Tell every agent here when the Master link goes down or comes back, so none mistakes the silence
        for the Master's. Told in order, newest state last; a flap shorter than one round may go untold."""
        while True:
            await self._status_changed.wait()
            self._status_changed.clear()
            state = "up" if self.is_up else "down"
            if state == self._told or self._agents is None:
                continue
            self._told = state
            try:
                reached = await self._agents.broadcast(self.status_frame())
            except Exception:  # a bug here must not end the telling for good
                log.exception("failed to tell agents the master link is %s", state)
                continue
            log.info("told agents the master link is %s", state, extra={"agents": reached, "buffered": len(self.buffer)})

    def _fail_pending(self, why: str) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(MasterUnavailable(why))

    # --- frames from the Master --------------------------------------------------------------------

    async def _receive(self, connection: ClientConnection, message: str | bytes) -> None:
        try:
            frame = decode_link_frame(message)
        except ProtocolError as exc:
            await self._refuse_frame(connection, exc)
            return
        await self._handle(frame)

    async def _refuse_frame(self, connection: ClientConnection, exc: ProtocolError) -> None:
        log.warning("bad frame from the Master: %s", exc, extra={"code": exc.code})
        await connection.send(error_frame(exc), text=True)

    async def _handle(self, frame: LinkFrame) -> None:
        assert self._agents is not None
        try:
            match frame:
                case Relay():
                    # An agent that is not (or no longer) here loses the frame; that is safe because the
                    # Master resends unacknowledged commands when the agent says hello again.
                    if not await self._agents.deliver(frame.agent_id, bytes(frame.frame)):
                        self._metrics.drop("agent_not_here")
                case Revocations():
                    await self._agents.revoke(frame.serials)
                case ReportPace():
                    self.pace = frame
                    self._metrics.report_pace.set(frame.factor)
                    await self._agents.pace(frame)
                case DirectoryNews():
                    await self._agents.directory(frame)
                case EnrollResponse():
                    future = self._pending.get(frame.req_id)
                    if future is not None and not future.done():
                        future.set_result(frame)
                case Error():
                    log.warning("the Master reported an error: %s %s", frame.code, frame.message, extra={"ref": frame.ref})
                case _:
                    log.warning("unexpected %s frame from the Master; ignored", type(frame).__name__)
        except Exception:  # one frame must not take down the link for every agent
            log.exception("failed to handle %s frame from the Master", type(frame).__name__)

    async def _report_stats(self) -> None:
        while True:
            await asyncio.sleep(self.config.stats_interval_s)
            connection = self._connection
            if connection is None or self._agents is None:
                continue
            stats = AccessStats(
                agents=self._agents.agent_count,
                frames_in=self._metrics.frames_in,
                frames_out=self._metrics.frames_out,
                buffered=len(self.buffer),
                refused=self._metrics.refused,
                telemetry_shed=self.buffer.telemetry_shed,
                telemetry_bytes=self.buffer.telemetry_size,
            )
            with contextlib.suppress(ConnectionClosed):
                await connection.send(encode(stats), text=True)

"""The Master's WebSocket endpoint for Access relays: mutual TLS, role ``access`` only, frames per agent."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from common.errors import PKIError, ProtocolError
from common.lanes import Lane, LaneBounds
from common.pki import CertRole, peer_identity
from common.wire import (
    CLOSE_NOT_LEADER,
    CLOSE_POLICY,
    HARD_FRAME_BYTES,
    AccessHello,
    AccessStats,
    AccessWelcome,
    AgentReports,
    DirectoryNews,
    ErrorCode,
    LinkFrame,
    Relay,
    RelayDirectory,
    RelayEntry,
    ReportPace,
    decode_link_frame,
    encode,
    error_frame,
    negotiate,
)
from master.intake import IntakeCounters, LinkIntake
from master.pacing import Pace, PaceSettings, Pressure, ReportPacer

log = logging.getLogger(__name__)

# Only relays dial this endpoint. TLS, the upgrade and the first frame each get this long (websockets applies
# open_timeout to TLS as well), so a peer that stalls anywhere in the opening is dropped.
OPEN_TIMEOUT_S = 10.0
# The Master pings each link every LINK_PING_INTERVAL_S and gives its relay LINK_PING_TIMEOUT_S to answer. A pong is read
# behind every message before it, and while the intake's admission lane is full the reader reads nothing (backpressure):
# a ramp of 12,500 hellos behind one link took longer than websockets' default 20 s to drain on a loaded machine, and
# the Master closed the link (1011), sending every agent behind it offline (bench/HISTORY.md, "100,000 agents"). An
# agent's liveness never rests on these pings (its frames do, master/intake.py), so a long wait costs little: a relay
# gone without a word is still found, a few minutes later, and its agents' silence is judged meanwhile.
LINK_PING_INTERVAL_S, LINK_PING_TIMEOUT_S = 20.0, 300.0


# A message of frames joined for a relay that takes batches (``AccessLink.send``) is kept under this many bytes, well
# inside what a relay reads in one message (HARD_FRAME_BYTES).
LINK_BATCH_BYTES = 256 * 1024


@dataclass(eq=False, slots=True)
class _Outbox:
    """The frames joining one message to a relay, each sender's future (whether it went), and the task writing them."""

    frames: list[bytes]
    senders: list[asyncio.Future[bool]]
    size: int
    writer: asyncio.Task[None] | None = None


@dataclass(eq=False)
class AccessLink:
    """One connected Access relay."""

    relay_id: str
    region: str
    connection: ServerConnection
    public_url: str = ""  # where agents dial this relay (its AccessHello says), "" when it did not say
    http_url: str = ""  # where renters reach its HTTPS port (tunnels), "" when it did not say
    agents: set[str] = field(default_factory=set)
    intake: LinkIntake | None = None  # its frames between reading and handling (master/intake.py)
    telemetry_shed: int = 0  # what its relay last said it let go of telemetry, in all (AccessStats)
    directory_news: bool = False  # it passes DirectoryNews on to its agents (its AccessHello said so)
    folds: bool = False  # it folds its agents' reports into report_fold frames (its AccessHello said so)
    batches: bool = False  # it takes a JSON array of frames as one message (its AccessHello said so): ``send`` joins
    _outbox: _Outbox | None = field(default=None, init=False, repr=False)  # the frames joining the next message

    async def send(self, data: bytes) -> bool:
        """``data`` (one encoded frame) to the relay; whether it went (False: the link is closed).

        To a relay that takes batches, the frames sent in one turn of the event loop go as one message, in the order
        they were sent, written by a task of their own at the next turn (a sender's cancellation never holds back the
        others'). A ramp's welcomes come so, dozens at once as their hellos' joined store writes end: one WebSocket
        message per frame was 8 % of the Master's loop in a 30,000-agent ramp (bench/HISTORY.md)."""
        if not self.batches:
            return await self._write(data)
        sent = asyncio.get_running_loop().create_future()
        outbox = self._outbox
        if outbox is None or outbox.size + len(data) > LINK_BATCH_BYTES:
            outbox = self._outbox = _Outbox([], [], 2)
            outbox.writer = asyncio.create_task(self._write_outbox(outbox), name=f"link-send-{self.relay_id}")
        outbox.frames.append(data)
        outbox.senders.append(sent)
        outbox.size += len(data) + 1
        return bool(await sent)

    async def _write_outbox(self, outbox: _Outbox) -> None:
        """One message of the frames ``send`` joined, written once the turn of the loop they were sent in is over."""
        if self._outbox is outbox:
            self._outbox = None  # a frame sent from now on joins the next message
        frames, went = outbox.frames, False
        try:
            went = await self._write(frames[0] if len(frames) == 1 else b"[" + b",".join(frames) + b"]")
        except Exception as exc:  # each sender's, as its own write's would have been
            for sent in outbox.senders:
                if not sent.done():
                    sent.set_exception(exc)
        finally:
            for sent in outbox.senders:
                if not sent.done():
                    sent.set_result(went)

    async def _write(self, message: bytes) -> bool:
        try:
            await self.connection.send(message, text=True)
            return True
        except ConnectionClosed:
            return False

    async def send_to_agent(self, agent_id: str, frame: bytes) -> bool:
        return await self.send(encode(Relay(agent_id=agent_id, frame=msgspec.Raw(frame))))


LinkHandler = Callable[[AccessLink, LinkFrame | AgentReports], Awaitable[None]]
LinkEvent = Callable[[AccessLink], Awaitable[None]]


class RelayHub:
    def __init__(
        self,
        ssl_context: ssl.SSLContext,
        on_frame: LinkHandler,
        on_close: LinkEvent,
        revoked: Callable[[], list[str]],
        on_open: LinkEvent | None = None,
        refusal: Callable[[], str | None] | None = None,
        lanes: LaneBounds | None = None,
        pace: PaceSettings | None = None,
        on_alive: Callable[[AccessLink, str], bool] | None = None,
    ) -> None:
        self._ssl = ssl_context
        self._on_alive = on_alive  # a fold's alive name handled at once, if it can be (master/intake.py ``_unfold``)
        self._on_frame = on_frame
        self._on_close = on_close
        self._on_open = on_open
        self._revoked = revoked
        # None while this Master leads (or runs alone); else the leader's link URL ("" when unknown): relays are refused
        # with CLOSE_NOT_LEADER and it as the reason (docs/ha.md).
        self._refusal = refusal
        self.links: dict[str, AccessLink] = {}
        self.agent_links: dict[str, AccessLink] = {}
        self._server: Server | None = None
        self.lanes = lanes or LaneBounds()
        self.intake = IntakeCounters()
        # agent id -> wall time a frame of it was last read from any link (master/intake.py): liveness, read before
        # the frame waits in a lane, so the Master's own backlog never counts as the agent's silence
        self.heard: dict[str, float] = {}
        self.pacer = ReportPacer(pace or PaceSettings())
        self._relay_shed_seen = 0  # relays' telemetry_shed already counted as pressure
        self._shed_seen = 0  # the intake's shed already counted as pressure
        self._busy_seen = (time.perf_counter(), 0.0)  # (when, the handlers' busy time) at the last check
        self._pacing: asyncio.Task[None] | None = None
        # Told at each pacing check while telemetry is paced or shed (now, factor, shed): rollups are marked thinner.
        self.on_thinning: Callable[[float, float, bool], None] | None = None

    async def start(self, host: str, port: int) -> int:
        self._server = await serve(
            self._serve_link,
            host,
            port,
            ssl=self._ssl,
            max_size=HARD_FRAME_BYTES,
            max_queue=64,
            compression=None,
            open_timeout=OPEN_TIMEOUT_S,
            ping_interval=LINK_PING_INTERVAL_S,
            ping_timeout=LINK_PING_TIMEOUT_S,
            process_request=_only_relays,
        )
        self._pacing = asyncio.create_task(self._keep_pace(), name="report-pace")
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._pacing is not None:
            self._pacing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pacing
            self._pacing = None
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def send_to_agent(self, agent_id: str, frame: bytes) -> bool:
        link = self.agent_links.get(agent_id)
        return link is not None and await link.send_to_agent(agent_id, frame)

    async def announce_directory(self, relays: list[RelayEntry]) -> int:
        """The relay directory, to every connected agent: one ``DirectoryNews`` to each relay that passes it on to its
        agents, one ``relay_directory`` frame per agent through an older relay. Returns how many frames went."""
        news = encode(DirectoryNews(relays=relays))
        each = encode(RelayDirectory(relays=relays))
        sent = 0
        for link in list(self.links.values()):
            if link.directory_news:
                sent += await link.send(news)
            else:
                agents = [a for a, via in list(self.agent_links.items()) if via is link]
                sent += sum(await asyncio.gather(*(link.send_to_agent(a, each) for a in agents)))
        return sent

    async def broadcast(self, data: bytes) -> None:
        await asyncio.gather(*(link.send(data) for link in list(self.links.values())))

    async def close_links(self, code: int, reason: str) -> None:
        """Close every relay link (a Master stepping down: ``CLOSE_NOT_LEADER``, the new leader's URL)."""
        await asyncio.gather(*(link.connection.close(code, reason) for link in list(self.links.values())))

    async def _serve_link(self, connection: ServerConnection) -> None:
        leader = self._refusal() if self._refusal is not None else None
        if leader is not None:
            log.debug("relay link refused: not the leader", extra={"leader": leader})
            await connection.close(CLOSE_NOT_LEADER, leader)
            return
        link = await self._open(connection)
        if link is None:
            return
        leader = self._refusal() if self._refusal is not None else None
        if leader is not None:  # stepped down while this link was opening
            await connection.close(CLOSE_NOT_LEADER, leader)
        if self._on_open is not None:
            await self._on_open(link)
        intake = link.intake = LinkIntake(
            lambda frame: self._handle(link, frame),
            lambda exc: self._bad_frame(link, exc),
            self.lanes,
            self.intake,
            self.heard,
            link.agents,
            alive=None if self._on_alive is None else functools.partial(self._on_alive, link),
        )
        handler = asyncio.create_task(intake.run(), name=f"intake-{link.relay_id}")
        await self._announce_pace()  # the admission share of every relay changed
        try:
            while True:
                # bytes: msgspec reads UTF-8 itself, so websockets need not decode a batch to str first
                await intake.take(await connection.recv(decode=False))
        except ConnectionClosed:
            pass
        finally:
            intake.close()
            try:
                await handler  # the control still waiting is handled before the link's close
            finally:
                if self.links.get(link.relay_id) is link:
                    del self.links[link.relay_id]
                await self._on_close(link)  # which also forgets the agents this link still spoke for
                log.info("access relay disconnected", extra={"relay": link.relay_id})
                if self.links:
                    with contextlib.suppress(Exception):
                        await self._announce_pace()

    async def _open(self, connection: ServerConnection) -> AccessLink | None:
        try:
            identity = peer_identity(connection.transport.get_extra_info("ssl_object"))
            if identity.role is not CertRole.ACCESS:
                raise PKIError(f"certificate role {identity.role.value!r} may not open a relay link")
            hello = decode_link_frame(await asyncio.wait_for(connection.recv(), timeout=OPEN_TIMEOUT_S))
            if not isinstance(hello, AccessHello):
                raise ProtocolError("the first frame on a relay link must be access_hello", code=ErrorCode.UNEXPECTED_FRAME.value)
            version = negotiate(hello.versions)
        except (PKIError, ProtocolError) as exc:
            log.warning("relay link refused: %s", exc)
            await connection.close(CLOSE_POLICY, str(exc)[:120])
            return None
        except (TimeoutError, ConnectionClosed):
            return None
        if identity.id != hello.relay_id:
            log.warning("relay %s announced itself as %s; using the certificate's name", identity.id, hello.relay_id)
        link = AccessLink(
            relay_id=identity.id,
            region=hello.region,
            connection=connection,
            public_url=hello.public_url,
            http_url=hello.http_url,
            directory_news=hello.directory_news,
            folds=hello.folds,
            batches=hello.batches,
        )
        old = self.links.get(link.relay_id)
        if old is not None:
            await old.connection.close(CLOSE_POLICY, "replaced by a newer link")
        self.links[link.relay_id] = link
        await link.send(encode(AccessWelcome(version=version, revoked_serials=self._revoked(), batches=True, folds=True)))
        log.info("access relay connected", extra={"relay": link.relay_id, "region": link.region})
        return link

    async def _handle(self, link: AccessLink, frame: LinkFrame | AgentReports) -> None:
        if isinstance(frame, AccessStats):
            link.telemetry_shed = frame.telemetry_shed
        try:
            await self._on_frame(link, frame)
        except Exception:  # one bad frame must not take the link down for every agent behind it
            log.exception("failed to handle %s frame from relay %s", type(frame).__name__, link.relay_id)

    async def _bad_frame(self, link: AccessLink, exc: ProtocolError) -> None:
        log.warning("bad frame from relay %s: %s", link.relay_id, exc)
        await link.send(error_frame(exc))

    # --- report pace and admission (master/pacing.py) -------------------------------------------------

    def heard_within(self, now: float, window_s: float) -> Mapping[str, float]:
        """When each agent was last heard (``heard``), counting every agent of a link whose reader waited for room
        in the last ``window_s`` seconds as heard ``now``: the Master's own backpressure is not its agents' silence."""
        stalled = [link for link in self.links.values() if link.intake is not None and link.intake.stalled_within(now, window_s)]
        if not stalled:
            return self.heard
        view = dict(self.heard)
        for link in stalled:
            view.update(dict.fromkeys(link.agents, now))
        return view

    def report_pace(self, pace: Pace | None = None) -> ReportPace:
        """The ``report_pace`` frame for each relay now: the pacer's intervals, and its share of admission."""
        pace = pace or self.pacer.pace
        settings = self.pacer.settings
        share = max(1, len(self.links))
        return ReportPace(
            heartbeat_s=pace.heartbeat_s,
            telemetry_s=pace.telemetry_s,
            factor=pace.factor,
            admit_per_s=settings.admit_agents_per_s / share,
            admit_burst=max(1, settings.admit_burst // share) if settings.admit_agents_per_s > 0 else 0,
        )

    async def _announce_pace(self) -> None:
        await self.broadcast(encode(self.report_pace()))

    def pressure(self) -> Pressure:
        """Telemetry shed since the last call (here and at the relays), whether a link's telemetry backlogs, and the
        share of the time since the last call the links' handlers were busy (several links share one loop: summed)."""
        relay_shed = sum(link.telemetry_shed for link in self.links.values())
        shed = self.intake.shed
        now, busy_s = time.perf_counter(), self.intake.busy_s
        (then, busy_then), self._busy_seen = self._busy_seen, (now, busy_s)
        pressure = Pressure(
            shed=max(0, shed - self._shed_seen) + max(0, relay_shed - self._relay_shed_seen),
            backlogged=any(
                link.intake is not None and link.intake.backlogged(self.lanes.coalesce_bytes, folds=link.folds)
                for link in self.links.values()
            ),
            busy=min(1.0, (busy_s - busy_then) / (now - then)) if now > then else 1.0,
        )
        self._shed_seen, self._relay_shed_seen = shed, relay_shed
        return pressure

    async def _keep_pace(self) -> None:
        while True:
            await asyncio.sleep(self.pacer.settings.check_s)
            try:
                pressure = self.pressure()
                changed = self.pacer.check(pressure)
                if self.on_thinning is not None:
                    self.on_thinning(time.time(), self.pacer.factor, pressure.shed > 0)
                if changed is not None:
                    log.warning(
                        "agents told to report %s",
                        "less often" if changed.factor > 1 else "at the normal pace again",
                        extra={
                            "factor": changed.factor,
                            "telemetry_s": changed.telemetry_s,
                            "heartbeat_s": changed.heartbeat_s,
                            "shed": pressure.shed,
                            "backlogged": pressure.backlogged,
                            "busy": round(pressure.busy, 3),
                        },
                    )
                    await self._announce_pace()
            except Exception:  # pacing must go on whatever one round met
                log.exception("report pacing failed")

    def register_metrics(self, registry: CollectorRegistry) -> None:
        """The intake's and the pacer's series, read at scrape time (docs/master.md, "Intake lanes")."""
        registry.register(_IntakeCollector(self))


class _IntakeCollector(Collector):
    def __init__(self, hub: RelayHub) -> None:
        self._hub = hub

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        hub, counters = self._hub, self._hub.intake
        waiting = GaugeMetricFamily(
            "idlegrid_master_intake_bytes", "Bytes of relay frames read and waiting to be handled, by lane", labels=["lane"]
        )
        intakes = [link.intake for link in hub.links.values() if link.intake is not None]
        waiting.add_metric(["control"], sum(i.queue.bytes(Lane.CONTROL) for i in intakes))
        waiting.add_metric(["admission"], sum(i.queue.bytes(Lane.ADMISSION) for i in intakes))
        waiting.add_metric(["telemetry"], sum(i.queue.bytes(Lane.TELEMETRY) for i in intakes))
        yield waiting
        shed = CounterMetricFamily(
            "idlegrid_master_telemetry_shed",
            "Heartbeat and telemetry frames let go at the Master's intake: replaced by a newer one of the same agent, "
            "evicted past the byte bound, or left when their agent or link went",
            labels=["reason"],
        )
        shed.add_metric(["replaced"], counters.replaced)
        shed.add_metric(["evicted"], counters.evicted)
        shed.add_metric(["forgotten"], counters.forgotten)
        yield shed
        relays = CounterMetricFamily(
            "idlegrid_master_relay_telemetry_shed", "Telemetry frames the linked relays say they let go, in all"
        )
        relays.add_metric([], sum(link.telemetry_shed for link in hub.links.values()))
        yield relays
        yield CounterMetricFamily(
            "idlegrid_master_intake_frames",
            "Link frames read from every relay (a fold, a relayed agent frame, a notice each): what the Master pays "
            "framing and decoding for",
            value=counters.frames,
        )
        yield CounterMetricFamily(
            "idlegrid_master_intake_waits",
            "Times a relay link's reader waited for room in the control lanes",
            value=counters.waits,
        )
        yield GaugeMetricFamily(
            "idlegrid_master_report_pace_factor",
            "How many times the configured telemetry interval agents are told to report at (1: all is well)",
            value=hub.pacer.factor,
        )


def _only_relays(connection: ServerConnection, request: Request) -> Response | None:
    """Refuse any certificate but a relay's before the upgrade: an agent's certificate is valid TLS here too."""
    try:
        role = peer_identity(connection.transport.get_extra_info("ssl_object")).role
    except PKIError as exc:
        log.warning("relay link refused: %s", exc)
        return connection.respond(http.HTTPStatus.FORBIDDEN, "a relay certificate is required\n")
    if role is not CertRole.ACCESS:
        log.warning("relay link refused: certificate role %r", role.value)
        return connection.respond(http.HTTPStatus.FORBIDDEN, f"certificate role {role.value!r} may not open a relay link\n")
    return None

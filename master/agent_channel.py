"""The agent channel: the one place that handles what relays and agents send the Master.

A relay's link frame (an agent connected or gone, an enrollment, a relayed agent frame, its stats) is routed by
``on_link_frame``. A relayed agent frame is decoded, judged by the agent's sans-I/O session (master/session.py
``AgentSession.receive`` -> ``Verdict``) and the verdict carried out by ``_carry_out``. A frame the session takes goes
to the handler of its kind: one method per kind (``_on_heartbeat``, ``_on_telemetry``, ``_on_command_report``,
``_on_image_pull``, ``_on_agent_report``, ``_on_renew``, ``_on_worker_call``, ``_on_agent_error``), so a new frame
kind, or a hook on one, is one method and one line of ``_take``. The parts these handlers write to (registry,
commands, telemetry, health, events) are built by master/composition.py; the rules live in them, this module only
moves frames between them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import msgspec

from common.errors import EnrollmentError, IdlegridError, ProtocolError
from common.inventory import GpuSample
from common.wire import (
    AccessStats,
    AgentConnected,
    AgentDisconnected,
    AgentEvent,
    AgentEventKind,
    AgentFrame,
    AgentReports,
    CommandAck,
    CommandResult,
    EnrollRequest,
    EnrollResponse,
    Error,
    Heartbeat,
    Hello,
    LinkFrame,
    Relay,
    RenewRequest,
    RenewResponse,
    ReportFold,
    ResultAck,
    Revocations,
    Telemetry,
    VerifyCommit,
    VerifyOpen,
    Welcome,
    WorkerAnswer,
    WorkerCall,
    WorkerOp,
    decode_agent_frame,
    encode,
    error_frame,
)
from master.budget import ReportLimits
from master.changes import SamplesTaken
from master.faults import HealthVerdict, Recovered
from master.link import AccessLink
from master.records import AgentRecord, CommandRecord, GpuRecord
from master.renewal import renew_certificate
from master.session import ASK_HELLO, HELLO_REQUIRED, TAKE, Act, AgentSession, SessionRules, Verdict
from master.states import AgentState
from master.telemetry import SampleWindow, SetAside, kept_sample, plausible_gpu
from master.worker_calls import (
    BUSY_STATUS,
    MAX_CALLS_IN_FLIGHT_PER_AGENT,
    WorkerCalls,
    WorkerPlaces,
    WorkerRef,
    answer_call,
)

if TYPE_CHECKING:
    from master.composition import Parts

log = logging.getLogger(__name__)

LOSE_SLICE = 250  # agents taken offline per turn of the event loop when their relay is lost (``_lose_all``)

# What an agent's last full heartbeat said, kept for the fold's ``alive`` marks (``_on_alive``) when it said nothing
# (no container running or exited, no overlay, no ping echo): one shared object, not a heartbeat, a list and two dicts
# per idle agent. Its date and sequence are never read again (a repeat is handled with its transit aside).
_SAID_NOTHING = Heartbeat(seq=0, ts=0.0)

# Agents in these states are shown reachable; a clean disconnect or a lost relay takes them offline at once.
_CONNECTED = frozenset({AgentState.ENROLLED.value, AgentState.READY.value, AgentState.BUSY.value, AgentState.MAINTENANCE.value})
# States in which a heartbeat that said nothing changes nothing but the agent's liveness (``alive_at_once``): not busy
# (no container running would end its work), not retired (nothing it says is taken).
_IDLE_ALIVE = frozenset(_CONNECTED - {AgentState.BUSY.value})


class AgentChannel:
    """Relay links and the agents behind them: sessions, presence, revocations, and every agent frame's handling."""

    def __init__(self, parts: Parts) -> None:
        # The parts it writes through, bound once: a frame's handling is the Master's hottest path.
        self._authority = parts.authority
        self._changes = parts.changes
        self._commands = parts.commands
        self._config = parts.config
        self._directory = parts.directory
        self._enrollment = parts.enrollment
        self._events = parts.events
        self._health = parts.health
        self._hub = parts.hub
        self._metrics = parts.metrics
        self._registry = parts.registry
        self._telemetry = parts.telemetry
        self._verifier = parts.verifier
        config = parts.config
        self.sessions: dict[str, AgentSession] = {}  # agent id -> its session on its current connection
        self.revoked: set[str] = set()  # certificate serials refused (loaded by the Master, sent to every relay)
        self.relay_stats: dict[str, AccessStats] = {}
        # How each create's image pull goes, as its agent last said ((agent id, container) -> "pulling image: ..."),
        # until the create's result: in memory only, since it is stale the moment the pull ends.
        self.pulls: dict[tuple[str, str], str] = {}
        self.stopping = False  # the Master is going away: a link closing says nothing about its agents
        self._rules = SessionRules(
            hello_ask_interval_s=config.heartbeat_s,
            max_gpus_per_host=config.max_gpus_per_host,
            reports=ReportLimits(config.report_events_per_window, config.report_bytes_per_window, config.report_window_s),
        )
        self._sample_window = SampleWindow(max_age_s=config.sample_max_age_s, max_ahead_s=config.sample_max_ahead_s)
        self._set_aside_logged: dict[str, float] = {}  # agent id -> when a sample of it set aside was last logged
        self._store = parts.store
        # Endpoint workers' calls (master/worker_calls.py): the handler management registers (None: answered 503),
        # where each worker's container was created, and the calls being answered (a take is a long poll: each call
        # runs as a task of its own, so it never holds back the agent's other frames).
        self.worker_calls: WorkerCalls | None = None
        self.worker_places = WorkerPlaces()
        self._worker_tasks: set[asyncio.Task[Any]] = set()
        self._worker_calls_of: dict[str, int] = {}  # agent id -> its calls being answered now
        # Each agent's last full heartbeat from a fold, for as long as its session lasts: a fold names an agent whose
        # heartbeat said nothing new only as alive, and this is what that heartbeat said (``_on_reports``).
        self._heartbeats: dict[str, Heartbeat] = {}

    def forget(self, agent_id: str) -> None:
        """The agent's session ends (it went silent): its next frame starts a new one, which must say hello."""
        self.sessions.pop(agent_id, None)
        self._heartbeats.pop(agent_id, None)

    # --- relay links ---------------------------------------------------------------------------

    async def on_link_frame(self, link: AccessLink, frame: LinkFrame | AgentReports) -> None:
        match frame:
            case Relay():
                await self._on_relayed(link, frame)
            case AgentReports():  # one agent's part of a fold, in its turn (master/intake.py)
                await self._on_reports(link, frame)
            case ReportFold():  # a whole fold, not unfolded by an intake: agent by agent
                for agent_id in frame.alive:
                    await self._on_reports(link, AgentReports(agent_id=agent_id))
                for reports in frame.reports:
                    await self._on_reports(link, reports)
            case AgentConnected():
                await self._on_agent_connected(link, frame)
            case AgentDisconnected():
                await self._on_agent_disconnected(link, frame)
            case EnrollRequest():
                await link.send(encode(await self._enroll(frame)))
            case AccessStats():
                self.relay_stats[link.relay_id] = frame
            case Error():
                log.warning("relay %s reported an error: %s %s", link.relay_id, frame.code, frame.message)
            case _:
                await link.send(
                    encode(Error(code="unexpected_frame", message=f"{type(frame).__name__} is not expected from a relay"))
                )

    async def on_link_opened(self, link: AccessLink) -> None:
        self._metrics.relay_links_opened.inc()
        self._directory.changed()

    async def on_link_closed(self, link: AccessLink) -> None:
        """Every agent this relay carried, and not since reconnected through another, is unreachable now."""
        self._metrics.relay_links_closed.inc()
        lost = []
        for agent_id in list(link.agents):
            if self._hub.agent_links.get(agent_id) is link:
                del self._hub.agent_links[agent_id]
                self.forget(agent_id)
                lost.append(agent_id)
        if not self.stopping:  # this Master going away says nothing about its agents
            await self._lose_all(lost, f"relay {link.relay_id} lost")
            self._directory.changed()

    async def _on_agent_disconnected(self, link: AccessLink, frame: AgentDisconnected) -> None:
        link.agents.discard(frame.agent_id)
        # Only if this link still speaks for it: an agent already back through another relay stays reachable.
        if self._hub.agent_links.get(frame.agent_id) is link:
            del self._hub.agent_links[frame.agent_id]
            await self._lose(frame.agent_id, f"disconnected from relay {link.relay_id}: {frame.reason or 'closed'}")

    async def _lose_all(self, agent_ids: list[str], reason: str) -> None:
        """Many agents gone at once (their relay): batched writes, not one per agent, in slices of ``LOSE_SLICE``
        with a turn of the event loop between them. At once, 5,000 agents and their 40,000 GPUs held the loop
        for 0.7 s (bench/HISTORY.md), every command and frame of every other agent behind them. An agent back
        through another relay before its slice (its hello may be handled in between) is left as it is now."""
        registry, links = self._registry, self._hub.agent_links
        for start in range(0, len(agent_ids), LOSE_SLICE):
            if start:
                await asyncio.sleep(0)
            lost = [i for i in agent_ids[start : start + LOSE_SLICE] if i not in links]
            for agent_id in lost:
                await self._verifier.on_disconnect(agent_id)  # a run in progress there is over
            # Again: a verification run's end may write to the store, and a hello be handled meanwhile.
            back = (registry.agents.get(i) for i in lost if i not in links)
            agents = [a for a in back if a is not None and a.state in _CONNECTED]
            for agent in agents:
                agent.relay = ""
            await registry.transition_many([(agent, reason) for agent in agents], "disconnected")

    async def _lose(self, agent_id: str, reason: str) -> None:
        """The agent's connection is gone: it leaves ``ready`` now rather than after missed heartbeats."""
        self.forget(agent_id)
        await self._verifier.on_disconnect(agent_id)  # a run in progress there is over
        agent = self._registry.agents.get(agent_id)
        if agent is not None and agent.state in _CONNECTED:
            agent.relay = ""
            await self._registry.transition(agent, "disconnected", reason)

    async def announce_to_agents(self, frame: bytes) -> int:
        """Send ``frame`` to every connected agent; how many it reached."""
        hub = self._hub
        sent = await asyncio.gather(*(hub.send_to_agent(agent_id, frame) for agent_id in list(hub.agent_links)))
        return sum(sent)

    async def _on_agent_connected(self, link: AccessLink, frame: AgentConnected) -> None:
        agent = self._registry.agents.get(frame.agent_id)
        if agent is None or frame.serial in self.revoked or agent.state == AgentState.RETIRED.value:
            # A relay with a stale revocation list: tell it again.
            await link.send(encode(Revocations(serials=sorted(self.revoked))))
            return
        link.agents.add(frame.agent_id)
        self._hub.agent_links[frame.agent_id] = link
        # A new connection, a new session: it must say hello again, and is asked at once if it does not.
        self.sessions[frame.agent_id] = AgentSession(frame.agent_id, self._rules)

    async def _enroll(self, request: EnrollRequest) -> EnrollResponse:
        try:
            agent, cert_pem = await self._enrollment.enroll(request.token, request.csr_pem, region=request.region)
        except EnrollmentError as exc:
            self._metrics.enrollments.labels(exc.code).inc()
            await self._events.record("agent.enrollment_refused", request.remote or "unknown", code=exc.code, reason=str(exc))
            return EnrollResponse(req_id=request.req_id, ok=False, error_code=exc.code, error_message=str(exc))
        await self._registry.add(agent)
        self._metrics.enrollments.labels("ok").inc()
        return EnrollResponse(
            req_id=request.req_id,
            ok=True,
            agent_id=agent.id,
            cert_pem=cert_pem.decode(),
            ca_pem=self._authority.ca.chain_pem().decode(),
            command_keys=self._authority.command_keys(),
            key_endorsements=self._authority.key_endorsements(),
            relays=self._directory.current(),
        )

    # --- agent frames: decoded, judged by the session, the verdict carried out ---------------------

    async def _on_relayed(self, link: AccessLink, envelope: Relay) -> None:
        agent_id = envelope.agent_id
        agent = self._registry.agents.get(agent_id)
        if agent is None or agent.state == AgentState.RETIRED.value or self._hub.agent_links.get(agent_id) is not link:
            return  # not (or no longer) connected here: nothing it says is taken
        raw = bytes(envelope.frame)
        try:
            frame = decode_agent_frame(raw)
        except ProtocolError as exc:
            await link.send_to_agent(agent_id, error_frame(exc))
            return
        now = time.time()
        self._metrics.frame_received(frame)
        session = self.sessions.get(agent_id)
        if session is None:
            session = self.sessions[agent_id] = AgentSession(agent_id, self._rules)
        await self._carry_out(link, agent, session, frame, session.receive(frame, len(raw), now), now)

    async def _on_reports(self, link: AccessLink, reports: AgentReports) -> None:
        """One agent's part of a fold (common/wire.py ``ReportFold``): what its frames one by one would have done.

        Each frame is judged by the agent's session and handled as ``_on_relayed`` would, in the agent's order; an agent
        named only as alive sent a heartbeat saying what its last full one said, which is handled again (its liveness,
        and its running containers against the registry now), its transit aside (that heartbeat's date is not this
        one's). A fold's frames are not counted into an agent's report budget: that budget is for events alone."""
        agent_id = reports.agent_id
        agent = self._registry.agents.get(agent_id)
        if agent is None or agent.state == AgentState.RETIRED.value or self._hub.agent_links.get(agent_id) is not link:
            return  # not (or no longer) connected here: nothing it says is taken
        now = time.time()
        session = self.sessions.get(agent_id)
        if session is None:
            session = self.sessions[agent_id] = AgentSession(agent_id, self._rules)
        if not reports.frames:
            await self._on_alive(link, agent, session, now)
        for frame in reports.frames:
            self._metrics.frame_received(frame)
            verdict = session.receive(frame, 0, now)
            if verdict is TAKE and isinstance(frame, Heartbeat):
                said_nothing = not (frame.running or frame.exited or frame.overlay or frame.ping is not None)
                self._heartbeats[agent_id] = _SAID_NOTHING if said_nothing else frame
            await self._carry_out(link, agent, session, frame, verdict, now)

    def alive_at_once(self, link: AccessLink, agent_id: str) -> bool:
        """A fold's ``alive`` name, handled at once when that is all it asks (its intake calls this, master/intake.py
        ``LinkIntake._unfold``); whether it was. The usual one is: an agent connected here, said hello, idle, whose
        last full heartbeat said nothing (``_SAID_NOTHING``), so that its name's whole handling by ``_on_reports`` is
        counting the heartbeat and marking the agent seen, with no store call and no await. Any other (busy, not here,
        a heartbeat that said something, no session yet) is left to ``_on_reports``: False. At 100,000 agents these
        names are 20,000 a second, each several coroutines deep on the way there."""
        agent = self._registry.agents.get(agent_id)
        if agent is None or self._heartbeats.get(agent_id) is not _SAID_NOTHING or agent.state not in _IDLE_ALIVE:
            return False
        session = self.sessions.get(agent_id)
        if session is None or not session.helloed or self._hub.agent_links.get(agent_id) is not link:
            return False
        # What ``_on_alive`` -> ``_on_heartbeat`` does with a heartbeat that said nothing, the agent not busy: a
        # helloed session takes a heartbeat (``AgentSession.receive``), and ``on_running([])`` moves only a busy agent.
        self._metrics.frame_received(_SAID_NOTHING)
        self._registry.on_heartbeat(agent, time.time(), max_gap_s=self._config.heartbeat_s * self._config.missed_heartbeats)
        self._registry.overlay_paths.pop(agent_id, None)
        return True

    async def _on_alive(self, link: AccessLink, agent: AgentRecord, session: AgentSession, now: float) -> None:
        beat = self._heartbeats.get(agent.id)
        if beat is None:  # its relay believes this Master has its heartbeat, which it has not: liveness alone
            if session.helloed:
                self._registry.on_heartbeat(agent, now, max_gap_s=self._config.heartbeat_s * self._config.missed_heartbeats)
            elif session.receive(_SAID_NOTHING, 0, now) is ASK_HELLO:
                # A Master that never had its hello (it took over, or restarted) while the relay goes on folding the
                # agent's unchanged heartbeats into names: a name may be all that ever comes. Asked, as a heartbeat
                # would have it asked (at most once per interval); unasked, it stayed unknown here for good.
                await self._ask_for_hello(link, agent.id)
            return
        self._metrics.frame_received(beat)
        verdict = session.receive(beat, 0, now)
        if verdict is TAKE:
            await self._on_heartbeat(agent, beat, now, transit=False)
        else:
            await self._carry_out(link, agent, session, beat, verdict, now)

    async def _carry_out(
        self, link: AccessLink, agent: AgentRecord, session: AgentSession, frame: AgentFrame, verdict: Verdict, now: float
    ) -> None:
        """Carry out what the session decided about ``frame``."""
        match verdict.act:
            case Act.TAKE:
                await self._take(link, agent, frame, now)
            case Act.WELCOME if isinstance(frame, Hello):
                await self._on_hello(link, agent, frame, verdict.version, now)
                session.welcomed()
            case Act.REFUSE:
                self._metrics.hellos_refused.labels(verdict.code).inc()
                await self._events.record("agent.hello_refused", agent.id, code=verdict.code, reason=verdict.message)
                await link.send_to_agent(agent.id, encode(Error(code=verdict.code, message=verdict.message)))
            case Act.TAKE_AND_ASK_HELLO if isinstance(frame, (CommandAck, CommandResult)):
                await self._on_command_report(link, agent, frame)
                await self._ask_for_hello(link, agent.id)
            case Act.ASK_HELLO:
                await self._ask_for_hello(link, agent.id)
            case Act.DROP:
                self._metrics.reports_dropped.inc()
            case Act.DROP_AND_NOTE:
                self._metrics.reports_dropped.inc()
                budget = session.budget
                assert budget is not None  # a drop is a spend from it
                await self._events.record(
                    "agent_report.budget_exceeded", agent.id, dropped=budget.dropped, dropped_bytes=budget.dropped_bytes
                )
            case Act.IGNORE:
                pass

    async def _take(self, link: AccessLink, agent: AgentRecord, frame: AgentFrame, now: float) -> None:
        """A frame the session took, to the handler of its kind (a hello is the verdict's own: ``_on_hello``)."""
        match frame:
            case Heartbeat():
                await self._on_heartbeat(agent, frame, now)
            case Telemetry():
                await self._on_telemetry(agent, frame, now)
            case CommandAck() | CommandResult():
                await self._on_command_report(link, agent, frame)
            case AgentEvent(kind=AgentEventKind.IMAGE_PULL):
                self._on_image_pull(agent, frame)
            case AgentEvent():
                await self._on_agent_report(agent, frame, now)
            case RenewRequest():
                await self._on_renew(link, agent, frame)
            case VerifyCommit():  # measured verification (master/verifier.py)
                await self._verifier.on_commit(agent.id, frame)
            case VerifyOpen():
                await self._verifier.on_open(agent.id, frame)
            case WorkerCall():
                self._on_worker_call(agent, frame)
            case Error():
                self._on_agent_error(agent, frame)

    async def _on_hello(self, link: AccessLink, agent: AgentRecord, hello: Hello, version: int, now: float) -> None:
        # The agent reads as connected from the registration on, and a command created from then on goes out on this
        # connection at once: the resend below is for what was sent before (on a connection gone), not a second copy.
        hello_at = time.monotonic()
        self._heartbeats.pop(agent.id, None)  # a new session: its relay sends its next heartbeat in full
        await self._registry.on_hello(
            agent, hello.inventory, relay=link.relay_id, region=hello.region, relay_region=link.region, now=now
        )
        # which benchmark it runs, if any, and the challenge forms it answers (docs/verification.md)
        self._verifier.on_hello(agent.id, hello.benchmark, hello.challenge_forms)
        welcome = Welcome(
            version=version,
            agent_id=agent.id,
            heartbeat_s=self._config.heartbeat_s,
            telemetry_s=self._config.telemetry_s,
            command_keys=self._authority.command_keys(),
            key_endorsements=self._authority.key_endorsements(),
            retired_keys=self._authority.keys.retired_keys(),
            relays=self._directory.current(),
        )
        await link.send_to_agent(agent.id, encode(welcome))
        await self._commands.resend_for(agent.id, sent_before=hello_at)

    async def _on_heartbeat(self, agent: AgentRecord, frame: Heartbeat, now: float, *, transit: bool = True) -> None:
        since = now - frame.ts
        if transit and -self._sample_window.max_ahead_s <= since <= self._sample_window.max_age_s:
            # A heartbeat's date is the agent's word too: one dated -1e21 would make the histogram's sum
            # meaningless for the whole fleet, so only a date a real clock could give is observed.
            self._metrics.heartbeat_transit.observe(max(0.0, since))
        self._registry.on_heartbeat(agent, now, max_gap_s=self._config.heartbeat_s * self._config.missed_heartbeats)
        if frame.overlay:  # in memory: the next heartbeat says it again
            self._registry.overlay_paths[agent.id] = frame.overlay
        else:
            self._registry.overlay_paths.pop(agent.id, None)
        if frame.exited:
            await self._registry.on_exited(agent, frame.exited)
        await self._registry.on_running(agent, frame.running)

    async def _on_telemetry(self, agent: AgentRecord, frame: Telemetry, now: float) -> None:
        self._registry.on_heartbeat(agent, now, max_gap_s=self._config.heartbeat_s * self._config.missed_heartbeats)
        # Only samples of GPUs this agent owns: it must not write figures onto another agent's GPUs.
        owned = self._plausible_samples(agent.id, frame.samples, now)
        self._telemetry.ingest(agent.id, owned)
        if self._changes.wants(SamplesTaken):
            self._changes.publish(SamplesTaken(agent_id=agent.id, samples=owned))
        if frame.host is not None:
            self._telemetry.ingest_host(agent.id, frame.host)
        await self._check_health(owned)

    async def _on_command_report(self, link: AccessLink, agent: AgentRecord, frame: CommandAck | CommandResult) -> None:
        commands = self._commands
        if isinstance(frame, CommandAck):
            await commands.on_ack(agent.id, frame.id)
            return
        command = commands.open.get(frame.id)
        if command is not None and command.agent_id == agent.id:
            self.pulls.pop((agent.id, str(command.spec.get("name", ""))), None)  # its pull, if any, is over
            self._learn_worker_place(agent.id, command)
        await commands.on_result(agent.id, frame)  # stored before the ack, so an acked result is never lost
        await link.send_to_agent(agent.id, encode(ResultAck(id=frame.id)))

    def _on_image_pull(self, agent: AgentRecord, frame: AgentEvent) -> None:
        """Progress, every few seconds per pull: kept for the renter's view, not written to the event log."""
        if frame.container and any(c.spec.get("name") == frame.container for c in self._open_creates(agent.id)):
            self.pulls[(agent.id, frame.container)] = frame.message

    async def _on_agent_report(self, agent: AgentRecord, report: AgentEvent, now: float) -> None:
        """An agent's report: recorded apart from the Master's own facts (an agent can report, never write the audit
        log), then what it changes beyond the record of it: an exit, a GPU fault."""
        recorded = msgspec.structs.asdict(report)
        recorded["kind"] = report.kind.value
        storage = recorded.pop("storage")
        if storage is not None:
            recorded["storage"] = msgspec.to_builtins(storage)
        await self._events.record(f"agent_report.{report.kind.value}", agent.id, **recorded)
        if report.kind == AgentEventKind.STORAGE:
            await self._on_storage(agent, report)
            return
        if report.kind == AgentEventKind.CONTAINER_EXITED:
            if report.container and report.code is not None:
                await self._registry.on_exited(agent, {report.container: report.code})
            return
        if report.kind in (AgentEventKind.GPU_XID, AgentEventKind.GPU_ECC) and report.gpu_uuid:
            gpu = self._registry.gpus.get(report.gpu_uuid)
            if gpu is None or gpu.agent_id != agent.id:
                return  # not its GPU: it cannot fault another host's card
            fault = self._health.on_report(gpu, report, now)
            if fault is not None:
                await self._registry.mark_faulty(gpu, fault)

    async def _on_storage(self, agent: AgentRecord, report: AgentEvent) -> None:
        """A workload's data moved (docs/storage.md): recorded under the workload as ``storage.<what>``, where its owner
        reads it; only for a container of that workload this host holds (or is creating or deleting), so a host cannot
        write into another host's workloads."""
        activity, name = report.storage, report.container
        if activity is None or name is None or not activity.workload_id or not name.startswith(activity.workload_id + "-"):
            return
        ours = name in agent.containers or any(
            c.agent_id == agent.id and c.spec.get("name") == name for c in self._commands.open.values()
        )
        if not ours:
            return
        data = msgspec.to_builtins(activity)
        data.pop("workload_id", None)
        await self._events.record(f"storage.{activity.what}", activity.workload_id, agent_id=agent.id, container=name, **data)

    async def _on_renew(self, link: AccessLink, agent: AgentRecord, request: RenewRequest) -> None:
        """A new certificate for the agent this link speaks for: whom it names comes from the link, never the CSR."""
        try:
            cert_pem = renew_certificate(
                self._authority.ca,
                agent,
                request.csr_pem,
                time.time(),
                min_interval_s=self._config.renew_min_interval_s,
                valid_s=self._config.agent_cert_s,
            )
        except IdlegridError as exc:
            await self._events.record("agent.renewal_refused", agent.id, code=exc.code, reason=str(exc))
            await link.send_to_agent(agent.id, encode(RenewResponse(error=str(exc))))
            return
        await self._registry.save(agent)
        await self._events.record("agent.renewed", agent.id, serial=agent.cert_serial, not_after=agent.cert_not_after)
        await link.send_to_agent(agent.id, encode(RenewResponse(cert_pem=cert_pem)))

    def _learn_worker_place(self, agent_id: str, command: CommandRecord) -> None:
        """An endpoint worker's create reached its host: calls for that worker are taken from this agent only."""
        worker = command.spec.get("endpoint_worker") if command.kind == "create_container" else None
        if isinstance(worker, dict):
            name = str(command.spec.get("name", ""))
            self.worker_places.created(str(worker.get("endpoint_id")), str(worker.get("worker_id")), agent_id, name)

    async def _recall_worker_place(self, agent_id: str, call: WorkerCall) -> WorkerRef | None:
        """A worker this process has not seen created (it was, before a restart): its place read back from the store,
        only for a container the Master created on this agent (``agent.containers``), by the newest create of that
        name there, so a host can name only what the Master put on it."""
        agent = self._registry.agents.get(agent_id)
        if (
            agent is None
            or call.container not in agent.containers
            or self.worker_places.is_gone(call.endpoint_id, call.worker_id)
        ):
            return None
        for command in await self._store.commands.list(agent_id=agent_id, states=["succeeded"], limit=1000):
            if command.kind == "create_container" and command.spec.get("name") == call.container:
                self._learn_worker_place(agent_id, command)
                break  # the newest create of that name: an older one's worker is not there any more
        return self.worker_places.ref(agent_id, call)

    async def stop_worker_calls(self) -> None:
        """The Master stops: the calls still waiting (long polls) end unanswered; their workers retry elsewhere."""
        for task in list(self._worker_tasks):
            task.cancel()
        await asyncio.gather(*self._worker_tasks, return_exceptions=True)

    def _on_worker_call(self, agent: AgentRecord, call: WorkerCall) -> None:
        agent_id = agent.id
        if self._worker_calls_of.get(agent_id, 0) >= MAX_CALLS_IN_FLIGHT_PER_AGENT and call.op is not WorkerOp.GONE:
            busy = WorkerAnswer(call_id=call.call_id, status=BUSY_STATUS, body={"error": "too many calls of this host at once"})
            self._spawn_worker_task(agent_id, self._hub.send_to_agent(agent_id, encode(busy)))
            return
        self._worker_calls_of[agent_id] = self._worker_calls_of.get(agent_id, 0) + 1
        self._spawn_worker_task(agent_id, self._answer_worker_call(agent_id, call), counted=True)

    def _spawn_worker_task(self, agent_id: str, work: Coroutine[Any, Any, object], *, counted: bool = False) -> None:
        task = asyncio.create_task(work, name=f"worker-call-{agent_id}")
        self._worker_tasks.add(task)

        def done(task: asyncio.Task[Any]) -> None:
            self._worker_tasks.discard(task)
            if counted:
                left = self._worker_calls_of.pop(agent_id, 1) - 1
                if left:
                    self._worker_calls_of[agent_id] = left

        task.add_done_callback(done)

    async def _answer_worker_call(self, agent_id: str, call: WorkerCall) -> None:
        """Pass an endpoint worker's call to the registered handler and answer it on the agent's connection; a call
        for a worker whose container is not on this agent is refused 403 (no host speaks for another's worker)."""
        worker = self.worker_places.ref(agent_id, call) or await self._recall_worker_place(agent_id, call)
        if worker is not None and call.op is WorkerOp.GONE:
            self.worker_places.forget(call.endpoint_id, call.worker_id)  # before the handler: no call passes after it
        try:
            if worker is None:
                status, body = 403, {"error": "this host holds no such worker"}
            else:
                status, body = await answer_call(self.worker_calls, worker, call)
        except Exception:  # the handler's fault: a 500 and a log line; the worker retries
            log.exception("a worker call failed", extra={"agent_id": agent_id, "op": call.op.value, "worker": call.worker_id})
            status, body = 500, {"error": "internal"}
        if call.op is WorkerOp.GONE:
            return
        # Through the hub, not ``link``: after a long poll the agent may be back through another relay.
        await self._hub.send_to_agent(agent_id, encode(WorkerAnswer(call_id=call.call_id, status=status, body=body)))

    def _on_agent_error(self, agent: AgentRecord, frame: Error) -> None:
        log.info("agent %s reported an error: %s %s", agent.id, frame.code, frame.message)

    async def _ask_for_hello(self, link: AccessLink, agent_id: str) -> None:
        """Tell an agent this process does not know it yet (after a restart, say) to say hello again."""
        await link.send_to_agent(agent_id, encode(Error(code=HELLO_REQUIRED, message="send hello first")))

    def _open_creates(self, agent_id: str) -> list[CommandRecord]:
        return [c for c in self._commands.open.values() if c.agent_id == agent_id and c.kind == "create_container"]

    async def _check_health(self, samples: list[GpuSample]) -> None:
        """Telemetry's part in GPU health (master/faults.py); a store write only when a GPU's health changes."""
        verdicts: list[tuple[GpuRecord, HealthVerdict]] = []
        for sample in samples:
            gpu = self._registry.gpus[sample.uuid]  # owned: checked by the caller
            verdict = self._health.on_sample(gpu, sample)
            if verdict is not None:
                verdicts.append((gpu, verdict))
        for gpu, verdict in verdicts:
            if isinstance(verdict, Recovered):
                await self._registry.clear_fault(gpu, verdict.reason)
            else:
                await self._registry.mark_faulty(gpu, verdict)

    def _plausible_samples(self, agent_id: str, samples: list[GpuSample], now: float) -> list[GpuSample]:
        """The samples of GPUs ``agent_id`` owns that are plausible (master/telemetry.py ``plausible_gpu``), as the
        Master keeps them (``kept_sample``); each one set aside is counted, and logged at most once per report window per
        agent, so a hostile agent cannot flood the log. The rest of the frame is taken: one bad record never holds back
        the others."""
        taken: list[GpuSample] = []
        for sample in samples:
            gpu = self._registry.gpus.get(sample.uuid)
            if gpu is None or gpu.agent_id != agent_id:
                continue  # it must not write figures onto another agent's GPUs
            checked = plausible_gpu(sample, gpu.info.memory_total_mib, now, self._sample_window)
            if isinstance(checked, SetAside):
                self._metrics.samples_set_aside.labels(checked.figure).inc()
                if now - self._set_aside_logged.get(agent_id, float("-inf")) >= self._config.report_window_s:
                    self._set_aside_logged[agent_id] = now
                    log.warning(
                        "telemetry sample set aside",
                        extra={"agent_id": agent_id, "gpu_uuid": sample.uuid, "figure": checked.figure, "why": checked.detail},
                    )
                continue
            taken.append(kept_sample(checked, gpu.uuid))
        return taken

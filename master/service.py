"""The Master: composes its parts, runs them, and offers the operations the management API calls.

What each part owns: the registry (agents and GPUs), the GPU allocations, the command ledger, the
relay hub (links), one sans-I/O session per connected agent (master/session.py) and the background
loops (master/loops.py). This module moves frames between them and keeps their lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import msgspec

from common.errors import Conflict, EnrollmentError, IdlegridError, InvalidRating, NotFound, ProtocolError
from common.inventory import GpuSample
from common.pki import server_tls_context
from common.wire import (
    CLOSE_NOT_LEADER,
    AccessStats,
    AgentConnected,
    AgentDisconnected,
    AgentEvent,
    AgentEventKind,
    AgentFrame,
    CommandAck,
    CommandResult,
    Config,
    EnrollRequest,
    EnrollResponse,
    Error,
    Heartbeat,
    Hello,
    LinkFrame,
    Relay,
    RelayEntry,
    RenewRequest,
    RenewResponse,
    ResultAck,
    Revocations,
    Telemetry,
    VerifyCommit,
    VerifyOpen,
    Welcome,
    decode_agent_frame,
    encode,
    error_frame,
)
from master.accounts import BOOTSTRAP_ACCOUNT, AccountBook, AccountRole
from master.allocations import GpuAllocations, offered
from master.authority import Authority
from master.budget import ReportLimits
from master.changes import ChangeFeed, CommandFinished
from master.commands import CommandLedger
from master.config import MasterConfig
from master.directory import RelayDirectoryAnnouncer
from master.enrollment import Enrollment
from master.events import EventLog
from master.faults import FaultRules, HealthVerdict, HealthWatch, Recovered
from master.history import HistoryKeeper
from master.keys import SigningKeyInfo
from master.leadership import Leadership, LeaseTiming, Role
from master.link import AccessLink, RelayHub
from master.loops import Loop
from master.metrics import FleetGauges, MasterMetrics
from master.network_floors import NetworkFloors
from master.records import (
    AgentRecord,
    ApiKeyRecord,
    CommandRecord,
    EventRecord,
    GpuRecord,
    LeaseRecord,
    RevocationRecord,
    TokenRecord,
)
from master.registry import Registry
from master.renewal import renew_certificate
from master.reputation import Reputation, reputation
from master.session import HELLO_REQUIRED, Act, AgentSession, SessionRules, Verdict
from master.states import AgentState, GpuState
from master.store import open_store
from master.store.base import Store
from master.store.fenced import fenced
from master.telemetry import SampleWindow, SetAside, TelemetryAggregator, plausible_gpu
from master.tiers import TierPolicy
from master.tunnels import TunnelDispatch
from master.verifier import Verifier, verifier_for

log = logging.getLogger(__name__)

# Agents in these states are shown reachable; a clean disconnect or a lost relay takes them offline at once.
_CONNECTED = frozenset({AgentState.ENROLLED.value, AgentState.READY.value, AgentState.BUSY.value, AgentState.MAINTENANCE.value})
SLOW_FLUSH_S = 1.0  # a flush longer than this is logged: writes queued behind it wait as long


class Master:
    def __init__(self, config: MasterConfig, *, store: Store | None = None) -> None:
        self.config = config
        self.state_dir = config.state_path
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = store or open_store(config.resolved_store_url())
        # High availability (docs/ha.md): the leader lease decides whether this Master serves, and fences its writes.
        self.leadership: Leadership | None = None
        self._taken_over = False  # the state is loaded and the loops run (high availability: once elected)
        self.on_elected: list[Callable[[], Awaitable[None]]] = []  # what serving needs beyond the Master (the API's loops)
        if config.ha:
            self.leadership = Leadership(
                self.store.leases,
                config.node_id or f"{socket.gethostname()}:{config.api_port}",
                timing=LeaseTiming(ttl_s=config.lease_ttl_s, renew_s=config.lease_renew_s, margin_s=config.lease_margin_s),
                on_elected=self._elected,
                on_deposed=self._deposed,
            )
            self.store = fenced(self.store, self.leadership.fence)
        self.authority = Authority.open(self.state_dir, names=config.server_names, ips=config.server_ips)
        self.policy = TierPolicy.load(Path(config.tier_policy) if config.tier_policy else None)
        self.events = EventLog(self.store)
        self.allocations = GpuAllocations()
        self.changes = ChangeFeed()  # what management code (a scheduler) subscribes to: master/changes.py
        self.registry = Registry(self.store, self.events, self.policy, self.allocations, changes=self.changes)
        self.health = HealthWatch(
            FaultRules(
                fatal_xids=frozenset(config.fatal_xids),
                max_temperature_c=config.max_temperature_c,
                overheat_samples=config.overheat_samples,
                cool_samples=config.cool_samples,
            )
        )
        self.telemetry = TelemetryAggregator(self.store)
        # Told of every batch of owned samples as it is ingested (agent id, samples): management's alert evaluation
        # sees each sample, not only the latest. A listener must be cheap and must not raise.
        self.sample_listeners: list[Callable[[str, list[GpuSample]], None]] = []
        self.history = HistoryKeeper(
            self.store,
            lambda: self.registry.gpus.keys(),
            minute_retention_s=self.config.history_minute_retention_s,
            hourly_retention_s=self.config.history_hourly_retention_s,
            agent_ids=lambda: self.registry.agents.keys(),  # hosts' own history
        )
        self.network_floors = NetworkFloors(self.policy)  # hosts kept from a tier by their bandwidth (metrics)
        self.accounts = AccountBook(self.store, max_keys=config.api_keys_per_account)
        self.enrollment = Enrollment(self.store, self.authority.ca, cert_validity_s=config.agent_cert_s)
        self.hub = RelayHub(
            server_tls_context(
                self.authority.cert_file, self.authority.key_file, self.authority.ca_file, require_client_cert=True
            ),
            self._on_link_frame,
            self._on_link_closed,
            lambda: sorted(self._revoked),
            on_open=self._on_link_opened,
            refusal=self._link_refusal,
        )
        self.ledger = CommandLedger(
            self.store,
            self.events,
            self.registry,
            self.authority.keys,
            self.hub.send_to_agent,
            timeout_s=config.command_timeout_s,
        )
        self.verifier: Verifier = verifier_for(
            config, self.registry, self.events, self.hub.send_to_agent, self.policy
        )  # verification
        self.tunnels = TunnelDispatch(
            self.hub, self.authority.keys, self.events, ticket_s=config.tunnel_ticket_s, bytes_per_s=config.tunnel_bytes_per_s
        )
        self.metrics = MasterMetrics(
            FleetGauges(
                lambda: self.registry.agents.values(),
                lambda: self.registry.gpus.values(),
                lambda: self.ledger.open.values(),
                lambda: len(self.hub.links),
                latest=lambda: self.telemetry.latest,
                per_gpu=config.metrics_per_gpu,
                below_network_floor=lambda: [
                    short.agent for short in self.network_floors.shortfalls(self.registry.agents.values(), self.registry.gpus_of)
                ],
            )
        )
        self.ledger.on_final = self._command_finished
        self.store.metrics.register(self.metrics.registry)
        self._revoked: set[str] = set()
        self.sessions: dict[str, AgentSession] = {}  # agent id -> its session on its current connection
        self._rules = SessionRules(
            hello_ask_interval_s=config.heartbeat_s,
            max_gpus_per_host=config.max_gpus_per_host,
            reports=ReportLimits(config.report_events_per_window, config.report_bytes_per_window, config.report_window_s),
        )
        self._sample_window = SampleWindow(max_age_s=config.sample_max_age_s, max_ahead_s=config.sample_max_ahead_s)
        self._set_aside_logged: dict[str, float] = {}  # agent id -> when a sample of it set aside was last logged
        self.directory = RelayDirectoryAnnouncer(
            lambda: self.hub.links.values(), self._announce_to_agents, coalesce_s=config.relay_directory_coalesce_s
        )
        self._stopping = False
        self.started_at = 0.0
        self._agents_flushed_at = 0.0  # monotonic time of the last heartbeat flush (master/config.py, heartbeat_flush_s)
        self.relay_stats: dict[str, AccessStats] = {}
        # How each create's image pull goes, as its agent last said ((agent id, container) -> "pulling image: ..."),
        # until the create's result: in memory only, since it is stale the moment the pull ends.
        self.pulls: dict[tuple[str, str], str] = {}
        self.link_port = 0
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if self.leadership is not None:
            raise RuntimeError("a Master with ha on starts with start_standby(api_url)")
        await self.store.open()
        await self._load()
        self.link_port = await self.hub.start(self.config.host, self.config.link_port)
        self._run_loops()

    async def _load(self) -> None:
        """What serving starts from: the registry, open commands, accounts, revocations, as the store has them."""
        await self.registry.load()
        await self.ledger.load()
        # Keys naming no account (the bootstrap operator key of a Master older than accounts) belong to this one.
        await self.accounts.ensure(BOOTSTRAP_ACCOUNT, AccountRole.OPERATOR, name="Operator")
        await self.accounts.adopt_legacy_keys()
        self._revoked = await self._load_revocations()
        await self._report_quarantined()

    def _run_loops(self) -> None:
        self.started_at = time.time()
        self._agents_flushed_at = time.monotonic()
        restart_s = self.config.loop_restart_s
        self._tasks = [
            Loop("sweep", min(1.0, self.config.heartbeat_s / 4), self._sweep, restart_s).start(),
            Loop("flush", self.config.rollup_flush_s, self._flush, restart_s).start(),
            Loop("history", self.config.history_period_s, self._keep_history, restart_s).start(),
            Loop("verification", self.config.verify_loop_s, self.verifier.step, restart_s).start(),
        ]
        log.info("master started", extra={"link_port": self.link_port, "store": self.store.backend})

    # --- high availability (master/leadership.py, docs/ha.md) ----------------------------------

    async def start_standby(self, api_url: str) -> None:
        """Open the store, listen for relays (refused until elected) and run the election; ``api_url``: where callers
        reach this Master's API, named in the lease. Serving starts when the lease is taken (``on_elected``)."""
        assert self.leadership is not None
        await self.store.open()
        self.link_port = await self.hub.start(self.config.host, self.config.link_port)
        advertised = self.config.advertise_host or self.config.host
        self.leadership.url = f"wss://{advertised}:{self.link_port}/link"
        self.leadership.api_url = api_url
        self.leadership.start()
        log.info("master standing by", extra={"link_port": self.link_port, "holder": self.leadership.holder})

    @property
    def role(self) -> str:
        """leader | standby | stepped_down; a Master without ha is always the leader."""
        return Role.LEADER.value if self.leadership is None else self.leadership.role.value

    def leads(self) -> bool:
        """Whether this Master may write now (always, without ha)."""
        return self.leadership is None or self.leadership.leads()

    def serves(self) -> bool:
        """Whether relays and API calls are taken: it leads, and has loaded the state it took over."""
        return self.leadership is None or (self._taken_over and self.leadership.leads())

    def _link_refusal(self) -> str | None:
        if self.leadership is None or self.serves():
            return None
        return self.leadership.leader_url()

    async def _elected(self, lease: LeaseRecord) -> None:
        """The lease is ours: load what the store holds now (the previous leader's last writes) and serve."""
        self.store.writes_by(lease.holder, lease.epoch)
        await self._load()
        self._run_loops()
        for take_over in self.on_elected:
            await take_over()
        self._taken_over = True
        log.info("master leading", extra={"epoch": lease.epoch, "holder": lease.holder})

    async def _deposed(self, reason: str) -> None:
        """The lease is lost: writes are refused already (the fence); stop the loops and hand the relays over."""
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        assert self.leadership is not None
        await self.hub.close_links(CLOSE_NOT_LEADER, self.leadership.leader_url())

    async def stop(self) -> None:
        """Graceful stop (SIGTERM): close the relay links, flush what is held in memory, close the store.

        Links close first, and their handlers run to the end: every frame a relay already sent is
        handled (a result stored and acknowledged) before the store closes. A relay counts a frame as
        delivered once it is written to the link, so this is what keeps them from being lost.
        """
        self._stopping = True
        await self.hub.stop()
        await self.directory.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.leads():  # a standby holds nothing to flush; a deposed leader may write nothing more
            await self.telemetry.flush(time.time(), everything=True)
            await self.registry.flush()
        if self.leadership is not None:
            await self.leadership.stop(release=True)
        await self.store.close()
        log.info("master stopped")

    @property
    def link_url(self) -> str:
        return f"wss://{self.config.host}:{self.link_port}/link"

    async def _load_revocations(self) -> set[str]:
        try:
            return {r.serial for r in await self.store.revocations.list()}
        except Exception as exc:
            # Relays keep the list they have; revocations made from now on are still sent to them.
            log.error("could not load revocations; serving the rest: %s", exc)
            await self.events.record("master.load_failed", "revocations", problem=str(exc))
            return set()

    async def _sweep(self) -> None:
        """Agents silent too long go offline; commands past their deadline time out."""
        now = time.time()
        silence = self.config.heartbeat_s * self.config.missed_heartbeats
        in_grace = self._in_start_grace(now, silence)
        if not in_grace:
            for agent_id in await self.registry.sweep(now, silence):
                self.sessions.pop(agent_id, None)
        await self.ledger.expire(now, spare_created_before=self.started_at if in_grace else 0.0)
        await self._report_quarantined()

    async def _report_quarantined(self) -> None:
        """One event for each stored record the store found undecodable (and skipped) since the last report."""
        for found in self.store.quarantine.take_unreported():
            await self.events.record(
                "store.quarantined", found.key, aggregate=found.aggregate.value, backend=found.backend, reason=found.reason
            )

    def _in_start_grace(self, now: float, silence: float) -> bool:
        """Whether this process is too young to judge anyone's silence.

        After a restart the stored ``last_seen`` dates from before the crash (heartbeats are written
        only with each flush), so sweeping at once would send every agent offline before its relay
        had even reconnected. Silence is counted from the start instead: each agent gets one full
        heartbeat timeout to be heard again. ``last_seen`` itself is left alone, so it stays the
        time the agent was last heard and uptime is not credited for the outage. Commands inherited
        from the previous process wait too before they time out: results a relay buffered while the
        Master was down arrive in that window.
        """
        return now - self.started_at < silence

    async def _flush(self) -> None:
        """Telemetry rollups and heartbeat-only agent changes, written in batches."""
        started = time.monotonic()
        rollups = await self.telemetry.flush(time.time())
        agents = 0
        if started - self._agents_flushed_at >= self.config.heartbeat_flush_s:
            self._agents_flushed_at = started
            agents = await self.registry.flush()
        took = time.monotonic() - started
        if took > SLOW_FLUSH_S:
            log.warning("slow flush", extra={"rollups": rollups, "agents": agents, "seconds": round(took, 2)})

    async def _keep_history(self) -> None:
        """Finished hours of telemetry downsampled; rollups past retention deleted (master/history.py)."""
        done = await self.history.step(time.time())
        if done["hours"] or done["deleted"]:
            log.info("telemetry history kept", extra=done)

    # --- relay links ---------------------------------------------------------------------------

    async def _on_link_frame(self, link: AccessLink, frame: LinkFrame) -> None:
        match frame:
            case Relay():
                await self._on_relayed(link, frame)
            case AgentConnected():
                await self._on_agent_connected(link, frame)
            case AgentDisconnected():
                link.agents.discard(frame.agent_id)
                # Only if this link still speaks for it: an agent already back through another relay stays reachable.
                if self.hub.agent_links.get(frame.agent_id) is link:
                    del self.hub.agent_links[frame.agent_id]
                    await self._lose(frame.agent_id, f"disconnected from relay {link.relay_id}: {frame.reason or 'closed'}")
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

    async def _on_link_opened(self, link: AccessLink) -> None:
        self.metrics.relay_links_opened.inc()
        self.directory.changed()

    async def _on_link_closed(self, link: AccessLink) -> None:
        """Every agent this relay carried, and not since reconnected through another, is unreachable now."""
        self.metrics.relay_links_closed.inc()
        lost = []
        for agent_id in list(link.agents):
            if self.hub.agent_links.get(agent_id) is link:
                del self.hub.agent_links[agent_id]
                self.sessions.pop(agent_id, None)
                lost.append(agent_id)
        if not self._stopping:  # this Master going away says nothing about its agents
            await self._lose_all(lost, f"relay {link.relay_id} lost")
        if not self._stopping:
            self.directory.changed()

    async def _lose_all(self, agent_ids: list[str], reason: str) -> None:
        """Many agents gone at once (their relay): one batched write, not one per agent."""
        agents = [a for a in (self.registry.agents.get(i) for i in agent_ids) if a is not None and a.state in _CONNECTED]
        for agent in agents:
            agent.relay = ""
        await self.registry.transition_many([(agent, reason) for agent in agents], "disconnected")

    async def _lose(self, agent_id: str, reason: str) -> None:
        """The agent's connection is gone: it leaves ``ready`` now rather than after missed heartbeats."""
        self.sessions.pop(agent_id, None)
        await self.verifier.on_disconnect(agent_id)  # verification
        agent = self.registry.agents.get(agent_id)
        if agent is not None and agent.state in _CONNECTED:
            agent.relay = ""
            await self.registry.transition(agent, "disconnected", reason)

    def relay_directory(self) -> list[RelayEntry]:
        """Every relay linked now that told where agents dial it, by id."""
        return self.directory.current()

    def enrollment_urls(self) -> list[tuple[str, str]]:
        """(region, https:// URL) of every relay linked now that told where its HTTPS port (enrollment) is, by relay id:
        what a new host enrolls through (management/onboarding/)."""
        links = sorted(self.hub.links.values(), key=lambda link: link.relay_id)
        return [(link.region, link.http_url) for link in links if link.http_url]

    def ca_chain_pem(self) -> bytes:
        """The platform CA's certificate chain: public, what an enrolling host trusts its relay by."""
        return self.authority.ca.chain_pem()

    async def _announce_to_agents(self, frame: bytes) -> None:
        await asyncio.gather(*(self.hub.send_to_agent(agent_id, frame) for agent_id in list(self.hub.agent_links)))

    async def _on_agent_connected(self, link: AccessLink, frame: AgentConnected) -> None:
        agent = self.registry.agents.get(frame.agent_id)
        if agent is None or frame.serial in self._revoked or agent.state == AgentState.RETIRED.value:
            # A relay with a stale revocation list: tell it again.
            await link.send(encode(Revocations(serials=sorted(self._revoked))))
            return
        link.agents.add(frame.agent_id)
        self.hub.agent_links[frame.agent_id] = link
        # A new connection, a new session: it must say hello again, and is asked at once if it does not.
        self.sessions[frame.agent_id] = AgentSession(frame.agent_id, self._rules, time.time())

    async def _on_relayed(self, link: AccessLink, envelope: Relay) -> None:
        agent_id = envelope.agent_id
        agent = self.registry.agents.get(agent_id)
        if agent is None or agent.state == AgentState.RETIRED.value or self.hub.agent_links.get(agent_id) is not link:
            return  # not (or no longer) connected here: nothing it says is taken
        raw = bytes(envelope.frame)
        try:
            frame = decode_agent_frame(raw)
        except ProtocolError as exc:
            await link.send_to_agent(agent_id, error_frame(exc))
            return
        now = time.time()
        self.metrics.frame_received(frame)
        session = self.sessions.get(agent_id)
        if session is None:
            session = self.sessions[agent_id] = AgentSession(agent_id, self._rules, now)
        await self._act(link, agent, session, frame, session.receive(frame, len(raw), now), now)

    # --- agent frames --------------------------------------------------------------------------

    async def _act(
        self, link: AccessLink, agent: AgentRecord, session: AgentSession, frame: AgentFrame, verdict: Verdict, now: float
    ) -> None:
        """Carry out what the session decided about ``frame``."""
        match verdict.act:
            case Act.TAKE:
                await self._take(link, agent, frame, now)
            case Act.WELCOME if isinstance(frame, Hello):
                await self._welcome(link, agent, frame, verdict.version, now)
                session.welcomed()
            case Act.REFUSE:
                self.metrics.hellos_refused.labels(verdict.code).inc()
                await self.events.record("agent.hello_refused", agent.id, code=verdict.code, reason=verdict.message)
                await link.send_to_agent(agent.id, encode(Error(code=verdict.code, message=verdict.message)))
            case Act.TAKE_AND_ASK_HELLO if isinstance(frame, (CommandAck, CommandResult)):
                await self._on_command_report(link, agent, frame)
                await self._ask_for_hello(link, agent.id)
            case Act.ASK_HELLO:
                await self._ask_for_hello(link, agent.id)
            case Act.DROP:
                self.metrics.reports_dropped.inc()
            case Act.DROP_AND_NOTE:
                self.metrics.reports_dropped.inc()
                budget = session.budget
                await self.events.record(
                    "agent_report.budget_exceeded", agent.id, dropped=budget.dropped, dropped_bytes=budget.dropped_bytes
                )
            case Act.IGNORE:
                pass

    async def _take(self, link: AccessLink, agent: AgentRecord, frame: AgentFrame, now: float) -> None:
        match frame:
            case Heartbeat():
                transit = now - frame.ts
                if -self._sample_window.max_ahead_s <= transit <= self._sample_window.max_age_s:
                    # A heartbeat's date is the agent's word too: one dated -1e21 would make the histogram's sum
                    # meaningless for the whole fleet, so only a date a real clock could give is observed.
                    self.metrics.heartbeat_transit.observe(max(0.0, transit))
                self.registry.on_heartbeat(agent, now, max_gap_s=self.config.heartbeat_s * self.config.missed_heartbeats)
                if frame.exited:
                    await self.registry.on_exited(agent, frame.exited)
                await self.registry.on_running(agent, frame.running)
            case Telemetry():
                self.registry.on_heartbeat(agent, now, max_gap_s=self.config.heartbeat_s * self.config.missed_heartbeats)
                # Only samples of GPUs this agent owns: it must not write figures onto another agent's GPUs.
                owned = self._plausible_samples(agent.id, frame.samples, now)
                self.telemetry.ingest(agent.id, owned)
                for listener in self.sample_listeners:
                    listener(agent.id, owned)
                if frame.host is not None:
                    self.telemetry.ingest_host(agent.id, frame.host)
                await self._check_health(owned)
            case CommandAck() | CommandResult():
                await self._on_command_report(link, agent, frame)
            case AgentEvent(kind=AgentEventKind.IMAGE_PULL):
                # Progress, every few seconds per pull: kept for the renter's view, not written to the event log.
                if frame.container and any(c.spec.get("name") == frame.container for c in self._open_creates(agent.id)):
                    self.pulls[(agent.id, frame.container)] = frame.message
            case AgentEvent():
                # Kept apart from the Master's own facts: an agent can report, never write the audit log.
                report = msgspec.structs.asdict(frame)
                report["kind"] = frame.kind.value
                await self.events.record(f"agent_report.{frame.kind.value}", agent.id, **report)
                await self._on_agent_report(agent, frame, now)
            case RenewRequest():
                await self._on_renew(link, agent, frame)
            case VerifyCommit():  # verification (master/verifier.py)
                await self.verifier.on_commit(agent.id, frame)
            case VerifyOpen():
                await self.verifier.on_open(agent.id, frame)
            case Error():
                log.info("agent %s reported an error: %s %s", agent.id, frame.code, frame.message)

    async def _on_command_report(self, link: AccessLink, agent: AgentRecord, frame: CommandAck | CommandResult) -> None:
        if isinstance(frame, CommandAck):
            await self.ledger.on_ack(agent.id, frame.id)
            return
        command = self.ledger.open.get(frame.id)
        if command is not None and command.agent_id == agent.id:
            self.pulls.pop((agent.id, str(command.spec.get("name", ""))), None)  # its pull, if any, is over
        await self.ledger.on_result(agent.id, frame)  # stored before the ack, so an acked result is never lost
        await link.send_to_agent(agent.id, encode(ResultAck(id=frame.id)))

    async def _ask_for_hello(self, link: AccessLink, agent_id: str) -> None:
        """Tell an agent this process does not know it yet (after a restart, say) to say hello again."""
        await link.send_to_agent(agent_id, encode(Error(code=HELLO_REQUIRED, message="send hello first")))

    async def _on_agent_report(self, agent: AgentRecord, report: AgentEvent, now: float) -> None:
        """What an agent's report changes beyond the record of it: an exit, a GPU fault."""
        if report.kind == AgentEventKind.CONTAINER_EXITED:
            if report.container and report.code is not None:
                await self.registry.on_exited(agent, {report.container: report.code})
            return
        if report.kind in (AgentEventKind.GPU_XID, AgentEventKind.GPU_ECC) and report.gpu_uuid:
            gpu = self.registry.gpus.get(report.gpu_uuid)
            if gpu is None or gpu.agent_id != agent.id:
                return  # not its GPU: it cannot fault another host's card
            fault = self.health.on_report(gpu, report, now)
            if fault is not None:
                await self.registry.mark_faulty(gpu, fault)

    async def _check_health(self, samples: list[GpuSample]) -> None:
        """Telemetry's part in GPU health (master/faults.py); a store write only when a GPU's health changes."""
        verdicts: list[tuple[GpuRecord, HealthVerdict]] = []
        for sample in samples:
            gpu = self.registry.gpus[sample.uuid]  # owned: checked by the caller
            verdict = self.health.on_sample(gpu, sample)
            if verdict is not None:
                verdicts.append((gpu, verdict))
        for gpu, verdict in verdicts:
            if isinstance(verdict, Recovered):
                await self.registry.clear_fault(gpu, verdict.reason)
            else:
                await self.registry.mark_faulty(gpu, verdict)

    def _command_finished(self, record: CommandRecord) -> None:
        self.metrics.command_finished(record)
        if self.changes.listening:
            self.changes.publish(
                CommandFinished(
                    command_id=record.id,
                    agent_id=record.agent_id,
                    kind=record.kind,
                    state=record.state,
                    container=str(record.spec.get("name", "")),
                    error=record.error,
                )
            )

    def _plausible_samples(self, agent_id: str, samples: list[GpuSample], now: float) -> list[GpuSample]:
        """The samples of GPUs ``agent_id`` owns that are plausible (master/telemetry.py ``plausible_gpu``); each one
        set aside is counted, and logged at most once per report window per agent, so a hostile agent cannot flood the
        log. The rest of the frame is taken: one bad record never holds back the others."""
        taken: list[GpuSample] = []
        for sample in samples:
            gpu = self.registry.gpus.get(sample.uuid)
            if gpu is None or gpu.agent_id != agent_id:
                continue  # it must not write figures onto another agent's GPUs
            checked = plausible_gpu(sample, gpu.info.memory_total_mib, now, self._sample_window)
            if isinstance(checked, SetAside):
                self.metrics.samples_set_aside.labels(checked.figure).inc()
                if now - self._set_aside_logged.get(agent_id, float("-inf")) >= self.config.report_window_s:
                    self._set_aside_logged[agent_id] = now
                    log.warning(
                        "telemetry sample set aside",
                        extra={"agent_id": agent_id, "gpu_uuid": sample.uuid, "figure": checked.figure, "why": checked.detail},
                    )
                continue
            taken.append(checked)
        return taken

    async def _welcome(self, link: AccessLink, agent: AgentRecord, hello: Hello, version: int, now: float) -> None:
        await self.registry.on_hello(
            agent, hello.inventory, relay=link.relay_id, region=hello.region, relay_region=link.region, now=now
        )
        self.verifier.on_hello(agent.id, hello.benchmark)  # verification
        welcome = Welcome(
            version=version,
            agent_id=agent.id,
            heartbeat_s=self.config.heartbeat_s,
            telemetry_s=self.config.telemetry_s,
            command_keys=self.authority.command_keys(),
            key_endorsements=self.authority.key_endorsements(),
            retired_keys=self.authority.keys.retired_keys(),
            relays=self.relay_directory(),
        )
        await link.send_to_agent(agent.id, encode(welcome))
        await self.ledger.resend_for(agent.id)

    async def _on_renew(self, link: AccessLink, agent: AgentRecord, request: RenewRequest) -> None:
        """A new certificate for the agent this link speaks for: whom it names comes from the link, never the CSR."""
        try:
            cert_pem = renew_certificate(
                self.authority.ca,
                agent,
                request.csr_pem,
                time.time(),
                min_interval_s=self.config.renew_min_interval_s,
                valid_s=self.config.agent_cert_s,
            )
        except IdlegridError as exc:
            await self.events.record("agent.renewal_refused", agent.id, code=exc.code, reason=str(exc))
            await link.send_to_agent(agent.id, encode(RenewResponse(error=str(exc))))
            return
        await self.registry.save(agent)
        await self.events.record("agent.renewed", agent.id, serial=agent.cert_serial, not_after=agent.cert_not_after)
        await link.send_to_agent(agent.id, encode(RenewResponse(cert_pem=cert_pem)))

    # --- command-signing keys ------------------------------------------------------------------

    async def rotate_signing_key(self) -> SigningKeyInfo:
        """A new current key; the old one keeps verifying commands already signed until it is retired."""
        info = self.authority.keys.rotate()
        await self.events.record("signing_key.rotated", info.key_id)
        await self._announce_keys()
        return info

    async def retire_signing_key(self, key_id: str) -> SigningKeyInfo:
        """Agents stop trusting ``key_id``; open commands it signed are re-signed first, so none is lost."""
        info = self.authority.keys.retire(key_id)
        resigned = await self.ledger.resign_retired(key_id)
        await self.events.record("signing_key.retired", key_id, resigned=resigned)
        await self._announce_keys()
        return info

    async def _announce_keys(self) -> int:
        """Tell every connected agent the keys in force now; agents not connected learn them in their welcome."""
        frame = encode(
            Config(
                command_keys=self.authority.command_keys(),
                key_endorsements=self.authority.key_endorsements(),
                retired_keys=self.authority.keys.retired_keys(),
            )
        )
        sent = await asyncio.gather(*(self.hub.send_to_agent(agent_id, frame) for agent_id in list(self.hub.agent_links)))
        return sum(sent)

    # --- enrollment, tokens, revocation --------------------------------------------------------

    async def _enroll(self, request: EnrollRequest) -> EnrollResponse:
        try:
            agent, cert_pem = await self.enrollment.enroll(request.token, request.csr_pem, region=request.region)
        except EnrollmentError as exc:
            self.metrics.enrollments.labels(exc.code).inc()
            await self.events.record("agent.enrollment_refused", request.remote or "unknown", code=exc.code, reason=str(exc))
            return EnrollResponse(req_id=request.req_id, ok=False, error_code=exc.code, error_message=str(exc))
        await self.registry.add(agent)
        self.metrics.enrollments.labels("ok").inc()
        return EnrollResponse(
            req_id=request.req_id,
            ok=True,
            agent_id=agent.id,
            cert_pem=cert_pem.decode(),
            ca_pem=self.authority.ca.chain_pem().decode(),
            command_keys=self.authority.command_keys(),
            key_endorsements=self.authority.key_endorsements(),
            relays=self.relay_directory(),
        )

    async def revoke(self, agent_id: str, reason: str = "revoked by an operator") -> AgentRecord:
        agent = self.registry.get(agent_id)
        now = time.time()
        # Every certificate the agent holds that is still valid, not just its latest: renewal leaves the old one usable.
        serials = [s for s in (agent.cert_serial, *agent.previous_serials) if s and s not in self._revoked]
        for serial in serials:
            self._revoked.add(serial)
            await self.store.revocations.put(RevocationRecord(serial=serial, agent_id=agent.id, revoked_at=now, reason=reason))
        await self.registry.transition(agent, "revoke", reason)
        await self.hub.broadcast(encode(Revocations(serials=sorted(self._revoked))))
        return agent

    async def drain(self, agent_id: str) -> AgentRecord:
        """The host takes no new work and its free GPUs are no longer offered; running containers stay."""
        agent = self.registry.get(agent_id)
        if agent.state != AgentState.MAINTENANCE.value and not self.registry.may(agent, "drain"):
            raise Conflict(f"agent {agent_id} is {agent.state} and cannot be drained")
        agent.drained = True
        if not await self.registry.transition(agent, "drain", "drained by an operator"):
            await self.registry.save(agent)
        return agent

    async def undrain(self, agent_id: str) -> AgentRecord:
        """A drained host takes work again, and its free GPUs are offered again."""
        agent = self.registry.get(agent_id)
        if not agent.drained and agent.state != AgentState.MAINTENANCE.value:
            raise Conflict(f"agent {agent_id} is {agent.state} and not drained")
        agent.drained = False
        if not await self.registry.transition(agent, "undrain", "undrained by an operator"):
            await self.registry.save(agent)  # offline (or quarantined): comes back ready, not to maintenance
            await self.registry.settle_gpus(agent)
        return agent

    # --- the market: reputation that pays (master/reputation.py) -------------------------------

    async def record_rental_outcome(self, agent_id: str, *, failed: bool, reason: str, now: float) -> Reputation:
        """A rental on ``agent_id`` ended: without a host failure (``failed`` False) or through the host (a container
        that would not start, the host offline mid-run, a GPU fault). Counts it in the ``rentals`` component, stores
        the agent and records ``agent.reputation`` with the old and new score and ``reason``."""
        agent = self.registry.get(agent_id)
        before = reputation(agent)
        if failed:
            agent.rentals_failed += 1
        else:
            agent.rentals_completed += 1
        return await self._reputation_changed(agent, before, "rentals", reason, now)

    async def record_rating(self, agent_id: str, rating: int, rental_id: str, now: float, *, weight: int = 1) -> Reputation:
        """A renter rated its ended rental ``rental_id`` on ``agent_id`` (1..5): counted ``weight`` times in the
        ``ratings`` component (a rating weighs what the renter paid), with an ``agent.reputation`` event. Whether the
        rental may be rated, and its weight, are the caller's (management/market/operations.py ``rate_rental``)."""
        if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5:
            raise InvalidRating(f"rating: {rating!r} is not a whole number from 1 to 5")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
            raise InvalidRating(f"weight: {weight!r} is not a whole number of at least 1")
        agent = self.registry.get(agent_id)
        before = reputation(agent)
        agent.ratings_count += weight
        agent.ratings_sum += rating * weight
        said = f"rental {rental_id} rated {rating} of 5" + (f" (weight {weight}: what was paid)" if weight > 1 else "")
        return await self._reputation_changed(agent, before, "ratings", said, now)

    async def _reputation_changed(
        self, agent: AgentRecord, before: Reputation, component: str, reason: str, now: float
    ) -> Reputation:
        after = reputation(agent)
        await self.registry.save(agent)
        await self.store.events.append(
            EventRecord(
                ts=now,
                kind="agent.reputation",
                subject=agent.id,
                data={
                    "component": component,
                    "old": before.score,
                    "new": after.score,
                    "component_old": before.components[component],
                    "component_new": after.components[component],
                    "reason": reason,
                },
            )
        )
        return after

    # --- operations the management API calls ---------------------------------------------------

    async def create_command(
        self, agent_id: str, kind: str, spec: dict[str, Any], *, timeout_s: float | None = None
    ) -> CommandRecord:
        """Sign and dispatch a container command; Conflict when the host or a GPU it names cannot take it."""
        return await self.ledger.create(agent_id, kind, spec, timeout_s=timeout_s)

    async def command(self, command_id: str) -> CommandRecord:
        return await self.ledger.get(command_id)

    async def commands(
        self, *, agent_id: str | None = None, states: Collection[str] | None = None, limit: int = 1000
    ) -> list[CommandRecord]:
        return await self.store.commands.list(agent_id=agent_id, states=states, limit=limit)

    def agent(self, agent_id: str) -> AgentRecord:
        return self.registry.get(agent_id)

    def pull_progress(self, agent_id: str, container: str) -> str:
        """How the image pull of ``container``'s create on that host goes ("pulling image: 12.0 MB of 45.3 MB, 1 of 3
        layers"), as its agent last said; "" when no pull is under way."""
        return self.pulls.get((agent_id, container), "")

    def _open_creates(self, agent_id: str) -> list[CommandRecord]:
        return [c for c in self.ledger.open.values() if c.agent_id == agent_id and c.kind == "create_container"]

    async def repair_gpu(self, uuid: str) -> GpuRecord:
        """An operator says ``uuid`` is sound again (after a reset, a reseat, a swap): its fault is cleared and it
        goes back to the state its holder and host call for. Its current uncorrectable ECC count is accepted.

        It also settles who has the card: other hosts' refused claims on it are dropped (their flag cleared) and
        the holder keeps it. A GPU neither faulty nor claimed has nothing to repair (Conflict)."""
        gpu = self.registry.gpus.get(uuid)
        if gpu is None:
            raise NotFound(f"no GPU {uuid!r}")
        host = self.registry.agents.get(gpu.agent_id)
        cleared = await self.registry.clear_claims(uuid, "cleared by an operator's repair")
        if gpu.fault is None and gpu.state != GpuState.FAULTY.value:
            if cleared:
                return gpu
            raise Conflict(f"GPU {uuid} is {gpu.state}, not faulty: there is nothing to repair")
        if gpu.fault is None and host is not None and host.state == AgentState.QUARANTINED.value:
            raise Conflict(f"GPU {uuid} is faulty because host {host.id} is quarantined; release the host instead")
        latest = self.telemetry.latest.get(uuid)
        counted = max(gpu.ecc_acknowledged, latest.ecc_uncorrected if latest is not None else 0)
        self.health.forget([uuid])
        await self.registry.clear_fault(gpu, "repaired by an operator", ecc_acknowledged=counted)
        return gpu

    def gpus(self, agent_id: str | None = None) -> list[GpuRecord]:
        if agent_id is not None:
            return self.registry.gpus_of(agent_id)
        return sorted(self.registry.gpus.values(), key=lambda g: (g.agent_id, g.index))

    def offered(self, gpu: GpuRecord) -> bool:
        """Whether renters are offered ``gpu`` now (allocations.offered, with the operator's setting)."""
        host = self.registry.agents.get(gpu.agent_id)
        return host is not None and offered(gpu, host, allow_sandboxed=self.config.offer_sandboxed_hosts)

    async def events_after(
        self, *, subject: str | None = None, kind_prefix: str | None = None, after_seq: int = 0, limit: int = 100
    ) -> list[EventRecord]:
        return await self.store.events.list(subject=subject, kind_prefix=kind_prefix, after_seq=after_seq, limit=limit)

    async def create_token(self, provider: str, ttl_s: float | None = None) -> tuple[str, TokenRecord]:
        """A one-time join token for ``provider`` (an enabled provider account); shown once, stored hashed."""
        await self.accounts.require_provider(provider)
        return await self.enrollment.create_token(provider, self.config.token_ttl_s if ttl_s is None else ttl_s)

    async def create_api_key(self, name: str, role: str = "operator") -> str:
        """A key naming no account, working as ``role`` (the operator): what tests and old tools use. Keys for an
        account are issued by ``accounts.create_key``."""
        return await self.accounts.create_legacy_key(name, role)

    async def check_api_key(self, key: str) -> ApiKeyRecord:
        """The key's record (NotFound for a key never issued), remembered a while: see master/accounts.py."""
        return (await self.accounts.credential(key)).key

"""The Master: owns all state, answers relays and agents, and offers the operations the management API calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import secrets
from pathlib import Path

from common.errors import EnrollmentError, IdlegridError, NotFound, ProtocolError
from common.pki import server_tls_context
from common.wire import (
    AccessStats,
    AgentConnected,
    AgentDisconnected,
    AgentEvent,
    AgentFrame,
    CommandAck,
    CommandResult,
    EnrollRequest,
    EnrollResponse,
    Error,
    Heartbeat,
    Hello,
    LinkFrame,
    Relay,
    ResultAck,
    Revocations,
    Telemetry,
    Welcome,
    decode_agent_frame,
    encode,
    error_frame,
    negotiate,
)
from master.authority import Authority
from master.commands import CommandLedger
from master.config import MasterConfig
from master.enrollment import Enrollment, hash_secret
from master.events import EventLog
from master.link import AccessLink, RelayHub
from master.records import AgentRecord, ApiKeyRecord, RevocationRecord
from master.registry import Registry
from master.states import AgentState
from master.store import open_store
from master.store.base import Store
from master.telemetry import TelemetryAggregator
from master.tiers import TierPolicy

log = logging.getLogger(__name__)

HELLO_REQUIRED = "hello_required"


class Master:
    def __init__(self, config: MasterConfig, *, store: Store | None = None) -> None:
        self.config = config
        self.state_dir = config.state_path
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.store = store or open_store(config.resolved_store_url())
        self.authority = Authority.open(self.state_dir, names=config.server_names, ips=config.server_ips)
        self.policy = TierPolicy.load(Path(config.tier_policy) if config.tier_policy else None)
        self.events = EventLog(self.store)
        self.registry = Registry(self.store, self.events, self.policy)
        self.telemetry = TelemetryAggregator(self.store)
        self.enrollment = Enrollment(self.store, self.authority.ca, cert_validity_s=config.agent_cert_s)
        self.hub = RelayHub(
            server_tls_context(
                self.authority.cert_file, self.authority.key_file, self.authority.ca_file, require_client_cert=True
            ),
            self._on_link_frame,
            self._on_link_closed,
            lambda: sorted(self._revoked),
        )
        self.ledger = CommandLedger(
            self.store, self.events, self.registry, self.authority.signer, self.hub.send_to_agent,
            timeout_s=config.command_timeout_s,
        )
        self._revoked: set[str] = set()
        self._helloed: set[str] = set()  # agents that said hello to this process since they connected
        self.relay_stats: dict[str, AccessStats] = {}
        self.link_port = 0
        self._tasks: list[asyncio.Task] = []

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self.store.open()
        await self.registry.load()
        await self.ledger.load()
        self._revoked = {r.serial for r in await self.store.revocations.list()}
        self.link_port = await self.hub.start(self.config.host, self.config.link_port)
        self._tasks = [
            asyncio.create_task(self._sweep_loop(), name="sweep"),
            asyncio.create_task(self._flush_loop(), name="flush"),
        ]
        log.info("master started", extra={"link_port": self.link_port, "store": self.store.backend})

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.hub.stop()
        await self.telemetry.flush(time.time(), everything=True)
        await self.registry.flush()
        await self.store.close()

    @property
    def link_url(self) -> str:
        return f"wss://{self.config.host}:{self.link_port}/link"

    async def _sweep_loop(self) -> None:
        period = min(1.0, self.config.heartbeat_s / 4)
        silence = self.config.heartbeat_s * self.config.missed_heartbeats
        while True:
            await asyncio.sleep(period)
            try:
                now = time.time()
                for agent_id in await self.registry.sweep(now, silence):
                    self._helloed.discard(agent_id)
                await self.ledger.expire(now)
            except Exception:
                log.exception("sweep failed; retrying")

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.rollup_flush_s)
            try:
                await self.telemetry.flush(time.time())
                await self.registry.flush()
            except Exception:
                log.exception("flush failed; retrying")

    # --- relay links ---------------------------------------------------------------------------

    async def _on_link_frame(self, link: AccessLink, frame: LinkFrame) -> None:
        match frame:
            case Relay():
                await self._on_relayed(link, frame)
            case AgentConnected():
                await self._on_agent_connected(link, frame)
            case AgentDisconnected():
                link.agents.discard(frame.agent_id)
                if self.hub.agent_links.get(frame.agent_id) is link:
                    del self.hub.agent_links[frame.agent_id]
                    self._helloed.discard(frame.agent_id)
            case EnrollRequest():
                await link.send(encode(await self._enroll(frame)))
            case AccessStats():
                self.relay_stats[link.relay_id] = frame
            case Error():
                log.warning("relay %s reported an error: %s %s", link.relay_id, frame.code, frame.message)
            case _:
                await link.send(encode(Error(code="unexpected_frame", message=f"{type(frame).__name__} is not expected from a relay")))

    async def _on_link_closed(self, link: AccessLink) -> None:
        for agent_id in link.agents:
            if agent_id not in self.hub.agent_links:
                self._helloed.discard(agent_id)

    async def _on_agent_connected(self, link: AccessLink, frame: AgentConnected) -> None:
        agent = self.registry.agents.get(frame.agent_id)
        if agent is None or frame.serial in self._revoked or agent.state == AgentState.RETIRED.value:
            # A relay with a stale revocation list: tell it again.
            await link.send(encode(Revocations(serials=sorted(self._revoked))))
            return
        link.agents.add(frame.agent_id)
        self.hub.agent_links[frame.agent_id] = link
        self._helloed.discard(frame.agent_id)

    async def _on_relayed(self, link: AccessLink, envelope: Relay) -> None:
        agent_id = envelope.agent_id
        agent = self.registry.agents.get(agent_id)
        if agent is None or agent.state == AgentState.RETIRED.value or self.hub.agent_links.get(agent_id) is not link:
            return  # not (or no longer) connected here: nothing it says is taken
        try:
            frame = decode_agent_frame(bytes(envelope.frame))
        except ProtocolError as exc:
            await link.send_to_agent(agent_id, error_frame(exc))
            return
        await self._on_agent_frame(link, agent, frame)

    # --- agent frames --------------------------------------------------------------------------

    async def _on_agent_frame(self, link: AccessLink, agent: AgentRecord, frame: AgentFrame) -> None:
        now = time.time()
        if isinstance(frame, Hello):
            await self._on_hello(link, agent, frame, now)
            return
        if agent.id not in self._helloed:
            await link.send_to_agent(agent.id, encode(Error(code=HELLO_REQUIRED, message="send hello first")))
            return
        match frame:
            case Heartbeat():
                self.registry.on_heartbeat(agent, now, max_gap_s=self.config.heartbeat_s * self.config.missed_heartbeats)
                await self.registry.on_running(agent, frame.running)
            case Telemetry():
                self.registry.on_heartbeat(agent, now, max_gap_s=self.config.heartbeat_s * self.config.missed_heartbeats)
                self.telemetry.ingest(agent.id, frame.samples)
            case CommandAck():
                await self.ledger.on_ack(agent.id, frame.id)
            case CommandResult():
                await self.ledger.on_result(agent.id, frame)
                await link.send_to_agent(agent.id, encode(ResultAck(id=frame.id)))
            case AgentEvent():
                await self.events.record(f"agent.{frame.kind}", agent.id, **frame.detail)
            case Error():
                log.info("agent %s reported an error: %s %s", agent.id, frame.code, frame.message)

    async def _on_hello(self, link: AccessLink, agent: AgentRecord, hello: Hello, now: float) -> None:
        try:
            version = negotiate(hello.versions)
        except ProtocolError as exc:
            await link.send_to_agent(agent.id, error_frame(exc))
            return
        await self.registry.on_hello(agent, hello.inventory, relay=link.relay_id, region=link.region, now=now)
        self._helloed.add(agent.id)
        welcome = Welcome(
            version=version, agent_id=agent.id, heartbeat_s=self.config.heartbeat_s, telemetry_s=self.config.telemetry_s,
            command_keys=self.authority.command_keys(), key_endorsements=self.authority.key_endorsements(),
        )
        await link.send_to_agent(agent.id, encode(welcome))
        await self.ledger.resend_for(agent.id)

    # --- enrollment, tokens, revocation --------------------------------------------------------

    async def _enroll(self, request: EnrollRequest) -> EnrollResponse:
        try:
            agent, cert_pem = await self.enrollment.enroll(request.token, request.csr_pem, region=request.region)
        except EnrollmentError as exc:
            await self.events.record("agent.enrollment_refused", request.remote or "unknown", code=exc.code, reason=str(exc))
            return EnrollResponse(req_id=request.req_id, ok=False, error_code=exc.code, error_message=str(exc))
        await self.registry.add(agent)
        return EnrollResponse(
            req_id=request.req_id, ok=True, agent_id=agent.id, cert_pem=cert_pem.decode(),
            ca_pem=self.authority.ca.chain_pem().decode(), command_keys=self.authority.command_keys(),
            key_endorsements=self.authority.key_endorsements(),
        )

    async def revoke(self, agent_id: str, reason: str = "revoked by an operator") -> AgentRecord:
        agent = self.registry.get(agent_id)
        if agent.cert_serial:
            self._revoked.add(agent.cert_serial)
            await self.store.revocations.put(
                RevocationRecord(serial=agent.cert_serial, agent_id=agent.id, revoked_at=time.time(), reason=reason)
            )
        await self.registry.transition(agent, "revoke", reason)
        await self.hub.broadcast(encode(Revocations(serials=sorted(self._revoked))))
        return agent

    async def drain(self, agent_id: str) -> AgentRecord:
        agent = self.registry.get(agent_id)
        agent.drained = True
        if not await self.registry.transition(agent, "drain", "drained by an operator"):
            if agent.state != AgentState.MAINTENANCE.value:
                raise IdlegridError(f"agent {agent_id} is {agent.state} and cannot be drained", code="conflict")
            await self.registry.save(agent)
        return agent

    async def create_api_key(self, name: str, role: str = "operator") -> str:
        key = "igak_" + secrets.token_urlsafe(32)
        await self.store.api_keys.put(ApiKeyRecord(key_hash=hash_secret(key), name=name, role=role, created_at=time.time()))
        return key

    async def check_api_key(self, key: str) -> ApiKeyRecord:
        record = await self.store.api_keys.get(hash_secret(key))
        if record is None:
            raise NotFound("unknown API key")
        return record

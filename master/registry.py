"""The registry of agents and their GPUs: in memory for speed, every change written through to the store."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import msgspec

from common.errors import NotFound
from common.inventory import GpuInfo, Inventory
from master.events import EventLog
from master.records import AgentRecord, GpuRecord
from master.states import AGENT, GPU, AgentState, GpuState
from master.store.base import Store
from master.tiers import TierPolicy, classify

log = logging.getLogger(__name__)

_LIVE = frozenset({AgentState.READY.value, AgentState.BUSY.value, AgentState.MAINTENANCE.value, AgentState.ENROLLED.value})


class Registry:
    def __init__(self, store: Store, events: EventLog, policy: TierPolicy) -> None:
        self._store = store
        self._events = events
        self.policy = policy
        self.agents: dict[str, AgentRecord] = {}
        self.gpus: dict[str, GpuRecord] = {}
        self._dirty: set[str] = set()

    async def load(self) -> None:
        for agent in await self._store.agents.list():
            self.agents[agent.id] = agent
        for gpu in await self._store.gpus.list():
            self.gpus[gpu.uuid] = gpu

    def get(self, agent_id: str) -> AgentRecord:
        agent = self.agents.get(agent_id)
        if agent is None:
            raise NotFound(f"no agent {agent_id!r}")
        return agent

    def gpus_of(self, agent_id: str) -> list[GpuRecord]:
        return sorted((g for g in self.gpus.values() if g.agent_id == agent_id), key=lambda g: g.index)

    async def add(self, agent: AgentRecord) -> None:
        self.agents[agent.id] = agent
        await self._events.record("agent.enrolled", agent.id, provider=agent.provider, serial=agent.cert_serial)

    async def transition(self, agent: AgentRecord, event: str, reason: str = "") -> bool:
        """Apply ``event`` if the table allows it from the agent's state; returns whether it changed."""
        if not AGENT.allows(agent.state, event):
            return False
        old, agent.state = agent.state, AGENT.next(agent.state, event)
        agent.state_reason = reason
        await self._events.transition("agent", agent.id, old, agent.state, event, reason=reason)
        await self.save(agent)
        gpu_event = {"heartbeat_lost": "lost", "revoke": "lost", "quarantine": "fault"}.get(event)
        if gpu_event is None and event == "connected":
            gpu_event = "restored"
        if gpu_event:
            await self.gpu_transition(self.gpus_of(agent.id), gpu_event)
        if gpu_event == "restored":
            # GPUs given to containers that kept running while the agent was away are still taken.
            held = {uuid for uuids in agent.containers.values() for uuid in uuids}
            await self.gpu_transition([g for g in self.gpus_of(agent.id) if g.uuid in held], "start")
        return True

    async def gpu_transition(self, gpus: Iterable[GpuRecord], event: str) -> None:
        changed = []
        for gpu in gpus:
            if GPU.allows(gpu.state, event):
                old, gpu.state = gpu.state, GPU.next(gpu.state, event)
                gpu.updated_at = time.time()
                changed.append(gpu)
                await self._events.transition("gpu", gpu.uuid, old, gpu.state, event, agent_id=gpu.agent_id)
        if changed:
            await self._store.gpus.put_many(changed)

    async def save(self, agent: AgentRecord) -> None:
        agent.version += 1
        self._dirty.discard(agent.id)
        await self._store.agents.put(agent)

    async def on_hello(self, agent: AgentRecord, inventory: Inventory, *, relay: str, region: str, now: float) -> None:
        """A (re)connected agent described itself: refresh its inventory and bring it up."""
        if agent.state == AgentState.OFFLINE.value and agent.last_seen:
            agent.downtime_s += max(0.0, now - agent.last_seen)
        agent.host, agent.simulated, agent.relay = inventory.host, inventory.simulated, relay
        agent.region = region or agent.region
        agent.last_seen, agent.connected_since = now, now
        await self._update_gpus(agent.id, inventory.gpus, inventory.host)
        if agent.drained:
            await self.transition(agent, "drain", "drained by an operator")
        elif not await self.transition(agent, "connected", f"connected through {relay}"):
            await self.save(agent)

    async def _update_gpus(self, agent_id: str, infos: list[GpuInfo], host: object) -> None:
        records = []
        for info in infos:
            c = classify(info, self.policy, host=host)  # type: ignore[arg-type]
            old = self.gpus.get(info.uuid)
            state = old.state if old is not None and old.agent_id == agent_id else GpuState.AVAILABLE.value
            record = GpuRecord(
                uuid=info.uuid, agent_id=agent_id, index=info.index, model=c.model, info=info,
                state=state, tier=c.tier, flags=list(c.flags), updated_at=time.time(),
            )
            if old is None or (old.tier, old.flags) != (record.tier, record.flags):
                await self._events.record(
                    "gpu.classified", info.uuid, agent_id=agent_id, model=c.model, tier=c.tier,
                    flags=list(c.flags), reasons=list(c.reasons),
                )
            self.gpus[info.uuid] = record
            records.append(record)
        if records:
            await self._store.gpus.put_many(records)

    def on_heartbeat(self, agent: AgentRecord, now: float, max_gap_s: float) -> None:
        """Heartbeats are frequent: kept in memory and written with the next flush."""
        if agent.state in _LIVE and agent.last_seen:
            agent.uptime_s += min(max(0.0, now - agent.last_seen), max_gap_s)
        agent.last_seen = now
        self._dirty.add(agent.id)

    async def on_running(self, agent: AgentRecord, running: list[str]) -> None:
        if running and agent.state == AgentState.READY.value:
            await self.transition(agent, "workload_started", f"{len(running)} container(s) running")
        elif not running and agent.state == AgentState.BUSY.value:
            await self.transition(agent, "workload_finished", "no container running")

    async def sweep(self, now: float, timeout_s: float) -> list[str]:
        """Agents silent for longer than ``timeout_s`` go offline, with their GPUs."""
        lost = []
        for agent in list(self.agents.values()):
            if agent.state in _LIVE and agent.state != AgentState.ENROLLED.value and now - agent.last_seen > timeout_s:
                agent.relay = ""
                await self.transition(agent, "heartbeat_lost", f"no heartbeat for {now - agent.last_seen:.1f} s")
                lost.append(agent.id)
        return lost

    async def flush(self) -> None:
        for agent_id in list(self._dirty):
            agent = self.agents.get(agent_id)
            if agent is not None:
                await self.save(agent)

    def view(self, agent: AgentRecord) -> dict:
        return msgspec.to_builtins(agent)

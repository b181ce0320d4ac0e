"""The registry of agents and their GPUs: in memory for speed, every change written through to the store."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from common.errors import NotFound
from common.inventory import GpuInfo, GpuReach, Inventory
from master.allocations import DUPLICATE_UUID_FLAG, GPU_UNREACHABLE_FLAG, GpuAllocations, gpu_state_for
from master.batches import GroupWrite, write_paced
from master.changes import AgentWritten, ChangeFeed, ContainerExited, GpuHealthChanged, GpusWritten, HostChanged
from master.events import EventLog
from master.records import AgentRecord, GpuFault, GpuRecord, GpuVerification
from master.reputation import verification_counts
from master.sharing import SharedValues
from master.states import AGENT, GPU, AgentState, GpuState
from master.store.base import Store
from master.tiers import TierPolicy, classify
from master.verification import carried, judged, measured_of

log = logging.getLogger(__name__)

# A GPU that left the pool keeps its stored record (the store keeps history) with one of these flags,
# and is not loaded again: its host no longer reports it, or its host was retired.
MISSING_FROM_INVENTORY_FLAG = "missing_from_inventory"
HOST_RETIRED_FLAG = "host_retired"
_WITHDRAWN_FLAGS = frozenset({MISSING_FROM_INVENTORY_FLAG, HOST_RETIRED_FLAG})

# An established host's card that left its report (fallen off the bus, a reboot without it) stays its own: another host
# naming it meanwhile is refused as if the card were listed, or a hostile claim would only wait for a fault to take the
# card for good. At most this many per host are kept so, the latest: a host that cycles through made-up UUIDs must not
# grow the Master's memory.
ABSENT_KEPT_PER_HOST = 64

_LIVE = frozenset({AgentState.READY.value, AgentState.BUSY.value, AgentState.MAINTENANCE.value, AgentState.ENROLLED.value})
# The states the liveness sweep judges (an enrolled agent that never said hello is not gone for its silence).
_SWEPT = _LIVE - {AgentState.ENROLLED.value}


def _with_gpu(held: tuple[GpuRecord, ...], gpu: GpuRecord) -> tuple[GpuRecord, ...]:
    """``held`` with ``gpu`` in the place of the record of its uuid, or after the others when there is none."""
    for i, kept in enumerate(held):
        if kept.uuid == gpu.uuid:
            return (*held[:i], gpu, *held[i + 1 :])
    return (*held, gpu)


class Registry:
    def __init__(
        self,
        store: Store,
        events: EventLog,
        policy: TierPolicy,
        allocations: GpuAllocations | None = None,
        *,
        changes: ChangeFeed | None = None,
    ) -> None:
        self._store = store
        # Per host, its gang replicas' overlay paths as its last heartbeat said (container -> peer -> direct|relay).
        self.overlay_paths: dict[str, dict[str, dict[str, str]]] = {}
        self.changes = changes if changes is not None else ChangeFeed()  # host, GPU health and exit changes go here
        self._events = events
        self.policy = policy
        self.allocations = allocations if allocations is not None else GpuAllocations(self.changes)
        self.agents: dict[str, AgentRecord] = {}
        self.gpus: dict[str, GpuRecord] = {}
        # What hosts report alike (GPU names, drivers, NvLinks, CPU models) kept once, not once per agent.
        self.shared = SharedValues()
        # agent id -> its GPUs, in the order first reported: no scan of every GPU. A tuple (about 100 bytes for 8 GPUs),
        # not a dict by uuid (about 360): a host has a few GPUs, and they change at a hello, not at every frame.
        self._gpus_by_agent: dict[str, tuple[GpuRecord, ...]] = {}
        # agent id -> the GPUs it reported under a uuid another host holds (its refused claims): shown on it (flagged
        # ``duplicate_uuid``, offline), never stored (the store keys GPUs by uuid, the holder's record is the one there)
        # and never offered. The holder is not touched: naming a uuid must not take a card out of another's hands.
        self._shadows: dict[str, dict[str, GpuRecord]] = {}
        # uuid -> the live host whose latest report left it out (ABSENT_KEPT_PER_HOST), and each host's such uuids,
        # oldest first: the card stays that host's until it is retired.
        self._absent_holder: dict[str, str] = {}
        self._absent_of: dict[str, dict[str, None]] = {}
        # No agent the sweep judges was last seen before this (``sweep``, ``_note_swept``); -inf: not known yet.
        self._seen_floor = -math.inf
        self._dirty: set[str] = set()
        # GPU and agent records of callers at once (a ramp's hellos) written together (master/batches.py)
        self._gpu_writes: GroupWrite[GpuRecord] = GroupWrite(lambda gpus: self._store.gpus.put_many(gpus))
        self._agent_writes: GroupWrite[AgentRecord] = GroupWrite(lambda agents: self._store.agents.put_many(agents))
        # The relay each agent was last seen through. AgentRecord.relay is cleared when the agent goes offline,
        # and a failover usually goes through offline, so the previous relay is remembered here.
        self._last_relay: dict[str, str] = {}

    async def _write_gpus(self, gpus: Sequence[GpuRecord]) -> None:
        if self.changes.wants(GpusWritten):
            for agent_id in sorted({g.agent_id for g in gpus}):
                self.changes.publish(GpusWritten(agent_id=agent_id))
        await self._gpu_writes.put(gpus)

    async def load(self) -> list[str]:
        """Agents and GPUs from the store; returns what could not be loaded (each logged and an event recorded).

        A store that fails to hand back one aggregate leaves the rest served: an agent the Master does not
        know is asked to enroll again, which is better than a Master that cannot start.
        """
        problems: list[str] = []
        try:
            for agent in await self._store.agents.list():
                self.agents[agent.id] = agent
                self._note_swept(agent)
                if agent.relay:
                    self._last_relay[agent.id] = agent.relay
        except Exception as exc:
            problems.append(f"agents: {exc}")
        try:
            absent: list[GpuRecord] = []
            for gpu in await self._store.gpus.list():
                owner = self.agents.get(gpu.agent_id)
                if owner is None or owner.state == AgentState.RETIRED.value:
                    continue
                if MISSING_FROM_INVENTORY_FLAG in gpu.flags:
                    absent.append(gpu)
                if _WITHDRAWN_FLAGS.intersection(gpu.flags):
                    continue
                if DUPLICATE_UUID_FLAG in gpu.flags:
                    # Stored by a Master that flagged the holder of a claimed uuid too (issue 22, D3): the stored
                    # record is always the holder's, which keeps its card. Written so with its next change.
                    gpu.flags = tuple(f for f in gpu.flags if f != DUPLICATE_UUID_FLAG)
                gpu.info = self.shared.gpu_info(gpu.info)
                self._put_gpu(gpu)
            for gpu in sorted(absent, key=lambda g: g.updated_at):
                if gpu.uuid not in self.gpus:
                    self._keep_absent(gpu.agent_id, [gpu.uuid])
        except Exception as exc:
            problems.append(f"gpus: {exc}")
        for agent in self.agents.values():  # agents stored before reputation counted verification: counted from here
            agent.gpus_verified, agent.gpus_unverified, agent.gpus_flagged = verification_counts(self.gpus_of(agent.id))
        for problem in problems:
            log.error("registry: could not load %s; serving the rest", problem)
            await self._events.record("master.load_failed", "registry", problem=problem)
        return problems

    def get(self, agent_id: str) -> AgentRecord:
        agent = self.agents.get(agent_id)
        if agent is None:
            raise NotFound(f"no agent {agent_id!r}")
        return agent

    def gpus_of(self, agent_id: str) -> list[GpuRecord]:
        """The GPUs the agent reported, its refused claims on another host's GPUs included (flagged ``duplicate_uuid``)."""
        owned = self._gpus_by_agent.get(agent_id, ())
        shadows = self._shadows.get(agent_id)
        gpus = [*owned, *shadows.values()] if shadows else owned
        return sorted(gpus, key=lambda g: g.index)

    def gpu_of_unit(self, uuid: str) -> GpuRecord | None:
        """The GPU a placed unit is on: the GPU itself, or for a MIG instance ("MIG-…") the GPU it splits."""
        gpu = self.gpus.get(uuid)
        if gpu is not None:
            return gpu
        parent = self.allocations.parent_of(uuid)
        return self.gpus.get(parent) if parent is not None else None

    def _put_gpu(self, gpu: GpuRecord) -> None:
        old = self.gpus.get(gpu.uuid)
        if old is not None and old.agent_id != gpu.agent_id:
            self._drop_from_host(old.agent_id, gpu.uuid)  # the card changed hosts
        self.gpus[gpu.uuid] = gpu
        self._gpus_by_agent[gpu.agent_id] = _with_gpu(self._gpus_by_agent.get(gpu.agent_id, ()), gpu)
        # The ledger keeps a whole-GPU hold and holds on its MIG instances apart (master/allocations.py).
        self.allocations.set_partition(gpu.uuid, [m.uuid for m in gpu.info.mig_instances] if gpu.info.mig_enabled else [])

    def _drop_from_host(self, agent_id: str, uuid: str) -> None:
        held = self._gpus_by_agent.get(agent_id)
        if held is not None:
            self._gpus_by_agent[agent_id] = tuple(g for g in held if g.uuid != uuid)

    async def add(self, agent: AgentRecord) -> None:
        self.agents[agent.id] = agent
        self._note_swept(agent)
        await self._events.record("agent.enrolled", agent.id, provider=agent.provider, serial=agent.cert_serial)

    def may(self, agent: AgentRecord, event: str) -> bool:
        """Whether the agent table allows ``event`` from the agent's state now."""
        return AGENT.allows(agent.state, event)

    async def transition(self, agent: AgentRecord, event: str, reason: str = "") -> bool:
        """Apply ``event`` if the table allows it from the agent's state; returns whether it changed."""
        if not AGENT.allows(agent.state, event):
            return False
        old, agent.state = agent.state, AGENT.next(agent.state, event)
        agent.state_reason = reason
        self._note_swept(agent)
        await self._events.transition("agent", agent.id, old, agent.state, event, reason=reason)
        if self.changes.wants(HostChanged):
            self.changes.publish(HostChanged(agent_id=agent.id, state=agent.state, previous=old, reason=reason))
        await self.save(agent)
        if agent.state == AgentState.RETIRED.value:
            self._shadows.pop(agent.id, None)
            self.overlay_paths.pop(agent.id, None)
            retired = list(self._gpus_by_agent.get(agent.id, ()))
            await self.withdraw_gpus(agent.id, retired, HOST_RETIRED_FLAG)
            self.allocations.release_host(agent.id)
            absent = self._absent_of.pop(agent.id, {})
            for uuid in absent:
                self._absent_holder.pop(uuid, None)
            await self._reconsider_claims({g.uuid for g in retired} | set(absent))
        else:
            await self.settle_gpus(agent)
        return True

    async def transition_many(self, moves: Sequence[tuple[AgentRecord, str]], event: str) -> list[AgentRecord]:
        """``event`` for many agents at once (agent, reason), written in paced batches: a lost relay may have
        carried thousands, and one write per agent would hold up every other store call. Returns those moved.

        Not for an event that retires an agent (``transition`` withdraws its GPUs)."""
        moved: list[AgentRecord] = []
        events: list[tuple[str, str, dict[str, object]]] = []
        gpus: list[GpuRecord] = []
        for agent, reason in moves:
            if not AGENT.allows(agent.state, event):
                continue
            old, agent.state = agent.state, AGENT.next(agent.state, event)
            agent.state_reason = reason
            self._note_swept(agent)
            events.append(("agent.transition", agent.id, {"old": old, "new": agent.state, "event": event, "reason": reason}))
            if self.changes.wants(HostChanged):
                self.changes.publish(HostChanged(agent_id=agent.id, state=agent.state, previous=old, reason=reason))
            self._settle_in_memory(agent, gpus, events)
            moved.append(agent)
        await self._events.record_many(events)
        for agent in moved:
            agent.version += 1
            self._dirty.discard(agent.id)
        await write_paced(moved, self._store.agents.put_many)
        await write_paced(gpus, self._write_gpus)
        return moved

    async def settle_gpus(self, agent: AgentRecord) -> None:
        """Bring each GPU of ``agent`` to the state its holder and its host call for (allocations.gpu_state_for),
        through the GPU table, every step recorded."""
        changed: list[GpuRecord] = []
        events: list[tuple[str, str, dict[str, object]]] = []
        self._settle_in_memory(agent, changed, events)
        if changed:  # (every event is a change's) side by side: the GPUs queue right behind their events
            await asyncio.gather(self._events.record_many(events), self._write_gpus(changed))

    def _settle_in_memory(
        self, agent: AgentRecord, changed: list[GpuRecord], events: list[tuple[str, str, dict[str, object]]]
    ) -> None:
        """The GPU moves of ``settle_gpus``, applied in memory; the records and events to write are appended."""
        now: float | None = None  # one time for the host's GPUs moved together (one float object, not one each)
        for gpu in self._gpus_by_agent.get(agent.id, ()):
            wanted = gpu_state_for(gpu, self.allocations.covering(gpu.uuid), agent)
            if wanted == gpu.state:
                continue
            for event in GPU.path(gpu.state, wanted):
                old, gpu.state = gpu.state, GPU.next(gpu.state, event)
                events.append(("gpu.transition", gpu.uuid, {"old": old, "new": gpu.state, "event": event, "agent_id": agent.id}))
            if now is None:
                now = time.time()
            gpu.updated_at = now
            changed.append(gpu)

    async def settle_gpus_of(self, agent_ids: Iterable[str]) -> None:
        for agent_id in set(agent_ids):
            agent = self.agents.get(agent_id)
            if agent is not None:
                await self.settle_gpus(agent)

    async def withdraw_gpus(self, agent_id: str, gpus: Iterable[GpuRecord], flag: str) -> None:
        """GPUs leave the pool: gone from memory (never offered, never listed), stored offline with ``flag``."""
        withdrawn = []
        now = time.time()
        for gpu in list(gpus):
            self.gpus.pop(gpu.uuid, None)
            self._drop_from_host(agent_id, gpu.uuid)
            self.allocations.set_partition(gpu.uuid, [])
            gpu.state, gpu.flags, gpu.updated_at = GpuState.OFFLINE.value, (*gpu.flags, flag), now
            withdrawn.append(gpu)
        if withdrawn:
            await self._events.record_many([("gpu.withdrawn", g.uuid, {"agent_id": agent_id, "reason": flag}) for g in withdrawn])
            await self._write_gpus(withdrawn)

    async def save(self, agent: AgentRecord) -> None:
        agent.version += 1
        self._dirty.discard(agent.id)
        if self.changes.wants(AgentWritten):
            self.changes.publish(AgentWritten(agent_id=agent.id))
        await self._agent_writes.put([agent])

    async def on_hello(
        self, agent: AgentRecord, inventory: Inventory, *, relay: str, region: str, now: float, relay_region: str = ""
    ) -> None:
        """A (re)connected agent described itself: refresh its inventory and bring it up."""
        if agent.state == AgentState.OFFLINE.value and agent.last_seen:
            agent.downtime_s += max(0.0, now - agent.last_seen)
        shared = self.shared
        agent.host, agent.simulated, agent.relay = shared.host(inventory.host), inventory.simulated, relay
        agent.runtime, agent.isolation = shared.one(inventory.runtime), shared.one(inventory.isolation)
        agent.images = list(inventory.images)
        agent.overlay_key = inventory.overlay_key
        agent.image_source = inventory.image_source
        # Only about GPUs this very report lists, once each: the self-test of a card the host does not report says nothing.
        listed = {gpu.uuid for gpu in inventory.gpus}
        reach: dict[str, GpuReach] = {}
        for tested in inventory.gpu_reach:
            if tested.uuid in listed:
                reach.setdefault(tested.uuid, tested)
        agent.gpu_reach = list(reach.values())
        agent.unoffered_gpus = list(inventory.unoffered)
        # The region is the one the agent declares (or enrolled with): a failover to another region's relay
        # does not move the host. The relay's region only fills in a region the agent never gave.
        agent.region = shared.one(region or agent.region or relay_region)
        await self._record_relay_change(agent, relay, relay_region=relay_region)
        agent.last_seen, agent.connected_since = now, now
        unreachable = {tested.uuid for tested in agent.gpu_reach if not tested.reachable}
        await self._update_gpus(agent.id, inventory.gpus, inventory.host, unreachable=unreachable)
        # reputation's verification component reads these counts, never the GPU list (master/reputation.py)
        agent.gpus_verified, agent.gpus_unverified, agent.gpus_flagged = verification_counts(self.gpus_of(agent.id))
        if agent.drained:
            changed = await self.transition(agent, "drain", "drained by an operator")
        else:
            changed = await self.transition(agent, "connected", f"connected through {relay}")
        if not changed:
            await self.save(agent)
            await self.settle_gpus(agent)

    def last_relays(self) -> set[str]:
        """The relays the agents (retired ones aside) last came through, whether still connected or not."""
        return {
            relay
            for agent_id, relay in self._last_relay.items()
            if relay and (agent := self.agents.get(agent_id)) is not None and agent.state != AgentState.RETIRED.value
        }

    async def _record_relay_change(self, agent: AgentRecord, relay: str, *, relay_region: str) -> None:
        """An agent that shows up through another relay than before failed over (or was moved): an event says so."""
        previous = self._last_relay.get(agent.id)
        self._last_relay[agent.id] = relay
        if previous and previous != relay:
            await self._events.record(
                "agent.relay_changed",
                agent.id,
                old_relay=previous,
                new_relay=relay,
                region=agent.region,
                relay_region=relay_region,
            )

    async def _update_gpus(
        self, agent_id: str, infos: list[GpuInfo], host: object, *, unreachable: frozenset[str] | set[str] = frozenset()
    ) -> None:
        """The latest report replaces the previous one: GPUs it no longer lists leave the pool. ``unreachable``: GPUs
        the agent's self-test found not to reach a container, flagged (never offered) until a later hello clears it."""
        records = []
        events: list[tuple[str, str, dict[str, object]]] = []  # one store write for all of them, not one per GPU
        reported: set[str] = set()
        # One time for every record of this report: a float object each was 24 bytes per GPU of the Master's memory.
        updated_at = time.time()
        self._shadows.pop(agent_id, None)  # its earlier claims end with this report: those still made are judged again
        for info in infos:
            if info.uuid in reported:
                continue  # listed twice in one report: the first entry stands
            reported.add(info.uuid)
            info = self.shared.gpu_info(info)  # kept for as long as the card is: its values shared with its peers'
            old = self.gpus.get(info.uuid)
            holder = old.agent_id if old is not None else self._absent_holder.get(info.uuid)
            if holder is not None and not self._may_claim(holder, agent_id):
                # A GPU UUID is whatever the agent says, and a renter of a card can read it: naming it must not take a
                # card from the host that holds it, nor take it out of offer. The claim is refused and flagged on the
                # claimant alone; the holder's record is not touched (docs/master.md, "What the Master trusts").
                events.append(("gpu.duplicate_uuid", info.uuid, {"agent_id": agent_id, "owner": holder}))
                shadow = GpuRecord(
                    uuid=info.uuid,
                    agent_id=agent_id,
                    index=info.index,
                    model=old.model if old is not None else classify(info, self.policy, host=host).model,  # type: ignore[arg-type]
                    info=info,
                    state=GpuState.OFFLINE.value,
                    flags=(DUPLICATE_UUID_FLAG,),
                    updated_at=updated_at,
                )
                self._shadows.setdefault(agent_id, {})[info.uuid] = shadow
                continue
            if holder == agent_id and old is None:
                self._absent_of.get(agent_id, {}).pop(info.uuid, None)  # its card is back
                self._absent_holder.pop(info.uuid, None)
            info = self._own_mig_instances(agent_id, info, events)
            same_host = old is not None and old.agent_id == agent_id
            # Measured verification (master/verification.py): kept while the host and its driver stay the same.
            verification = carried(old.verification, info) if old is not None and same_host else None
            c = classify(info, self.policy, host=host, measured=measured_of(verification))  # type: ignore[arg-type]
            tier, judged_flags, reasons = judged(c, verification)
            state = old.state if old is not None and same_host else GpuState.AVAILABLE.value
            record = GpuRecord(
                uuid=info.uuid,
                agent_id=agent_id,
                index=info.index,
                model=c.model,
                info=info,
                state=state,
                tier=tier,
                flags=tuple(judged_flags) + ((GPU_UNREACHABLE_FLAG,) if info.uuid in unreachable else ()),
                updated_at=updated_at,
                # A hello does not clear a fault: a card that threw a fatal Xid may do so again (docs/master.md).
                fault=old.fault if old is not None and same_host else None,
                ecc_acknowledged=old.ecc_acknowledged if old is not None and same_host else 0,
                verification=verification,
            )
            if old is None or (old.tier, old.flags) != (record.tier, record.flags):
                events.append(
                    (
                        "gpu.classified",
                        info.uuid,
                        {
                            "agent_id": agent_id,
                            "model": c.model,
                            "tier": tier,
                            "flags": judged_flags,
                            "reasons": reasons,
                        },
                    )
                )
            self._put_gpu(record)
            records.append(record)
        await self._events.record_many(events)
        if records:
            await self._write_gpus(records)
        gone = [g for g in self._gpus_by_agent.get(agent_id, ()) if g.uuid not in reported]
        await self.withdraw_gpus(agent_id, gone, MISSING_FROM_INVENTORY_FLAG)
        agent = self.agents.get(agent_id)
        if gone and agent is not None and agent.state != AgentState.RETIRED.value:
            self._keep_absent(agent_id, [g.uuid for g in gone])

    def _keep_absent(self, agent_id: str, uuids: Iterable[str]) -> None:
        """``uuids`` left ``agent_id``'s report and stay its own (ABSENT_KEPT_PER_HOST, the latest)."""
        kept = self._absent_of.setdefault(agent_id, {})
        for uuid in uuids:
            kept.pop(uuid, None)
            kept[uuid] = None
            self._absent_holder[uuid] = agent_id
        while len(kept) > ABSENT_KEPT_PER_HOST:
            oldest = next(iter(kept))
            del kept[oldest]
            if self._absent_holder.get(oldest) == agent_id:
                del self._absent_holder[oldest]

    def claimants(self, uuid: str) -> list[str]:
        """The agents whose claim on ``uuid`` was refused (another host holds it), by id."""
        return sorted(agent_id for agent_id, shadows in self._shadows.items() if uuid in shadows)

    async def _reconsider_claims(self, uuids: set[str]) -> None:
        """The GPUs ``uuids`` left their host (it was retired, or no longer reports them): hosts whose claim on one
        was refused report it again (their latest report, as kept), so the first of them takes it, as if it had said
        hello now; the cards moved."""
        for agent_id in sorted(a for a, shadows in self._shadows.items() if uuids.intersection(shadows)):
            agent = self.agents.get(agent_id)
            if agent is None or agent.state == AgentState.RETIRED.value:
                continue
            await self._update_gpus(agent_id, [g.info for g in self.gpus_of(agent_id)], agent.host)
            await self._recount(agent)

    async def clear_claims(self, uuid: str, reason: str) -> list[str]:
        """An operator's word on ``uuid``: the refused claims on it are dropped, their flag cleared on each claimant,
        and the holder keeps it. A claimant that names it again in a later hello is refused and flagged again: the
        conflict is then real again. Returns the claimants cleared."""
        cleared = self.claimants(uuid)
        for agent_id in cleared:
            shadows = self._shadows[agent_id]
            del shadows[uuid]
            if not shadows:
                del self._shadows[agent_id]
        if cleared:
            await self._events.record_many(
                [("gpu.claim_cleared", uuid, {"agent_id": agent_id, "reason": reason}) for agent_id in cleared]
            )
            for agent_id in cleared:
                agent = self.agents.get(agent_id)
                if agent is not None:
                    await self._recount(agent)
        return cleared

    async def set_verification(self, uuid: str, verification: GpuVerification) -> GpuRecord | None:
        """Record a GPU's latest verification and classify it again with it; None when the GPU is gone."""
        gpu = self.gpus.get(uuid)
        agent = self.agents.get(gpu.agent_id) if gpu is not None else None
        if gpu is None or agent is None:
            return None
        c = classify(gpu.info, self.policy, host=agent.host, measured=measured_of(verification))
        tier, flags, reasons = judged(c, verification)
        kept = tuple(flag for flag in gpu.flags if flag in (GPU_UNREACHABLE_FLAG, DUPLICATE_UUID_FLAG))
        flags_now = tuple(flags) + kept
        record = msgspec.structs.replace(gpu, tier=tier, flags=flags_now, verification=verification, updated_at=time.time())
        if (gpu.tier, gpu.flags) != (record.tier, record.flags):
            await self._events.record(
                "gpu.classified", uuid, agent_id=gpu.agent_id, model=c.model, tier=tier, flags=flags, reasons=reasons
            )
        self._put_gpu(record)
        await self._write_gpus([record])
        await self._recount(agent)
        return record

    async def _recount(self, agent: AgentRecord) -> None:
        """The agent's verification counts (what reputation reads) after its GPUs or claims changed, and its GPUs
        brought to the state its host calls for."""
        agent.gpus_verified, agent.gpus_unverified, agent.gpus_flagged = verification_counts(self.gpus_of(agent.id))
        await self.save(agent)
        await self.settle_gpus(agent)

    def _own_mig_instances(self, agent_id: str, info: GpuInfo, events: list[tuple[str, str, dict[str, object]]]) -> GpuInfo:
        """``info`` without the MIG instances it may not claim: a uuid that is a GPU's, one listed twice, or one
        another GPU (of any host) reports as its instance. Like a GPU uuid, an instance uuid is whatever the agent says,
        and one host must not shadow another's instance by naming it; each one left out is recorded."""
        kept = []
        seen: set[str] = set()
        for instance in info.mig_instances:
            parent = self.allocations.parent_of(instance.uuid)
            owner = self.gpus.get(parent) if parent is not None else None
            taken = owner is not None and owner.uuid != info.uuid  # another GPU's (of this host or another)
            if instance.uuid in seen or instance.uuid in self.gpus or taken:
                events.append(("gpu.mig_instance_refused", info.uuid, {"agent_id": agent_id, "instance": instance.uuid}))
                continue
            seen.add(instance.uuid)
            kept.append(instance)
        if len(kept) == len(info.mig_instances):
            return info
        return msgspec.structs.replace(info, mig_instances=tuple(kept))

    def _may_claim(self, holder: str, agent_id: str) -> bool:
        """A GPU another agent holds (reports, or left out of its report) moves only once that agent is retired."""
        owner = self.agents.get(holder)
        return holder == agent_id or owner is None or owner.state == AgentState.RETIRED.value

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

    async def on_exited(self, agent: AgentRecord, exited: dict[str, int]) -> list[str]:
        """Containers of ``agent`` that ended on their own (name -> exit status), as its heartbeat or an event says.

        Only containers the Master created on it count (an agent cannot invent one), each exit is taken once (the
        heartbeat repeats it until a delete), and the container keeps its GPUs: it exists until deleted. Returns the
        names newly recorded."""
        new = {n: c for n, c in exited.items() if n in agent.containers and agent.exited.get(n) != c}
        if not new:
            return []
        agent.exited = {**agent.exited, **new}
        await self._events.record_many([("container.exited", agent.id, {"container": n, "code": c}) for n, c in new.items()])
        await self.save(agent)
        if self.changes.wants(ContainerExited):
            for name, code in new.items():
                self.changes.publish(ContainerExited(agent_id=agent.id, container=name, code=code))
        return list(new)

    async def mark_faulty(self, gpu: GpuRecord, fault: GpuFault) -> None:
        """``gpu`` is faulty for ``fault``: not offered, given nothing new (a container on it keeps its hold)."""
        was_healthy = gpu.fault is None and gpu.state != GpuState.FAULTY.value
        gpu.fault = fault
        events: list[tuple[str, str, dict[str, object]]] = [
            ("gpu.fault", gpu.uuid, {"agent_id": gpu.agent_id, "kind": fault.kind, "reason": fault.reason, "code": fault.code})
        ]
        if GPU.allows(gpu.state, "fault"):
            old, gpu.state = gpu.state, GPU.next(gpu.state, "fault")
            events.append(
                (
                    "gpu.transition",
                    gpu.uuid,
                    {"old": old, "new": gpu.state, "event": "fault", "agent_id": gpu.agent_id, "reason": fault.reason},
                )
            )
        gpu.updated_at = time.time()
        await self._events.record_many(events)
        await self._write_gpus([gpu])
        if was_healthy and self.changes.wants(GpuHealthChanged):
            self.changes.publish(GpuHealthChanged(uuid=gpu.uuid, agent_id=gpu.agent_id, healthy=False, reason=fault.reason))

    async def clear_fault(self, gpu: GpuRecord, reason: str, *, ecc_acknowledged: int | None = None) -> None:
        """``gpu`` is healthy again (repaired, or cooled down): back to the state its holder and host call for."""
        gpu.fault = None
        if ecc_acknowledged is not None:
            gpu.ecc_acknowledged = ecc_acknowledged
        events: list[tuple[str, str, dict[str, object]]] = [
            ("gpu.fault_cleared", gpu.uuid, {"agent_id": gpu.agent_id, "reason": reason})
        ]
        if GPU.allows(gpu.state, "repair"):
            old, gpu.state = gpu.state, GPU.next(gpu.state, "repair")
            events.append(
                (
                    "gpu.transition",
                    gpu.uuid,
                    {"old": old, "new": gpu.state, "event": "repair", "agent_id": gpu.agent_id, "reason": reason},
                )
            )
        gpu.updated_at = time.time()
        await self._events.record_many(events)
        await self._write_gpus([gpu])
        agent = self.agents.get(gpu.agent_id)
        if agent is not None:
            await self.settle_gpus(agent)
        if self.changes.wants(GpuHealthChanged):
            healthy = gpu.state != GpuState.FAULTY.value
            self.changes.publish(GpuHealthChanged(uuid=gpu.uuid, agent_id=gpu.agent_id, healthy=healthy, reason=reason))

    async def sweep(self, now: float, timeout_s: float, heard: Mapping[str, float] | None = None) -> list[str]:
        """Agents silent for longer than ``timeout_s`` go offline, with their GPUs (in one batched write).

        ``heard`` (agent id -> when the Master last read a frame of it, handled yet or not): an agent heard since is
        not silent, whatever its heartbeats wait behind (master/intake.py).

        Every agent is looked at only when one may be silent: a scan finds the oldest ``last_seen`` among the agents
        it judges (``_seen_floor``), and until the cutoff passes it no agent can be silent (``last_seen`` only grows,
        and an agent that comes to be judged lowers the floor to its own: ``_note_swept``). Every second, the scan of
        every agent was 1.8 % of a 30,000-agent Master's loop in the hold (bench/HISTORY.md); now it runs about once
        per heartbeat timeout less a heartbeat interval."""
        cutoff = now - timeout_s
        if cutoff < self._seen_floor:
            return []
        heard = heard or {}
        swept, floor = _SWEPT, math.inf
        silent: list[AgentRecord] = []
        for a in self.agents.values():
            if a.state in swept:
                seen = a.last_seen
                if seen < cutoff and heard.get(a.id, 0.0) < cutoff:
                    silent.append(a)
                elif seen < floor:
                    floor = seen
        self._seen_floor = floor
        for agent in silent:
            agent.relay = ""
            self.overlay_paths.pop(agent.id, None)  # the paths its heartbeats reported are no longer known
        moves = [(agent, f"no heartbeat for {now - agent.last_seen:.1f} s") for agent in silent]
        moved = await self.transition_many(moves, "heartbeat_lost")
        for agent in silent:
            self._note_swept(agent)  # one the table kept from going offline is still judged
        return [agent.id for agent in moved]

    def _note_swept(self, agent: AgentRecord) -> None:
        """``agent`` is judged by the sweep now (``_SWEPT``): the floor of the agents' ``last_seen`` comes down to its."""
        if agent.state in _SWEPT and agent.last_seen < self._seen_floor:
            self._seen_floor = agent.last_seen

    async def flush(self, spread_s: float = 0.0) -> int:
        """Write the agents changed in memory only (heartbeats), in paced batches (master/batches.py): one write
        per agent would queue ten thousand store calls every flush, and a command's writes behind them.
        ``spread_s``: over about that long (write_paced)."""
        dirty = [a for a in (self.agents.get(i) for i in list(self._dirty)) if a is not None]
        self._dirty.clear()
        written = 0

        async def write(batch: Sequence[AgentRecord]) -> None:
            nonlocal written
            for agent in batch:
                agent.version += 1
            await self._store.agents.put_many(batch)
            written += len(batch)

        try:
            await write_paced(dirty, write, spread_s=spread_s)
        except BaseException:
            self._dirty.update(a.id for a in dirty[written:])  # written with the next flush
            raise
        return len(dirty)

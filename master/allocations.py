"""GPU allocations: who holds each GPU. The single source of truth the Master dispatches against.

A GPU has at most one holder, a container on the GPU's own host. A create command takes its GPUs
when it is created (before it is dispatched), so two commands in flight can never name the same GPU;
the hold is confirmed when the agent reports the container started, and given back when the create
fails or times out, or when the container is deleted. Nothing here does I/O: the ledger calls it, the
registry derives each GPU's state from it, and after a restart it is rebuilt from what is stored
(the containers each agent record lists and the create commands still open).

MIG: a GPU in MIG mode is split into instances, each held on its own (by its "MIG-…" uuid). The ledger knows
each GPU's instances (``set_partition``, from the registry's latest inventory), so a hold on a whole GPU and a
hold on any of its instances exclude each other, both ways, in a claim and in a rebuild alike. A GPU with any
instance held counts as held (``covering``) for its state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.errors import Conflict
from master.changes import ChangeFeed, HoldsChanged
from master.records import AgentRecord, CommandRecord, GpuRecord
from master.states import AgentState, GpuState
from master.verification import MEASURED_FLAGS

# A host's copy of a GPU another host holds (a refused claim, master/registry.py): shown on the claimant, offline,
# never offered nor given a container. The holder's own record never carries it.
DUPLICATE_UUID_FLAG = "duplicate_uuid"
# A GPU its agent's self-test found not to reach a container of the host's runtime (common.inventory.GpuReach): not
# offered until a later self-test finds it reachable (the provider fixes the host and restarts the agent).
GPU_UNREACHABLE_FLAG = "unreachable_from_runtime"


# Hosts that answer and may be given new work; a maintenance (drained) host answers but takes none.
_REACHABLE = frozenset({AgentState.READY.value, AgentState.BUSY.value, AgentState.MAINTENANCE.value})
_TAKES_WORK = frozenset({AgentState.READY.value, AgentState.BUSY.value})


@dataclass(frozen=True, slots=True)
class Hold:
    """One GPU taken by one container of one host."""

    agent_id: str
    container: str
    command_id: str  # the create command that took it ("" when rebuilt from a confirmed container)
    running: bool  # the agent reported the container started


class GpuAllocations:
    def __init__(self, changes: ChangeFeed | None = None) -> None:
        self._changes = changes if changes is not None else ChangeFeed()  # told of each host whose holds changed
        self._holds: dict[str, Hold] = {}  # GPU (or MIG instance) uuid -> its holder
        self._parent: dict[str, str] = {}  # MIG instance uuid -> its GPU's uuid
        self._instances: dict[str, tuple[str, ...]] = {}  # GPU uuid -> its MIG instances' uuids (only when split)

    def _changed(self, agent_ids: Iterable[str | None]) -> None:
        """Tell the change feed (``HoldsChanged``), synchronously, so what a listener records is there before the
        change is acted on."""
        if self._changes.wants(HoldsChanged):
            for agent_id in set(agent_ids):
                self._changes.publish(HoldsChanged(agent_id=agent_id))

    def holder(self, gpu_uuid: str) -> Hold | None:
        """The hold on exactly this GPU or MIG instance."""
        return self._holds.get(gpu_uuid)

    def set_partition(self, gpu_uuid: str, instance_uuids: Sequence[str]) -> None:
        """``gpu_uuid`` is split into ``instance_uuids`` now (none: not split, or gone). Holds are not touched: a
        hold on an instance that is no longer reported stays until its container is deleted."""
        for old in self._instances.pop(gpu_uuid, ()):
            self._parent.pop(old, None)
        if instance_uuids:
            self._instances[gpu_uuid] = tuple(instance_uuids)
            for uuid in instance_uuids:
                self._parent[uuid] = gpu_uuid

    def parent_of(self, uuid: str) -> str | None:
        """The GPU a MIG instance belongs to; None for a whole GPU (or an unknown uuid)."""
        return self._parent.get(uuid)

    def covering(self, gpu_uuid: str) -> Hold | None:
        """The hold that keeps ``gpu_uuid`` from being free: on the GPU itself, else on one of its MIG instances
        (a running one first)."""
        hold = self._holds.get(gpu_uuid)
        if hold is not None:
            return hold
        held = [h for h in (self._holds.get(u) for u in self._instances.get(gpu_uuid, ())) if h is not None]
        return next((h for h in held if h.running), held[0] if held else None)

    def _clash(self, uuid: str, agent_id: str, container: str) -> str | None:
        """Why ``container`` may not hold ``uuid``: another container holds it, its GPU whole, or one of its
        instances. None when it may."""
        mine = (agent_id, container)
        hold = self._holds.get(uuid)
        if hold is not None and (hold.agent_id, hold.container) != mine:
            return f"GPU {uuid} is held by container {hold.container!r} on host {hold.agent_id}"
        parent = self._parent.get(uuid)
        hold = self._holds.get(parent) if parent is not None else None
        if hold is not None and (hold.agent_id, hold.container) != mine:
            return f"MIG instance {uuid}: its GPU {parent} is held whole by container {hold.container!r} on host {hold.agent_id}"
        for instance in self._instances.get(uuid, ()):
            hold = self._holds.get(instance)
            if hold is not None and (hold.agent_id, hold.container) != mine:
                return f"GPU {uuid}: its MIG instance {instance} is held by container {hold.container!r} on host {hold.agent_id}"
        return None

    def __len__(self) -> int:
        return len(self._holds)

    def holds(self) -> dict[str, Hold]:
        """Every hold now, GPU uuid -> holder: a snapshot (a copy), for a scheduler's pure core."""
        return dict(self._holds)

    def resolve(self, agent_id: str, host_gpus: Sequence[GpuRecord], named: Iterable[str]) -> list[str]:
        """The uuids of the GPUs ``named`` (uuids or indexes, or MIG instance uuids) on the host; Conflict for one
        not on it, or whose GPU is faulty or another host's (a refused claim) (a MIG instance goes down with its GPU)."""
        by_name = {g.uuid: g for g in host_gpus} | {str(g.index): g for g in host_gpus}
        instances = {m.uuid: g for g in host_gpus for m in g.info.mig_instances}
        uuids: list[str] = []
        for name in named:
            if name in instances:
                _refuse_unsound(instances[name])
                if name not in uuids:
                    uuids.append(name)
                continue
            gpu = by_name.get(name)
            if gpu is None:
                reported = ", ".join(sorted(g.uuid for g in host_gpus)) or "no GPU"
                raise Conflict(f"GPU {name!r} is not on host {agent_id}; it reports {reported}")
            _refuse_unsound(gpu)
            if gpu.uuid not in uuids:
                uuids.append(gpu.uuid)
        return uuids

    def claim(self, agent_id: str, container: str, command_id: str, gpu_uuids: Sequence[str]) -> None:
        """Take ``gpu_uuids`` (GPUs or MIG instances) for ``container``, all or none; Conflict when another
        container holds one, or holds its GPU whole, or holds one of its instances."""
        for uuid in gpu_uuids:
            clash = self._clash(uuid, agent_id, container)
            if clash is not None:
                raise Conflict(f"{clash}; delete that container first or name another GPU")
        for uuid in gpu_uuids:
            held = self._holds.get(uuid)
            self._holds[uuid] = Hold(agent_id, container, command_id, running=held is not None and held.running)
        self._changed([agent_id] if gpu_uuids else [])

    def confirm(self, command_id: str) -> list[str]:
        """The create ``command_id`` succeeded: its GPUs are now in use by a running container."""
        taken = [uuid for uuid, hold in self._holds.items() if hold.command_id == command_id]
        for uuid in taken:
            hold = self._holds[uuid]
            self._holds[uuid] = Hold(hold.agent_id, hold.container, hold.command_id, running=True)
        self._changed(self._holds[uuid].agent_id for uuid in taken)
        return taken

    def abandon(self, command_id: str) -> list[str]:
        """The create ``command_id`` failed or timed out: what it took and never started is free again."""
        freed = [uuid for uuid, hold in self._holds.items() if hold.command_id == command_id and not hold.running]
        hosts = [self._holds[uuid].agent_id for uuid in freed]
        for uuid in freed:
            del self._holds[uuid]
        self._changed(hosts)
        return freed

    def release(self, agent_id: str, container: str) -> list[str]:
        """``container`` was deleted: only its own GPUs are freed."""
        freed = [uuid for uuid, hold in self._holds.items() if (hold.agent_id, hold.container) == (agent_id, container)]
        for uuid in freed:
            del self._holds[uuid]
        self._changed([agent_id] if freed else [])
        return freed

    def release_host(self, agent_id: str) -> list[str]:
        """The host left for good (retired): whatever it held is gone with it."""
        freed = [uuid for uuid, hold in self._holds.items() if hold.agent_id == agent_id]
        for uuid in freed:
            del self._holds[uuid]
        self._changed([agent_id] if freed else [])
        return freed

    def rebuild(
        self,
        agents: Iterable[AgentRecord],
        open_creates: Iterable[tuple[CommandRecord, Sequence[str]]],
        gpu_owner: Mapping[str, str],
    ) -> list[str]:
        """Holds as they were before a restart; returns a description of each conflict found and dropped.

        Running containers first (what an agent confirmed is a fact), then open creates in the order
        they were made (each with the uuids its GPU names resolve to). A hold naming a GPU (or MIG instance,
        ``gpu_owner`` lists those too) its host does not own, or one already held (the instance's GPU held whole,
        or the GPU's instance held: ``set_partition`` ran before), is dropped.
        """
        self._holds.clear()
        dropped: list[str] = []
        for agent in agents:
            for container, uuids in agent.containers.items():
                for uuid in uuids:
                    if gpu_owner.get(uuid) == agent.id and self._clash(uuid, agent.id, container) is None:
                        self._holds[uuid] = Hold(agent.id, container, "", running=True)
                    else:
                        dropped.append(f"container {container!r} of {agent.id} on GPU {uuid}")
        for command, named in sorted(open_creates, key=lambda pair: pair[0].created_at):
            container = str(command.spec.get("name", ""))
            for uuid in named:
                owned = gpu_owner.get(uuid) == command.agent_id
                hold = self._holds.get(uuid)
                if owned and self._clash(uuid, command.agent_id, container) is None:
                    self._holds[uuid] = Hold(command.agent_id, container, command.id, running=hold is not None and hold.running)
                else:
                    dropped.append(f"command {command.id} on GPU {uuid}")
        self._changed([None])
        return dropped


def _refuse_unsound(gpu: GpuRecord) -> None:
    """Conflict when ``gpu`` (or a MIG instance of it) may take no new container."""
    if DUPLICATE_UUID_FLAG in gpu.flags:
        raise Conflict(f"GPU {gpu.uuid} is reported by more than one host; another host holds it, this host's claim was refused")
    if GPU_UNREACHABLE_FLAG in gpu.flags:
        raise Conflict(f"GPU {gpu.uuid} does not reach a container of its host's runtime (the agent's self-test failed)")
    if gpu.state == GpuState.FAULTY.value:
        why = f" ({gpu.fault.reason})" if gpu.fault is not None else ""
        raise Conflict(f"GPU {gpu.uuid} is faulty{why} and takes no new container until an operator repairs it")


def offered(gpu: GpuRecord, host: AgentRecord, *, allow_sandboxed: bool) -> bool:
    """Whether renters are offered ``gpu``: it is ``available`` and its host keeps workloads in a container (or in
    the process runtime's sandbox, when the operator allows that). A host with no isolation is never offered."""
    if gpu.state != GpuState.AVAILABLE.value or not MEASURED_FLAGS.isdisjoint(gpu.flags):
        return False  # measured as less than it claims (master/verification.py): not offered
    return host.isolation == "container" or (allow_sandboxed and host.isolation == "sandbox")


def gpu_state_for(gpu: GpuRecord, hold: Hold | None, host: AgentRecord) -> str:
    """The state a GPU should show given its holder and its host: ``available`` only when nothing
    holds it and its host takes work. A faulty GPU stays faulty until repaired."""
    if gpu.state == GpuState.FAULTY.value or host.state == AgentState.QUARANTINED.value:
        return GpuState.FAULTY.value
    if host.state not in _REACHABLE or DUPLICATE_UUID_FLAG in gpu.flags or GPU_UNREACHABLE_FLAG in gpu.flags:
        return GpuState.OFFLINE.value
    if hold is not None:
        return GpuState.BUSY.value if hold.running else GpuState.RESERVED.value
    if host.state in _TAKES_WORK and not host.drained:
        return GpuState.AVAILABLE.value
    return GpuState.OFFLINE.value

"""GPU allocations: who holds each GPU. The single source of truth the Master dispatches against.

A GPU has at most one holder, a container on the GPU's own host. A create command takes its GPUs
when it is created (before it is dispatched), so two commands in flight can never name the same GPU;
the hold is confirmed when the agent reports the container started, and given back when the create
fails or times out, or when the container is deleted. Nothing here does I/O: the ledger calls it, the
registry derives each GPU's state from it, and after a restart it is rebuilt from what is stored
(the containers each agent record lists and the create commands still open).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from common.errors import Conflict
from master.records import AgentRecord, CommandRecord, GpuRecord
from master.states import AgentState, GpuState

# A GPU carrying this flag was reported by two hosts; neither copy is offered until an operator looks.
DUPLICATE_UUID_FLAG = "duplicate_uuid"


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
    def __init__(self) -> None:
        self._holds: dict[str, Hold] = {}  # GPU uuid -> its holder

    def holder(self, gpu_uuid: str) -> Hold | None:
        return self._holds.get(gpu_uuid)

    def __len__(self) -> int:
        return len(self._holds)

    def holds(self) -> dict[str, Hold]:
        """Every hold now, GPU uuid -> holder: a snapshot (a copy), for a scheduler's pure core."""
        return dict(self._holds)

    def resolve(self, agent_id: str, host_gpus: Sequence[GpuRecord], named: Iterable[str]) -> list[str]:
        """The uuids of the GPUs ``named`` (uuids or indexes) on the host; Conflict for one not on it."""
        by_name = {g.uuid: g for g in host_gpus} | {str(g.index): g for g in host_gpus}
        uuids: list[str] = []
        for name in named:
            gpu = by_name.get(name)
            if gpu is None:
                reported = ", ".join(sorted(g.uuid for g in host_gpus)) or "no GPU"
                raise Conflict(f"GPU {name!r} is not on host {agent_id}; it reports {reported}")
            if DUPLICATE_UUID_FLAG in gpu.flags:
                raise Conflict(f"GPU {gpu.uuid} is reported by more than one host and is not offered until that is resolved")
            if gpu.state == GpuState.FAULTY.value:
                why = f" ({gpu.fault.reason})" if gpu.fault is not None else ""
                raise Conflict(f"GPU {gpu.uuid} is faulty{why} and takes no new container until an operator repairs it")
            if gpu.uuid not in uuids:
                uuids.append(gpu.uuid)
        return uuids

    def claim(self, agent_id: str, container: str, command_id: str, gpu_uuids: Sequence[str]) -> None:
        """Take ``gpu_uuids`` for ``container``, all or none; Conflict when another container holds one."""
        for uuid in gpu_uuids:
            hold = self._holds.get(uuid)
            if hold is not None and (hold.agent_id, hold.container) != (agent_id, container):
                raise Conflict(
                    f"GPU {uuid} is held by container {hold.container!r} on host {hold.agent_id}; "
                    "delete that container first or name another GPU"
                )
        for uuid in gpu_uuids:
            held = self._holds.get(uuid)
            self._holds[uuid] = Hold(agent_id, container, command_id, running=held is not None and held.running)

    def confirm(self, command_id: str) -> list[str]:
        """The create ``command_id`` succeeded: its GPUs are now in use by a running container."""
        taken = [uuid for uuid, hold in self._holds.items() if hold.command_id == command_id]
        for uuid in taken:
            hold = self._holds[uuid]
            self._holds[uuid] = Hold(hold.agent_id, hold.container, hold.command_id, running=True)
        return taken

    def abandon(self, command_id: str) -> list[str]:
        """The create ``command_id`` failed or timed out: what it took and never started is free again."""
        freed = [uuid for uuid, hold in self._holds.items() if hold.command_id == command_id and not hold.running]
        for uuid in freed:
            del self._holds[uuid]
        return freed

    def release(self, agent_id: str, container: str) -> list[str]:
        """``container`` was deleted: only its own GPUs are freed."""
        freed = [uuid for uuid, hold in self._holds.items() if (hold.agent_id, hold.container) == (agent_id, container)]
        for uuid in freed:
            del self._holds[uuid]
        return freed

    def release_host(self, agent_id: str) -> list[str]:
        """The host left for good (retired): whatever it held is gone with it."""
        freed = [uuid for uuid, hold in self._holds.items() if hold.agent_id == agent_id]
        for uuid in freed:
            del self._holds[uuid]
        return freed

    def rebuild(
        self,
        agents: Iterable[AgentRecord],
        open_creates: Iterable[tuple[CommandRecord, Sequence[str]]],
        gpu_owner: Mapping[str, str],
    ) -> list[str]:
        """Holds as they were before a restart; returns a description of each conflict found and dropped.

        Running containers first (what an agent confirmed is a fact), then open creates in the order
        they were made (each with the uuids its GPU names resolve to). A hold naming a GPU its host does
        not own, or one already held, is dropped.
        """
        self._holds.clear()
        dropped: list[str] = []
        for agent in agents:
            for container, uuids in agent.containers.items():
                for uuid in uuids:
                    if gpu_owner.get(uuid) == agent.id and uuid not in self._holds:
                        self._holds[uuid] = Hold(agent.id, container, "", running=True)
                    else:
                        dropped.append(f"container {container!r} of {agent.id} on GPU {uuid}")
        for command, named in sorted(open_creates, key=lambda pair: pair[0].created_at):
            container = str(command.spec.get("name", ""))
            for uuid in named:
                owned = gpu_owner.get(uuid) == command.agent_id
                hold = self._holds.get(uuid)
                if owned and (hold is None or (hold.agent_id, hold.container) == (command.agent_id, container)):
                    self._holds[uuid] = Hold(command.agent_id, container, command.id, running=hold is not None and hold.running)
                else:
                    dropped.append(f"command {command.id} on GPU {uuid}")
        return dropped


def offered(gpu: GpuRecord, host: AgentRecord, *, allow_sandboxed: bool) -> bool:
    """Whether renters are offered ``gpu``: it is ``available`` and its host keeps workloads in a container (or in
    the process runtime's sandbox, when the operator allows that). A host with no isolation is never offered."""
    if gpu.state != GpuState.AVAILABLE.value:
        return False
    return host.isolation == "container" or (allow_sandboxed and host.isolation == "sandbox")


def gpu_state_for(gpu: GpuRecord, hold: Hold | None, host: AgentRecord) -> str:
    """The state a GPU should show given its holder and its host: ``available`` only when nothing
    holds it and its host takes work. A faulty GPU stays faulty until repaired."""
    if gpu.state == GpuState.FAULTY.value or host.state == AgentState.QUARANTINED.value:
        return GpuState.FAULTY.value
    if host.state not in _REACHABLE or DUPLICATE_UUID_FLAG in gpu.flags:
        return GpuState.OFFLINE.value
    if hold is not None:
        return GpuState.BUSY.value if hold.running else GpuState.RESERVED.value
    if host.state in _TAKES_WORK and not host.drained:
        return GpuState.AVAILABLE.value
    return GpuState.OFFLINE.value

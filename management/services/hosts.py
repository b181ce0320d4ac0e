"""Hosts (agents) and their GPUs: lists filtered and paged over the registry in memory, drain, revoke, repair, and the
fleet's figures at a glance.

``owner`` (as the API's auth decided it): the provider a call is limited to, None for the operator; another
provider's host answers NotFound, as a missing one does, so existence is not leaked.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from common.errors import NotFound
from common.inventory import GpuSample
from management.services.fleet import FleetFigures, fleet_figures
from management.services.models import KeyText, Page, page_of
from management.workloads.book import WorkloadBook
from management.workloads.states import AssignmentState
from master.port import AgentRecord, GpuRecord, MasterPort


class AgentKey(msgspec.Struct, array_like=True, frozen=True):
    id: KeyText


class GpuKey(msgspec.Struct, array_like=True, frozen=True):
    agent_id: KeyText
    index: Annotated[int, msgspec.Meta(ge=-1, le=10**6)]
    uuid: KeyText


@dataclass(frozen=True)
class HostedReplica:
    """One replica of a workload placed on a host, as the host's provider may see it: what runs on its GPUs, never
    the renter's env, command, labels or account (docs/workloads.md, "What a provider sees")."""

    workload_id: str
    name: str
    image: str
    replica: int
    units: list[str]  # the GPU uuids (or MIG instance ids) the replica's container was given
    container: str
    state: str  # the workload's
    container_state: str  # the assignment's: pending | running | exited | deleting | deleted
    started_at: float | None


@dataclass(frozen=True)
class AgentDetail:
    """An agent with what its view shows beside the record."""

    agent: AgentRecord
    gpus: list[GpuRecord]
    latest: Mapping[str, GpuSample]
    reachable: bool  # a relay link carries it now: commands sent to it are delivered at once
    offered: frozenset[str]  # uuids of its GPUs renters are offered now
    workloads: list[HostedReplica] = field(default_factory=list)  # open workloads' replicas placed on it
    holders: Mapping[str, str] = field(default_factory=dict)  # GPU or MIG instance uuid -> the container holding it


@dataclass(frozen=True)
class GpuDetail:
    gpu: GpuRecord
    latest: GpuSample | None
    offered: bool  # renters are offered it now: available, on a host that isolates workloads well enough
    holders: Mapping[str, str] = field(default_factory=dict)  # the GPU's and its MIG instances' holding containers


@dataclass(frozen=True)
class HostChoices:
    """The values a hosts list may be filtered by."""

    regions: list[str]
    tiers: list[str]
    models: list[str]


class HostsService:
    def __init__(self, master: MasterPort, book: WorkloadBook) -> None:
        self._master = master
        self._book = book  # the open workloads, for what runs on each host

    # --- lookups the other services share ---------------------------------------------------------------------------

    def provider_of(self, agent_id: str) -> str | None:
        agent = self._master.registry.agents.get(agent_id)
        return agent.provider if agent is not None else None

    def owned_agent(self, agent_id: str, owner: str | None) -> AgentRecord:
        agent = self._master.registry.get(agent_id)
        if owner is not None and agent.provider != owner:
            raise NotFound(f"no agent {agent_id!r}")  # the same answer as a missing one: existence is not leaked
        return agent

    def gpu_of_unit(self, agent_id: str, unit: str) -> GpuRecord | None:
        """The GPU a unit (a GPU uuid, or a MIG instance's) is on, among the host's GPUs."""
        for gpu in self._master.registry.gpus_of(agent_id):
            if gpu.uuid == unit or any(m.uuid == unit for m in gpu.info.mig_instances):
                return gpu
        return None

    # --- agents ----------------------------------------------------------------------------------------------------

    def _detail(self, agent: AgentRecord, hosted: dict[str, list[HostedReplica]] | None = None) -> AgentDetail:
        m = self._master
        gpus = m.registry.gpus_of(agent.id)
        offered = frozenset(g.uuid for g in gpus if m.offered(g))
        replicas = (hosted if hosted is not None else self._hosted({agent.id})).get(agent.id, [])
        return AgentDetail(agent, gpus, m.telemetry.latest, agent.id in m.hub.agent_links, offered, replicas, self._holders(gpus))

    def _hosted(self, agent_ids: set[str]) -> dict[str, list[HostedReplica]]:
        """The replicas of open workloads placed on these agents (whose containers are not yet deleted), oldest
        workload first. One pass over the open workloads in memory: a page of agents costs one, not one per agent."""
        found: dict[str, list[HostedReplica]] = {}
        for rec in self._book.open_workloads():
            for a in rec.assignments:
                if a.agent_id in agent_ids and a.state != AssignmentState.DELETED:
                    found.setdefault(a.agent_id, []).append(
                        HostedReplica(
                            workload_id=rec.id,
                            name=rec.spec.name,
                            image=rec.spec.image,
                            replica=a.replica,
                            units=list(a.units),
                            container=a.container,
                            state=rec.state,
                            container_state=a.state,
                            started_at=rec.started_at,
                        )
                    )
        return found

    def _holders(self, gpus: Iterable[GpuRecord]) -> dict[str, str]:
        """GPU and MIG instance uuid -> the container holding it, for the GPUs given."""
        allocations = self._master.allocations
        found: dict[str, str] = {}
        for gpu in gpus:
            for uuid in (gpu.uuid, *(m.uuid for m in gpu.info.mig_instances)):
                hold = allocations.holder(uuid)
                if hold is not None:
                    found[uuid] = hold.container
        return found

    def get_agent(self, agent_id: str, *, owner: str | None = None) -> AgentDetail:
        return self._detail(self.owned_agent(agent_id, owner))

    def list_agents(
        self,
        *,
        state: str | None = None,
        provider: str | None = None,
        region: str | None = None,
        tier: str | None = None,
        model: str | None = None,
        owner: str | None = None,
        after: AgentKey | None = None,
        limit: int,
    ) -> Page[AgentDetail]:
        """Hosts by id from the cursor on; a host matches ``tier`` (``model``) when one of its GPUs is of it. A page walks
        the ids until it has ``limit + 1`` hosts."""
        registry = self._master.registry
        found: list[AgentRecord] = []
        for agent_id in self._ids_after(after.id if after else None, strictly=True):
            agent = registry.agents[agent_id]
            if (
                (state is not None and agent.state != state)
                or (region is not None and agent.region != region)
                or (provider is not None and agent.provider != provider)
                or (owner is not None and agent.provider != owner)
            ):
                continue
            if tier is not None or model is not None:
                gpus = registry.gpus_of(agent_id)
                if tier is not None and not any(g.tier == tier for g in gpus):
                    continue
                if model is not None and not any(g.model == model for g in gpus):
                    continue
            found.append(agent)
            if len(found) > limit:
                break
        page = page_of(found, limit, lambda a: AgentKey(a.id))
        hosted = self._hosted({a.id for a in page.items})
        return Page([self._detail(a, hosted) for a in page.items], page.next_key)

    def _ids_after(self, agent_id: str | None, *, strictly: bool) -> Iterator[str]:
        """Agent ids in order, from ``agent_id`` on. Sorting 10,000 ids takes about a millisecond: cheaper than
        keeping a sorted index in step with the registry, which this service is not told about."""
        ids = sorted(self._master.registry.agents)
        start = 0
        if agent_id is not None:
            start = (bisect.bisect_right if strictly else bisect.bisect_left)(ids, agent_id)
        return iter(ids[start:])

    async def drain(self, agent_id: str, *, owner: str | None = None) -> AgentDetail:
        self.owned_agent(agent_id, owner)
        return self._detail(await self._master.drain(agent_id))

    async def undrain(self, agent_id: str, *, owner: str | None = None) -> AgentDetail:
        self.owned_agent(agent_id, owner)
        return self._detail(await self._master.undrain(agent_id))

    async def revoke(self, agent_id: str) -> AgentDetail:
        return self._detail(await self._master.revoke(agent_id))

    # --- GPUs ------------------------------------------------------------------------------------------------------

    def list_gpus(
        self,
        *,
        state: str | None = None,
        tier: str | None = None,
        model: str | None = None,
        agent_id: str | None = None,
        offered: bool | None = None,
        owner: str | None = None,
        after: GpuKey | None = None,
        limit: int,
    ) -> Page[GpuDetail]:
        """GPUs ordered by (agent id, index, uuid). Walks the agents in id order from the cursor's agent and each
        agent's few GPUs, so a page costs one sort of agent ids and ``limit`` GPUs, never a sort of every GPU."""
        registry = self._master.registry
        start = after
        if agent_id is not None:
            wanted = agent_id in registry.agents and (start is None or agent_id >= start.agent_id)
            ids: Iterator[str] = iter([agent_id] if wanted else [])
        else:
            ids = self._ids_after(start.agent_id if start else None, strictly=False)
        found: list[GpuRecord] = []
        for aid in ids:
            if owner is not None and registry.agents[aid].provider != owner:
                continue
            for gpu in registry.gpus_of(aid):
                if start is not None and (gpu.agent_id, gpu.index, gpu.uuid) <= (start.agent_id, start.index, start.uuid):
                    continue
                if (
                    (state is None or gpu.state == state)
                    and (tier is None or gpu.tier == tier)
                    and (model is None or gpu.model == model)
                    and (offered is None or self._master.offered(gpu) == offered)
                ):
                    found.append(gpu)
            if len(found) > limit:
                break
        page = page_of(found, limit, lambda g: GpuKey(g.agent_id, g.index, g.uuid))
        latest = self._master.telemetry.latest
        return Page(
            [GpuDetail(g, latest.get(g.uuid), self._master.offered(g), self._holders([g])) for g in page.items], page.next_key
        )

    async def repair_gpu(self, uuid: str) -> GpuDetail:
        """Clear a faulty GPU's fault (master/faults.py): NotFound for an unknown GPU, Conflict for one not faulty."""
        gpu = await self._master.repair_gpu(uuid)
        return GpuDetail(gpu, self._master.telemetry.latest.get(gpu.uuid), self._master.offered(gpu), self._holders([gpu]))

    # --- the fleet at a glance (the console) ---------------------------------------------------------------------

    def fleet(self) -> FleetFigures:
        """Compute-unit figures of the whole fleet by tier, region and model, and its faulty GPUs
        (management/services/fleet.py): one pass over the registry in memory."""
        m = self._master
        order = [rule.name for rule in m.policy.tiers]
        return fleet_figures(m.registry.gpus.values(), m.registry.agents, m.telemetry.usage, tier_order=order)

    def host_choices(self, *, owner: str | None = None) -> HostChoices:
        """What the hosts list may be filtered by: the regions, tiers and models present (of ``owner``'s hosts)."""
        registry = self._master.registry
        regions: set[str] = set()
        models: set[str] = set()
        for agent in registry.agents.values():
            if owner is None or agent.provider == owner:
                if agent.region:
                    regions.add(agent.region)
        for gpu in registry.gpus.values():
            if gpu.model and (owner is None or self.provider_of(gpu.agent_id) == owner):
                models.add(gpu.model)
        return HostChoices(
            regions=sorted(regions), tiers=[rule.name for rule in self._master.policy.tiers], models=sorted(models)
        )

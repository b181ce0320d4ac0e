"""Hosts kept from a tier by their network: a host whose measured bandwidth (the slower direction, as the tiers
judge it) is under the network floor (``min_network_mbps``) of the tier its GPUs' hardware earns.

The registry classifies a GPU with its host's bandwidth, so such a host's GPUs sit in a lower tier than their
hardware earns; this says which hosts, by how much, for the alert rule ``host.bandwidth_below_floor``
(management/monitoring/observe.py) and the Prometheus gauge ``idlegrid_hosts_below_network_floor``.

Cheap at fleet scale: only a host that measured its bandwidth under the policy's highest floor is looked at (with
the shipped policy, which sets no floor, none is), and the floor its GPUs earn is kept until its GPUs change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from common.inventory import GpuInfo
from master.records import AgentRecord, GpuRecord
from master.states import AgentState
from master.tiers import TierPolicy, network_floor_mbps, network_mbps


@dataclass(frozen=True, slots=True)
class Shortfall:
    agent: AgentRecord
    measured_mbps: float
    floor_mbps: float


@dataclass
class NetworkFloors:
    policy: TierPolicy
    # agent id -> (its GPUs' infos, the floor they earn): only hosts measured under the highest floor
    _floors: dict[str, tuple[tuple[GpuInfo, ...], float | None]] = field(default_factory=dict)

    @property
    def highest_mbps(self) -> float:
        return max((rule.min_network_mbps or 0.0 for rule in self.policy.tiers), default=0.0)

    def shortfalls(self, agents: Iterable[AgentRecord], gpus_of: Callable[[str], Sequence[GpuRecord]]) -> list[Shortfall]:
        """The (not retired) hosts under the floor their GPUs' hardware earns."""
        highest = self.highest_mbps
        out: list[Shortfall] = []
        seen: set[str] = set()
        if highest > 0:
            for agent in agents:
                measured = network_mbps(agent.host)
                if measured is None or measured >= highest or agent.state == AgentState.RETIRED.value:
                    continue
                seen.add(agent.id)
                floor = self.floor_of(agent.id, gpus_of(agent.id))
                if floor is not None and measured < floor:
                    out.append(Shortfall(agent, measured, floor))
        for agent_id in self._floors.keys() - seen:
            del self._floors[agent_id]  # no longer a candidate, or gone
        return out

    def floor_of(self, agent_id: str, gpus: Sequence[GpuRecord]) -> float | None:
        """The highest network floor among the tiers these GPUs' hardware earns; None when none sets a floor."""
        infos = tuple(gpu.info for gpu in gpus)
        cached = self._floors.get(agent_id)
        if cached is not None and len(cached[0]) == len(infos) and all(a is b for a, b in zip(cached[0], infos, strict=True)):
            return cached[1]
        floors = [f for f in (network_floor_mbps(info, self.policy) for info in infos) if f is not None]
        floor = max(floors) if floors else None
        self._floors[agent_id] = (infos, floor)
        return floor

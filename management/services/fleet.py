"""The fleet at a glance: compute-unit (GPU) figures in total and by tier, region and model, and the faulty GPUs.

One pass over the registry's GPUs in memory: each GPU adds to the figures of its (tier, region, model, state)
combination, and the few hundred combinations are then summed into the groups, so a fleet of 80,000 GPUs costs one
dictionary update per GPU (tests/management/test_fleet.py measures it). Nothing is read from the store.

- ``busy``: GPUs that hold or are set aside for a workload (states busy and reserved).
- ``available``: GPUs in state available (renters are offered those on hosts that isolate workloads well enough).
- ``faulty`` and ``offline``: out of service, for their hardware or because their host is silent.
- ``utilization_pct``: the mean latest utilization of the GPUs in service (not offline) that reported a sample.
- ``memory_pct``: the latest memory used over the memory of those same GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from common.inventory import GpuSample
from master.port import AgentRecord, GpuFault, GpuRecord, GpuState

UNTIERED = "untiered"  # the tier group of GPUs no tier matched
UNKNOWN_MODEL = "unknown"
NO_REGION = "none"
FAULTY_LISTED = 200  # the faulty GPUs listed by name; the count says how many there are in all

_BUSY = frozenset({GpuState.BUSY.value, GpuState.RESERVED.value})


@dataclass
class UnitFigures:
    """One group's compute-unit figures."""

    name: str
    total: int = 0
    busy: int = 0
    available: int = 0
    faulty: int = 0
    offline: int = 0
    utilization_sum: float = 0.0
    sampled: int = 0  # GPUs in service with a sample: what utilization and memory are averaged over
    memory_used_mib: int = 0
    memory_total_mib: int = 0

    @property
    def utilization_pct(self) -> float | None:
        return round(self.utilization_sum / self.sampled, 1) if self.sampled else None

    @property
    def memory_pct(self) -> float | None:
        return round(100.0 * self.memory_used_mib / self.memory_total_mib, 1) if self.memory_total_mib else None

    def add(self, other: UnitFigures) -> None:
        self.total += other.total
        self.busy += other.busy
        self.available += other.available
        self.faulty += other.faulty
        self.offline += other.offline
        self.utilization_sum += other.utilization_sum
        self.sampled += other.sampled
        self.memory_used_mib += other.memory_used_mib
        self.memory_total_mib += other.memory_total_mib


@dataclass(frozen=True)
class FaultyGpu:
    uuid: str
    agent_id: str
    index: int
    model: str
    region: str
    fault: GpuFault | None  # None: marked faulty without a recorded cause


@dataclass
class FleetFigures:
    total: UnitFigures
    by_tier: list[UnitFigures]  # in the tier policy's order when given, then by name
    by_region: list[UnitFigures]  # by name
    by_model: list[UnitFigures]  # by name
    faulty: list[FaultyGpu] = field(default_factory=list)  # the first FAULTY_LISTED, by (agent id, index)
    faulty_count: int = 0
    hosts: int = 0


def usage_of(latest: Mapping[str, GpuSample]) -> Callable[[str], tuple[float, int] | None]:
    """``fleet_figures``' reading of each GPU's utilization and memory used, from samples by UUID."""

    def usage(uuid: str) -> tuple[float, int] | None:
        sample = latest.get(uuid)
        return None if sample is None else (sample.utilization_pct, sample.memory_used_mib)

    return usage


def fleet_figures(
    gpus: Iterable[GpuRecord],
    agents: Mapping[str, AgentRecord],
    usage: Callable[[str], tuple[float, int] | None],
    *,
    tier_order: Iterable[str] = (),
) -> FleetFigures:
    """The figures of ``gpus`` (their hosts' regions from ``agents``, each one's latest utilization and memory used from
    ``usage``: the Master's telemetry reads the two of 80,000 GPUs without making their samples; ``usage_of`` for a
    mapping of samples)."""
    combos: dict[tuple[str, str, str], UnitFigures] = {}
    faulty: list[GpuRecord] = []
    regions = {agent_id: agent.region or NO_REGION for agent_id, agent in agents.items()}
    for gpu in gpus:
        region = regions.get(gpu.agent_id, NO_REGION)
        key = (gpu.tier or UNTIERED, region, gpu.model or UNKNOWN_MODEL)
        figures = combos.get(key)
        if figures is None:
            figures = combos[key] = UnitFigures("")
        figures.total += 1
        state = gpu.state
        if state == GpuState.AVAILABLE.value:
            figures.available += 1
        elif state in _BUSY:
            figures.busy += 1
        elif state == GpuState.FAULTY.value:
            figures.faulty += 1
            faulty.append(gpu)
        elif state == GpuState.OFFLINE.value:
            figures.offline += 1
            continue  # a silent host's last figures are not the fleet's now
        used = usage(gpu.uuid)
        if used is not None:
            figures.sampled += 1
            figures.utilization_sum += used[0]
            figures.memory_used_mib += used[1]
            figures.memory_total_mib += gpu.info.memory_total_mib

    total = UnitFigures("all")
    groups: list[dict[str, UnitFigures]] = [{}, {}, {}]
    for key, figures in combos.items():
        total.add(figures)
        for group, name in zip(groups, key, strict=True):
            group.setdefault(name, UnitFigures(name)).add(figures)
    rank = {name: i for i, name in enumerate(tier_order)}
    by_tier = sorted(groups[0].values(), key=lambda f: (rank.get(f.name, len(rank)), f.name))
    faulty.sort(key=lambda g: (g.agent_id, g.index, g.uuid))
    listed = [
        FaultyGpu(g.uuid, g.agent_id, g.index, g.model, regions.get(g.agent_id, NO_REGION), g.fault)
        for g in faulty[:FAULTY_LISTED]
    ]
    return FleetFigures(
        total=total,
        by_tier=by_tier,
        by_region=sorted(groups[1].values(), key=lambda f: f.name),
        by_model=sorted(groups[2].values(), key=lambda f: f.name),
        faulty=listed,
        faulty_count=len(faulty),
        hosts=len(agents),
    )

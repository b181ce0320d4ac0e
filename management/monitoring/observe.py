"""What the alert rules can watch today, read off the running Master each evaluation as series of recent values.

Metrics wired (subject in brackets):

- ``gpu.temperature_c`` [GPU uuid]: the latest telemetry sample's temperature, at the sample's time;
- ``gpu.hardware_error`` [GPU uuid]: 1 while the GPU is faulty for an Xid or uncorrectable ECC errors, else 0;
- ``gpu.rented_utilization_pct`` [GPU uuid]: the latest utilization of a GPU a running container holds (absent
  for a GPU nobody holds, so the alert resolves when the rental ends);
- ``host.offline`` [agent id]: 1 while the host is offline, else 0 (retired hosts are not watched).

Not wired yet (no data in the Master to read): a relay down, a host's bandwidth under its tier's floor, a renter's
balance under an hour of its running rentals, the command failure rate over a window.

The observer sees each GPU's latest sample once per evaluation (not every sample in between), and keeps per
subject only the points the rules' durations need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from management.monitoring.evaluator import Point, Series
from management.monitoring.rules import AlertRule
from master.faults import LASTING
from master.records import WorkloadRecord
from master.service import Master
from master.states import AgentState

MAX_POINTS = 256  # per subject: a bound whatever the rules' durations and the evaluation period

GPU_TEMPERATURE = "gpu.temperature_c"
GPU_HARDWARE_ERROR = "gpu.hardware_error"
GPU_RENTED_UTILIZATION = "gpu.rented_utilization_pct"
HOST_OFFLINE = "host.offline"
WIRED = frozenset({GPU_TEMPERATURE, GPU_HARDWARE_ERROR, GPU_RENTED_UTILIZATION, HOST_OFFLINE})

OpenWorkloads = Callable[[], Sequence[WorkloadRecord]]


@dataclass
class FleetObserver:
    master: Master
    open_workloads: OpenWorkloads = tuple  # the scheduler's open workloads, to label a rented GPU with its renter
    _points: dict[tuple[str, str], list[Point]] = field(default_factory=dict)

    def collect(self, rules: Sequence[AlertRule], now: float) -> list[Series]:
        wanted = {rule.metric for rule in rules}
        window = max((max(r.for_s, r.clear_for_s) for r in rules), default=0.0)
        current: dict[tuple[str, str], tuple[Point, dict[str, str]]] = {}
        registry = self.master.registry
        renters = self._renters()
        for gpu in registry.gpus.values():
            host = registry.agents.get(gpu.agent_id)
            labels = {"agent_id": gpu.agent_id, "gpu": gpu.uuid, "tier": gpu.tier or "", "model": gpu.model}
            if host is not None:
                labels |= {"provider": host.provider, "region": host.region}
            labels |= renters.get(gpu.uuid, {})
            sample = self.master.telemetry.latest.get(gpu.uuid)
            if GPU_TEMPERATURE in wanted and sample is not None and sample.temperature_c is not None:
                current[(GPU_TEMPERATURE, gpu.uuid)] = ((sample.ts, sample.temperature_c), labels)
            if GPU_HARDWARE_ERROR in wanted:
                broken = 1.0 if gpu.fault is not None and gpu.fault.kind in LASTING else 0.0
                current[(GPU_HARDWARE_ERROR, gpu.uuid)] = ((now, broken), labels)
            if GPU_RENTED_UTILIZATION in wanted and sample is not None:
                hold = self.master.allocations.holder(gpu.uuid)
                if hold is not None and hold.running:
                    current[(GPU_RENTED_UTILIZATION, gpu.uuid)] = ((sample.ts, sample.utilization_pct), labels)
        if HOST_OFFLINE in wanted:
            for agent in registry.agents.values():
                if agent.state == AgentState.RETIRED.value:
                    continue
                offline = 1.0 if agent.state == AgentState.OFFLINE.value else 0.0
                labels = {"agent_id": agent.id, "provider": agent.provider, "region": agent.region}
                current[(HOST_OFFLINE, agent.id)] = ((now, offline), labels)
        series: list[Series] = []
        kept: dict[tuple[str, str], list[Point]] = {}
        for key, (point, labels) in current.items():
            points = self._points.get(key, [])
            if not points or point[0] > points[-1][0]:
                points.append(point)
            horizon = now - window - 1.0
            while len(points) > 1 and (points[1][0] < horizon or len(points) > MAX_POINTS):
                points.pop(0)  # the oldest point older than the window is kept: it may start the current run
            kept[key] = points
            series.append(Series(metric=key[0], subject=key[1], points=tuple(points), labels=labels))
        self._points = kept  # subjects gone from the fleet are forgotten
        return series

    def _renters(self) -> dict[str, dict[str, str]]:
        by_gpu: dict[str, dict[str, str]] = {}
        for workload in self.open_workloads():
            for assignment in workload.assignments:
                for unit in assignment.units:
                    by_gpu[unit] = {"renter": workload.account, "workload": workload.id}
        return by_gpu

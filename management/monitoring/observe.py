"""What the alert rules can watch today, read off the running Master each evaluation as series of recent values.

Metrics wired (subject in brackets):

- ``gpu.temperature_c`` [GPU uuid]: every telemetry sample's temperature, at the sample's time;
- ``gpu.hardware_error`` [GPU uuid]: 1 while the GPU is faulty for an Xid or uncorrectable ECC errors, else 0;
- ``gpu.rented_utilization_pct`` [GPU uuid]: every utilization sample of a GPU a running container holds (absent
  for a GPU nobody holds, so the alert resolves when the rental ends);
- ``host.offline`` [agent id]: 1 while the host is offline, else 0 (retired hosts are not watched);
- ``renter.balance_cover_s`` [renter account]: how long the renter's balance covers its running rentals (only
  renters with running rentals; label ``renter``);
- ``fleet.command_failure_pct`` ["fleet"]: failed container commands as a percentage of those finished over the
  last ``COMMAND_WINDOW_S`` (0 until at least ``COMMAND_MIN_COUNT`` finished in the window), from the hosts' counters.

Not wired yet (no data in the Master to read): a relay down, a host's bandwidth under its tier's floor.

Telemetry metrics see every sample: the observer listens to the Master's ingestion (``Master.sample_listeners``)
while attached (until then, and for a GPU not heard since, the Master's latest sample stands in). Per subject it
keeps only the points since the last evaluation and the one before them: the evaluator carries the rest in the
alerts' state (``since``, ``clear_since``), so memory stays a few points per GPU.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from common.inventory import GpuSample
from management.monitoring.evaluator import Point, Series
from management.monitoring.rules import AlertRule
from master.faults import LASTING
from master.records import WorkloadRecord
from master.service import Master
from master.states import AgentState

MAX_POINTS = 256  # per subject between two evaluations: a bound should the loop stall

GPU_TEMPERATURE = "gpu.temperature_c"
GPU_HARDWARE_ERROR = "gpu.hardware_error"
GPU_RENTED_UTILIZATION = "gpu.rented_utilization_pct"
HOST_OFFLINE = "host.offline"
RENTER_BALANCE_COVER = "renter.balance_cover_s"
FLEET_COMMAND_FAILURE = "fleet.command_failure_pct"
WIRED = frozenset(
    {GPU_TEMPERATURE, GPU_HARDWARE_ERROR, GPU_RENTED_UTILIZATION, HOST_OFFLINE, RENTER_BALANCE_COVER, FLEET_COMMAND_FAILURE}
)
COMMAND_WINDOW_S = 600.0
COMMAND_MIN_COUNT = 10

OpenWorkloads = Callable[[], Sequence[WorkloadRecord]]
BalanceCover = Callable[[float], Mapping[str, float]]  # now -> renter -> seconds its balance covers


def _no_balances(now: float) -> Mapping[str, float]:
    return {}


@dataclass
class FleetObserver:
    master: Master
    open_workloads: OpenWorkloads = tuple  # the scheduler's open workloads, to label a rented GPU with its renter
    balance_cover: BalanceCover = _no_balances  # the market's meter
    _points: dict[tuple[str, str], list[Point]] = field(default_factory=dict)
    _attached: bool = False
    # (ts, succeeded, failed) fleet-wide command counters at each evaluation of the last COMMAND_WINDOW_S
    _commands: deque[tuple[float, int, int]] = field(default_factory=deque)

    def attach(self) -> None:
        """Start hearing every telemetry sample as the Master ingests it."""
        if not self._attached:
            self.master.sample_listeners.append(self._on_samples)
            self._attached = True

    def detach(self) -> None:
        if self._attached:
            self.master.sample_listeners.remove(self._on_samples)
            self._attached = False

    def _on_samples(self, agent_id: str, samples: list[GpuSample]) -> None:
        allocations = self.master.allocations
        for sample in samples:
            if sample.temperature_c is not None:
                self._add((GPU_TEMPERATURE, sample.uuid), (sample.ts, sample.temperature_c))
            hold = allocations.holder(sample.uuid)
            if hold is not None and hold.running:
                self._add((GPU_RENTED_UTILIZATION, sample.uuid), (sample.ts, sample.utilization_pct))

    def _add(self, key: tuple[str, str], point: Point) -> None:
        points = self._points.get(key)
        if points is None:
            self._points[key] = [point]
        elif point[0] > points[-1][0]:  # a late or repeated sample is not counted twice
            points.append(point)
            if len(points) > MAX_POINTS:
                del points[0]

    def collect(self, rules: Sequence[AlertRule], now: float) -> list[Series]:
        """Every wired metric the rules ask for, as series; then forget all but each subject's latest point."""
        wanted = {rule.metric for rule in rules}
        registry = self.master.registry
        renters = self._renters()
        series: list[Series] = []
        current: dict[tuple[str, str], list[Point]] = {}

        def emit(key: tuple[str, str], points: list[Point], labels: dict[str, str]) -> None:
            current[key] = points
            series.append(Series(metric=key[0], subject=key[1], points=tuple(points), labels=labels))

        for gpu in registry.gpus.values():
            host = registry.agents.get(gpu.agent_id)
            labels = {"agent_id": gpu.agent_id, "gpu": gpu.uuid, "tier": gpu.tier or "", "model": gpu.model}
            if host is not None:
                labels |= {"provider": host.provider, "region": host.region}
            labels |= renters.get(gpu.uuid, {})
            if GPU_TEMPERATURE in wanted:
                points = self._sampled((GPU_TEMPERATURE, gpu.uuid))
                if points:
                    emit((GPU_TEMPERATURE, gpu.uuid), points, labels)
            if GPU_RENTED_UTILIZATION in wanted:
                hold = self.master.allocations.holder(gpu.uuid)
                points = self._sampled((GPU_RENTED_UTILIZATION, gpu.uuid))
                if hold is not None and hold.running and points:
                    emit((GPU_RENTED_UTILIZATION, gpu.uuid), points, labels)
            if GPU_HARDWARE_ERROR in wanted:
                broken = 1.0 if gpu.fault is not None and gpu.fault.kind in LASTING else 0.0
                emit((GPU_HARDWARE_ERROR, gpu.uuid), [(now, broken)], labels)
        if HOST_OFFLINE in wanted:
            for agent in registry.agents.values():
                if agent.state == AgentState.RETIRED.value:
                    continue
                offline = 1.0 if agent.state == AgentState.OFFLINE.value else 0.0
                labels = {"agent_id": agent.id, "provider": agent.provider, "region": agent.region}
                emit((HOST_OFFLINE, agent.id), [(now, offline)], labels)
        if RENTER_BALANCE_COVER in wanted:
            for renter, cover_s in self.balance_cover(now).items():
                if math.isfinite(cover_s):
                    emit((RENTER_BALANCE_COVER, renter), [(now, cover_s)], {"renter": renter})
        if FLEET_COMMAND_FAILURE in wanted:
            emit((FLEET_COMMAND_FAILURE, "fleet"), [(now, self._command_failure_pct(now))], {})
        # Keep each telemetry subject's latest point (the next evaluation's run may start before its new samples);
        # subjects no longer in the fleet are forgotten.
        self._points = {key: points[-1:] for key, points in self._points.items() if key in current}
        return series

    def _sampled(self, key: tuple[str, str]) -> list[Point]:
        """The points heard for ``key``; the latest sample the Master holds when none was heard (just attached)."""
        points = self._points.get(key)
        if points:
            return points
        metric, uuid = key
        sample = self.master.telemetry.latest.get(uuid)
        if sample is None:
            return []
        value = sample.temperature_c if metric == GPU_TEMPERATURE else sample.utilization_pct
        if value is None:
            return []
        self._points[key] = [(sample.ts, value)]
        return self._points[key]

    def _command_failure_pct(self, now: float) -> float:
        agents = self.master.registry.agents.values()
        succeeded = sum(a.commands_succeeded for a in agents)
        failed = sum(a.commands_failed for a in agents)
        self._commands.append((now, succeeded, failed))
        while len(self._commands) > 1 and self._commands[1][0] <= now - COMMAND_WINDOW_S:
            self._commands.popleft()  # the oldest kept is at or before the window's start
        _, succeeded_then, failed_then = self._commands[0]
        failed_in = max(0, failed - failed_then)
        finished = failed_in + max(0, succeeded - succeeded_then)
        return 100.0 * failed_in / finished if finished >= COMMAND_MIN_COUNT else 0.0

    def _renters(self) -> dict[str, dict[str, str]]:
        by_gpu: dict[str, dict[str, str]] = {}
        for workload in self.open_workloads():
            for assignment in workload.assignments:
                for unit in assignment.units:
                    by_gpu[unit] = {"renter": workload.account, "workload": workload.id}
        return by_gpu

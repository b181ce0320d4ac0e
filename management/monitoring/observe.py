"""What the alert rules can watch today, read off the running Master each evaluation as series of recent values.

Metrics wired (subject in brackets):

- ``gpu.temperature_c`` [GPU uuid]: every telemetry sample's temperature, at the sample's time;
- ``gpu.hardware_error`` [GPU uuid]: 1 while the GPU is faulty for an Xid or uncorrectable ECC errors, else 0;
- ``gpu.rented_utilization_pct`` [GPU uuid]: every utilization sample of a GPU a running container holds (absent
  for a GPU nobody holds, so the alert resolves when the rental ends);
- ``host.offline`` [agent id]: 1 while the host is offline, else 0 (retired hosts are not watched);
- ``renter.balance_cover_s`` [renter account]: how long the renter's balance covers its running rentals (only
  renters with running rentals; label ``renter``);
- ``renter.spend_cap_used_pct`` [renter/cap, e.g. ``rita/project=train/month/hard``]: what the renter spent in a spend
  cap's window as a percentage of its limit, as the spend-cap watch last read it (every capped renter's caps; labels
  ``renter``, ``cap``, ``spent``, ``limit``, ``hard``);
- ``renter.auto_topup_failed`` [renter account]: 1 while the renter's latest auto top-up failed (declined at once or by
  the provider's event), until a later one is credited or the renter changes its card or its auto top-up (only
  renters whose latest failed; labels ``renter``, ``amount``, ``reason``);
- ``fleet.command_failure_pct`` ["fleet"]: failed container commands as a percentage of those finished over the
  last ``COMMAND_WINDOW_S`` (0 until at least ``COMMAND_MIN_COUNT`` finished in the window), from the hosts' counters;
- ``relay.down`` [relay id]: 1 while a known relay is not linked to the Master, else 0. Known: linked now, or the
  relay some (not retired) agent last came through, or seen linked by this observer in the last
  ``RELAY_MEMORY_S``; a relay none of these names any more is forgotten (its alert resolves). Label ``region``;
- ``host.bandwidth_below_floor`` [agent id]: 1 while the host's measured bandwidth (the slower direction) is under
  the network floor (``min_network_mbps``) of the tier its GPUs' hardware earns, else 0: the host is kept from
  that tier by its network. Only hosts that measured their bandwidth and have GPUs whose tier sets a floor (the
  shipped tier policy sets none; an operator's may). Labels ``bandwidth_mbps``, ``floor_mbps``;
- ``payouts.unreconciled`` ["fleet"]: how many differences the last reconciliation of the ledger's payouts with the
  payment provider's transfers found (docs/payments.md, "Reconciliation"); 0 before the first;
- ``gpu.temperature_anomaly`` [GPU uuid]: each sample's temperature scored against the GPU's own recent range at
  the same utilization (management/monitoring/anomaly.py), from the moment a rule asks for it.

Sparse by design (a fleet is 80,000 GPUs, nearly all quiet). Telemetry metrics see every sample: the observer
listens to the Master's ingestion (``SamplesTaken`` on its change feed) while attached, and keeps a point only if

- it breaches some rule on that metric, or
- the subject already has kept points since the last evaluation, or
- the subject has a live alert state (pending or firing) for a rule of that metric.

Each evaluation emits a series only for a subject with a live state (always: the evaluator resolves a firing alert
whose subject is not reported) or with a kept point that breaches some rule; labels are built only for those. This
is exactly what the evaluator needs: for a subject with no state it only looks at the trailing run of breaching
points (a point that breaches nothing yields no state, ``continue``), and it never looks before that run. Likewise
``gpu.hardware_error`` and ``host.offline`` emit only faulty GPUs / offline hosts and subjects with a live state,
unless some rule breaches on the healthy value 0 (then every subject, as before). A quiet fleet thus keeps no
points and yields no series. One difference with an observer that kept everything: a late sample (stamped before
one already heard of that GPU) of a GPU with no kept point is judged as its newest, where the other dropped it
(remembering every GPU's last time is what this avoids; a repeated sample is dropped either way). Per subject the
points since the last evaluation and the one before them are kept; the evaluator carries the rest in the alerts'
state (``since``, ``clear_since``).

The Master's latest sample stands in for a GPU not heard since the observer attached: once, at the first
evaluation (filtered the same way), and for a subject with a live state but no point.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from common.inventory import GpuSample
from management.monitoring.anomaly import TemperatureBaselines
from management.monitoring.evaluator import Point, Series
from management.monitoring.rules import AlertRule
from master.port import (
    LASTING,
    AgentRecord,
    AgentState,
    Change,
    GpuRecord,
    MasterPort,
    NetworkFloors,
    SamplesTaken,
    Shortfall,
    WorkloadRecord,
)

MAX_POINTS = 256  # per subject between two evaluations: a bound should the loop stall

GPU_TEMPERATURE = "gpu.temperature_c"
GPU_HARDWARE_ERROR = "gpu.hardware_error"
GPU_RENTED_UTILIZATION = "gpu.rented_utilization_pct"
HOST_OFFLINE = "host.offline"
RENTER_BALANCE_COVER = "renter.balance_cover_s"
FLEET_COMMAND_FAILURE = "fleet.command_failure_pct"
RELAY_DOWN = "relay.down"
HOST_BANDWIDTH_BELOW_FLOOR = "host.bandwidth_below_floor"
GPU_TEMPERATURE_ANOMALY = "gpu.temperature_anomaly"
SPEND_CAP_USED = "renter.spend_cap_used_pct"
AUTO_TOPUP_FAILED = "renter.auto_topup_failed"
PAYOUTS_UNRECONCILED = "payouts.unreconciled"
WIRED = frozenset(
    {
        GPU_TEMPERATURE,
        GPU_HARDWARE_ERROR,
        GPU_RENTED_UTILIZATION,
        HOST_OFFLINE,
        RENTER_BALANCE_COVER,
        FLEET_COMMAND_FAILURE,
        RELAY_DOWN,
        HOST_BANDWIDTH_BELOW_FLOOR,
        GPU_TEMPERATURE_ANOMALY,
        SPEND_CAP_USED,
        AUTO_TOPUP_FAILED,
        PAYOUTS_UNRECONCILED,
    }
)
SAMPLED = (GPU_TEMPERATURE, GPU_RENTED_UTILIZATION, GPU_TEMPERATURE_ANOMALY)  # read off telemetry samples
RELAY_MEMORY_S = 7 * 86400.0  # a relay seen linked is known this long after it was last linked
COMMAND_WINDOW_S = 600.0
COMMAND_MIN_COUNT = 10

OpenWorkloads = Callable[[], Sequence[WorkloadRecord]]
BalanceCover = Callable[[float], Mapping[str, float]]  # now -> renter -> seconds its balance covers
Key = tuple[str, str]  # (metric, subject)


class Reading(NamedTuple):
    """One value of a metric read off a part of the grid (not telemetry), about one subject, with its labels."""

    subject: str
    value: float
    labels: dict[str, str]


Readings = Callable[[float], Sequence[Reading]]  # now -> the metric's current values


def _no_readings(now: float) -> Sequence[Reading]:
    return ()


def _no_balances(now: float) -> Mapping[str, float]:
    return {}


def _reconciled() -> int:
    return 0


def _alerted_hosts(short: Mapping[str, Shortfall], live: Collection[Key], agents: Mapping[str, AgentRecord]) -> list[AgentRecord]:
    """The hosts under their floor and those with a live bandwidth alert."""
    ids = set(short) | {subject for metric, subject in live if metric == HOST_BANDWIDTH_BELOW_FLOOR}
    return [agents[agent_id] for agent_id in sorted(ids) if agent_id in agents]


def _noted(metric: str, subject: str, points: Mapping[Key, object], live: Collection[Key]) -> bool:
    key = (metric, subject)
    return key in points or key in live


def _sample_value(metric: str, sample: GpuSample) -> float | None:
    """The metric's value in one sample; None for the anomaly score, which is not a sample's own figure."""
    if metric == GPU_TEMPERATURE:
        return sample.temperature_c
    return sample.utilization_pct if metric == GPU_RENTED_UTILIZATION else None


@dataclass
class FleetObserver:
    master: MasterPort
    open_workloads: OpenWorkloads = tuple  # the scheduler's open workloads, to label a rented GPU with its renter
    balance_cover: BalanceCover = _no_balances  # the market's meter
    spend_caps: Readings = _no_readings  # the spend-cap watch: renter.spend_cap_used_pct
    failed_auto_topups: Readings = _no_readings  # the top-ups: renter.auto_topup_failed
    unreconciled: Callable[[], int] = _reconciled  # the payout service's last reconciliation: differences found
    _points: dict[Key, list[Point]] = field(default_factory=dict)  # only subjects worth keeping (module docstring)
    _stop_listening: Callable[[], None] | None = None  # attached: how to stop hearing samples
    _caught_up: bool = False  # the one-time pass over the Master's latest samples was made
    # metric -> the rules on it, as of the last evaluation; None: not known yet (every point is kept until then)
    _watched: dict[str, tuple[AlertRule, ...]] | None = None
    _live: set[Key] = field(default_factory=set)  # subjects with a pending or firing alert, as of the last evaluation
    _subjects: set[str] = field(default_factory=set)  # the subjects of _points and _live: a quiet sample's fast test
    # (ts, succeeded, failed) fleet-wide command counters at each evaluation of the last COMMAND_WINDOW_S
    _commands: deque[tuple[float, int, int]] = field(default_factory=deque)
    _relays: dict[str, tuple[str, float]] = field(default_factory=dict)  # relay seen linked -> (region, last linked)
    baselines: TemperatureBaselines = field(default_factory=TemperatureBaselines)  # for gpu.temperature_anomaly
    floors: NetworkFloors = field(init=False)  # hosts under their hardware tier's network floor (the Master's policy)

    def __post_init__(self) -> None:
        self.floors = NetworkFloors(self.master.policy)

    def attach(self) -> None:
        """Start hearing every telemetry sample as the Master ingests it."""
        if self._stop_listening is None:
            self._stop_listening = self.master.changes.listen(self._on_taken, (SamplesTaken,))

    def detach(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None

    def _on_taken(self, change: Change) -> None:
        if isinstance(change, SamplesTaken):
            self._on_samples(change.agent_id, change.samples)

    def watch(self, rules: Sequence[AlertRule]) -> None:
        """Keep the points these rules need from now on (collect does this too; the loop calls it on new rules)."""
        watched: dict[str, list[AlertRule]] = {}
        for rule in rules:
            watched.setdefault(rule.metric, []).append(rule)
        self._watched = {metric: tuple(on) for metric, on in watched.items()}

    @property
    def kept_points(self) -> int:
        """How many telemetry points are held (the memory this observer costs)."""
        return sum(len(points) for points in self._points.values())

    def _worth_keeping(self, key: Key, value: float) -> bool:
        watched = self._watched
        if watched is None:
            return True
        rules = watched.get(key[0])
        if not rules:
            return False
        return key in self._points or key in self._live or any(rule.breached(value) for rule in rules)

    def _breaches(self, metric: str) -> Callable[[float], bool] | None:
        """Whether a value breaches some rule on ``metric``; None when no rule watches it."""
        rules = (self._watched or {}).get(metric)
        if not rules:
            return None
        if len(rules) == 1:
            return rules[0].breached
        return lambda value: any(rule.breached(value) for rule in rules)

    def _on_samples(self, agent_id: str, samples: list[GpuSample]) -> None:
        """Called for every telemetry frame: the quiet case (nothing breaches, the GPU has no kept point and no
        alert) costs a few comparisons and a set lookup a sample."""
        if self._watched is None:  # the rules are not known yet: keep everything until the first evaluation
            self._keep_every(samples)
            return
        hot, cold = self._breaches(GPU_TEMPERATURE), self._breaches(GPU_TEMPERATURE_ANOMALY)
        idle = self._breaches(GPU_RENTED_UTILIZATION)
        points, live, watched_subjects = self._points, self._live, self._subjects
        allocations, gpus, baselines = self.master.allocations, self.master.registry.gpus, self.baselines
        for sample in samples:
            uuid, temperature = sample.uuid, sample.temperature_c
            noted = uuid in watched_subjects  # kept points or a live alert, for some sampled metric
            if temperature is not None:
                if hot is not None and (hot(temperature) or (noted and _noted(GPU_TEMPERATURE, uuid, points, live))):
                    self._add((GPU_TEMPERATURE, uuid), (sample.ts, temperature))
                if cold is not None:
                    gpu = gpus.get(uuid)  # keyed by the registry's own uuid string: a sample's is a copy per frame
                    score = None if gpu is None else baselines.observe(gpu.uuid, sample.utilization_pct, temperature)
                    if score is not None and (cold(score) or (noted and _noted(GPU_TEMPERATURE_ANOMALY, uuid, points, live))):
                        self._add((GPU_TEMPERATURE_ANOMALY, uuid), (sample.ts, score))
            if idle is not None and (
                idle(sample.utilization_pct) or (noted and _noted(GPU_RENTED_UTILIZATION, uuid, points, live))
            ):
                hold = allocations.holder(uuid)
                if hold is not None and hold.running:
                    self._add((GPU_RENTED_UTILIZATION, uuid), (sample.ts, sample.utilization_pct))

    def _keep_every(self, samples: list[GpuSample]) -> None:
        allocations, gpus = self.master.allocations, self.master.registry.gpus
        for sample in samples:
            if sample.temperature_c is not None:
                self._add((GPU_TEMPERATURE, sample.uuid), (sample.ts, sample.temperature_c))
                gpu = gpus.get(sample.uuid)
                score = None if gpu is None else self.baselines.observe(gpu.uuid, sample.utilization_pct, sample.temperature_c)
                if score is not None:
                    self._add((GPU_TEMPERATURE_ANOMALY, sample.uuid), (sample.ts, score))
            hold = allocations.holder(sample.uuid)
            if hold is not None and hold.running:
                self._add((GPU_RENTED_UTILIZATION, sample.uuid), (sample.ts, sample.utilization_pct))

    def _add(self, key: Key, point: Point) -> None:
        points = self._points.get(key)
        if points is None:
            self._points[key] = [point]
            self._subjects.add(key[1])
        elif point[0] > points[-1][0]:  # a late or repeated sample is not counted twice
            points.append(point)
            if len(points) > MAX_POINTS:
                del points[0]

    def collect(self, rules: Sequence[AlertRule], now: float, states: Collection[tuple[str, str]] = ()) -> list[Series]:
        """The series the rules need, given the keys ``(rule, subject)`` of the alerts' current states; then forget
        all but each emitted subject's latest point."""
        self.watch(rules)
        watched = self._watched or {}
        metric_of = {rule.name: rule.metric for rule in rules}
        live = {(metric_of[rule], subject) for rule, subject in states if rule in metric_of}
        self._live = live
        if not self._caught_up:
            self._catch_up(watched)
        registry = self.master.registry
        series: list[Series] = []
        current: set[Key] = set()
        renters: dict[str, dict[str, str]] | None = None
        gpu_labels: dict[str, dict[str, str]] = {}

        def labels_of(gpu: GpuRecord) -> dict[str, str]:
            nonlocal renters
            labels = gpu_labels.get(gpu.uuid)
            if labels is None:
                host = registry.agents.get(gpu.agent_id)
                labels = {"agent_id": gpu.agent_id, "gpu": gpu.uuid, "tier": gpu.tier or "", "model": gpu.model}
                if host is not None:
                    labels |= {"provider": host.provider, "region": host.region}
                if renters is None:
                    renters = self._renters()
                labels |= renters.get(gpu.uuid, {})
                gpu_labels[gpu.uuid] = labels
            return labels

        def emit(key: Key, points: Sequence[Point], labels: dict[str, str]) -> None:
            current.add(key)
            series.append(Series(metric=key[0], subject=key[1], points=tuple(points), labels=labels))

        for metric in SAMPLED:
            on = watched.get(metric)
            if not on:
                continue
            subjects = {key for key in self._points if key[0] == metric} | {key for key in live if key[0] == metric}
            for key in sorted(subjects):
                gpu = registry.gpus.get(key[1])
                if gpu is None:
                    continue
                if metric == GPU_RENTED_UTILIZATION:
                    hold = self.master.allocations.holder(gpu.uuid)
                    if hold is None or not hold.running:
                        continue
                points = self._points.get(key) or self._latest(key)
                if not points:
                    continue
                if key in live or any(rule.breached(value) for _, value in points for rule in on):
                    emit(key, points, labels_of(gpu))
        on = watched.get(GPU_HARDWARE_ERROR)
        if on:
            every = any(rule.breached(0.0) for rule in on)  # a healthy GPU breaches: every GPU, as before
            for gpu in registry.gpus.values() if every else self._faulty_or_alerted(live):
                broken = gpu.fault is not None and gpu.fault.kind in LASTING
                if every or broken or (GPU_HARDWARE_ERROR, gpu.uuid) in live:
                    emit((GPU_HARDWARE_ERROR, gpu.uuid), [(now, 1.0 if broken else 0.0)], labels_of(gpu))
        on = watched.get(HOST_OFFLINE)
        if on:
            online_breaches = any(rule.breached(0.0) for rule in on)
            for agent in registry.agents.values():
                if agent.state == AgentState.RETIRED.value:
                    continue
                offline = agent.state == AgentState.OFFLINE.value
                if offline or online_breaches or (HOST_OFFLINE, agent.id) in live:
                    labels = {"agent_id": agent.id, "provider": agent.provider, "region": agent.region}
                    emit((HOST_OFFLINE, agent.id), [(now, 1.0 if offline else 0.0)], labels)
        on = watched.get(RELAY_DOWN)
        if on:
            for relay_id, (region, linked) in self._known_relays(now).items():
                emit((RELAY_DOWN, relay_id), [(now, 0.0 if linked else 1.0)], {"relay": relay_id, "region": region})
        on = watched.get(HOST_BANDWIDTH_BELOW_FLOOR)
        if on:
            short = {s.agent.id: s for s in self.floors.shortfalls(registry.agents.values(), registry.gpus_of)}
            every = any(rule.breached(0.0) for rule in on)  # a host over its floor breaches: every host, as before
            hosts = registry.agents.values() if every else _alerted_hosts(short, live, registry.agents)
            for agent in hosts:
                if agent.state == AgentState.RETIRED.value:
                    continue
                labels = {"agent_id": agent.id, "provider": agent.provider, "region": agent.region}
                shortfall = short.get(agent.id)
                if shortfall is not None:
                    labels |= {"bandwidth_mbps": f"{shortfall.measured_mbps:g}", "floor_mbps": f"{shortfall.floor_mbps:g}"}
                emit((HOST_BANDWIDTH_BELOW_FLOOR, agent.id), [(now, 0.0 if shortfall is None else 1.0)], labels)
        if GPU_TEMPERATURE_ANOMALY in watched and len(self.baselines) > len(registry.gpus):
            self.baselines.forget_except(registry.gpus)  # GPUs gone from the fleet
        if RENTER_BALANCE_COVER in watched:
            for renter, cover_s in self.balance_cover(now).items():
                if math.isfinite(cover_s):
                    emit((RENTER_BALANCE_COVER, renter), [(now, cover_s)], {"renter": renter})
        for metric, read in ((SPEND_CAP_USED, self.spend_caps), (AUTO_TOPUP_FAILED, self.failed_auto_topups)):
            if metric in watched:
                for reading in read(now):
                    emit((metric, reading.subject), [(now, reading.value)], reading.labels)
        if FLEET_COMMAND_FAILURE in watched:
            emit((FLEET_COMMAND_FAILURE, "fleet"), [(now, self._command_failure_pct(now))], {})
        if PAYOUTS_UNRECONCILED in watched:
            emit((PAYOUTS_UNRECONCILED, "fleet"), [(now, float(self.unreconciled()))], {})
        # Keep each emitted telemetry subject's latest point (the next evaluation's run may start before its new
        # samples); every other subject is forgotten: quiet, or no longer in the fleet.
        self._points = {key: points[-1:] for key, points in self._points.items() if key in current}
        self._subjects = {subject for _, subject in self._points} | {subject for _, subject in live}
        return series

    def _known_relays(self, now: float) -> dict[str, tuple[str, bool]]:
        """Relay id -> (region, linked now) for every relay known (module docstring)."""
        links = self.master.hub.links
        for relay_id, link in links.items():
            self._relays[relay_id] = (link.region, now)
        used = self.master.registry.last_relays()
        for relay_id, (_, linked_at) in list(self._relays.items()):
            if relay_id not in links and relay_id not in used and now - linked_at > RELAY_MEMORY_S:
                del self._relays[relay_id]
        known = {relay_id: (region, relay_id in links) for relay_id, (region, _) in self._relays.items()}
        for relay_id in used - known.keys():
            known[relay_id] = ("", False)
        return known

    def _faulty_or_alerted(self, live: Collection[Key]) -> list[GpuRecord]:
        """The GPUs with a lasting fault (one attribute read each) and those with a live hardware error alert."""
        gpus = self.master.registry.gpus
        found = {gpu.uuid: gpu for gpu in gpus.values() if gpu.fault is not None and gpu.fault.kind in LASTING}
        for metric, uuid in live:
            gpu = gpus.get(uuid) if metric == GPU_HARDWARE_ERROR else None
            if gpu is not None:
                found[uuid] = gpu
        return list(found.values())

    def _catch_up(self, watched: Mapping[str, tuple[AlertRule, ...]]) -> None:
        """Once: the Master's latest sample of each GPU not heard since attaching, kept if worth keeping."""
        self._caught_up = True
        for metric in SAMPLED:
            if not watched.get(metric):
                continue
            for uuid, sample in self.master.telemetry.latest.items():
                key = (metric, uuid)
                value = _sample_value(metric, sample)
                if key not in self._points and value is not None and self._worth_keeping(key, value):
                    self._points[key] = [(sample.ts, value)]

    def _latest(self, key: Key) -> list[Point]:
        """For a subject with a live state but no point: the latest sample the Master holds, if any."""
        sample = self.master.telemetry.latest.get(key[1])
        value = None if sample is None else _sample_value(key[0], sample)
        if sample is None or value is None:
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

"""The Master's Prometheus metrics, in a registry of their own (``MasterMetrics.registry``).

Fleet gauges (agents, GPUs, open commands, relays) are read from memory at scrape time, so nothing
is kept up to date on the hot path. Counters and histograms are bumped where things happen. Labels
are bounded sets (states, tiers, frame types, outcome codes), never agent, GPU or command ids.
"""

from __future__ import annotations

import asyncio
import time
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.inventory import GpuSample
from common.wire import AgentFrame
from master.faults import ECC, OVERHEAT, XID
from master.records import AgentRecord, CommandRecord, GpuRecord
from master.states import AgentState, CommandState, GpuState

# Seconds from a command's creation to its final state: a container starts in seconds, a delete may wait
# for its grace period, a timeout takes the command's whole deadline.
COMMAND_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# A heartbeat's transit, agent -> relay -> Master: milliseconds when all is well, seconds when a relay or the Master lags.
HEARTBEAT_TRANSIT_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5)
_FRAME_TYPES: tuple[type[msgspec.Struct], ...] = typing.get_args(AgentFrame)  # every frame an agent may send
_OPEN_COMMAND_STATES = (CommandState.PENDING.value, CommandState.SENT.value, CommandState.ACKED.value)


# The fleet's series are grouped by (tier, region, model): a few hundred groups at most, whatever the fleet's size.
UNTIERED = "none"  # the tier label of GPUs no tier matched
NO_REGION = "none"
UNKNOWN_MODEL = "unknown"
MIB = 1024 * 1024
_IN_SERVICE = frozenset({GpuState.AVAILABLE.value, GpuState.RESERVED.value, GpuState.BUSY.value})
_GROUP = ["tier", "region", "model"]
FAULT_KINDS = (ECC, OVERHEAT, XID)


@dataclass(slots=True)
class _Group:
    """One (tier, region, model) group's figures, summed in the scrape's one pass over the GPUs."""

    sampled: int = 0  # GPUs in service (available, reserved, busy) with a latest sample
    utilization_sum: float = 0.0
    memory_used_mib: int = 0
    memory_total_mib: int = 0
    temperature_max: float | None = None
    rented_idle: int = 0  # busy GPUs whose latest sample shows 0 % utilization
    ecc_uncorrected: int = 0  # GPUs whose uncorrectable ECC count is above what an operator accepted


# GPUs tallied per slice of a prepared scrape (``FleetGauges.prepare``): about 4 ms of the event loop each.
PREPARE_SLICE = 2_000


@dataclass(slots=True)
class _GpuTally:
    """The GPUs' figures of one scrape, summed as GPUs are added (in one pass or in slices)."""

    counts: dict[tuple[str, str, str, str], int] = field(default_factory=dict)  # (state, tier, region, model)
    groups: dict[tuple[str, str, str], _Group] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    per_gpu: list[tuple[list[str], GpuSample, int]] = field(default_factory=list)

    def add(
        self, gpus: Iterable[GpuRecord], regions: Mapping[str, str], latest: Mapping[str, GpuSample], *, per_gpu: bool
    ) -> None:
        counts, groups, faults = self.counts, self.groups, self.faults
        busy = GpuState.BUSY.value
        for gpu in gpus:
            group_key = (gpu.tier or UNTIERED, regions.get(gpu.agent_id, NO_REGION), gpu.model or UNKNOWN_MODEL)
            key = (gpu.state, *group_key)
            counts[key] = counts.get(key, 0) + 1
            group = groups.get(group_key)
            if group is None:
                group = groups[group_key] = _Group()
            if gpu.fault is not None:
                faults[gpu.fault.kind] = faults.get(gpu.fault.kind, 0) + 1
            sample = latest.get(gpu.uuid)
            if sample is None or gpu.state not in _IN_SERVICE:
                continue  # a silent or faulty GPU's last figures are not the fleet's now
            group.sampled += 1
            group.utilization_sum += sample.utilization_pct
            group.memory_used_mib += sample.memory_used_mib
            group.memory_total_mib += gpu.info.memory_total_mib
            temp = sample.temperature_c
            if temp is not None and (group.temperature_max is None or temp > group.temperature_max):
                group.temperature_max = temp
            if gpu.state == busy and sample.utilization_pct <= 0.0:
                group.rented_idle += 1
            if sample.ecc_uncorrected > gpu.ecc_acknowledged:
                group.ecc_uncorrected += 1
            if per_gpu:
                self.per_gpu.append(([gpu.uuid, gpu.agent_id, *group_key], sample, gpu.info.memory_total_mib))


class FleetGauges(Collector):
    """The fleet counted when scraped, by bounded labels: GPUs by state, tier, region and model; their mean
    utilization and memory use, hottest temperature, idle rented GPUs and GPUs with new uncorrectable ECC errors
    by tier, region and model; faulty GPUs by fault kind; agents by state and region and the longest silence of
    an offline one; hosts under their hardware tier's network floor by region; open commands by state; relays
    linked. One pass over agents and GPUs, nothing from the store.

    ``per_gpu`` (the Master's ``metrics_per_gpu`` setting) adds series per GPU (utilization, memory, temperature,
    labelled by uuid): 80,000 GPUs make 240,000 series, so it is for small fleets or a Prometheus sized for it."""

    def __init__(
        self,
        agents: Callable[[], Iterable[AgentRecord]],
        gpus: Callable[[], Iterable[GpuRecord]],
        open_commands: Callable[[], Iterable[CommandRecord]],
        relays: Callable[[], int],
        *,
        latest: Callable[[], Mapping[str, GpuSample]] = dict,
        per_gpu: bool = False,
        clock: Callable[[], float] = time.time,
        below_network_floor: Callable[[], Iterable[AgentRecord]] = tuple,
    ) -> None:
        self._agents, self._gpus, self._open_commands, self._relays = agents, gpus, open_commands, relays
        self._latest, self._per_gpu, self._clock = latest, per_gpu, clock
        self._below_network_floor = below_network_floor  # hosts under their hardware tier's floor (master/network_floors.py)
        self._prepared: _GpuTally | None = None  # what ``prepare`` summed for the next ``collect``

    def collect(self) -> Iterator[GaugeMetricFamily]:
        now = self._clock()
        agents = GaugeMetricFamily("idlegrid_agents", "Agents by state and region", labels=["state", "region"])
        offline_longest = GaugeMetricFamily(
            "idlegrid_agents_offline_longest_seconds",
            "Seconds since the longest-silent offline agent of a region was last seen (0: none offline)",
            labels=["region"],
        )
        by_state: dict[tuple[str, str], int] = {}
        silent: dict[str, float] = {}
        regions: dict[str, str] = {}
        offline = AgentState.OFFLINE.value
        for agent in self._agents():
            region = agent.region or NO_REGION
            regions[agent.id] = region
            key = (agent.state, region)
            by_state[key] = by_state.get(key, 0) + 1
            if agent.state == offline and agent.last_seen:
                silent[region] = max(silent.get(region, 0.0), now - agent.last_seen)
            else:
                silent.setdefault(region, 0.0)
        for region in sorted(set(regions.values())):
            for known in AgentState:
                by_state.setdefault((known.value, region), 0)
        for (state, region), n in sorted(by_state.items()):
            agents.add_metric([state, region], n)
        for region, seconds in sorted(silent.items()):
            offline_longest.add_metric([region], max(0.0, seconds))
        yield agents
        yield offline_longest

        below = GaugeMetricFamily(
            "idlegrid_hosts_below_network_floor",
            "Hosts whose measured bandwidth is under the network floor of the tier their GPUs' hardware earns",
            labels=["region"],
        )
        below_by_region = dict.fromkeys(sorted(set(regions.values())), 0)
        for agent in self._below_network_floor():
            region = agent.region or NO_REGION
            below_by_region[region] = below_by_region.get(region, 0) + 1
        for region, n in below_by_region.items():
            below.add_metric([region], n)
        yield below

        yield from self._gpu_families(regions)

        commands = GaugeMetricFamily("idlegrid_commands_open", "Commands not yet final", labels=["state"])
        open_by_state = dict.fromkeys(_OPEN_COMMAND_STATES, 0)
        for command in self._open_commands():
            open_by_state[command.state] = open_by_state.get(command.state, 0) + 1
        for state, n in open_by_state.items():
            commands.add_metric([state], n)
        yield commands

        yield GaugeMetricFamily("idlegrid_relays_connected", "Access relays linked to this Master", value=self._relays())

    async def prepare(self) -> None:
        """Walk the GPUs for the next ``collect`` in slices of ``PREPARE_SLICE``, giving the event loop back between
        them: in one pass, 80,000 GPUs held the Master's loop for 110-160 ms per scrape, and every command and frame
        behind it (bench/HISTORY.md). The GPUs are those of the moment it starts; their figures are read as the walk
        reaches them, as a scrape reads any live gauge. The next ``collect`` uses the result (once)."""
        regions = {agent.id: agent.region or NO_REGION for agent in self._agents()}
        gpus = list(self._gpus())
        latest = self._latest()
        tally = _GpuTally()
        for start in range(0, len(gpus), PREPARE_SLICE):
            if start:
                await asyncio.sleep(0)
            tally.add(gpus[start : start + PREPARE_SLICE], regions, latest, per_gpu=self._per_gpu)
        self._prepared = tally

    def _gpu_families(self, regions: Mapping[str, str]) -> Iterator[GaugeMetricFamily]:
        tally, self._prepared = self._prepared, None
        if tally is None:  # not prepared (a registry scraped without ``prepare``): one pass now
            tally = _GpuTally()
            tally.add(self._gpus(), regions, self._latest(), per_gpu=self._per_gpu)
        counts, groups, faults, per_gpu = tally.counts, tally.groups, tally.faults, tally.per_gpu

        gpus = GaugeMetricFamily("idlegrid_gpus", "GPUs by state, tier, region and model", labels=["state", *_GROUP])
        for (state, tier, region, model), n in sorted(counts.items()):
            gpus.add_metric([state, tier, region, model], n)
        yield gpus

        sampled = GaugeMetricFamily(
            "idlegrid_gpus_sampled", "GPUs in service with a latest sample: what the means are over", labels=_GROUP
        )
        utilization = GaugeMetricFamily(
            "idlegrid_gpu_utilization_mean_percent", "Mean latest utilization of the GPUs in service", labels=_GROUP
        )
        memory = GaugeMetricFamily(
            "idlegrid_gpu_memory_used_ratio", "Memory used over memory of the GPUs in service (0 to 1)", labels=_GROUP
        )
        memory_used = GaugeMetricFamily(
            "idlegrid_gpu_memory_used_bytes", "Memory used, summed over the GPUs in service", labels=_GROUP
        )
        memory_total = GaugeMetricFamily(
            "idlegrid_gpu_memory_total_bytes", "Memory, summed over the GPUs in service with a sample", labels=_GROUP
        )
        temperature = GaugeMetricFamily(
            "idlegrid_gpu_temperature_max_celsius", "The hottest latest temperature of the GPUs in service", labels=_GROUP
        )
        idle = GaugeMetricFamily(
            "idlegrid_gpus_rented_idle", "Busy (rented) GPUs whose latest sample shows 0 % utilization", labels=_GROUP
        )
        ecc = GaugeMetricFamily(
            "idlegrid_gpus_ecc_uncorrected",
            "GPUs in service with uncorrectable ECC errors beyond those an operator accepted",
            labels=_GROUP,
        )
        for labels, group in sorted(groups.items()):
            values = list(labels)
            sampled.add_metric(values, group.sampled)
            idle.add_metric(values, group.rented_idle)
            ecc.add_metric(values, group.ecc_uncorrected)
            memory_used.add_metric(values, group.memory_used_mib * MIB)
            memory_total.add_metric(values, group.memory_total_mib * MIB)
            if group.sampled:
                utilization.add_metric(values, group.utilization_sum / group.sampled)
            if group.memory_total_mib:
                memory.add_metric(values, group.memory_used_mib / group.memory_total_mib)
            if group.temperature_max is not None:
                temperature.add_metric(values, group.temperature_max)
        yield from (sampled, utilization, memory, memory_used, memory_total, temperature, idle, ecc)

        faulty = GaugeMetricFamily("idlegrid_gpus_faulty", "Faulty GPUs by the kind of their fault", labels=["kind"])
        for kind, n in sorted(faults.items()):
            faulty.add_metric([kind], n)
        yield faulty

        if self._per_gpu:
            yield from _per_gpu_families(per_gpu)


def _per_gpu_families(gpus: list[tuple[list[str], GpuSample, int]]) -> Iterator[GaugeMetricFamily]:
    """One series per GPU in service (the ``metrics_per_gpu`` setting)."""
    labels = ["uuid", "agent", *_GROUP]
    utilization = GaugeMetricFamily("idlegrid_gpu_utilization_percent", "A GPU's latest utilization", labels=labels)
    memory = GaugeMetricFamily("idlegrid_gpu_memory_used_bytes_per_gpu", "A GPU's latest memory used", labels=labels)
    temperature = GaugeMetricFamily("idlegrid_gpu_temperature_celsius", "A GPU's latest temperature", labels=labels)
    for values, sample, _total_mib in gpus:
        utilization.add_metric(values, sample.utilization_pct)
        memory.add_metric(values, sample.memory_used_mib * MIB)
        if sample.temperature_c is not None:
            temperature.add_metric(values, sample.temperature_c)
    yield from (utilization, memory, temperature)


class MasterMetrics:
    def __init__(self, fleet: FleetGauges) -> None:
        self.fleet = fleet
        self.registry = CollectorRegistry()
        self.registry.register(fleet)
        ProcessCollector(registry=self.registry)  # CPU seconds, resident memory, open descriptors of this process
        frames = Counter(
            "idlegrid_master_frames_received", "Agent frames received through relays, by type", ["type"], registry=self.registry
        )
        # Children looked up once: counting a heartbeat is one dict lookup and one increment.
        self._frames = {cls: frames.labels(cls.__struct_config__.tag) for cls in _FRAME_TYPES}
        self.commands_finished = Counter(
            "idlegrid_commands_finished", "Commands that reached a final state", ["kind", "state"], registry=self.registry
        )
        self.command_latency = Histogram(
            "idlegrid_command_latency_seconds",
            "Seconds from a command's creation to its final state",
            ["kind"],
            buckets=COMMAND_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.heartbeat_transit = Histogram(
            "idlegrid_heartbeat_transit_seconds",
            "Seconds from an agent sending a heartbeat (its clock) to the Master taking it (this host's clock): a relay's "
            "or the Master's lag shows here; across hosts it is only as good as their clocks' agreement",
            buckets=HEARTBEAT_TRANSIT_BUCKETS,
            registry=self.registry,
        )
        self.enrollments = Counter(
            "idlegrid_enrollments", "Enrollments by outcome (ok or the refusal's code)", ["outcome"], registry=self.registry
        )
        self.hellos_refused = Counter(
            "idlegrid_hellos_refused", "Hellos refused, by the error code sent back", ["code"], registry=self.registry
        )
        self.reports_dropped = Counter(
            "idlegrid_agent_reports_dropped", "Agent event reports dropped over the agent's budget", registry=self.registry
        )
        self.samples_set_aside = Counter(
            "idlegrid_gpu_samples_set_aside",
            "GPU telemetry samples set aside as implausible, by the figure out of bounds (master/telemetry.py)",
            ["figure"],
            registry=self.registry,
        )
        self.relay_links_opened = Counter("idlegrid_relay_links_opened", "Relay links opened", registry=self.registry)
        self.relay_links_closed = Counter("idlegrid_relay_links_closed", "Relay links closed", registry=self.registry)

    def frame_received(self, frame: AgentFrame) -> None:
        self._frames[type(frame)].inc()

    def command_finished(self, record: CommandRecord) -> None:
        self.commands_finished.labels(record.kind, record.state).inc()
        finished = record.finished_at if record.finished_at is not None else record.created_at
        self.command_latency.labels(record.kind).observe(max(0.0, finished - record.created_at))

"""The Master's Prometheus metrics, in a registry of their own (``MasterMetrics.registry``).

Fleet gauges (agents, GPUs, open commands, relays) are read from memory at scrape time, so nothing
is kept up to date on the hot path. Counters and histograms are bumped where things happen. Labels
are bounded sets (states, tiers, frame types, outcome codes), never agent, GPU or command ids.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Iterator

import msgspec
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from common.wire import AgentFrame
from master.records import AgentRecord, CommandRecord, GpuRecord
from master.states import AgentState, CommandState

# Seconds from a command's creation to its final state: a container starts in seconds, a delete may wait
# for its grace period, a timeout takes the command's whole deadline.
COMMAND_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# A heartbeat's transit, agent -> relay -> Master: milliseconds when all is well, seconds when a relay or the Master lags.
HEARTBEAT_TRANSIT_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5)
_FRAME_TYPES: tuple[type[msgspec.Struct], ...] = typing.get_args(AgentFrame)  # every frame an agent may send
_OPEN_COMMAND_STATES = (CommandState.PENDING.value, CommandState.SENT.value, CommandState.ACKED.value)


class FleetGauges(Collector):
    """Agents by state, GPUs by state and tier, open commands by state, relays linked: counted when scraped."""

    def __init__(
        self,
        agents: Callable[[], Iterable[AgentRecord]],
        gpus: Callable[[], Iterable[GpuRecord]],
        open_commands: Callable[[], Iterable[CommandRecord]],
        relays: Callable[[], int],
    ) -> None:
        self._agents, self._gpus, self._open_commands, self._relays = agents, gpus, open_commands, relays

    def collect(self) -> Iterator[GaugeMetricFamily]:
        agents = GaugeMetricFamily("idlegrid_agents", "Agents by state", labels=["state"])
        by_state = dict.fromkeys((s.value for s in AgentState), 0)
        for agent in self._agents():
            by_state[agent.state] = by_state.get(agent.state, 0) + 1
        for state, n in by_state.items():
            agents.add_metric([state], n)
        yield agents

        gpus = GaugeMetricFamily("idlegrid_gpus", "GPUs by state and tier", labels=["state", "tier"])
        counts: dict[tuple[str, str], int] = {}
        for gpu in self._gpus():
            key = (gpu.state, gpu.tier or "none")
            counts[key] = counts.get(key, 0) + 1
        for (state, tier), n in sorted(counts.items()):
            gpus.add_metric([state, tier], n)
        yield gpus

        commands = GaugeMetricFamily("idlegrid_commands_open", "Commands not yet final", labels=["state"])
        open_by_state = dict.fromkeys(_OPEN_COMMAND_STATES, 0)
        for command in self._open_commands():
            open_by_state[command.state] = open_by_state.get(command.state, 0) + 1
        for state, n in open_by_state.items():
            commands.add_metric([state], n)
        yield commands

        yield GaugeMetricFamily("idlegrid_relays_connected", "Access relays linked to this Master", value=self._relays())


class MasterMetrics:
    def __init__(self, fleet: FleetGauges) -> None:
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
        self.relay_links_opened = Counter("idlegrid_relay_links_opened", "Relay links opened", registry=self.registry)
        self.relay_links_closed = Counter("idlegrid_relay_links_closed", "Relay links closed", registry=self.registry)

    def frame_received(self, frame: AgentFrame) -> None:
        self._frames[type(frame)].inc()

    def command_finished(self, record: CommandRecord) -> None:
        self.commands_finished.labels(record.kind, record.state).inc()
        finished = record.finished_at if record.finished_at is not None else record.created_at
        self.command_latency.labels(record.kind).observe(max(0.0, finished - record.created_at))

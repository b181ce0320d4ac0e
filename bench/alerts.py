"""``python -m bench alerts``: one alert evaluation over a fleet of 80,000 GPUs, quiet and with some of them hot.

Seeding: a real Master on its embedded store (SQLite, in a temporary directory) whose store holds ``agents`` online
hosts of ``gpus_per_agent`` GPUs each, loaded into its registry as at a restart. The alert loop runs the shipped rules
(management/monitoring/rules.toml) with its observer attached to the Master's sample listeners. Each round, every
GPU reports one sample through the listeners (the Master's ingestion path after its own checks), then the loop
evaluates once; its clock steps by the evaluation period, so the hot GPUs' overheating alerts go pending, fire (the
GPUs marked faulty, events recorded) and stay firing.

Timed: ``listen``: the listeners over one round of samples (every GPU); ``collect``: the observer's series;
``evaluate``: the evaluator over them (in slices); ``step``: the loop's whole evaluation (collect, evaluate, events,
faults); ``stall``: the longest the event loop was held during that step (a task asking to wake every millisecond:
what a command's round trip could wait). Also the series emitted, the points kept, and the observer's memory
(tracemalloc, ``observer_kib``).
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import tracemalloc
from dataclasses import asdict, dataclass, field
from typing import Any

from common.inventory import GpuInfo, GpuSample
from management.monitoring.alert_loop import AlertLoop, evaluate_in_slices
from management.monitoring.observe import FleetObserver
from management.monitoring.rules import load_rules
from master.config import MasterConfig
from master.master import Master
from master.port import MasterPort, SamplesTaken
from master.records import AgentRecord, GpuRecord

BATCH = 10_000
PERIOD_S = 15.0
QUIET_C = 55.0
HOT_C = 92.0


@dataclass(frozen=True)
class AlertsBenchOptions:
    agents: int = 10_000
    gpus_per_agent: int = 8
    hot: int = 1_000  # GPUs over the overheating threshold in the hot rounds
    rounds: int = 5  # evaluations per phase


@dataclass
class Phase:
    name: str
    series: int = 0
    kept_points: int = 0
    transitions: int = 0
    listen_ms: list[float] = field(default_factory=list)
    collect_ms: list[float] = field(default_factory=list)
    evaluate_ms: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    stall_ms: list[float] = field(default_factory=list)  # the longest the event loop was held during the step


class StallProbe:
    """Wakes every millisecond while running; ``longest_ms``: the longest gap between two wake-ups beyond that."""

    def __init__(self) -> None:
        self.longest_ms = 0.0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StallProbe:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        await asyncio.sleep(0.003)  # the probe wakes after the last stall and counts it
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.longest_ms = max(self.longest_ms, (now - last - 0.001) * 1000)
            last = now


def gpu_uuid(agent: int, index: int) -> str:
    return f"GPU-bench-{agent:05d}-{index}"


async def seed_fleet(master: Master, agents: int, gpus_per_agent: int) -> list[str]:
    """Store ``agents`` online hosts of ``gpus_per_agent`` H100s and load them into the registry; their GPU uuids."""
    now = time.time()
    hosts = [
        AgentRecord(id=f"agt-{a:05d}", provider=f"prov-{a % 50}", state="online", region="eu", last_seen=now)
        for a in range(agents)
    ]
    uuids: list[str] = []
    records: list[GpuRecord] = []
    for a in range(agents):
        for i in range(gpus_per_agent):
            uuid = gpu_uuid(a, i)
            uuids.append(uuid)
            info = GpuInfo(
                index=i,
                uuid=uuid,
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"0000:{i:02x}:00.0",
                memory_total_mib=81_559,
                compute_capability="9.0",
                simulated=True,
            )
            records.append(GpuRecord(uuid=uuid, agent_id=hosts[a].id, index=i, model="h100-sxm", info=info, state="idle"))
    for start in range(0, len(hosts), BATCH):
        await master.store.agents.put_many(hosts[start : start + BATCH])
    for start in range(0, len(records), BATCH):
        await master.store.gpus.put_many(records[start : start + BATCH])
    await master.registry.load()
    return uuids


def batches(master: MasterPort, uuids: list[str], hot: set[str], ts: float) -> list[tuple[str, list[GpuSample]]]:
    """One sample of every GPU, by host, as the Master hands them to its sample listeners."""
    out = []
    for start in range(0, len(uuids), 8):
        agent_id = master.registry.gpus[uuids[start]].agent_id
        samples = [
            GpuSample(uuid=u, ts=ts, utilization_pct=60.0, temperature_c=HOT_C if u in hot else QUIET_C)
            for u in uuids[start : start + 8]
        ]
        out.append((agent_id, samples))
    return out


def report(master: Master, reports: list[tuple[str, list[GpuSample]]]) -> float:
    """``reports`` published on the Master's change feed (``SamplesTaken``, as its telemetry intake does); the
    milliseconds its listeners took."""
    started = time.perf_counter()
    for agent_id, samples in reports:
        master.changes.publish(SamplesTaken(agent_id=agent_id, samples=samples))
    return (time.perf_counter() - started) * 1000


async def _phase(
    master: Master, loop: AlertLoop, uuids: list[str], hot: set[str], name: str, rounds: int, clock: list[float]
) -> Phase:
    """``master``: the Master ``loop`` observes, whose telemetry intake this bench plays (it publishes on its feed)."""
    phase = Phase(name)
    for _ in range(rounds):
        clock[0] += PERIOD_S
        phase.listen_ms.append(report(master, batches(master, uuids, hot, clock[0] - 1.0)))
        phase.kept_points = loop.observer.kept_points
        rules = list(loop.rules)
        started = time.perf_counter()
        series = loop.observer.collect(rules, clock[0], loop.states.keys())
        phase.collect_ms.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await evaluate_in_slices(rules, series, loop.states, clock[0])
        phase.evaluate_ms.append((time.perf_counter() - started) * 1000)
        phase.series = len(series)
        # The loop's own evaluation of the same round (it collects again: the observer kept each emitted
        # subject's latest point, which is what it would have seen).
        async with StallProbe() as probe:
            started = time.perf_counter()
            phase.transitions += len(await loop.step())
            phase.step_ms.append((time.perf_counter() - started) * 1000)
        phase.stall_ms.append(probe.longest_ms)
    return phase


def _observer_kib(master: Master, uuids: list[str], now: float) -> float:
    """What an observer of the shipped rules holds after two rounds of quiet samples and an evaluation (tracemalloc,
    apart from the timed rounds: tracing slows everything down)."""
    reports = [batches(master, uuids, set(), now - 10.0), batches(master, uuids, set(), now - 5.0)]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    observer = FleetObserver(master)
    rules = load_rules()
    observer.watch(rules)
    observer.attach()
    for one in reports:
        report(master, one)
    observer.collect(rules, now)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    observer.detach()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")) / 1024


async def _run(options: AlertsBenchOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as state_dir:
        master = Master(MasterConfig(state_dir=state_dir, link_port=0))
        await master.start()
        try:
            uuids = await seed_fleet(master, options.agents, options.gpus_per_agent)
            clock = [time.time()]
            observer_kib = _observer_kib(master, uuids, clock[0])
            observer = FleetObserver(master)
            loop = AlertLoop(observer, load_rules(), clock=lambda: clock[0], period_s=PERIOD_S)
            observer.watch(loop.rules)
            observer.attach()
            quiet = await _phase(master, loop, uuids, set(), "quiet", options.rounds, clock)
            hot = set(uuids[:: max(1, len(uuids) // options.hot)][: options.hot])
            # 120 s of overheating fires the shipped rule: enough rounds to see it pending, firing, then held.
            hot_phase = await _phase(master, loop, uuids, hot, "hot", max(options.rounds, 10), clock)
            observer.detach()
        finally:
            await master.stop()
    return {
        "options": asdict(options),
        "gpus": len(uuids),
        "observer_kib_quiet": round(observer_kib, 1),
        "phases": [asdict(quiet), asdict(hot_phase)],
    }


def run_alerts_bench(options: AlertsBenchOptions) -> dict[str, Any]:
    return asyncio.run(_run(options))


def _figure(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[len(ordered) // 2]:.1f} / {ordered[-1]:.1f}"


def alerts_table(result: dict[str, Any]) -> str:
    lines = [
        f"alert evaluation over {result['gpus']:,} GPUs (shipped rules); ms as median / max of the rounds",
        f"{'phase':<6} {'series':>7} {'kept pts':>9} {'transitions':>11} {'listen ms':>14} {'collect ms':>14} "
        f"{'evaluate ms':>14} {'step ms':>14} {'stall ms':>14}",
    ]
    for phase in result["phases"]:
        lines.append(
            f"{phase['name']:<6} {phase['series']:>7} {phase['kept_points']:>9} {phase['transitions']:>11} "
            f"{_figure(phase['listen_ms']):>14} {_figure(phase['collect_ms']):>14} "
            f"{_figure(phase['evaluate_ms']):>14} {_figure(phase['step_ms']):>14} {_figure(phase['stall_ms']):>14}"
        )
    lines.append(f"observer memory after the quiet rounds: {result['observer_kib_quiet']} KiB")
    return "\n".join(lines)

"""``python -m bench fleet --relays-simulated N``: the real Master, with its real store, behind N simulated relays.

Each simulated relay (bench/relay_sim.py) is one process playing a relay with ``agents_per_relay`` agents behind it
(10,000 by default), sending the Master what a real relay sends. So the Master's half of a grid of 100,000 agents is
measured on a machine that could not hold 100,000 agent connections; the relay's half is the real relay's, measured
by ``bench fleet`` with real agents (docs/capacity.md adds the two).

In order:

1. The agents are written to the Master's store as enrollment writes them (an ``enrolled`` record and its
   ``agent.enrolled`` event each), in batches: no certificate is issued, since no agent dials a relay here.
2. The Master starts on that store (under bench.gcwatch), then the simulated relays, each linked and loaded.
3. Ramp: every relay connects its agents at ``connect_rate`` / N each (``agent_connected``, then a hello);
   ``ready_s`` runs until every agent's welcome came back; the store's writes in the ramp are counted.
4. Once the Master's intake is drained and its report pace is full again, the hold: ``duration`` seconds of folded
   reports, commands through the operator API at ``cmd_rate`` (a create, then its delete), each timed from the API
   call to its final state. Measured: the Master's CPU (cores) and RSS, link frames and agent frames per second into
   it, store writes per second.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench.fleet import (
    FINAL_STATES,
    SETTLE_S,
    START_TIMEOUT_S,
    BenchGrid,
    CommandLoad,
    FleetDriver,
    FleetOptions,
    _cut_phases,
    _round,
    _slowest,
    _sum_stats,
    machine_facts,
    percentile,
    phase_summary,
)
from bench.procs import read_usage
from bench.profile import Profiler
from bench.provision import PROVIDER
from common.pki import CertRole
from master.config import MasterConfig
from master.records import AgentRecord, EventRecord
from master.states import AgentState
from master.store import open_store

PROVISION_BATCH = 1_000
PACE_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 120.0
METRICS_TIMEOUT_S = 25.0  # under the session's 30 s


async def provision_records(master_config: MasterConfig, count: int, *, region: str) -> list[dict[str, str]]:
    """``count`` agents in the Master's store as enrollment leaves them (record and event), ``PROVISION_BATCH`` a write;
    returns each one's id and certificate serial, as its relay would name them."""
    store = open_store(master_config.resolved_store_url())
    await store.open()
    agents: list[dict[str, str]] = []
    try:
        for start in range(0, count, PROVISION_BATCH):
            now = time.time()
            records = [
                AgentRecord(
                    id="agt-" + secrets.token_hex(8),
                    provider=PROVIDER,
                    state=AgentState.ENROLLED.value,
                    region=region,
                    cert_serial=secrets.token_hex(16),
                    cert_not_after=now + 86_400 * 30,
                    enrolled_at=now,
                )
                for _ in range(min(PROVISION_BATCH, count - start))
            ]
            await store.agents.put_many(records)
            events = [
                EventRecord(ts=now, kind="agent.enrolled", subject=r.id, data={"provider": PROVIDER, "serial": r.cert_serial})
                for r in records
            ]
            await store.events.append_many(events)
            agents.extend({"id": r.id, "serial": r.cert_serial} for r in records)
    finally:
        await store.close()
    return agents


def _relay_args(grid: BenchGrid, options: FleetOptions, relay_id: str, agents_file: Path) -> list[str]:
    cert, key, ca = grid.authority.write_server_identity(grid.root / "relays" / relay_id, CertRole.ACCESS, relay_id)
    fold = options.fold_interval_s if options.fold_interval_s else 1.0
    return [
        "--master-url",
        f"wss://127.0.0.1:{grid.link_port}/link",
        "--relay-id",
        relay_id,
        "--region",
        "bench",
        "--cert",
        str(cert),
        "--key",
        str(key),
        "--ca",
        str(ca),
        "--agents-file",
        str(agents_file),
        "--simulate",
        options.simulate.split("|")[0],
        "--connect-rate",
        str(options.connect_rate / options.relays_simulated),
        "--heartbeat-s",
        str(options.heartbeat_s),
        "--telemetry-s",
        str(options.telemetry_s),
        "--fold-interval-s",
        str(fold),
        "--latency-ms",
        str(options.latency_ms),
        "--jitter-ms",
        str(options.jitter_ms),
        "--log-level",
        options.log_level,
    ]


class _Master:
    """The Master's process and its metrics, read at the phases of the run."""

    def __init__(self, grid: BenchGrid) -> None:
        self.grid = grid
        assert grid.launcher.master is not None
        self.pid = grid.launcher.master.pid
        self.readings: dict[str, tuple[float, Any, dict[str, float]]] = {}

    async def metrics(self) -> dict[str, float]:
        """The Master's counters; {} when it does not answer in time (at 100,000 agents a full collection held its
        loop 10-19 s, and the run ended on the scrape's timeout before: bench/HISTORY.md)."""
        try:
            return await asyncio.wait_for(self.grid.master_intake(), METRICS_TIMEOUT_S)
        except (TimeoutError, aiohttp.ClientError, OSError):
            return {}

    async def read(self, label: str) -> None:
        self.readings[label] = (time.monotonic(), read_usage(self.pid), await self.metrics())

    def between(self, a: str, b: str) -> dict[str, Any]:
        (t0, u0, m0), (t1, u1, m1) = self.readings[a], self.readings[b]
        wall = t1 - t0
        per_s = {k: round((m1.get(k, 0.0) - m0.get(k, 0.0)) / wall, 1) for k in ("link_frames", "agent_frames", "store_writes")}
        return {
            "wall_s": round(wall, 1),
            "cpu_cores": round((u1.cpu_s - u0.cpu_s) / wall, 3) if wall > 0 else None,
            "link_frames_per_s": per_s["link_frames"],
            "agent_frames_per_s": per_s["agent_frames"],
            "store_writes_per_s": per_s["store_writes"],
            "store_writes": round(m1.get("store_writes", 0.0) - m0.get("store_writes", 0.0)),
        }


async def run_simulated(options: FleetOptions) -> dict[str, Any]:
    agents = options.relays_simulated * options.agents_per_relay
    if options.work_dir:
        Path(options.work_dir).mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=time.strftime("sim-%Y%m%d-%H%M%S-"), dir=options.work_dir))
    else:
        root = Path(tempfile.mkdtemp(prefix="idlegrid-bench-sim-"))
    grid = BenchGrid(root, options)
    relays: list[FleetDriver] = []
    result: dict[str, Any] = {
        "agents": agents,
        "relays_simulated": options.relays_simulated,
        "agents_per_relay": options.agents_per_relay,
        "gpus_per_agent": options.gpus_per_agent,
        "options": asdict(options),
        "machine": machine_facts(),
    }
    await grid.open()
    try:
        began = time.monotonic()
        listed = await provision_records(grid.master_config, agents, region="bench")
        result["provision_s"] = round(time.monotonic() - began, 2)
        await grid.start_master()
        master = _Master(grid)
        for r in range(options.relays_simulated):
            relay_id = f"relay-sim-{r + 1}"
            agents_file = root / f"{relay_id}.json"
            agents_file.write_text(json.dumps(listed[r * options.agents_per_relay : (r + 1) * options.agents_per_relay]))
            args = _relay_args(grid, options, relay_id, agents_file)
            relays.append(await FleetDriver.spawn(relay_id, args, grid.logs, module="bench.relay_sim"))
        loads = await asyncio.gather(*(d.loaded(START_TIMEOUT_S + options.agents_per_relay / 200) for d in relays))
        result["relay_load_s"] = max(a["load_s"] for a in loads)
        await asyncio.sleep(SETTLE_S)
        await master.read("idle")
        profiler = _profiler(options, "ramp", {"master": master.pid}, options.ready_timeout or 60.0 + agents / 100)
        result.update(await _ramp(relays, agents, options))
        await master.read("ready")
        if profiler is not None:
            result["profile_ramp"] = profiler.finish()
        result["ramp"] = master.between("idle", "ready")
        result["drain_s"] = await _settle(grid, relays, agents, options)
        await master.read("hold_start")
        profiler = _profiler(options, "hold", {"master": master.pid}, options.duration)
        result.update(await _hold(grid, relays, [a["id"] for a in listed], options))
        await master.read("hold_end")
        if profiler is not None:
            result["profile_hold"] = profiler.finish()
        hold = result["hold"] = master.between("hold_start", "hold_end")
        idle_kib, end_kib = master.readings["idle"][1].rss_kib, master.readings["hold_end"][1].rss_kib
        result["master_rss_idle_mib"] = round(idle_kib / 1024, 1)
        result["master_rss_end_mib"] = round(end_kib / 1024, 1)
        result["master_kib_per_agent"] = round((end_kib - idle_kib) / agents, 1)
        result["master_cpu_hold_cores"] = hold["cpu_cores"]
        result["master_cpu_per_1000_agents"] = round(hold["cpu_cores"] * 1000 / agents, 4) if hold["cpu_cores"] else None
        result["link_frames_per_s"] = hold["link_frames_per_s"]
        result["agent_frames_per_s"] = hold["agent_frames_per_s"]
        result["gc"] = grid.gc_figures()
        result["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        for relay in relays:
            await relay.stop()
        await grid.stop()
        if not options.keep and not options.work_dir:
            shutil.rmtree(root, ignore_errors=True)
    result["work_dir"] = str(root) if options.keep or options.work_dir else None
    return result


def _profiler(options: FleetOptions, phase: str, pids: dict[str, int], seconds: float) -> Profiler | None:
    """py-spy on the Master for ``phase`` (``--profile DIR``), or None."""
    if not options.profile_dir:
        return None
    profiler = Profiler(Path(options.profile_dir) / phase)
    profiler.start(pids, seconds)
    return profiler


async def _ramp(relays: list[FleetDriver], agents: int, options: FleetOptions) -> dict[str, Any]:
    timeout = options.ready_timeout or 60.0 + agents / 100
    await asyncio.gather(*(d.request("start") for d in relays))
    started = time.monotonic()
    curve = []
    while True:
        stats = await _sum_stats(relays)
        elapsed = time.monotonic() - started
        curve.append((round(elapsed, 1), stats["ever_ready"]))
        if stats["ever_ready"] >= agents or elapsed > timeout:
            break
        if stats.get("task_failures"):
            raise RuntimeError(f"a simulated relay stopped serving its link; see {', '.join(str(d.log) for d in relays)}")
        await asyncio.sleep(0.5)
    all_ready = stats["ever_ready"] >= agents
    hellos = stats["sent"].get("hello", 0)
    return {
        "ready_s": stats["all_ready_s"] if all_ready else None,
        "ready_agents": stats["ever_ready"],
        "ready_curve": curve[:: max(1, len(curve) // 20)],
        "hellos": hellos,
        "hellos_again": max(0, hellos - stats["ever_ready"]),
    }


async def _settle(grid: BenchGrid, relays: list[FleetDriver], agents: int, options: FleetOptions) -> float:
    """Until the Master's intake holds no backlog and its report pace is full again (bounded): the hold measures the
    steady state."""
    started = time.monotonic()
    await asyncio.sleep(SETTLE_S)
    quiet = 0
    while time.monotonic() - started < DRAIN_TIMEOUT_S + PACE_TIMEOUT_S:
        try:
            figures = await grid.master_intake()
        except (TimeoutError, aiohttp.ClientError, OSError):
            figures = {"pace_factor": 99.0}  # no answer: not settled
        waiting = sum(v for k, v in figures.items() if k.endswith("_bytes"))
        paced = figures.get("pace_factor", 1.0) <= 1.0
        quiet = quiet + 1 if waiting < 64 * 1024 and paced else 0
        if quiet >= 3:
            break
        await asyncio.sleep(1.0)
    return round(time.monotonic() - started, 1)


async def _hold(grid: BenchGrid, relays: list[FleetDriver], agent_ids: list[str], options: FleetOptions) -> dict[str, Any]:
    assert grid.client is not None
    before = await _sum_stats(relays)
    load = CommandLoad(grid.client, agent_ids, gpus_per_agent=options.gpus_per_agent)
    started = time.monotonic()
    commands = asyncio.create_task(load.run(options.cmd_rate, options.duration))
    await asyncio.sleep(options.duration)
    held = time.monotonic() - started
    after = await _sum_stats(relays)
    await commands
    await _cut_phases(relays, load, grid.root)
    sent = {k: after["sent"].get(k, 0) - before["sent"].get(k, 0) for k in after["sent"]}
    rtts = [t.rtt_s * 1000 for t in load.timings if t.state in FINAL_STATES]
    states: dict[str, int] = {}
    for timing in load.timings:
        states[timing.state] = states.get(timing.state, 0) + 1
    try:
        pace = (await grid.master_intake()).get("pace_factor")
    except (aiohttp.ClientError, OSError):
        pace = None
    return {
        "hold_s": round(held, 1),
        "relay_sent_per_s": {k: round(v / held, 1) for k, v in sorted(sent.items())},
        "pace_factor_end": pace,
        "agents_ready_end": after["ready"],
        "commands": {
            "issued": len(load.timings),
            "states": states,
            "errors": load.errors[:5],
            "error_count": len(load.errors),
            "executed_by_relays": after["commands_executed"],
            "duplicate_executions": after["duplicate_executions"],
        },
        "cmd_rtt_p50_ms": _round(percentile(rtts, 50)),
        "cmd_rtt_p99_ms": _round(percentile(rtts, 99)),
        "cmd_rtt_max_ms": _round(max(rtts) if rtts else None),
        "cmd_rtt_slowest": _slowest(load, 0.0),
        "cmd_phases": phase_summary(load.timings),
    }


def simulated_table(r: dict[str, Any]) -> str:
    """The run's figures beside issue 42's targets at 100,000 agents."""
    hold = r.get("hold", {})
    rows = [
        ("agents (simulated relays x agents)", f"{r['agents']:,} ({r['relays_simulated']} x {r['agents_per_relay']:,})", ""),
        ("ready_s", r.get("ready_s"), "<= 180 s"),
        ("cmd p50 / p99 / max ms", " / ".join(str(r.get(f"cmd_rtt_{q}_ms")) for q in ("p50", "p99", "max")), "p99 < 250"),
        ("Master CPU in the hold (cores)", r.get("master_cpu_hold_cores"), "<= 1"),
        ("Master CPU per 1,000 agents (cores)", r.get("master_cpu_per_1000_agents"), ""),
        ("Master KiB per agent", r.get("master_kib_per_agent"), "<= 16"),
        ("link frames / agent frames per s into the Master", f"{r.get('link_frames_per_s')} / {r.get('agent_frames_per_s')}", ""),
        ("store writes in the ramp (per hello)", _writes_per_hello(r), ""),
        ("store writes per s in the hold", hold.get("store_writes_per_s"), ""),
        ("duplicate executions", r.get("commands", {}).get("duplicate_executions"), "0"),
    ]
    return "\n".join(f"{name:<52} {value!s:<40} {target}" for name, value, target in rows)


def _per(total: Any, count: Any) -> str:
    return f"{total / count:.2f}" if isinstance(total, (int, float)) and count else "-"


def _writes_per_hello(r: dict[str, Any]) -> str:
    writes = r.get("ramp", {}).get("store_writes")
    return f"{writes} ({_per(writes, r.get('hellos'))})"

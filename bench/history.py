"""``python -m bench history``: telemetry history queries of one GPU on a store that 80,000 GPUs report into.

Seeding (SQLite, the Master's default store, in a temporary directory): one GPU gets a whole week of one-minute
rollups (10,080) and the hourly rollups the Master's history loop makes of them (master/history.py, merged by the
same function); every other GPU (``gpus`` in all) gets ``filler_minutes`` one-minute rollups of the last minutes of
that week, so the tables' B-trees hold every GPU's keys around the queried one. A full week of every GPU (806
million rows, some 300 GB) does not fit the machine; a range query on the clustered (gpu_uuid, minute) key costs a
seek down the tree (one or two levels more at full size) and a contiguous scan of the GPU's own rows, which is what
is timed. Rollup values are random but realistic (utilization, memory, temperature, power, clocks).

Timed (``rounds`` each, after one warm-up): ``query``: management.monitoring.history.gpu_history, the rollups read,
decoded and merged into the step; ``answer``: that plus the API's view and its JSON encoding (what
GET /api/v1/gpus/{uuid}/telemetry does beyond HTTP). Windows: the week at step 1 h (hourly rollups, topped up from
the minutes of the last hour) and at step 1 min (10,080 minutes), and the last day at 1 min. Target: p99 < 100 ms.
The garbage collector is set as the management daemon sets it (common/heap.py).

A host's own history is timed alike (``host_history``, the host telemetry answer's ``host_points``): one host gets a
week of one-minute host rollups and their hours, every other host (``hosts`` in all) ``filler_minutes`` of them;
the history loop's pass then covers every host too.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import msgspec

from common.heap import tune_for_daemon
from management.monitoring.history import (
    GpuSeries,
    TelemetryHistory,
    gpu_history,
    host_history,
    resolution_of,
    window_of,
)
from management.views.telemetry import telemetry_view
from master.history import MINUTES_PER_HOUR, HistoryKeeper, downsample, downsample_host
from master.records import HostRollup, TelemetryRollup
from master.store import SqliteStore

TARGET_P99_MS = 100.0
WEEK_MINUTES = 7 * 24 * 60
BATCH = 20_000


@dataclass(frozen=True)
class HistoryBenchOptions:
    gpus: int = 80_000
    filler_minutes: int = 10
    rounds: int = 50
    seed: int = 1
    loop: bool = True  # also time one pass of the history loop over every GPU (and host)
    hosts: int = 10_000  # hosts reporting themselves (host history), one of them with a whole week


def _rollup(rng: random.Random, uuid: str, agent_id: str, minute: int) -> TelemetryRollup:
    util = rng.random() * 100
    return TelemetryRollup(
        gpu_uuid=uuid,
        agent_id=agent_id,
        minute=minute,
        samples=6,
        utilization_avg=round(util, 2),
        utilization_max=round(min(100.0, util + rng.random() * 10), 2),
        memory_used_mib_max=rng.randrange(0, 81_920),
        memory_used_mib_avg=round(rng.random() * 81_920, 2),
        temperature_max=round(35 + util / 2 + rng.random() * 5, 1),
        temperature_avg=round(35 + util / 2, 2),
        power_avg_w=round(70 + util * 6, 2),
        power_max_w=round(80 + util * 6.2, 1),
        clock_sm_avg_mhz=round(600 + util * 13.8, 2),
        clock_mem_avg_mhz=2619.0,
        throttle_reasons=["gpu_idle"] if util < 5 else [],
    )


def _host_rollup(rng: random.Random, agent_id: str, minute: int) -> HostRollup:
    cpu = rng.random() * 100
    ram = rng.randrange(8_192, 515_000)
    return HostRollup(
        agent_id=agent_id,
        minute=minute,
        samples=6,
        cpu_pct_avg=round(cpu, 2),
        cpu_pct_max=round(min(100.0, cpu + rng.random() * 20), 2),
        load_1m_avg=round(cpu / 100 * 64, 2),
        ram_used_mib_avg=float(ram),
        ram_used_mib_max=ram + rng.randrange(0, 4_096),
        ram_total_mib=515_000,
        disk_used_gib=round(1_000 + rng.random() * 100, 2),
        disk_free_gib_min=round(2_500 + rng.random() * 100, 2),
        net_rx_bytes=rng.randrange(0, 60 * 1_250_000_000),  # up to 10 Gbit/s
        net_tx_bytes=rng.randrange(0, 60 * 125_000_000),
    )


def _host_id(n: int) -> str:
    return f"agt-{n:05d}"


async def _seed_hosts(store: SqliteStore, options: HistoryBenchOptions, end_minute: int) -> tuple[str, dict[str, float]]:
    """As ``_seed``, for hosts' own rollups: a week of one host among ``hosts``."""
    rng = random.Random(options.seed + 1)
    target = _host_id(options.hosts // 2)
    began = time.perf_counter()
    week = [_host_rollup(rng, target, m) for m in range(end_minute - WEEK_MINUTES, end_minute)]
    for start in range(0, len(week), BATCH):
        await store.host_rollups.put_many(week[start : start + BATCH])
    hours = [h for h in downsample_host(week, MINUTES_PER_HOUR) if h.minute + MINUTES_PER_HOUR <= end_minute - 30]
    await store.host_hourly_rollups.put_many(hours)
    batch: list[HostRollup] = []
    for n in range(options.hosts):
        if n == options.hosts // 2:
            continue
        batch += [_host_rollup(rng, _host_id(n), m) for m in range(end_minute - options.filler_minutes, end_minute)]
        if len(batch) >= BATCH:
            await store.host_rollups.put_many(batch)
            batch = []
    await store.host_rollups.put_many(batch)
    return target, {"seed_hosts_s": time.perf_counter() - began}


def _uuid(n: int) -> str:
    return f"GPU-{n:08x}-0000-4000-8000-{n:012x}"


async def _seed(store: SqliteStore, options: HistoryBenchOptions, end_minute: int) -> tuple[str, dict[str, float]]:
    rng = random.Random(options.seed)
    target = _uuid(options.gpus // 2)  # in the middle of the key space
    took: dict[str, float] = {}
    began = time.perf_counter()
    week = [_rollup(rng, target, "agt-target", m) for m in range(end_minute - WEEK_MINUTES, end_minute)]
    for start in range(0, len(week), BATCH):
        await store.rollups.put_many(week[start : start + BATCH])
    finished_hours = [h for h in downsample(week, MINUTES_PER_HOUR) if h.minute + MINUTES_PER_HOUR <= end_minute - 30]
    await store.hourly_rollups.put_many(finished_hours)  # as the loop would have: the last half hour not yet
    took["seed_target_s"] = time.perf_counter() - began
    began = time.perf_counter()
    batch: list[TelemetryRollup] = []
    for n in range(options.gpus):
        if n == options.gpus // 2:
            continue
        uuid, agent = _uuid(n), f"agt-{n // 8:05d}"
        batch += [_rollup(rng, uuid, agent, m) for m in range(end_minute - options.filler_minutes, end_minute)]
        if len(batch) >= BATCH:
            await store.rollups.put_many(batch)
            batch = []
    await store.rollups.put_many(batch)
    took["seed_filler_s"] = time.perf_counter() - began
    return target, took


async def _timed(rounds: int, work: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    await work()  # warm-up: the first read of the pages
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        await work()
        times.append((time.perf_counter() - began) * 1000)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times), 2),
        "p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "max_ms": round(times[-1], 2),
    }


def loop_time(end_minute: int) -> float:
    """When the pass runs: just after the hour holding the last minute seeded (``end_minute - 1``; the hour of
    ``end_minute`` itself held none of them when the bench started at minute :00, and the pass rolled up nothing)."""
    last = end_minute - 1
    return (last - last % MINUTES_PER_HOUR + MINUTES_PER_HOUR) * 60.0 + 1


async def _time_loop(store: SqliteStore, options: HistoryBenchOptions, end_minute: int) -> dict[str, Any]:
    """One pass of the Master's history loop over every GPU, unpaced: the hour holding the last minutes downsampled
    (a read per GPU, the hours written in batches), then a retention delete per GPU of each resolution."""
    uuids = [_uuid(n) for n in range(options.gpus)]
    hosts = [_host_id(n) for n in range(options.hosts)]
    keeper = HistoryKeeper(
        store,
        lambda: uuids,
        minute_retention_s=7 * 86400.0,
        hourly_retention_s=90 * 86400.0,
        duty=1.0,
        agent_ids=lambda: hosts,
    )
    now = loop_time(end_minute)
    began = time.perf_counter()
    done = await keeper.step(now)
    return {"seconds": round(time.perf_counter() - began, 1), **done}


async def _run(options: HistoryBenchOptions, directory: Path) -> dict[str, Any]:
    store = SqliteStore(str(directory / "master.db"))
    await store.open()
    try:
        now = time.time()
        end_minute = int(now // 60)
        target, seeding = await _seed(store, options, end_minute)
        host, host_seeding = await _seed_hosts(store, options, end_minute)
        seeding |= host_seeding
        kept_since = end_minute - WEEK_MINUTES
        windows = {
            "week, step 1 h": (now - 7 * 86400, now, 3600),
            "week, step 1 min": (now - 7 * 86400, now, 60),
            "day, step 1 min": (now - 86400, now, 60),
        }
        rows: list[dict[str, Any]] = []
        for name, (since, until, step) in windows.items():
            window = window_of(since, until, step, now=now)
            points = await gpu_history(store, target, window, minutes_kept_since=kept_since)
            resolution = resolution_of(window, minutes_kept_since=kept_since)

            async def query(window: Any = window) -> list[TelemetryRollup]:
                return await gpu_history(store, target, window, minutes_kept_since=kept_since)

            async def answer(window: Any = window, resolution: int = resolution) -> bytes:
                found = await gpu_history(store, target, window, minutes_kept_since=kept_since)
                history = TelemetryHistory("gpu", target, window, resolution, [GpuSeries(target, "agt-target", found)])
                return msgspec.json.encode(telemetry_view(history))

            rows.append(
                {
                    "window": name,
                    "points": len(points),
                    "resolution_s": resolution * 60,
                    "query": await _timed(options.rounds, query),
                    "answer": await _timed(options.rounds, answer),
                }
            )
        for name, (since, until, step) in windows.items():
            window = window_of(since, until, step, now=now)
            resolution = resolution_of(window, minutes_kept_since=kept_since)
            host_points = await host_history(store, host, window, minutes_kept_since=kept_since)

            async def host_query(window: Any = window) -> list[HostRollup]:
                return await host_history(store, host, window, minutes_kept_since=kept_since)

            async def host_answer(window: Any = window, resolution: int = resolution) -> bytes:
                found = await host_history(store, host, window, minutes_kept_since=kept_since)
                history = TelemetryHistory("host", host, window, resolution, [], host_points=found)
                return msgspec.json.encode(telemetry_view(history))

            rows.append(
                {
                    "window": f"host {name}",
                    "points": len(host_points),
                    "resolution_s": resolution * 60,
                    "query": await _timed(options.rounds, host_query),
                    "answer": await _timed(options.rounds, host_answer),
                }
            )
        db_mib = sum(p.stat().st_size for p in directory.iterdir()) / 2**20
        result = {"options": asdict(options), "seeding": seeding, "store_mib": round(db_mib, 1), "rows": rows}
        if options.loop:
            result["loop"] = await _time_loop(store, options, end_minute)
        return result
    finally:
        await store.close()


def run_history_bench(options: HistoryBenchOptions) -> dict[str, Any]:
    tune_for_daemon()  # as the management daemon runs (common/heap.py)
    with tempfile.TemporaryDirectory(prefix="bench-history-") as directory:
        return asyncio.run(_run(options, Path(directory)))


def history_table(result: dict[str, Any]) -> str:
    options = result["options"]
    lines = [
        f"history: one GPU's week among {options['gpus']:,} GPUs, one host's among {options.get('hosts', 0):,} hosts "
        f"({options['filler_minutes']} minutes each), "
        f"SQLite {result['store_mib']} MiB; seeded in {sum(result['seeding'].values()):.0f} s",
        f"{'window':<23} {'points':>6} {'res':>5}  {'query p50':>9} {'p99':>7}  {'answer p50':>10} {'p99':>7}  target p99 < "
        f"{TARGET_P99_MS:g} ms",
    ]
    for row in result["rows"]:
        q, a = row["query"], row["answer"]
        ok = "ok" if a["p99_ms"] < TARGET_P99_MS else "OVER"
        lines.append(
            f"{row['window']:<23} {row['points']:>6} {row['resolution_s']:>4}s  {q['p50_ms']:>8.1f}ms {q['p99_ms']:>6.1f}ms"
            f"  {a['p50_ms']:>9.1f}ms {a['p99_ms']:>6.1f}ms  {ok}"
        )
    if "loop" in result:
        loop = result["loop"]
        lines.append(
            f"history loop, one pass unpaced: {loop['seconds']:g} s ({loop['hourly_rollups']:,} hours written, "
            f"{loop['deleted']:,} rollups deleted)"
        )
    return "\n".join(lines)

"""``python -m bench scheduler-snapshot``: what the scheduling loop pays per cycle before the core runs.

The loop (management/workloads/runner.py) turns the Master's records into the core's snapshot every cycle, and builds
the core's free-unit index from it (it does not keep one across cycles yet). This times both on a generated grid of
Master records (half the GPUs held), the snapshot with and without the per-host unit cache, several times each.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from common.inventory import GpuInfo, HostInfo, NvLink
from management.scheduler.model import Policy
from management.scheduler.pool import FreePool
from management.scheduler.snapshot import UnitCache, build_snapshot
from master.allocations import Hold
from master.records import AgentRecord, GpuRecord

HOST = HostInfo(
    hostname="bench",
    cpu_model="EPYC",
    cpu_cores=128,
    ram_mib=1_024_000,
    disk_total_gib=4000,
    disk_free_gib=3500,
    os="linux",
    kernel="6.1",
)


@dataclass(frozen=True)
class SnapshotBenchOptions:
    hosts: int = 10_000
    gpus_per_host: int = 8
    repeats: int = 5


def _grid(o: SnapshotBenchOptions) -> tuple[dict[str, AgentRecord], dict[str, list[GpuRecord]], dict[str, Hold]]:
    now = time.time()
    agents: dict[str, AgentRecord] = {}
    gpus: dict[str, list[GpuRecord]] = {}
    holds: dict[str, Hold] = {}
    n = o.gpus_per_host
    for h in range(o.hosts):
        agent_id = f"agt-{h:06d}"
        agents[agent_id] = AgentRecord(
            id=agent_id, provider="bench", state="ready", host=HOST, runtime="docker", isolation="container", last_seen=now
        )
        records = []
        for i in range(n):
            uuid = f"GPU-{h:06d}-{i}"
            peers = [j for j in range(n) if j != i]
            links = tuple(NvLink(link=k, active=True, remote_pci_bus_id=f"0000:{j:02x}:00.0") for k, j in enumerate(peers))
            info = GpuInfo(
                index=i,
                uuid=uuid,
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"0000:{i:02x}:00.0",
                memory_total_mib=81_559,
                compute_capability="9.0",
                nvlinks=links if h % 2 == 0 else (),  # half the hosts NVLinked (SXM), half not
            )
            record = GpuRecord(
                uuid=uuid, agent_id=agent_id, index=i, model="h100-sxm", tier="flagship", info=info, state="available"
            )
            records.append(record)
            if h % 2 == 0:
                holds[uuid] = Hold(agent_id, f"container-{h}", "", running=True)
        gpus[agent_id] = records
    return agents, gpus, holds


def run_snapshot_bench(o: SnapshotBenchOptions) -> dict[str, Any]:
    agents, gpus, holds = _grid(o)
    cache = UnitCache()

    def snapshot(unit_cache: UnitCache | None) -> Any:
        return build_snapshot(
            now=time.time(),
            agents=agents,
            gpus_by_agent=gpus,
            holds=holds,
            workloads=[],
            usage={},
            project_usage={},
            policy=Policy(),
            offline_grace_s=20.0,
            unit_cache=unit_cache,
        )

    plain, cached, index = [], [], []
    snapshot(cache)  # the cache's first fill is a plain build
    for _ in range(o.repeats):
        t = time.perf_counter()
        snapshot(None)
        plain.append(time.perf_counter() - t)
        t = time.perf_counter()
        snap = snapshot(cache)
        cached.append(time.perf_counter() - t)
        t = time.perf_counter()
        FreePool(snap)
        index.append(time.perf_counter() - t)
    return {
        "hosts": o.hosts,
        "gpus": o.hosts * o.gpus_per_host,
        "repeats": o.repeats,
        "snapshot_s": [round(x, 3) for x in plain],
        "snapshot_cached_s": [round(x, 3) for x in cached],
        "index_build_s": [round(x, 3) for x in index],
        "snapshot_median_s": round(statistics.median(plain), 3),
        "snapshot_cached_median_s": round(statistics.median(cached), 3),
        "index_build_median_s": round(statistics.median(index), 3),
    }


def snapshot_table(r: dict[str, Any]) -> str:
    rows = [
        ("grid (Master records)", f"{r['hosts']:,} hosts, {r['gpus']:,} GPUs, half held; {r['repeats']} runs each"),
        ("snapshot, no unit cache, s", f"median {r['snapshot_median_s']}  {r['snapshot_s']}"),
        ("snapshot, unit cache, s", f"median {r['snapshot_cached_median_s']}  {r['snapshot_cached_s']}"),
        ("free-unit index build, s", f"median {r['index_build_median_s']}  {r['index_build_s']}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)

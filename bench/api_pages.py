"""``python -m bench api-pages``: page through a fleet's GPUs over the real HTTP API, timing each page.

A generated fleet (10,000 agents x 8 GPUs by default) is written to a fresh SQLite store; the real
Master loads it at start (as after a restart) and serves the real management API on a local port.
The bench then follows ``next_cursor`` from the first page to the last and reports the latency of
each page (p50/p99/max), checks that every GPU came back exactly once, and, for comparison, times
what a page would cost if it sorted every GPU first.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.catalog import CATALOG, reference_gpu_info
from management.client.api import ApiRequest, AsyncApiClient, list_request, next_page
from master.config import MasterConfig
from master.records import AgentRecord, GpuRecord
from master.states import AgentState, GpuState
from master.store import open_store
from master.tiers import TierPolicy, classify

MODELS = ("h100-sxm", "a100-80gb", "l4", "rtx-4090")
PROVIDERS = 25
REGIONS = ("eu-west", "us-east", "ap-south")
SEED_BATCH = 5_000  # records per store write while seeding


@dataclass(frozen=True)
class Fleet:
    agents: list[AgentRecord]
    gpus: list[GpuRecord]


def generated_fleet(agents: int, gpus_per_agent: int, *, providers: int = PROVIDERS, now: float | None = None) -> Fleet:
    """A deterministic fleet: agent i belongs to provider i % providers, runs model i % len(MODELS); every 10th
    agent is offline (its GPUs too) and every 4th runs the process runtime (a sandbox, not offered), so the filters
    have something to choose between."""
    now = time.time() if now is None else now
    policy = TierPolicy.load(None)
    tier_of = {key: classify(reference_gpu_info(CATALOG[key]), policy).tier for key in MODELS}
    agent_records: list[AgentRecord] = []
    gpu_records: list[GpuRecord] = []
    for i in range(agents):
        agent_id = f"agt-{i:08d}"
        offline = i % 10 == 9
        agent_records.append(
            AgentRecord(
                id=agent_id,
                provider=f"prov-{i % providers:03d}",
                state=AgentState.OFFLINE.value if offline else AgentState.READY.value,
                region=REGIONS[i % len(REGIONS)],
                enrolled_at=now,
                last_seen=now,
                runtime="process" if i % 4 == 3 else "docker",
                isolation="sandbox" if i % 4 == 3 else "container",
                simulated=True,
            )
        )
        model = MODELS[i % len(MODELS)]
        for index in range(gpus_per_agent):
            uuid = f"GPU-{i:08d}-{index:02d}"
            info = reference_gpu_info(CATALOG[model], index=index, uuid=uuid, pci_bus_id=f"0000:{index:02x}:00.0")
            gpu_records.append(
                GpuRecord(
                    uuid=uuid,
                    agent_id=agent_id,
                    index=index,
                    model=model,
                    info=info,
                    state=GpuState.OFFLINE.value if offline else GpuState.AVAILABLE.value,
                    tier=tier_of[model],
                    updated_at=now,
                )
            )
    return Fleet(agent_records, gpu_records)


async def seed_store(state_dir: Path, fleet: Fleet) -> None:
    """Write the fleet into the Master's default store in ``state_dir``, as a Master would have left it."""
    config = MasterConfig(state_dir=str(state_dir), link_port=0)
    store = open_store(config.resolved_store_url())
    await store.open()
    try:
        for start in range(0, len(fleet.agents), SEED_BATCH):
            await store.agents.put_many(fleet.agents[start : start + SEED_BATCH])
        for start in range(0, len(fleet.gpus), SEED_BATCH):
            await store.gpus.put_many(fleet.gpus[start : start + SEED_BATCH])
    finally:
        await store.close()


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def page_through(client: AsyncApiClient, first: ApiRequest) -> tuple[list[str], list[float]]:
    """Every item's uuid (in the order served) and each page's latency in ms, following next_cursor to the end.
    ``first`` carries the limit and filters; they go with every page (a cursor is valid only with its filters)."""
    uuids: list[str] = []
    latencies: list[float] = []
    request: ApiRequest | None = first
    while request is not None:
        started = time.perf_counter()
        page = await client.send(request)
        latencies.append((time.perf_counter() - started) * 1000)
        uuids.extend(g["uuid"] for g in page["items"])
        request = next_page(request, page)
    return uuids, latencies


async def run_api_pages_bench(
    *, agents: int, gpus_per_agent: int, limit: int, query: str = "", work_dir: str = ""
) -> dict[str, Any]:
    from management.app import MasterServer  # the real server: keep-alive, middlewares, settings

    with tempfile.TemporaryDirectory(dir=work_dir or None) as tmp:
        state_dir = Path(tmp)
        started = time.perf_counter()
        fleet = generated_fleet(agents, gpus_per_agent)
        await seed_store(state_dir, fleet)
        seeded_s = time.perf_counter() - started
        # One client paging as fast as it can: the per-key rate limit would measure itself, so it is lifted.
        server = MasterServer(
            MasterConfig(state_dir=str(state_dir), link_port=0, api_port=0, api_key_rate_per_s=1e9, api_key_burst=10**9)
        )
        started = time.perf_counter()
        await server.start()
        loaded_s = time.perf_counter() - started
        try:
            key = server.operator_token_file.read_text().strip()
            async with AsyncApiClient(server.api_url, key) as client:
                filters = dict(part.split("=", 1) for part in query.split("&") if part)
                uuids, latencies = await page_through(client, list_request("/api/v1/gpus", filters, limit))
            registry = server.master.registry
            offered = {uuid for uuid, gpu in registry.gpus.items() if server.master.offered(gpu)}
            started = time.perf_counter()
            sorted(registry.gpus.values(), key=lambda g: (g.agent_id, g.index, g.uuid))
            sort_all_ms = (time.perf_counter() - started) * 1000
        finally:
            await server.stop()
    wanted = dict(part.split("=", 1) for part in query.split("&") if part)

    def value(gpu: GpuRecord, field: str) -> str:
        return str(gpu.uuid in offered).lower() if field == "offered" else str(getattr(gpu, field))

    matching = [g for g in fleet.gpus if all(value(g, k) == v for k, v in wanted.items())]
    expected = [g.uuid for g in sorted(matching, key=lambda g: (g.agent_id, g.index, g.uuid))]
    return {
        "agents": agents,
        "gpus": len(fleet.gpus),
        "query": query,
        "matching": len(matching),
        "limit": limit,
        "pages": len(latencies),
        "every_gpu_once_in_order": uuids == expected,
        "page_p50_ms": round(statistics.median(latencies), 2),
        "page_p99_ms": round(_percentile(latencies, 0.99), 2),
        "page_max_ms": round(max(latencies), 2),
        "sort_every_gpu_ms": round(sort_all_ms, 2),
        "seed_s": round(seeded_s, 2),
        "master_load_s": round(loaded_s, 2),
    }


def api_pages_table(r: dict[str, Any]) -> str:
    target_met = "met" if r["page_p99_ms"] < 50 else "MISSED"
    rows = [
        ("agents x GPUs per agent", f"{r['agents']:,} x {r['gpus'] // max(1, r['agents'])} = {r['gpus']:,} GPUs"),
        ("filter, GPUs matching", f"{r['query'] or '(none)'}, {r['matching']:,}"),
        ("pages of limit", f"{r['pages']:,} of {r['limit']}"),
        ("every GPU exactly once, in order", "yes" if r["every_gpu_once_in_order"] else "NO"),
        (
            "page latency p50 / p99 / max ms",
            f"{r['page_p50_ms']} / {r['page_p99_ms']} / {r['page_max_ms']}  (target < 50: {target_met})",
        ),
        ("one sort of every GPU, ms (not done per page)", f"{r['sort_every_gpu_ms']}"),
        ("seeding the store s, Master load s", f"{r['seed_s']}, {r['master_load_s']}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def run(agents: int, gpus_per_agent: int, limit: int, query: str = "", work_dir: str = "") -> dict[str, Any]:
    return asyncio.run(
        run_api_pages_bench(agents=agents, gpus_per_agent=gpus_per_agent, limit=limit, query=query, work_dir=work_dir)
    )

"""``python -m bench offers``: offer search on a generated market (default 10,000 hosts, 80,000 GPUs).

The grid is Master records (AgentRecord + GpuRecords) of mixed models, regions, providers, prices, bandwidths and
reputations, a share of every host's GPUs held; the OfferIndex is built from them the way the OfferFeed builds it
(management/market/offers.py), then a set of realistic queries (filters, sorts, the first page and deep cursor pages)
is run ``rounds`` times each and timed one by one: p50/p99 per query and overall, beside the target (p99 < 50 ms).
The first run of a query in a new sort order pays for that order (kept from then on, and kept in step with every
change); it is among the timed runs. The garbage collector is set as the management daemon sets it (common/heap.py).
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from common.catalog import CATALOG, expected_figures
from common.heap import tune_for_daemon
from common.inventory import GpuInfo, HostInfo, NvLink
from common.wire import BenchmarkFigures
from management.market.offers import OfferIndex, score_of
from management.market.prices import HostPrice
from master.records import AgentRecord, GpuRecord, GpuVerification

TARGET_P99_MS = 50.0

# model -> (NVML name, VRAM MiB, compute capability, tier, NVLinked, list price per GPU-hour in micro-units)
MODELS: dict[str, tuple[str, int, str, str, bool, int]] = {
    "h100-sxm": ("NVIDIA H100 80GB HBM3", 81_559, "9.0", "flagship", True, 2_400_000),
    "h200": ("NVIDIA H200", 143_771, "9.0", "flagship", True, 3_200_000),
    "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81_920, "8.0", "datacenter", True, 1_400_000),
    "l40s": ("NVIDIA L40S", 46_068, "8.9", "inference", False, 900_000),
    "rtx-4090": ("NVIDIA GeForce RTX 4090", 24_564, "8.9", "consumer", False, 400_000),
    "rtx-3090": ("NVIDIA GeForce RTX 3090", 24_576, "8.6", "consumer", False, 250_000),
}
MODEL_WEIGHTS = (20, 8, 20, 15, 25, 12)
REGIONS = ("eu-west", "eu-central", "us-east", "us-west", "ap-south", "ap-northeast", "sa-east", "af-south")
CUDA = ("11.8", "12.0", "12.2", "12.4", "12.6", "12.10")

# The example from the issue, and what renters search for: (name, query, sort, pages deep).
QUERIES: tuple[tuple[str, str, str | None, int], ...] = (
    (
        "issue example",
        "gpu_ram>=24 num_gpus>=4 tier=flagship model in [h100-sxm,h200] reliability>0.95 region=eu-west "
        "price<=2.5 cuda>=12.2 inet_down>=500 verified=true",
        None,
        0,
    ),
    ("everything, default sort", "", None, 0),
    ("everything, page 20", "", None, 20),
    ("cheapest 4090s", "model=rtx-4090", "price", 0),
    ("cheapest 4090s, page 10", "model=rtx-4090", "price", 10),
    ("8 x H100 NVLink", "model=h100-sxm num_gpus>=8 nvlink=true", None, 0),
    ("big VRAM, reliable", "gpu_ram>=80 reliability>=0.9 sort=-reliability", None, 0),
    ("eu under 1.00", "region in [eu-west,eu-central] price<1", "-gpu_ram", 0),
    ("interruptible, cheap bids", "interruptible=true min_bid<=0.5", "min_bid", 0),
    ("fast network, new CUDA", "inet_down>=1000 inet_up>=500 cuda>=12.4", "-inet_down", 0),
    ("nothing matches", "model=h200 num_gpus>=2 gpu_ram<80", None, 0),
    ("by region desc, page 5", "num_gpus>=2", "-region", 5),
)


@dataclass(frozen=True)
class OffersBenchOptions:
    hosts: int = 10_000
    gpus_per_host: int = 8
    rounds: int = 30
    seed: int = 7
    limit: int = 50
    queries: tuple[tuple[str, str, str | None, int], ...] = field(default=QUERIES)


def market(o: OffersBenchOptions) -> tuple[OfferIndex, float]:
    """A generated market's offer index, and how long building it took (s)."""
    rng = random.Random(o.seed)
    index = OfferIndex()
    names = list(MODELS)
    build_s = 0.0
    for h in range(o.hosts):
        agent_id = f"agt-{h:06d}"
        model = rng.choices(names, MODEL_WEIGHTS)[0]
        nvml, vram, cc, tier, nvlinked, list_price = MODELS[model]
        down = rng.choice((None, 100.0, 500.0, 1000.0, 2500.0, 10_000.0))
        host = HostInfo(
            hostname=f"node{h}",
            cpu_model="EPYC",
            cpu_cores=rng.choice((32, 64, 128, 192)),
            ram_mib=rng.choice((256, 512, 1024, 2048)) * 1024,
            disk_total_gib=4000,
            disk_free_gib=rng.uniform(500, 4000),
            os="linux",
            kernel="6.1",
            bandwidth_mbps_down=down,
            bandwidth_mbps_up=down / 2 if down is not None else None,
        )
        agent = AgentRecord(
            id=agent_id,
            provider=f"prov-{h % 400:03d}",
            state=rng.choice(("ready", "busy")),
            region=rng.choice(REGIONS),
            host=host,
            runtime="docker",
            isolation="container",
        )
        cuda = rng.choice(CUDA)
        n = o.gpus_per_host
        flagged = rng.random() < 0.05
        expected = expected_figures(CATALOG[model])
        figures = BenchmarkFigures(bf16_tflops=expected.tensor_tflops, memory_bandwidth_gbs=expected.memory_bandwidth_gbs)
        measured = GpuVerification(status="verified", at=1.0, figures=figures)
        gpus = []
        for i in range(n):
            links = tuple(
                NvLink(link=k, active=True, remote_pci_bus_id=f"0000:{j:02x}:00.0") for k, j in enumerate(range(n)) if j != i
            )
            info = GpuInfo(
                index=i,
                uuid=f"GPU-{h:06d}-{i}",
                name=nvml,
                pci_bus_id=f"0000:{i:02x}:00.0",
                memory_total_mib=vram,
                compute_capability=cc,
                cuda_version=cuda,
                nvlinks=links if nvlinked else (),
            )
            gpus.append(
                GpuRecord(
                    uuid=info.uuid,
                    agent_id=agent_id,
                    index=i,
                    model=model,
                    info=info,
                    state="available",
                    tier=tier,
                    flags=("vram_mismatch",) if flagged else (),
                    # a passed verification run (docs/verification.md), so ``verified=true`` matches the unflagged hosts
                    verification=None if flagged else measured,
                )
            )
        held = {g.uuid for g in gpus[: rng.randrange(n)]}  # 0..n-1 held: every host offers at least one
        on_demand = int(list_price * rng.uniform(0.6, 1.4)) // 10_000 * 10_000
        if rng.random() < 0.03:
            on_demand = 0  # a free host, as on a shared cluster
        min_bid = on_demand // 3 if rng.random() < 0.5 else None
        price = HostPrice(on_demand=on_demand, min_bid=min_bid, reserved_discount=rng.choice((0.0, 0.1, 0.2)))
        reliability = min(1.0, max(0.3, rng.betavariate(12, 1.2)))
        started = time.perf_counter()
        index.update_host(agent, gpus, held, price, reliability)
        build_s += time.perf_counter() - started
    return index, build_s


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_offers_bench(o: OffersBenchOptions) -> dict[str, Any]:
    tune_for_daemon()  # the collector's settings of the management daemon the search runs in (common/heap.py)
    index, build_s = market(o)
    per_query: list[dict[str, Any]] = []
    every: list[float] = []
    for name, query, sort, depth in o.queries:
        # The cursor of page ``depth`` is found once (walking the pages), then that page is what is timed.
        cursor = None
        for _ in range(depth):
            cursor = index.search(query, sort, o.limit, cursor).next_cursor
            if cursor is None:
                break
        times: list[float] = []
        result = None
        for _ in range(o.rounds):
            started = time.perf_counter()
            result = index.search(query, sort, o.limit, cursor)
            times.append((time.perf_counter() - started) * 1000)
        assert result is not None
        every.extend(times)
        per_query.append(
            {
                "name": name,
                "query": query,
                "sort": sort or result.sort,
                "page": depth + 1,
                "matched": result.total,
                "returned": len(result.offers),
                "emptied_by": result.emptied_by.condition if result.emptied_by else None,
                "p50_ms": round(statistics.median(times), 3),
                "p99_ms": round(_percentile(times, 0.99), 3),
            }
        )
    churn = _churn(index, o)
    every.extend(churn.pop("search_ms"))
    return {
        "hosts": o.hosts,
        "gpus": o.hosts * o.gpus_per_host,
        "offers": len(index),
        "rounds": o.rounds,
        "build_s": round(build_s, 3),
        "queries": per_query,
        "churn": churn,
        "p50_ms": round(statistics.median(every), 3),
        "p99_ms": round(_percentile(every, 0.99), 3),
        "target_p99_ms": TARGET_P99_MS,
    }


def _churn(index: OfferIndex, o: OffersBenchOptions) -> dict[str, Any]:
    """A host's offer changes (its price, as a provider's edit or a hold would change it), then the default search
    runs and the sorted page is searched again: both timed, ``rounds`` times over different hosts."""
    rng = random.Random(o.seed + 1)
    offers = index.offers()
    updates: list[float] = []
    searches: list[float] = []
    for _ in range(o.rounds):
        offer = rng.choice(offers)
        price = int(offer.price * rng.uniform(0.8, 1.2))
        changed = msgspec.structs.replace(offer, price=price, score=score_of(offer.reliability, price))
        started = time.perf_counter()
        index.put(changed)
        updates.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        index.search("num_gpus>=1", None, o.limit)
        searches.append((time.perf_counter() - started) * 1000)
    return {
        "update_p50_ms": round(statistics.median(updates), 3),
        "update_p99_ms": round(_percentile(updates, 0.99), 3),
        "search_p50_ms": round(statistics.median(searches), 3),
        "search_p99_ms": round(_percentile(searches, 0.99), 3),
        "search_ms": searches,
    }


def offers_table(r: dict[str, Any]) -> str:
    lines = [
        f"offer search: {r['hosts']} hosts, {r['gpus']} GPUs, {r['offers']} offers; index built in {r['build_s']:.2f} s; "
        f"{r['rounds']} runs per query",
        f"{'query':<28} {'page':>4} {'matched':>7} {'p50 ms':>8} {'p99 ms':>8}",
    ]
    for q in r["queries"]:
        lines.append(f"{q['name']:<28} {q['page']:>4} {q['matched']:>7} {q['p50_ms']:>8.2f} {q['p99_ms']:>8.2f}")
    c = r["churn"]
    lines.append(
        f"{'a host changed, then search':<28} {'':>4} {'':>7} {c['search_p50_ms']:>8.2f} {c['search_p99_ms']:>8.2f}"
        f"  (the change itself: p50 {c['update_p50_ms']:.3f} ms, p99 {c['update_p99_ms']:.3f} ms)"
    )
    verdict = "ok" if r["p99_ms"] < r["target_p99_ms"] else "MISSED"
    target = f"target p99 < {r['target_p99_ms']:g} ms: {verdict}"
    lines.append(f"{'overall':<28} {'':>4} {'':>7} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f}  ({target})")
    return "\n".join(lines)

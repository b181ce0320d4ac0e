"""The fleet's Prometheus series (master/metrics.py, FleetGauges): GPUs by state, tier, region and model, their
means and extremes by tier, region and model, agents by state and region; bounded whatever the fleet's size, one
series per GPU only when the ``metrics_per_gpu`` setting asks, whatever the fleet's size (how fast a scrape of 10,000 hosts
/ 80,000 GPUs is, is measured by ``python -m bench summaries``).

The records are the Master's own types built in memory (what its registry holds); the GPUs are simulated."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, generate_latest

import master.metrics as metrics
from common.inventory import GpuInfo, GpuSample
from master.metrics import FleetGauges
from master.records import AgentRecord, CommandRecord, GpuFault, GpuRecord
from tests.support.prometheus import check_metrics, names, sample, samples

NOW = 1_000_000.0
H100_MIB = 81_559


def agent(agent_id: str, *, state: str = "ready", region: str = "eu-west", last_seen: float = NOW) -> AgentRecord:
    return AgentRecord(id=agent_id, provider="prov-1", state=state, region=region, last_seen=last_seen)


def gpu(
    agent_id: str,
    index: int,
    *,
    state: str = "available",
    tier: str | None = "premium",
    model: str = "h100-sxm",
    fault: GpuFault | None = None,
) -> GpuRecord:
    uuid = f"GPU-{agent_id}-{index}"
    info = GpuInfo(
        index=index,
        uuid=uuid,
        name="NVIDIA H100",
        pci_bus_id=f"0000:{index:02x}:00.0",
        memory_total_mib=H100_MIB,
        compute_capability="9.0",
    )
    return GpuRecord(uuid=uuid, agent_id=agent_id, index=index, model=model, info=info, state=state, tier=tier, fault=fault)


def reading(record: GpuRecord, util: float, mem_mib: int, temp: float | None = 50.0, ecc: int = 0) -> GpuSample:
    return GpuSample(
        uuid=record.uuid, ts=NOW, utilization_pct=util, memory_used_mib=mem_mib, temperature_c=temp, ecc_uncorrected=ecc
    )


def scrape(
    agents: list[AgentRecord],
    gpus: list[GpuRecord],
    latest: dict[str, GpuSample],
    *,
    per_gpu: bool = False,
    commands: tuple[CommandRecord, ...] = (),
) -> str:
    registry = CollectorRegistry()
    registry.register(
        FleetGauges(
            lambda: agents,
            lambda: gpus,
            lambda: commands,
            lambda: 2,
            latest=lambda: latest,
            per_gpu=per_gpu,
            clock=lambda: NOW,
        )
    )
    return generate_latest(registry).decode()


def test_gpus_are_counted_by_state_tier_region_and_model_with_their_groups_means():
    agents = [agent("a1"), agent("a2", region="us-east"), agent("a3", state="offline", last_seen=NOW - 400)]
    busy_hot = gpu("a1", 0, state="busy")
    busy_idle = gpu("a1", 1, state="busy")
    free = gpu("a1", 2)
    untiered = gpu("a2", 0, tier=None, model="")
    faulty = gpu("a2", 1, state="faulty", fault=GpuFault(kind="xid", reason="Xid 79", since=NOW, code=79))
    silent = gpu("a3", 0, state="offline")
    gpus = [busy_hot, busy_idle, free, untiered, faulty, silent]
    latest = {
        busy_hot.uuid: reading(busy_hot, 90.0, 40_000, temp=88.0),
        busy_idle.uuid: reading(busy_idle, 0.0, 0, temp=40.0),
        free.uuid: reading(free, 30.0, 20_000, temp=45.0, ecc=2),
        untiered.uuid: reading(untiered, 10.0, 1_000),
        faulty.uuid: reading(faulty, 0.0, 0, temp=99.0),  # out of service: not in the means nor the hottest
        silent.uuid: reading(silent, 100.0, 80_000, temp=99.0),
    }
    text = scrape(agents, gpus, latest)

    eu = {"tier": "premium", "region": "eu-west", "model": "h100-sxm"}
    assert sample(text, "idlegrid_gpus", state="busy", **eu) == 2
    assert sample(text, "idlegrid_gpus", state="available", **eu) == 1
    assert sample(text, "idlegrid_gpus", state="available", tier="none", region="us-east", model="unknown") == 1
    assert sample(text, "idlegrid_gpus", state="faulty", tier="premium", region="us-east", model="h100-sxm") == 1
    assert sample(text, "idlegrid_gpus", state="offline", tier="premium", region="none", model="h100-sxm") is None
    assert sample(text, "idlegrid_gpus", state="offline", tier="premium", region="eu-west", model="h100-sxm") == 1
    assert sum(value for _, value in samples(text, "idlegrid_gpus")) == len(gpus)

    assert sample(text, "idlegrid_gpus_sampled", **eu) == 3
    assert sample(text, "idlegrid_gpu_utilization_mean_percent", **eu) == 40.0  # (90 + 0 + 30) / 3
    assert sample(text, "idlegrid_gpu_memory_used_ratio", **eu) == 60_000 / (3 * H100_MIB)
    assert sample(text, "idlegrid_gpu_memory_used_bytes", **eu) == 60_000 * 1024 * 1024
    assert sample(text, "idlegrid_gpu_memory_total_bytes", **eu) == 3 * H100_MIB * 1024 * 1024
    assert sample(text, "idlegrid_gpu_temperature_max_celsius", **eu) == 88.0
    assert sample(text, "idlegrid_gpus_rented_idle", **eu) == 1
    assert sample(text, "idlegrid_gpus_ecc_uncorrected", **eu) == 1
    assert sample(text, "idlegrid_gpus_faulty", kind="xid") == 1
    assert sample(text, "idlegrid_gpus_faulty", kind="ecc") == 0

    assert sample(text, "idlegrid_agents", state="ready", region="eu-west") == 1
    assert sample(text, "idlegrid_agents", state="offline", region="eu-west") == 1
    assert sample(text, "idlegrid_agents", state="ready", region="us-east") == 1
    assert sample(text, "idlegrid_agents_offline_longest_seconds", region="eu-west") == 400
    assert sample(text, "idlegrid_agents_offline_longest_seconds", region="us-east") == 0
    assert sample(text, "idlegrid_relays_connected") == 2


def test_no_series_names_a_gpu_or_an_agent_unless_the_setting_asks():
    agents = [agent("agt-secret")]
    gpus = [gpu("agt-secret", i) for i in range(4)]
    latest = {g.uuid: reading(g, 50.0, 1000, temp=60.0 + i) for i, g in enumerate(gpus)}

    bounded = scrape(agents, gpus, latest)
    assert "agt-secret" not in bounded and "GPU-" not in bounded
    check = check_metrics(bounded)
    assert check.clean, check.findings

    per_gpu = scrape(agents, gpus, latest, per_gpu=True)
    assert sample(per_gpu, "idlegrid_gpu_temperature_celsius", uuid="GPU-agt-secret-3") == 63.0
    assert sample(per_gpu, "idlegrid_gpu_utilization_percent", uuid="GPU-agt-secret-0", agent="agt-secret") == 50.0
    assert len(samples(per_gpu, "idlegrid_gpu_memory_used_bytes_per_gpu")) == 4
    check = check_metrics(per_gpu)
    assert check.clean, check.findings


# A scrape of the largest fleet the Master is sized for, with every GPU reporting. Its speed target (under 2 s, beside
# Prometheus's default 10 s scrape timeout) is bench's: `python -m bench summaries`, bench/README.md.
FLEET_HOSTS = 10_000
GPUS_PER_HOST = 8


def test_a_scrape_of_10000_hosts_and_80000_gpus_stays_bounded():
    regions = ("eu-west", "eu-north", "us-east", "us-west", "ap-south")
    models = (("h100-sxm", "premium"), ("a100-sxm", "premium"), ("l40s", "standard"), ("rtx-4090", "community"))
    states = ("available", "busy", "busy", "reserved", "available", "busy", "faulty", "offline")
    agents = [agent(f"a{h}", region=regions[h % len(regions)]) for h in range(FLEET_HOSTS)]
    gpus, latest = [], {}
    for h in range(FLEET_HOSTS):
        model, tier = models[h % len(models)]
        for i in range(GPUS_PER_HOST):
            record = gpu(f"a{h}", i, state=states[i], tier=tier, model=model)
            gpus.append(record)
            latest[record.uuid] = reading(record, float((h + i) % 101), 1000 * i, temp=40.0 + (h % 50))
    registry = CollectorRegistry()
    registry.register(FleetGauges(lambda: agents, lambda: gpus, lambda: [], lambda: 3, latest=lambda: latest))

    text = generate_latest(registry).decode()

    assert sum(value for _, value in samples(text, "idlegrid_gpus")) == FLEET_HOSTS * GPUS_PER_HOST
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    assert series < 1_000, f"{series} series for {len(gpus)} GPUs: cardinality must not grow with the fleet"
    assert "GPU-" not in text and names(text) >= {"idlegrid_gpus", "idlegrid_gpu_utilization_mean_percent"}


async def test_a_prepared_scrape_reads_as_one_pass_and_gives_the_loop_back_between_slices(monkeypatch):
    """``prepare`` walks the GPUs in slices with the event loop free between them (a scrape of 80,000 GPUs in one
    pass held the Master's loop 110-160 ms); what the next collect then shows is what one pass shows."""
    monkeypatch.setattr(metrics, "PREPARE_SLICE", 3)
    agents = [agent(f"a{i}", region="eu-west" if i % 2 else "us-east") for i in range(4)]
    gpus = [gpu(f"a{i}", n, state="busy" if n == 0 else "available") for i in range(4) for n in range(4)]
    latest = {g.uuid: reading(g, util=10.0 * g.index, mem_mib=1000 * (g.index + 1)) for g in gpus}
    one_pass = scrape(agents, gpus, latest, per_gpu=True)

    gauges = FleetGauges(
        lambda: agents, lambda: gpus, lambda: (), lambda: 2, latest=lambda: latest, per_gpu=True, clock=lambda: NOW
    )
    registry = CollectorRegistry()
    registry.register(gauges)
    turns = 0
    walking = True

    async def meanwhile() -> None:
        nonlocal turns
        while walking:
            turns += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(meanwhile())
    await asyncio.sleep(0)
    started = turns
    await gauges.prepare()
    walking = False
    await other
    assert turns - started >= len(gpus) // 3 - 1  # the other task ran between every two slices of 3 GPUs
    assert generate_latest(registry).decode() == one_pass
    assert gauges._prepared is None  # used once: the next scrape without ``prepare`` walks the GPUs itself
    assert generate_latest(registry).decode() == one_pass


async def test_gpus_coming_and_going_while_a_scrape_is_prepared_do_not_break_it(monkeypatch):
    """The walk is over the GPUs of the moment it started: the registry's dict may change between slices."""
    monkeypatch.setattr(metrics, "PREPARE_SLICE", 2)
    agents = [agent("a1")]
    by_uuid = {g.uuid: g for g in (gpu("a1", n) for n in range(6))}
    gauges = FleetGauges(lambda: agents, lambda: by_uuid.values(), lambda: (), lambda: 1, clock=lambda: NOW)
    registry = CollectorRegistry()
    registry.register(gauges)

    async def churn() -> None:
        await asyncio.sleep(0)
        late = gpu("a1", 9)
        by_uuid[late.uuid] = late
        del by_uuid[gpu("a1", 0).uuid]

    churning = asyncio.create_task(churn())
    await gauges.prepare()
    await churning
    text = generate_latest(registry).decode()
    assert sample(text, "idlegrid_gpus", state="available", tier="premium", region="eu-west", model="h100-sxm") == 6

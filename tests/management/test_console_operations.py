"""The services' console reads (management/services/): hosts filtered by their GPUs' tier and model, the fleet
at a glance, and the recent samples the live charts poll. A real Master on a real SQLite store, its fleet generated
(bench/api_pages.py) and loaded at start, as after a restart; samples are made here (no GPU)."""

from __future__ import annotations

import pytest

from bench.api_pages import generated_fleet, seed_store
from common.errors import NotFound
from common.inventory import GpuSample
from management.app import compose
from management.services import Services
from management.services.hosts import AgentKey
from master.config import MasterConfig
from master.master import Master


@pytest.fixture
async def operations(tmp_path):
    await seed_store(tmp_path, generated_fleet(40, 2, providers=2))  # agent i: provider i % 2, model i % 4
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    composition = compose(master)
    await composition.load()
    yield composition.services
    await master.stop()


def every_host(operations: Services, **filters) -> list[str]:
    ids: list[str] = []
    after: AgentKey | None = None
    while True:
        page = operations.hosts.list_agents(**filters, after=after, limit=7)
        ids += [d.agent.id for d in page.items]
        if page.next_key is None:
            return ids
        assert isinstance(page.next_key, AgentKey)
        after = page.next_key


async def test_hosts_are_filtered_by_their_gpus_model_and_tier_and_by_owner_across_pages(operations):
    h100s = every_host(operations, model="h100-sxm")
    assert h100s == [f"agt-{i:08d}" for i in range(0, 40, 4)]  # model i % 4 == 0, every page walked once
    tier = operations.hosts._master.registry.gpus_of("agt-00000000")[0].tier
    assert set(h100s) <= set(every_host(operations, tier=tier))
    own = every_host(operations, owner="prov-001", state="offline")
    assert own == [f"agt-{i:08d}" for i in range(40) if i % 2 == 1 and i % 10 == 9]
    assert every_host(operations, owner="prov-001", model="h100-sxm") == []  # prov-001 has the odd hosts: no h100


async def test_host_choices_name_what_is_there_for_the_asker(operations):
    choices = operations.hosts.host_choices()
    assert choices.regions == ["ap-south", "eu-west", "us-east"]
    assert choices.models == ["a100-80gb", "h100-sxm", "l4", "rtx-4090"]
    assert operations.hosts.host_choices(owner="prov-001").models == ["a100-80gb", "rtx-4090"]


async def test_the_fleet_counts_every_gpu_of_the_registry(operations):
    fleet = operations.hosts.fleet()
    assert fleet.total.total == 80 and fleet.total.offline == 8 and fleet.hosts == 40
    assert [f.name for f in fleet.by_tier][: len(operations.hosts._master.policy.tiers)] == [
        r.name for r in operations.hosts._master.policy.tiers if r.name in {f.name for f in fleet.by_tier}
    ]


async def test_recent_samples_watch_a_host_from_its_latest_sample_on_and_another_providers_host_is_not_found(operations):
    master = operations.hosts._master
    gpu = master.registry.gpus_of("agt-00000000")[0]
    master.telemetry.ingest("agt-00000000", [GpuSample(uuid=gpu.uuid, ts=100.0, utilization_pct=5.0)])
    first = operations.telemetry.recent_samples("agt-00000000", owner="prov-000")
    assert [s.ts for s in first.samples[gpu.uuid]] == [100.0]  # starts from the latest sample
    master.telemetry.ingest("agt-00000000", [GpuSample(uuid=gpu.uuid, ts=101.0, utilization_pct=7.0)])
    again = operations.telemetry.recent_samples("agt-00000000")
    assert [s.utilization_pct for s in again.samples[gpu.uuid]] == [5.0, 7.0]
    with pytest.raises(NotFound):
        operations.telemetry.recent_samples("agt-00000000", owner="prov-001")

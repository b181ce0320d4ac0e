"""The fleet at a glance (management/services/fleet.py): compute-unit figures by tier, region and model, and the faulty GPUs,
from a generated fleet's records (bench/api_pages.py) and samples made here (no GPU is needed to add them up)."""

from __future__ import annotations

import msgspec

from bench.api_pages import generated_fleet
from common.inventory import GpuSample
from management.services.fleet import FAULTY_LISTED, fleet_figures, usage_of
from master.records import GpuFault
from master.states import GpuState


def test_figures_count_every_state_and_average_only_gpus_in_service():
    fleet = generated_fleet(20, 2, now=1000.0)  # every 10th host offline: agt-9 and agt-19
    gpus = {g.uuid: g for g in fleet.gpus}
    gpus["GPU-00000000-00"].state = GpuState.BUSY.value
    gpus["GPU-00000001-00"].state = GpuState.RESERVED.value
    gpus["GPU-00000002-01"].state = GpuState.FAULTY.value
    gpus["GPU-00000002-01"].fault = GpuFault(kind="xid", reason="Xid 79: GPU has fallen off the bus", since=999.0, code=79)
    latest = {
        "GPU-00000000-00": GpuSample(uuid="GPU-00000000-00", ts=1000.0, utilization_pct=90.0, memory_used_mib=40_960),
        "GPU-00000000-01": GpuSample(uuid="GPU-00000000-01", ts=1000.0, utilization_pct=10.0, memory_used_mib=0),
        "GPU-00000009-00": GpuSample(uuid="GPU-00000009-00", ts=900.0, utilization_pct=100.0, memory_used_mib=1),  # offline
    }
    agents = {a.id: a for a in fleet.agents}

    figures = fleet_figures(fleet.gpus, agents, usage_of(latest), tier_order=["premium", "standard"])

    total = figures.total
    assert (total.total, total.busy, total.available, total.faulty, total.offline) == (40, 2, 33, 1, 4)
    assert total.utilization_pct == 50.0  # (90 + 10) / 2: the offline host's old sample does not count
    h100 = gpus["GPU-00000000-00"].info.memory_total_mib
    assert total.memory_pct == round(100 * 40_960 / (2 * h100), 1)
    assert figures.hosts == 20 and figures.faulty_count == 1
    [faulty] = figures.faulty
    assert faulty.fault is not None
    assert (faulty.uuid, faulty.agent_id, faulty.region, faulty.fault.code) == ("GPU-00000002-01", "agt-00000002", "ap-south", 79)
    assert (
        sum(f.total for f in figures.by_tier)
        == sum(f.total for f in figures.by_region)
        == sum(f.total for f in figures.by_model)
        == 40
    )
    assert [f.name for f in figures.by_region] == ["ap-south", "eu-west", "us-east"]
    assert [f.name for f in figures.by_model] == ["a100-80gb", "h100-sxm", "l4", "rtx-4090"]
    by_model = {f.name: f for f in figures.by_model}
    assert (by_model["h100-sxm"].busy, by_model["a100-80gb"].busy) == (1, 1)  # agt-0 runs h100s, agt-1 a100s
    assert by_model["l4"].utilization_pct is None  # no sample: no figure rather than a made-up 0


def test_many_faulty_gpus_are_counted_all_and_listed_up_to_the_limit_in_host_order():
    fleet = generated_fleet(FAULTY_LISTED, 2, now=1000.0)
    for gpu in fleet.gpus:
        gpu.state = GpuState.FAULTY.value
    figures = fleet_figures(reversed(fleet.gpus), {a.id: a for a in fleet.agents}, usage_of({}))
    assert figures.faulty_count == 2 * FAULTY_LISTED and len(figures.faulty) == FAULTY_LISTED
    assert [g.uuid for g in figures.faulty[:2]] == ["GPU-00000000-00", "GPU-00000000-01"]
    assert figures.total.faulty == 2 * FAULTY_LISTED and figures.total.utilization_pct is None


def test_a_fleet_of_10000_hosts_and_80000_gpus_is_summed_up_whole():
    # How fast is bench's (`python -m bench summaries`, target in bench/README.md), not a unit test's.
    fleet = generated_fleet(10_000, 8, now=1000.0)
    agents = {a.id: a for a in fleet.agents}
    latest = {
        g.uuid: GpuSample(uuid=g.uuid, ts=1000.0, utilization_pct=float(i % 100), memory_used_mib=i % 4096)
        for i, g in enumerate(fleet.gpus)
    }
    figures = fleet_figures(fleet.gpus, agents, usage_of(latest))
    assert figures.total.total == 80_000 and figures.total.offline == 8_000
    assert msgspec.to_builtins(figures.faulty) == []

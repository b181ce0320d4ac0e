"""The snapshot's unit cache: a host's units are built again only when one of its GPUs changed in a way a unit
shows, so the loop's snapshot of a large grid does not rebuild 80,000 units every cycle."""

from __future__ import annotations

import msgspec

from common.inventory import GpuInfo, NvLink
from management.scheduler.snapshot import UnitCache, units_of
from master.records import GpuFault, GpuRecord


def gpus(host: str = "agt-1") -> list[GpuRecord]:
    infos = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{i}",
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"0000:0{i}:00.0",
            memory_total_mib=81_559,
            compute_capability="9.0",
            nvlinks=(NvLink(link=0, active=True, remote_pci_bus_id=f"0000:0{1 - i}:00.0"),),
        )
        for i in range(2)
    ]
    return [GpuRecord(uuid=g.uuid, agent_id=host, index=g.index, model="h100-sxm", info=g, state="available") for g in infos]


def test_an_unchanged_host_gets_the_same_units_back_without_building_them():
    cache, host = UnitCache(), gpus()
    first = cache.units("agt-1", host)
    assert first == units_of(host) and first[0].nvlink_peers == frozenset({"GPU-1"})
    assert cache.units("agt-1", host) is first


def test_a_fault_a_state_a_tier_or_a_new_inventory_builds_the_hosts_units_again():
    cache, host = UnitCache(), gpus()
    first = cache.units("agt-1", host)
    host[0].fault = GpuFault(kind="xid", reason="Xid 79", since=1.0, code=79)  # the registry changes records in place
    faulty = cache.units("agt-1", host)
    assert faulty is not first and not faulty[0].healthy and faulty[1].healthy
    host[1].tier = "flagship"
    assert cache.units("agt-1", host)[1].tier == "flagship"
    host[1].info = msgspec.structs.replace(host[1].info, memory_total_mib=40_000)  # the host said hello again
    assert cache.units("agt-1", host)[1].vram_mib == 40_000
    assert cache.units("agt-1", host[:1]) == units_of(host[:1])  # a GPU left the inventory


def test_hosts_gone_from_the_grid_are_forgotten():
    cache = UnitCache()
    cache.units("agt-1", gpus("agt-1"))
    cache.units("agt-2", gpus("agt-2"))
    cache.forget_all_but({"agt-2"})
    assert list(cache._hosts) == ["agt-2"]  # noqa: SLF001

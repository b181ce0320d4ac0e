"""The snapshot's view of MIG (management/scheduler/snapshot.py): a GPU in MIG mode is its instances, each a unit with
its profile, its own memory and the GPU as parent; holds on instances, or on the whole split GPU, map to them."""

from __future__ import annotations

import msgspec

from common.inventory import MigInstance
from management.scheduler.model import Policy
from management.scheduler.snapshot import build_snapshot, units_of
from master.allocations import Hold
from master.records import AgentRecord, GpuFault, GpuRecord
from tests.master.linked import gpus

PROFILES = [("MIG-0", "3g.40gb", 40960), ("MIG-1", "2g.20gb", 20480), ("MIG-2", "1g.10gb", 10240)]


def records(*, mig_enabled: bool = True, instances: list[tuple[str, str, int]] = PROFILES) -> list[GpuRecord]:
    """GPU-h100-0 in MIG mode split into ``instances``; GPU-h100-1 whole, NVLinked to it."""
    first, second = gpus(2)
    split = [MigInstance(uuid=u, profile=p, memory_mib=m, index=i) for i, (u, p, m) in enumerate(instances)]
    first = msgspec.structs.replace(first, mig_enabled=mig_enabled, mig_instances=tuple(split))
    return [
        GpuRecord(uuid=first.uuid, agent_id="agt-a", index=0, model="h100-sxm", info=first, state="available", tier="t1"),
        GpuRecord(uuid=second.uuid, agent_id="agt-a", index=1, model="h100-sxm", info=second, state="available", tier="t1"),
    ]


def test_a_gpu_in_mig_mode_yields_its_instances_not_itself():
    units = {u.id: u for u in units_of(records())}

    assert set(units) == {"MIG-0", "MIG-1", "MIG-2", "GPU-h100-1"}
    small = units["MIG-2"]
    assert (small.mig_profile, small.parent, small.vram_mib, small.host) == ("1g.10gb", "GPU-h100-0", 10240, "agt-a")
    assert (small.model, small.tier, small.compute_capability, small.healthy) == ("h100-sxm", "t1", (9, 0), True)
    assert small.nvlink_peers == frozenset()
    assert (units["GPU-h100-1"].mig_profile, units["GPU-h100-1"].parent) == (None, None)


def test_a_gpu_in_mig_mode_without_instances_offers_nothing_and_one_with_mig_off_is_whole():
    assert [u.id for u in units_of(records(instances=[]))] == ["GPU-h100-1"]
    assert [u.id for u in units_of(records(mig_enabled=False))] == ["GPU-h100-0", "GPU-h100-1"]


def test_a_faulty_gpu_takes_every_instance_down():
    gpu, whole = records()
    gpu.state, gpu.fault = "faulty", GpuFault(kind="xid", reason="Xid 79", since=1.0)
    assert {u.id: u.healthy for u in units_of([gpu, whole])} == {
        "MIG-0": False,
        "MIG-1": False,
        "MIG-2": False,
        "GPU-h100-1": True,
    }


def snapshot(holds: dict[str, Hold]):
    agent = AgentRecord(id="agt-a", provider="p", state="ready", runtime="docker", isolation="container")
    return build_snapshot(
        now=100.0,
        agents={"agt-a": agent},
        gpus_by_agent={"agt-a": records()},
        holds=holds,
        workloads=[],
        usage={},
        project_usage={},
        policy=Policy(),
        offline_grace_s=5.0,
    )


def test_a_held_instance_is_held_and_a_split_gpu_held_whole_takes_every_instance():
    held = snapshot({"MIG-1": Hold("agt-a", "raw-1", "cmd-1", running=True)})
    assert held.holders == {"MIG-1": "container:agt-a/raw-1"}

    whole = snapshot({"GPU-h100-0": Hold("agt-a", "raw-2", "", running=True)})
    assert whole.holders == dict.fromkeys(["MIG-0", "MIG-1", "MIG-2"], "container:agt-a/raw-2")

"""The allocation ledger with MIG: a MIG instance is held on its own, and a hold on a whole GPU and a hold on any of
its instances exclude each other, both ways, in a claim, in a rebuild after a restart, and for a faulty GPU."""

from __future__ import annotations

import msgspec
import pytest

from common.containers import ContainerSpec
from common.errors import Conflict
from common.inventory import GpuInfo, MigInstance
from common.wire import CommandResult
from master.allocations import GpuAllocations, Hold
from master.config import MasterConfig
from master.master import Master
from master.records import AgentRecord, CommandRecord, GpuFault, GpuRecord
from tests.master.linked import connect, gpus, relay, relay_link

MIG = ["MIG-a-0", "MIG-a-1", "MIG-a-2"]


def split(info: GpuInfo, *uuids: str) -> GpuInfo:
    """``info`` in MIG mode, split into 2g.20gb instances named ``uuids``."""
    instances = [MigInstance(uuid=u, profile="2g.20gb", memory_mib=20389, index=i) for i, u in enumerate(uuids)]
    return msgspec.structs.replace(info, mig_enabled=True, mig_instances=tuple(instances))


def host_gpus() -> list[GpuInfo]:
    """GPU-h100-0 split into three instances, GPU-h100-1 whole."""
    whole = gpus(2)
    return [split(whole[0], *MIG), whole[1]]


def ledger() -> GpuAllocations:
    allocations = GpuAllocations()
    allocations.set_partition("GPU-h100-0", MIG)
    return allocations


def test_instances_of_one_gpu_are_held_by_different_containers():
    allocations = ledger()
    allocations.claim("agt-a", "a", "cmd-a", [MIG[0]])
    allocations.claim("agt-a", "b", "cmd-b", [MIG[1]])
    assert allocations.holder(MIG[1]) == Hold("agt-a", "b", "cmd-b", running=False)
    with pytest.raises(Conflict, match=f"GPU {MIG[0]} is held by container 'a'"):
        allocations.claim("agt-a", "c", "cmd-c", [MIG[0]])


def test_a_gpu_with_an_instance_held_cannot_be_held_whole():
    allocations = ledger()
    allocations.claim("agt-a", "part", "cmd-1", [MIG[2]])
    with pytest.raises(Conflict, match=f"GPU GPU-h100-0: its MIG instance {MIG[2]} is held by container 'part'"):
        allocations.claim("agt-a", "whole", "cmd-2", ["GPU-h100-1", "GPU-h100-0"])
    assert allocations.holder("GPU-h100-1") is None  # all or none
    assert allocations.covering("GPU-h100-0") == Hold("agt-a", "part", "cmd-1", running=False)


def test_an_instance_of_a_gpu_held_whole_cannot_be_held():
    allocations = ledger()
    allocations.claim("agt-a", "whole", "cmd-1", ["GPU-h100-0"])
    with pytest.raises(Conflict, match=f"MIG instance {MIG[1]}: its GPU GPU-h100-0 is held whole by container 'whole'"):
        allocations.claim("agt-a", "part", "cmd-2", [MIG[1]])
    # Once the whole-GPU container is gone, its instances are free.
    allocations.release("agt-a", "whole")
    allocations.claim("agt-a", "part", "cmd-3", [MIG[1]])


def test_a_new_partition_replaces_the_old_one():
    allocations = ledger()
    allocations.set_partition("GPU-h100-0", ["MIG-new"])
    assert allocations.parent_of(MIG[0]) is None and allocations.parent_of("MIG-new") == "GPU-h100-0"
    allocations.claim("agt-a", "whole", "cmd-1", ["GPU-h100-0"])
    with pytest.raises(Conflict, match="held whole"):
        allocations.claim("agt-a", "part", "cmd-2", ["MIG-new"])


def test_a_rebuild_keeps_the_exclusion_both_ways_and_drops_what_breaks_it():
    allocations = ledger()
    agent = AgentRecord(id="agt-a", provider="p", state="ready", containers={"part": [MIG[0]]})
    whole = CommandRecord(
        id="cmd-w", agent_id="agt-a", kind="create_container", spec={"name": "whole"}, state="sent", created_at=1, deadline=9
    )
    other = CommandRecord(
        id="cmd-o", agent_id="agt-a", kind="create_container", spec={"name": "other"}, state="sent", created_at=2, deadline=9
    )
    owner = {"GPU-h100-0": "agt-a", "GPU-h100-1": "agt-a"} | dict.fromkeys(MIG, "agt-a")
    dropped = allocations.rebuild([agent], [(whole, ["GPU-h100-0"]), (other, [MIG[1]])], owner)
    assert allocations.holder(MIG[0]) == Hold("agt-a", "part", "", running=True)
    assert allocations.holder(MIG[1]) == Hold("agt-a", "other", "cmd-o", running=False)
    assert allocations.holder("GPU-h100-0") is None
    assert dropped == ["command cmd-w on GPU GPU-h100-0"]


def test_an_instance_is_resolved_on_its_host_and_goes_down_with_a_faulty_gpu():
    split_gpu = GpuRecord(uuid="GPU-h100-0", agent_id="agt-a", index=0, model="h100-sxm", info=host_gpus()[0], state="available")
    allocations = ledger()
    assert allocations.resolve("agt-a", [split_gpu], [MIG[1], "0"]) == [MIG[1], "GPU-h100-0"]
    split_gpu.state, split_gpu.fault = "faulty", GpuFault(kind="xid", reason="Xid 79: GPU has fallen off the bus", since=1.0)
    with pytest.raises(Conflict, match="GPU GPU-h100-0 is faulty .Xid 79"):
        allocations.resolve("agt-a", [split_gpu], [MIG[1]])


# --- through the real Master ---------------------------------------------------------------------------------


def spec(name: str, *gpu_names: str) -> ContainerSpec:
    return ContainerSpec(name=name, image="none", gpus=list(gpu_names))


async def test_a_create_names_mig_instances_and_the_gpu_shows_busy_while_one_runs(master):
    link = relay_link()
    await connect(master, link, "agt-a", host_gpus())
    first = await master.create_command("agt-a", spec("a", MIG[0]))
    await relay(master, link, "agt-a", CommandResult(id=first.id, ok=True))
    await master.create_command("agt-a", spec("b", MIG[1]))
    with pytest.raises(Conflict, match="its MIG instance"):
        await master.create_command("agt-a", spec("whole", "GPU-h100-0"))
    with pytest.raises(Conflict, match="not on host agt-a"):
        await master.create_command("agt-a", spec("ghost", "MIG-elsewhere"))
    assert master.registry.gpus["GPU-h100-0"].state == "busy"
    assert master.registry.agents["agt-a"].containers == {"a": [MIG[0]]}


async def test_mig_holds_survive_a_master_restart_and_keep_excluding(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path / "m"), link_port=0)
    first = Master(config)
    await first.start()
    try:
        link = relay_link()
        await connect(first, link, "agt-a", host_gpus())
        running = await first.create_command("agt-a", spec("a", MIG[0]))
        await relay(first, link, "agt-a", CommandResult(id=running.id, ok=True))
        pending = await first.create_command("agt-a", spec("b", MIG[2]))
    finally:
        await first.stop()

    again = Master(config)
    await again.start()
    try:
        assert again.allocations.holder(MIG[0]) == Hold("agt-a", "a", "", running=True)
        assert again.allocations.holder(MIG[2]) == Hold("agt-a", "b", pending.id, running=False)
        with pytest.raises(Conflict, match="its MIG instance"):
            await again.create_command("agt-a", spec("whole", "GPU-h100-0"))
        await again.create_command("agt-a", spec("c", MIG[1]))  # the free one is still free
    finally:
        await again.stop()


async def test_a_host_cannot_claim_another_host_s_mig_instance_or_a_gpu_uuid(master):
    link = relay_link()
    await connect(master, link, "agt-a", host_gpus())
    impostor = split(gpus(1, prefix="GPU-b")[0], MIG[0], "GPU-h100-1", "MIG-b-own", "MIG-b-own")
    await connect(master, link, "agt-b", [impostor])

    (gpu_b,) = master.registry.gpus_of("agt-b")
    assert [m.uuid for m in gpu_b.info.mig_instances] == ["MIG-b-own"]  # the others are left out
    assert master.allocations.parent_of(MIG[0]) == "GPU-h100-0"  # still agt-a's
    assert master.registry.gpu_of_unit(MIG[0]).agent_id == "agt-a"
    refused = await master.store.events.list(subject="GPU-b-0", kind_prefix="gpu.mig_instance_refused")
    assert sorted(e.data["instance"] for e in refused) == sorted([MIG[0], "GPU-h100-1", "MIG-b-own"])

"""GPU allocations: one holder per GPU, refused before dispatch, freed only by their own container."""

from __future__ import annotations

import pytest

from common.containers import ContainerSpec, DeleteSpec
from common.errors import Conflict
from common.wire import CommandResult
from master.allocations import DUPLICATE_UUID_FLAG, GpuAllocations, Hold, gpu_state_for, offered
from master.config import MasterConfig
from master.master import Master
from master.records import AgentRecord, CommandRecord, GpuRecord
from tests.master.linked import connect, gpus, relay, relay_link


def gpu(
    uuid: str, index: int = 0, agent_id: str = "agt-a", state: str = "available", flags: tuple[str, ...] | None = None
) -> GpuRecord:
    info = gpus(index + 1)[index]
    return GpuRecord(uuid=uuid, agent_id=agent_id, index=index, model="h100", info=info, state=state, flags=flags or ())


HOST_GPUS = [gpu("GPU-0", 0), gpu("GPU-1", 1)]


def test_a_gpu_is_resolved_by_uuid_or_index_and_one_not_on_the_host_is_a_conflict():
    allocations = GpuAllocations()
    assert allocations.resolve("agt-a", HOST_GPUS, ["GPU-1", "0"]) == ["GPU-1", "GPU-0"]
    with pytest.raises(Conflict, match="GPU 'GPU-9' is not on host agt-a"):
        allocations.resolve("agt-a", HOST_GPUS, ["GPU-9"])


def test_a_gpu_two_hosts_report_is_not_offered():
    with pytest.raises(Conflict, match="more than one host"):
        GpuAllocations().resolve("agt-a", [gpu("GPU-0", flags=(DUPLICATE_UUID_FLAG,))], ["GPU-0"])


def test_a_gpu_held_by_one_container_is_refused_to_another_and_nothing_is_half_taken():
    allocations = GpuAllocations()
    allocations.claim("agt-a", "job-1", "cmd-1", ["GPU-0"])
    with pytest.raises(Conflict, match="GPU GPU-0 is held by container 'job-1'"):
        allocations.claim("agt-a", "job-2", "cmd-2", ["GPU-1", "GPU-0"])
    assert allocations.holder("GPU-1") is None  # all or none


def test_deleting_a_container_frees_its_own_gpus_and_no_other():
    allocations = GpuAllocations()
    allocations.claim("agt-a", "job-1", "cmd-1", ["GPU-0"])
    allocations.claim("agt-a", "job-2", "cmd-2", ["GPU-1"])
    snapshot = allocations.holds()
    assert allocations.release("agt-a", "job-1") == ["GPU-0"]
    assert allocations.holder("GPU-0") is None and "GPU-0" in snapshot  # a snapshot does not change under its reader
    assert allocations.holder("GPU-1") == Hold("agt-a", "job-2", "cmd-2", running=False)


def test_a_create_that_failed_gives_its_gpus_back_but_one_that_started_keeps_them():
    allocations = GpuAllocations()
    allocations.claim("agt-a", "job-1", "cmd-1", ["GPU-0"])
    allocations.claim("agt-a", "job-2", "cmd-2", ["GPU-1"])
    assert allocations.confirm("cmd-1") == ["GPU-0"]
    assert allocations.abandon("cmd-1") == []  # started: a late failure report frees nothing
    assert allocations.abandon("cmd-2") == ["GPU-1"]


def test_holds_are_rebuilt_from_running_containers_and_open_creates_and_conflicts_dropped():
    agent = AgentRecord(id="agt-a", provider="p", state="ready", containers={"job-1": ["GPU-0"]})
    create = CommandRecord(
        id="cmd-2", agent_id="agt-a", kind="create_container", spec={"name": "job-2"}, state="sent", created_at=1, deadline=9
    )
    clash = CommandRecord(
        id="cmd-3", agent_id="agt-a", kind="create_container", spec={"name": "job-3"}, state="sent", created_at=2, deadline=9
    )
    allocations = GpuAllocations()
    dropped = allocations.rebuild([agent], [(clash, ["GPU-1"]), (create, ["GPU-1"])], {"GPU-0": "agt-a", "GPU-1": "agt-a"})
    assert allocations.holder("GPU-0") == Hold("agt-a", "job-1", "", running=True)
    assert allocations.holder("GPU-1") == Hold("agt-a", "job-2", "cmd-2", running=False)  # the older create wins
    assert dropped == ["command cmd-3 on GPU GPU-1"]


@pytest.mark.parametrize(
    ("host_state", "drained", "hold", "expected"),
    [
        ("ready", False, None, "available"),
        ("busy", False, None, "available"),
        ("ready", False, Hold("agt-a", "j", "c", running=False), "reserved"),
        ("busy", False, Hold("agt-a", "j", "c", running=True), "busy"),
        ("maintenance", True, None, "offline"),  # a drained host's free GPUs are not offered
        ("maintenance", True, Hold("agt-a", "j", "c", running=True), "busy"),
        ("offline", False, Hold("agt-a", "j", "c", running=True), "offline"),
        ("enrolled", False, None, "offline"),
        ("quarantined", False, None, "faulty"),
    ],
)
def test_a_gpu_is_available_only_when_nothing_holds_it_and_its_host_takes_work(host_state, drained, hold, expected):
    host = AgentRecord(id="agt-a", provider="p", state=host_state, drained=drained)
    assert gpu_state_for(gpu("GPU-0"), hold, host) == expected


@pytest.mark.parametrize(
    ("isolation", "allow_sandboxed", "state", "expected"),
    [
        ("container", False, "available", True),
        ("sandbox", False, "available", False),  # the process runtime: not offered unless the operator allows it
        ("sandbox", True, "available", True),
        ("none", True, "available", False),  # no isolation (no engine, or a runtime that cannot switch users): never
        ("", True, "available", False),  # an agent that never said
        ("container", False, "busy", False),
        ("container", False, "offline", False),
    ],
)
def test_renters_are_offered_only_available_gpus_on_hosts_that_isolate_workloads(isolation, allow_sandboxed, state, expected):
    host = AgentRecord(id="agt-a", provider="p", state="ready", isolation=isolation)
    assert offered(gpu("GPU-0", state=state), host, allow_sandboxed=allow_sandboxed) is expected


# --- through the real Master's ledger ------------------------------------------------------------


async def test_two_creates_naming_one_gpu_the_second_is_refused_before_dispatch(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    first = await master.create_command("agt-a", ContainerSpec(name="job-1", image="none", gpus=["GPU-h100-0"]))
    with pytest.raises(Conflict, match="held by container 'job-1'"):
        await master.create_command("agt-a", ContainerSpec(name="job-2", image="none", gpus=["0"]))
    assert [c.id for c in await master.list_commands(agent_id="agt-a")] == [first.id]  # nothing stored, nothing sent
    assert master.registry.gpus["GPU-h100-0"].state == "reserved"


async def test_a_gpu_not_on_the_host_is_refused(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    with pytest.raises(Conflict, match="not on host agt-a"):
        await master.create_command("agt-a", ContainerSpec(name="j", image="none", gpus=["GPU-elsewhere"]))


def spec(name: str, *gpu_names: str) -> ContainerSpec:
    return ContainerSpec(name=name, image="none", gpus=list(gpu_names))


async def test_deleting_one_container_leaves_the_other_containers_gpu_busy(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    one = await master.create_command("agt-a", spec("job-1", "GPU-h100-0"))
    two = await master.create_command("agt-a", spec("job-2", "GPU-h100-1"))
    for command in (one, two):
        await relay(master, link, "agt-a", CommandResult(id=command.id, ok=True))
    delete = await master.create_command("agt-a", DeleteSpec(name="job-1"))
    await relay(master, link, "agt-a", CommandResult(id=delete.id, ok=True))

    states = {g.uuid: g.state for g in master.gpus("agt-a")}
    assert states == {"GPU-h100-0": "available", "GPU-h100-1": "busy"}
    assert master.allocations.holder("GPU-h100-1") == Hold("agt-a", "job-2", two.id, running=True)
    # The freed GPU can be given again; the held one still cannot.
    await master.create_command("agt-a", spec("job-3", "GPU-h100-0"))
    with pytest.raises(Conflict):
        await master.create_command("agt-a", spec("job-4", "GPU-h100-1"))


async def test_a_failed_create_frees_its_gpu(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    failed = await master.create_command("agt-a", spec("job-1", "GPU-h100-0"))
    await relay(master, link, "agt-a", CommandResult(id=failed.id, ok=False, error="image not found"))
    assert master.registry.gpus["GPU-h100-0"].state == "available"
    await master.create_command("agt-a", spec("job-2", "GPU-h100-0"))


async def test_holds_survive_a_master_restart(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path / "m"), link_port=0)
    first = Master(config)
    await first.start()
    try:
        link = relay_link()
        await connect(first, link, "agt-a")
        running = await first.create_command("agt-a", spec("job-1", "GPU-h100-0"))
        await relay(first, link, "agt-a", CommandResult(id=running.id, ok=True))
        pending = await first.create_command("agt-a", spec("job-2", "1"))
    finally:
        await first.stop()

    again = Master(config)
    await again.start()
    try:
        assert again.allocations.holder("GPU-h100-0") == Hold("agt-a", "job-1", "", running=True)
        assert again.allocations.holder("GPU-h100-1") == Hold("agt-a", "job-2", pending.id, running=False)
        link = relay_link()
        await connect(again, link, "agt-a")
        assert {g.uuid: g.state for g in again.gpus("agt-a")} == {"GPU-h100-0": "busy", "GPU-h100-1": "reserved"}
        with pytest.raises(Conflict):
            await again.create_command("agt-a", spec("job-3", "GPU-h100-0"))
    finally:
        await again.stop()

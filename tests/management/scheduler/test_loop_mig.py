"""MIG through the scheduling loop on a real Master (SQLite in tmp_path, no sockets, as tests/management/scheduler/
test_loop.py): a host reports a simulated A100 split into seven 1g.10gb instances (agent/simulate.py lays the
partition out as NVML would report it; no GPU is needed). A renter asking for a 1g.10gb gets one instance, not the
card; a renter asking for a whole GPU gets nothing there, since a GPU in MIG mode runs work only in its instances."""

from __future__ import annotations

import time

from agent.simulate import SimulatedCollector
from common.wire import AgentEvent, AgentEventKind, Command, CommandResult
from management.workloads.book import WorkloadBook
from management.workloads.runner import SchedulerLoop, SchedulerSettings
from master.link import AccessLink
from master.records import ReplicaSpec, WorkloadSpec
from tests.master.linked import connect, relay, relay_link, to_agent


def spec(name: str, mig_profile: str | None = None) -> WorkloadSpec:
    return WorkloadSpec(
        name=name, image="busybox", command=["sleep", "600"], replica=ReplicaSpec(gpus=1, mig_profile=mig_profile)
    )


def creates_sent(link: AccessLink, agent_id: str) -> list[Command]:
    return [f for f in to_agent(link, agent_id) if isinstance(f, Command) and f.body.kind == "create_container"]


async def test_a_1g_10gb_workload_lands_on_a_mig_instance_and_a_whole_gpu_workload_does_not(master):
    link = relay_link()
    (a100,) = SimulatedCollector("a100:1:mig=1g.10gb*7", host_key="agt-mig").inventory()
    instances = [m.uuid for m in a100.mig_instances]
    await connect(master, link, "agt-mig", [a100], runtime="docker", isolation="container")
    book = WorkloadBook(master.store, master, policy=master.policy)
    loop = SchedulerLoop(master, book, SchedulerSettings(grace_s=5.0, offline_grace_s=5.0))
    await loop.book.load()
    whole = await loop.book.submit("alice", spec("whole"), time.time())
    small = await loop.book.submit("bob", spec("small", "1g.10gb"), time.time())

    await loop.cycle()

    rec = await loop.book.get(small.id)
    assert rec.state == "scheduled"
    ((unit,),) = [a.units for a in rec.assignments]
    assert unit in instances and unit != a100.uuid
    (command,) = creates_sent(link, "agt-mig")
    assert command.body.spec["gpus"] == [unit]  # the container is given the instance's MIG uuid
    assert command.body.spec["workload_id"] == small.id
    assert master.allocations.holder(unit) is not None and master.allocations.holder(a100.uuid) is None
    assert master.registry.gpus[a100.uuid].state == "reserved"  # the card is partly taken

    assert (await loop.book.get(whole.id)).state != "scheduled"  # never the whole card, nor an instance
    assert all(c.body.spec["workload_id"] != whole.id for c in creates_sent(link, "agt-mig"))

    # A second renter's 1g.10gb gets another instance of the same card.
    other = await loop.book.submit("alice", spec("other", "1g.10gb"), time.time())
    await loop.cycle()
    ((second,),) = [a.units for a in (await loop.book.get(other.id)).assignments]
    assert second in instances and second != unit


async def test_a_profile_the_partition_does_not_offer_is_not_placed(master):
    link = relay_link()
    (a100,) = SimulatedCollector("a100:1:mig=3g.40gb*2", host_key="agt-mig").inventory()
    await connect(master, link, "agt-mig", [a100], runtime="docker", isolation="container")
    loop = SchedulerLoop(master, WorkloadBook(master.store, master, policy=master.policy), SchedulerSettings())
    await loop.book.load()
    wl = await loop.book.submit("alice", spec("small", "1g.10gb"), time.time())

    await loop.cycle()

    assert (await loop.book.get(wl.id)).state != "scheduled"
    assert creates_sent(link, "agt-mig") == [] and master.allocations.holds() == {}


async def test_a_fault_on_a_split_gpu_moves_its_instance_workload_to_another_card(master):
    link = relay_link()
    (first_card,) = SimulatedCollector("a100:1:mig=1g.10gb*7", host_key="agt-a").inventory()
    (second_card,) = SimulatedCollector("h100:1:mig=1g.10gb*7", host_key="agt-b").inventory()
    await connect(master, link, "agt-a", [first_card], runtime="docker", isolation="container")
    await connect(master, link, "agt-b", [second_card], runtime="docker", isolation="container")
    loop = SchedulerLoop(master, WorkloadBook(master.store, master, policy=master.policy), SchedulerSettings())
    await loop.book.load()
    wl = await loop.book.submit("alice", spec("small", "1g.10gb"), time.time())
    await loop.cycle()
    rec = await loop.book.get(wl.id)
    (placed,) = rec.assignments
    await relay(master, link, placed.agent_id, CommandResult(id=placed.command_id, ok=True))
    await loop.cycle()
    faulty, other = (first_card, second_card) if placed.agent_id == "agt-a" else (second_card, first_card)

    # The agent reports the Xid against the GPU (NVML's events name the card, not an instance).
    fault = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=faulty.uuid, code=79)
    await relay(master, link, placed.agent_id, fault)
    await loop.cycle()  # requeued
    await loop.cycle()  # placed on an instance of the sound card

    rec = await loop.book.get(wl.id)
    assert rec.state == "scheduled" and rec.attempts == 2
    ((unit,),) = [a.units for a in rec.assignments]
    assert unit in {m.uuid for m in other.mig_instances}

"""GPU faults on a real Master (SQLite): each cause makes a GPU faulty with its reason, a faulty GPU is neither offered
nor given a container, overheating clears with hysteresis, Xid and ECC faults wait for an operator's repair, and the
fault outlives a Master restart."""

from __future__ import annotations

import time

import pytest

from common.containers import ContainerSpec
from common.errors import Conflict
from common.inventory import GpuSample, Inventory
from common.wire import PROTOCOL_VERSIONS, AgentEvent, AgentEventKind, Hello, Telemetry
from master.changes import GpuHealthChanged
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import HOST, connect, events, gpus, relay, relay_link

GPU0 = "GPU-h100-0"


def container_hello() -> Hello:
    inventory = Inventory(host=HOST, gpus=gpus(2), simulated=True, runtime="simulated", isolation="container")
    return Hello(versions=list(PROTOCOL_VERSIONS), agent_version="test", inventory=inventory)


async def online(master: Master, agent_id: str = "agt-a"):
    link = relay_link()
    await connect(master, link, agent_id)
    await relay(master, link, agent_id, container_hello())
    return link


def sample(uuid: str = GPU0, *, temperature: float = 60.0, ecc: int = 0) -> GpuSample:
    return GpuSample(uuid=uuid, ts=time.time(), temperature_c=temperature, ecc_uncorrected=ecc)


async def telemetry(master: Master, link, *samples: GpuSample, agent_id: str = "agt-a") -> None:
    await relay(master, link, agent_id, Telemetry(ts=time.time(), samples=list(samples)))


def xid(code: int, uuid: str = GPU0) -> AgentEvent:
    return AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=uuid, code=code, message="from the driver")


async def test_a_fatal_xid_makes_the_gpu_faulty_with_its_reason_not_offered_and_announced(master):
    link = await online(master)
    changes = master.changes.subscribe()
    gpu = master.registry.gpus[GPU0]
    assert gpu.state == "available" and master.offered(gpu)

    await relay(master, link, "agt-a", xid(13))  # a graphics engine exception: the application's fault, not the card's
    assert gpu.state == "available" and gpu.fault is None

    await relay(master, link, "agt-a", xid(79))
    assert gpu.state == "faulty" and not master.offered(gpu)
    assert gpu.fault is not None and (gpu.fault.kind, gpu.fault.code) == ("xid", 79)
    assert gpu.fault.reason.startswith("Xid 79")
    [transition] = [e for e in await events(master, "gpu.transition", GPU0) if e.data["event"] == "fault"]
    assert transition.data["reason"].startswith("Xid 79")
    assert changes.get_nowait() == GpuHealthChanged(uuid=GPU0, agent_id="agt-a", healthy=False, reason=gpu.fault.reason)
    with pytest.raises(Conflict, match="faulty"):
        await master.create_command("agt-a", ContainerSpec(name="job", image="none", gpus=[GPU0]))


async def test_an_agent_cannot_fault_another_hosts_gpu(master):
    await online(master, "agt-a")
    other = relay_link("relay-b")
    await connect(master, other, "agt-b", gpus(1, prefix="GPU-b"))
    await relay(master, other, "agt-b", xid(79, uuid=GPU0))
    assert master.registry.gpus[GPU0].state == "available"


async def test_uncorrectable_ecc_errors_fault_the_gpu_and_a_repair_accepts_the_count_seen(master):
    link = await online(master)
    await relay(master, link, "agt-a", AgentEvent(kind=AgentEventKind.GPU_ECC, ts=time.time(), gpu_uuid="GPU-h100-1", code=2))
    assert master.registry.gpus["GPU-h100-1"].fault.kind == "ecc"

    await telemetry(master, link, sample(ecc=0))
    assert master.registry.gpus[GPU0].state == "available"
    await telemetry(master, link, sample(ecc=3))
    gpu = master.registry.gpus[GPU0]
    assert gpu.state == "faulty" and gpu.fault.kind == "ecc" and gpu.fault.code == 3

    repaired = await master.repair_gpu(GPU0)
    assert repaired.state == "available" and repaired.fault is None and repaired.ecc_acknowledged == 3
    await telemetry(master, link, sample(ecc=3))  # the same volatile count: nothing new
    assert gpu.state == "available"
    await telemetry(master, link, sample(ecc=4))
    assert gpu.state == "faulty"


async def test_overheating_faults_after_n_hot_samples_and_clears_after_n_cool_ones(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, max_temperature_c=90, overheat_samples=3, cool_samples=2)
    master = Master(config)
    await master.start()
    try:
        link = await online(master)
        changes = master.changes.subscribe()
        gpu = master.registry.gpus[GPU0]
        for temperature in (95, 96, 60, 95, 91):  # a cool sample breaks the streak
            await telemetry(master, link, sample(temperature=temperature))
        assert gpu.state == "available"
        await telemetry(master, link, sample(temperature=90))  # at the limit counts as hot: third in a row
        assert gpu.state == "faulty" and gpu.fault is not None and gpu.fault.kind == "overheat"
        for temperature in (80, 92, 80):  # hot again in between: the cool streak starts over
            await telemetry(master, link, sample(temperature=temperature))
        assert gpu.state == "faulty"
        await telemetry(master, link, sample(temperature=79))
        assert gpu.state == "available" and gpu.fault is None
        went, came = changes.get_nowait(), changes.get_nowait()
        assert isinstance(went, GpuHealthChanged) and isinstance(came, GpuHealthChanged)
        assert [went.healthy, came.healthy] == [False, True]
        with pytest.raises(Conflict, match="not faulty"):
            await master.repair_gpu(GPU0)
    finally:
        await master.stop()


async def test_an_xid_fault_waits_for_the_repair_and_outlives_a_master_restart_and_a_new_hello(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    master = Master(config)
    await master.start()
    link = await online(master)
    await relay(master, link, "agt-a", xid(48))
    await telemetry(master, link, sample(temperature=40))  # a cool card is still faulty: only a repair clears an Xid
    assert master.registry.gpus[GPU0].state == "faulty"
    await master.stop()

    restarted = Master(config)
    await restarted.start()
    try:
        gpu = restarted.registry.gpus[GPU0]
        assert gpu.state == "faulty" and gpu.fault is not None and gpu.fault.kind == "xid" and gpu.fault.code == 48
        link = relay_link()
        await connect(restarted, link, "agt-a")
        await relay(restarted, link, "agt-a", container_hello())
        gpu = restarted.registry.gpus[GPU0]
        assert gpu.state == "faulty" and not restarted.offered(gpu)
        assert restarted.registry.gpus["GPU-h100-1"].state == "available"
        await restarted.repair_gpu(GPU0)
        assert restarted.registry.gpus[GPU0].state == "available" and restarted.offered(restarted.registry.gpus[GPU0])
        [cleared] = await events(restarted, "gpu.fault_cleared", GPU0)
        assert cleared.data["reason"] == "repaired by an operator"
    finally:
        await restarted.stop()

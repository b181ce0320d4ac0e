"""The agent's GPU self-test as the Master takes it (issue 23, acceptance 4): a GPU its hello reports not reaching a
container is flagged, offline, in no offer and refused to any command; a later hello that finds it reachable brings it
back; a self-test entry about a card the hello does not list changes nothing. A real Master on SQLite, frames as a
relay forwards them (tests/master/linked.py)."""

from __future__ import annotations

import pytest

from common.containers import ContainerSpec
from common.errors import Conflict
from common.inventory import GpuReach, Inventory
from common.wire import PROTOCOL_VERSIONS, Hello
from master.allocations import GPU_UNREACHABLE_FLAG
from tests.master.linked import HOST, connect, gpus, relay, relay_link

FIX = "install the NVIDIA Container Toolkit"


def hello_with_reach(count: int, reach: list[GpuReach]) -> Hello:
    inventory = Inventory(host=HOST, gpus=gpus(count), simulated=True, runtime="docker", isolation="container", gpu_reach=reach)
    return Hello(versions=list(PROTOCOL_VERSIONS), agent_version="test", inventory=inventory)


async def test_a_gpu_that_did_not_reach_a_container_is_not_offered_until_a_later_self_test_passes(master):
    link = relay_link()
    await connect(master, link, "agt-a", runtime="docker", isolation="container")
    assert all(master.offered(g) for g in master.gpus("agt-a"))

    reach = [
        GpuReach(uuid="GPU-h100-0", reachable=True, detail="seen in a docker container"),
        GpuReach(uuid="GPU-h100-1", reachable=False, detail="the engine dropped the request for GPUs", fix=FIX),
        GpuReach(uuid="GPU-elsewhere", reachable=False, detail="not this host's", fix=FIX),
    ]
    await relay(master, link, "agt-a", hello_with_reach(2, reach))
    agent = master.agent("agt-a")
    assert agent.state == "ready" and [r.uuid for r in agent.gpu_reach] == ["GPU-h100-0", "GPU-h100-1"]
    fine, broken = master.registry.gpus["GPU-h100-0"], master.registry.gpus["GPU-h100-1"]
    assert master.offered(fine) and fine.state == "available"
    assert not master.offered(broken) and broken.state == "offline" and GPU_UNREACHABLE_FLAG in broken.flags
    with pytest.raises(Conflict, match="self-test"):
        await master.create_command("agt-a", ContainerSpec(name="j", image="none", gpus=["GPU-h100-1"]))

    fixed = [GpuReach(uuid=f"GPU-h100-{i}", reachable=True, detail="seen in a docker container") for i in range(2)]
    await relay(master, link, "agt-a", hello_with_reach(2, fixed))
    broken = master.registry.gpus["GPU-h100-1"]
    assert master.offered(broken) and GPU_UNREACHABLE_FLAG not in broken.flags

"""Drain and undrain on the real Master: a drained host takes no new work and offers no GPU, and comes back."""

from __future__ import annotations

import pytest

from common.containers import ContainerSpec, DeleteSpec
from common.errors import Conflict
from common.wire import CommandResult
from tests.master.linked import connect, relay, relay_link


async def test_a_drained_host_refuses_new_containers_and_offers_no_gpu_but_keeps_what_runs(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    running = await master.create_command("agt-a", ContainerSpec(name="j1", image="none", gpus=["0"]))
    await relay(master, link, "agt-a", CommandResult(id=running.id, ok=True))

    agent = await master.drain("agt-a")
    assert agent.state == "maintenance"
    assert [g.state for g in master.gpus("agt-a")] == ["busy", "offline"]
    with pytest.raises(Conflict, match="agt-a is drained and takes no new containers"):
        await master.create_command("agt-a", ContainerSpec(name="j2", image="none", gpus=["1"]))
    await master.create_command("agt-a", DeleteSpec(name="j1"))  # removing work is still allowed


async def test_undrain_brings_the_host_back_to_ready_and_its_gpus_back_to_the_pool(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    await master.drain("agt-a")
    agent = await master.undrain("agt-a")
    assert (agent.state, agent.drained) == ("ready", False)
    assert [g.state for g in master.gpus("agt-a")] == ["available", "available"]
    await master.create_command("agt-a", ContainerSpec(name="j", image="none", gpus=["0"]))


async def test_undraining_a_host_that_is_not_drained_is_a_conflict(master):
    await connect(master, relay_link(), "agt-a")
    with pytest.raises(Conflict, match="agt-a is ready and not drained"):
        await master.undrain("agt-a")


async def test_a_drained_host_that_reconnects_stays_drained(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    await master.drain("agt-a")
    await connect(master, link, "agt-a")
    assert master.agent("agt-a").state == "maintenance"
    assert [g.state for g in master.gpus("agt-a")] == ["offline", "offline"]

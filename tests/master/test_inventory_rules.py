"""What a host may report about itself, on the real Master: bounded, unique, replaced, and gone when retired."""

from __future__ import annotations

import pytest

from common.errors import Conflict
from common.wire import Error, Welcome
from master.config import MasterConfig
from master.service import Master
from tests.master.linked import connect, events, gpus, hello, relay, relay_link, to_agent


async def test_a_hello_over_the_gpu_bound_is_refused_with_an_error_frame_and_an_event_and_nothing_registered(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(40))  # the wire takes up to 64; the Master's bound is 16
    sent = to_agent(link, "agt-a")
    assert sent == [
        Error(code="inventory_too_large", message="the inventory lists 40 GPUs; this Master takes at most 16 per host")
    ]
    assert master.gpus() == [] and master.agent("agt-a").state == "enrolled"
    [refused] = await events(master, "agent.hello_refused")
    assert refused.subject == "agt-a" and refused.data["code"] == "inventory_too_large"


async def test_the_gpu_bound_is_configurable(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, max_gpus_per_host=2))
    await master.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a", gpus(3))
        assert isinstance(to_agent(link, "agt-a")[0], Error)
        await relay(master, link, "agt-a", hello(gpus(2)))
        assert isinstance(to_agent(link, "agt-a")[1], Welcome) and len(master.gpus()) == 2
    finally:
        await master.stop()


async def test_a_uuid_two_hosts_report_is_flagged_and_offered_by_neither(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(2))
    await connect(master, link, "agt-b", gpus(1))  # names GPU-h100-0, which agt-a reported first
    shared = master.registry.gpus["GPU-h100-0"]
    assert shared.agent_id == "agt-a" and "duplicate_uuid" in shared.flags and shared.state == "offline"
    assert master.registry.gpus["GPU-h100-1"].state == "available"  # agt-a's other GPU is fine
    [copy] = master.gpus("agt-b")  # shown on the second host too, flagged, never offered, never stored over the first
    assert (copy.uuid, copy.state, copy.flags) == ("GPU-h100-0", "offline", ["duplicate_uuid"])
    assert (await master.store.gpus.get("GPU-h100-0")).agent_id == "agt-a"
    with pytest.raises(Conflict, match="more than one host"):
        await master.create_command("agt-b", "create_container", {"name": "j", "image": "none", "gpus": ["GPU-h100-0"]})
    [flagged] = await events(master, "gpu.duplicate_uuid")
    assert flagged.data == {"agent_id": "agt-b", "owner": "agt-a"}

    await relay(master, link, "agt-a", hello(gpus(2)))  # the owner saying hello again does not clear it
    assert "duplicate_uuid" in master.registry.gpus["GPU-h100-0"].flags
    assert master.registry.gpus["GPU-h100-0"].state == "offline"


async def test_a_re_reported_inventory_replaces_the_previous_one(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(4, prefix="GPU-h100"))
    await relay(master, link, "agt-a", hello(gpus(2, prefix="GPU-a10", name="NVIDIA A10")))  # restarted, another --simulate
    assert [g.uuid for g in master.gpus("agt-a")] == ["GPU-a10-0", "GPU-a10-1"]
    assert sorted(master.registry.gpus) == ["GPU-a10-0", "GPU-a10-1"]
    assert len(await events(master, "gpu.withdrawn")) == 4


async def test_gpus_that_left_the_pool_stay_gone_after_a_restart(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    first = Master(config)
    await first.start()
    try:
        link = relay_link()
        await connect(first, link, "agt-a", gpus(2, prefix="GPU-old"))
        await relay(first, link, "agt-a", hello(gpus(1, prefix="GPU-new")))
        await connect(first, link, "agt-b", gpus(1, prefix="GPU-b"))
        await first.revoke("agt-b")
    finally:
        await first.stop()
    again = Master(config)
    await again.start()
    try:
        assert sorted(again.registry.gpus) == ["GPU-new-0"]
    finally:
        await again.stop()


async def test_a_revoked_hosts_gpus_leave_the_pool_and_may_be_reported_by_their_new_host(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(2))
    running = await master.create_command("agt-a", "create_container", {"name": "j", "image": "none", "gpus": ["0"]})
    await master.revoke("agt-a")
    assert master.gpus("agt-a") == [] and master.gpus() == []
    assert master.allocations.holder("GPU-h100-0") is None
    assert running.id  # the command itself is the ledger's; the GPU no longer counts as held

    await connect(master, link, "agt-b", gpus(2))  # the cards moved to another host
    assert [g.state for g in master.gpus("agt-b")] == ["available", "available"]


async def test_a_hello_with_100_gpus_is_answered_with_an_error_and_registers_nothing(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(100))  # over the wire's own bound (64): refused when decoded
    [error] = to_agent(link, "agt-a")
    assert isinstance(error, Error) and error.code == "schema_violation" and "gpus" in error.message
    assert master.gpus() == [] and master.agent("agt-a").state == "enrolled"

"""What a host may report about itself, on the real Master: bounded, unique, replaced, and gone when retired."""

from __future__ import annotations

import pytest

from common.containers import ContainerSpec
from common.errors import Conflict
from common.wire import Error, Welcome
from master.config import MasterConfig
from master.master import Master
from master.registry import ABSENT_KEPT_PER_HOST, Registry
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


async def test_a_uuid_another_host_holds_stays_with_it_and_only_the_claimant_is_flagged(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(2))
    await connect(master, link, "agt-b", gpus(1))  # names GPU-h100-0, which agt-a reported first
    held = master.registry.gpus["GPU-h100-0"]
    assert (held.agent_id, held.state, held.flags) == ("agt-a", "available", ())  # the holder keeps it, offered
    [copy] = master.gpus("agt-b")  # shown on the claimant, flagged, never offered, never stored over the holder's
    assert (copy.uuid, copy.state, copy.flags) == ("GPU-h100-0", "offline", ("duplicate_uuid",))
    stored = await master.store.gpus.get("GPU-h100-0")
    assert (stored.agent_id, stored.flags) == ("agt-a", ())
    assert (master.agent("agt-a").gpus_flagged, master.agent("agt-b").gpus_flagged) == (0, 1)
    with pytest.raises(Conflict, match="another host holds it"):
        await master.create_command("agt-b", ContainerSpec(name="j", image="none", gpus=["GPU-h100-0"]))
    await master.create_command("agt-a", ContainerSpec(name="j", image="none", gpus=["GPU-h100-0"]))
    [flagged] = await events(master, "gpu.duplicate_uuid")
    assert flagged.data == {"agent_id": "agt-b", "owner": "agt-a"}


async def test_a_refused_claim_clears_when_the_claimant_stops_making_it(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(1))
    await connect(master, link, "agt-b", gpus(1))
    await relay(master, link, "agt-b", hello(gpus(1, prefix="GPU-b")))  # its own cards now
    assert [(g.uuid, g.flags) for g in master.gpus("agt-b")] == [("GPU-b-0", ())]
    assert master.agent("agt-b").gpus_flagged == 0 and master.registry.claimants("GPU-h100-0") == []


async def test_the_holders_retirement_hands_the_card_to_the_claimant(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(1))
    await connect(master, link, "agt-b", gpus(1))  # the card moved before agt-a was revoked
    await master.revoke("agt-a")
    [moved] = master.gpus("agt-b")
    assert (moved.uuid, moved.agent_id, moved.state, moved.flags) == ("GPU-h100-0", "agt-b", "available", ())
    assert master.registry.gpus["GPU-h100-0"] is moved and master.agent("agt-b").gpus_flagged == 0
    assert (await master.store.gpus.get("GPU-h100-0")).agent_id == "agt-b"


async def test_a_card_its_holder_leaves_out_of_a_report_stays_its_own_until_it_is_retired(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(2))
    await relay(master, link, "agt-a", hello(gpus(2)[1:]))  # GPU-h100-0 fell off the bus: not reported
    await connect(master, link, "agt-b", gpus(1))  # a claim waiting for that must not take it
    assert [(g.uuid, g.flags) for g in master.gpus("agt-b")] == [("GPU-h100-0", ("duplicate_uuid",))]
    [claim] = await events(master, "gpu.duplicate_uuid")
    assert claim.data == {"agent_id": "agt-b", "owner": "agt-a"}
    await relay(master, link, "agt-a", hello(gpus(2)))  # back after a reset: still agt-a's
    assert [(g.uuid, g.state) for g in master.gpus("agt-a")] == [("GPU-h100-0", "available"), ("GPU-h100-1", "available")]

    await relay(master, link, "agt-a", hello(gpus(2)[1:]))
    await master.revoke("agt-a")  # the operator retires the old host: the card moved, the claimant takes it
    [moved] = master.gpus("agt-b")
    assert (moved.uuid, moved.agent_id, moved.state, moved.flags) == ("GPU-h100-0", "agt-b", "available", ())


async def test_a_card_left_out_of_a_report_stays_its_hosts_across_a_master_restart(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    first = Master(config)
    await first.start()
    try:
        link = relay_link()
        await connect(first, link, "agt-a", gpus(2))
        await relay(first, link, "agt-a", hello(gpus(2)[1:]))
    finally:
        await first.stop()
    again = Master(config)
    await again.start()
    try:
        await connect(again, relay_link(), "agt-b", gpus(1))
        assert [g.flags for g in again.gpus("agt-b")] == [("duplicate_uuid",)]
    finally:
        await again.stop()


def test_a_host_cycling_through_made_up_uuids_keeps_a_bounded_number_of_them():
    registry = Registry(store=None, events=None, policy=None)  # type: ignore[arg-type]  # only the memory is used
    for batch in range(20):
        registry._keep_absent("agt-a", [f"GPU-{batch}-{n}" for n in range(16)])
    assert len(registry._absent_holder) == ABSENT_KEPT_PER_HOST == len(registry._absent_of["agt-a"])
    assert "GPU-19-15" in registry._absent_holder and "GPU-0-0" not in registry._absent_holder


async def test_an_operator_clears_a_refused_claim_and_the_holder_keeps_the_card(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(1))
    await connect(master, link, "agt-b", gpus(1))
    repaired = await master.repair_gpu("GPU-h100-0")  # not faulty, but claimed: the operator's word settles it
    assert (repaired.agent_id, repaired.state) == ("agt-a", "available")
    assert master.gpus("agt-b") == [] and master.agent("agt-b").gpus_flagged == 0
    [cleared] = await events(master, "gpu.claim_cleared")
    assert cleared.data == {"agent_id": "agt-b", "reason": "cleared by an operator's repair"}
    with pytest.raises(Conflict, match="not faulty"):
        await master.repair_gpu("GPU-h100-0")  # nothing left to settle
    await relay(master, link, "agt-b", hello(gpus(1)))  # claims it again: refused and flagged again
    assert [g.flags for g in master.gpus("agt-b")] == [("duplicate_uuid",)]


async def test_a_claimed_card_stays_with_its_holder_across_the_claimant_leaving_and_a_master_restart(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    first = Master(config)
    await first.start()
    try:
        link = relay_link()
        await connect(first, link, "agt-a", gpus(2))
        await connect(first, link, "agt-b", gpus(2))
        await first.revoke("agt-b")
    finally:
        await first.stop()
    again = Master(config)
    await again.start()
    try:
        link = relay_link()
        await connect(again, link, "agt-a", gpus(2))
        assert [(g.agent_id, g.state, g.flags) for g in again.gpus("agt-a")] == [("agt-a", "available", ())] * 2
    finally:
        await again.stop()


async def test_a_holder_flagged_by_an_older_master_is_unflagged_when_loaded(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0)
    first = Master(config)
    await first.start()
    try:
        await connect(first, relay_link(), "agt-a", gpus(1))
        stored = await first.store.gpus.get("GPU-h100-0")
        assert stored is not None
        stored.flags, stored.state = ("duplicate_uuid",), "offline"  # what issue 22's D3 left in a store
        await first.store.gpus.put_many([stored])
    finally:
        await first.stop()
    again = Master(config)
    await again.start()
    try:
        assert again.registry.gpus["GPU-h100-0"].flags == ()
        await connect(again, relay_link(), "agt-a", gpus(1))
        assert again.registry.gpus["GPU-h100-0"].state == "available"
    finally:
        await again.stop()


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
    running = await master.create_command("agt-a", ContainerSpec(name="j", image="none", gpus=["0"]))
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

"""The relay's link to the Master: several frames per message when the Master takes batches, in order, none lost."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from access.upstream import FrameBuffer, Outbound, send_delay
from common.wire import AgentConnected, Error, ErrorCode, Relay, encode
from tests.access.conftest import heartbeat, result
from tests.support.prometheus import sample


def entry(agent: str, kind: str, size: int = 10) -> Outbound:
    return Outbound(agent, kind, agent.encode().ljust(size, b"."))


def test_take_gives_the_oldest_entries_in_order_within_both_limits():
    buffer = FrameBuffer(limit=100)
    for n in range(10):
        buffer.offer(entry(f"a{n}", "command_result", size=100))
    assert [e.agent_id for e in buffer.take(4, 10_000)] == ["a0", "a1", "a2", "a3"]
    buffer.done()
    assert [e.agent_id for e in buffer.take(100, 250)] == ["a4", "a5"]  # a third would pass 250 bytes
    buffer.done()
    assert [e.agent_id for e in buffer.take(100, 10)] == ["a6"]  # the first always goes, whatever its size
    buffer.done()
    assert len(buffer) == 3


def test_what_is_being_sent_is_neither_evicted_nor_withdrawn_and_a_failed_send_gives_it_back():
    dropped: list[str] = []
    buffer = FrameBuffer(limit=2, on_drop=dropped.append)
    buffer.offer(entry("a1", "agent_connected"))
    buffer.offer(entry("a2", "heartbeat"))
    taken = buffer.take(10, 10_000)
    assert [e.agent_id for e in taken] == ["a1", "a2"]
    assert not buffer.cancel_connect("a1")  # on the wire: the Master will hear of the visit
    assert not buffer.offer(entry("a3", "command_result"))  # the heartbeat being sent is not evicted for it
    assert dropped == []
    buffer.send_failed()
    assert buffer.kinds() == [("a1", "agent_connected"), ("a2", "heartbeat")]
    assert [e.agent_id for e in buffer.take(10, 10_000)] == ["a1", "a2"]
    buffer.done()
    assert len(buffer) == 0


def test_the_sender_waits_out_the_batch_window_only_while_no_control_frame_waits():
    assert send_delay(10.0, 9.995, 0.01, control_waiting=False) == pytest.approx(0.005)  # the window's rest
    assert send_delay(10.0, 9.995, 0.01, control_waiting=True) == 0.0  # a command's result, a worker's call: at once
    assert send_delay(10.0, 9.0, 0.01, control_waiting=False) == 0.0  # an idle link: at once


async def test_a_control_frame_queued_during_the_window_ends_the_wait():
    buffer = FrameBuffer(limit=100)
    buffer.offer(entry("a1", "heartbeat"))
    assert not buffer.control_waiting
    waiting = asyncio.create_task(buffer.control_or(3600.0))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done()
    buffer.offer(entry("a2", "worker_call"))
    await waiting  # without the control frame it would wait the hour out
    assert buffer.control_waiting
    assert [e.kind for e in buffer.take(10, 10_000)] == ["worker_call", "heartbeat"]


async def test_frames_of_many_agents_reach_the_master_batched_and_in_order(make_relay, master, pki, open_agent):
    relay = await make_relay(link_batch_window_s=0.2)  # long enough that the frames below pile up behind the first
    agents = [pki.agent() for _ in range(3)]
    sockets = [await open_agent(relay, agent) for agent in agents]
    try:
        for seq in range(20):
            for ws in sockets:
                await ws.send(heartbeat(seq))
        for ws, agent in zip(sockets, agents):
            await ws.send(result(f"cmd-{agent.identity.id}"))
        await master.wait_for(lambda: len(master.relayed()) == 63, "every frame relayed")
    finally:
        for ws in sockets:
            await ws.close()
    for agent in agents:
        frames = [frame for _, frame in master.relayed(agent.identity.id)]
        # each agent's heartbeats in the order it sent them; its result (control) may go ahead of them (lanes)
        assert [f["seq"] for f in frames if f["type"] == "heartbeat"] == list(range(20))
        assert [f["type"] for f in frames].count("command_result") == 1
    # every agent_connected before the agent's first frame
    order = [(type(f).__name__, f.agent_id) for f in master.frames if isinstance(f, (Relay, AgentConnected))]
    for agent in agents:
        assert order.index(("AgentConnected", agent.identity.id)) < order.index(("Relay", agent.identity.id))
    assert max(master.messages) > 1
    assert len(master.messages) < len(master.frames) / 4
    text = relay.metrics.render().decode()
    frames_sent = sample(text, "idlegrid_access_master_link_frames_total")
    assert frames_sent == len(master.frames)
    assert sample(text, "idlegrid_access_master_link_messages_total") == len(master.messages)


async def test_a_master_that_does_not_take_batches_gets_one_frame_per_message(make_relay, master, pki, open_agent):
    master.batches = False
    relay = await make_relay(link_batch_window_s=0.2)
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        for seq in range(10):
            await ws.send(heartbeat(seq))
        await master.wait_for(lambda: len(master.relayed()) == 10, "every frame relayed")
    assert [frame["seq"] for _, frame in master.relayed()] == list(range(10))
    assert set(master.messages) == {1}


async def test_batching_can_be_turned_off(make_relay, master, pki, open_agent):
    relay = await make_relay(link_batch_frames=1)
    async with open_agent(relay, pki.agent()) as ws:
        for seq in range(10):
            await ws.send(heartbeat(seq))
        await master.wait_for(lambda: len(master.relayed()) == 10, "every frame relayed")
    assert set(master.messages) == {1}


async def test_an_idle_link_sends_a_frame_at_once(make_relay, master, pki, open_agent):
    relay = await make_relay(link_batch_window_s=1.0)
    async with open_agent(relay, pki.agent()) as ws:
        await master.wait_for(lambda: master.of_type(AgentConnected), "the agent_connected notice")
        await asyncio.sleep(1.1)  # a window's length since the notice went: the link is idle
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: len(master.relayed()) == 1, "the heartbeat, not held for a window", timeout=0.5)


async def test_the_relay_takes_batches_from_the_master_in_order_a_bad_frame_costing_only_itself(relay, master, pki, open_agent):
    one, two = pki.agent(), pki.agent()
    assert master.hellos[-1].batches  # the hello says so: a Master may then send several frames per message
    async with open_agent(relay, one) as ws1, open_agent(relay, two) as ws2:
        await master.wait_for(lambda: len(master.of_type(AgentConnected)) == 2, "both agents announced")
        pings = [b'{"type":"ping","nonce":"n-%d"}' % n for n in range(4)]
        envelopes = [
            encode(Relay(agent_id=one.identity.id, frame=msgspec.Raw(pings[0]))),
            encode(Relay(agent_id=two.identity.id, frame=msgspec.Raw(pings[1]))),
            b'{"type":"relay","agent_id":7}',  # not a frame: answered with an error, the others still go
            encode(Relay(agent_id=one.identity.id, frame=msgspec.Raw(pings[2]))),
            encode(Relay(agent_id=one.identity.id, frame=msgspec.Raw(pings[3]))),
        ]
        await master.links[-1].send(b"[" + b",".join(envelopes) + b"]", text=True)
        assert [await asyncio.wait_for(ws1.recv(decode=False), 3) for _ in range(3)] == [pings[0], pings[2], pings[3]]
        assert await asyncio.wait_for(ws2.recv(decode=False), 3) == pings[1]
        errors = await master.wait_for(lambda: master.of_type(Error), "the bad frame's error")
        assert errors[0].code == ErrorCode.SCHEMA_VIOLATION.value

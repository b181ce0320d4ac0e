"""The link to the Master: what the relay says on (re)connect, and what it keeps while the Master is away."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from common.wire import AccessStats, AgentConnected, AgentDisconnected
from tests.access.conftest import eventually, heartbeat, result


async def health(relay, pki) -> dict:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{relay.http_url}/healthz", ssl=pki.client_context()) as response:
            assert response.status == 200
            return await response.json()


async def test_the_relay_introduces_itself_with_access_hello(relay, master, pki):
    hello = master.hellos[0]
    assert (hello.relay_id, hello.region, hello.versions) == (pki.relay.identity.id, "test", [1])
    assert hello.public_url == relay.agent_url


async def test_while_the_master_is_down_frames_are_buffered_and_replayed_in_order(relay, master, pki, open_agent):
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(), "the first heartbeat")
        await master.stop()
        await eventually(lambda: not relay.link.is_up, "the relay to notice")
        assert (await health(relay, pki))["status"] == "degraded"

        for _seq, frame in enumerate(
            [
                heartbeat(2),
                result("c-1"),
                json.dumps({"type": "telemetry", "ts": 1.0, "samples": []}),
                heartbeat(3),
                result("c-2"),
                json.dumps({"type": "event", "kind": "runtime_failure", "ts": 1.0, "message": "disk full"}),
                json.dumps({"type": "telemetry", "ts": 2.0, "samples": []}),
                heartbeat(4),
            ]
        ):
            await ws.send(frame)
        await eventually(lambda: len(relay.link.buffer) == 5, "the frames in the buffer")
        assert await health(relay, pki) == {
            "status": "degraded",
            "master_link": "down",
            "agents": 1,
            "buffered": 5,
            "relay_id": pki.relay.identity.id,
            "region": "test",
        }
        text = relay.metrics.render().decode()
        assert f'idlegrid_access_buffered_frames{{relay="{pki.relay.identity.id}"}} 5.0' in text
        assert f'idlegrid_access_frames_dropped_total{{reason="superseded",relay="{pki.relay.identity.id}"}} 3.0' in text

        master.frames.clear()
        await master.start()  # the same port: the Master is back
        await master.wait_for(lambda: len(master.relayed()) == 5, "the buffer replayed")
        assert (await health(relay, pki))["status"] == "ok"

    # The Master forgot this relay's agents when the link dropped: it hears of the agent first again.
    assert isinstance(master.frames[0], AgentConnected) and master.frames[0].agent_id == agent.identity.id
    replayed = [(f["type"], f.get("id") or f.get("seq") or f.get("ts") or f.get("kind")) for _, f in master.relayed()]
    # Results and events in the order sent; only the newest heartbeat and telemetry survive.
    assert replayed == [
        ("command_result", "c-1"),
        ("command_result", "c-2"),
        ("event", 1.0),
        ("telemetry", 2.0),
        ("heartbeat", 4),
    ]


async def test_a_full_buffer_holds_results_back_instead_of_dropping_them(make_relay, master, pki, open_agent):
    relay = await make_relay(buffer_frames=3)
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await master.wait_for(lambda: master.of_type(AgentConnected), "the agent announced")
        await master.stop()
        await eventually(lambda: not relay.link.is_up, "the relay to notice")
        await ws.send(heartbeat(1))
        for n in range(5):
            await ws.send(result(f"c-{n}"))
        # The agent notice, heartbeat evicted for room, three results: then the relay stops reading this agent.
        await eventually(lambda: [k for _, k in relay.link.buffer.kinds()] == ["command_result"] * 3, "a full buffer")
        await asyncio.sleep(0.2)
        assert len(relay.link.buffer) == 3

        master.frames.clear()
        await master.start()
        await master.wait_for(lambda: len(master.relayed()) == 5, "every result")
    assert [f["id"] for _, f in master.relayed()] == [f"c-{n}" for n in range(5)]


async def test_an_agent_that_left_while_the_master_was_down_is_not_announced_again(relay, master, pki, open_agent):
    """It may be on another relay by now: announcing it here would take it from there. Its waiting frames still
    go (the Master ignores frames of agents not on the link) and the agent resends results until acked."""
    gone, staying = pki.agent(), pki.agent()
    async with open_agent(relay, staying) as ws_staying:
        async with open_agent(relay, gone) as ws:
            await master.wait_for(lambda: len(master.of_type(AgentConnected)) == 2, "both agents announced")
            await master.stop()
            await eventually(lambda: not relay.link.is_up, "the relay to notice")
            await ws.send(result("c-9"))
            await ws_staying.send(result("c-1"))
            await eventually(lambda: len(relay.link.buffer) == 2, "the results buffered")
        await eventually(lambda: relay.agents.agent_count == 1, "one agent gone")

        master.frames.clear()
        await master.start()
        await master.wait_for(lambda: master.of_type(AgentDisconnected), "the goodbye")
    announced = [f.agent_id for f in master.of_type(AgentConnected)]
    assert announced == [staying.identity.id]
    assert [(agent_id, f["id"]) for agent_id, f in master.relayed()] == [(gone.identity.id, "c-9"), (staying.identity.id, "c-1")]


async def test_an_agent_that_came_and_went_while_the_master_was_down_leaves_no_trace(relay, master, pki, open_agent):
    await master.stop()
    await eventually(lambda: not relay.link.is_up, "the relay to notice")
    async with open_agent(relay, pki.agent()):
        await eventually(lambda: relay.agents.agent_count == 1, "the agent in")
    await eventually(lambda: relay.agents.agent_count == 0, "the agent gone")
    assert len(relay.link.buffer) == 0
    master.frames.clear()
    await master.start()
    await relay.link.wait_up(3)
    await asyncio.sleep(0.1)
    assert not [f for f in master.frames if not isinstance(f, AccessStats)]


async def test_the_relay_reports_its_stats_to_the_master(make_relay, master, pki, open_agent):
    relay = await make_relay(stats_interval_s=0.1)
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
        # A report may be taken while the heartbeat still waits in the buffer (buffered 1): the one after its flush says 0.
        stats = await master.wait_for(
            lambda: [s for s in master.of_type(AccessStats) if s.frames_in == 1 and s.buffered == 0], "stats after the flush"
        )
    assert stats[0].agents == 1
    assert all(s.buffered <= 1 and s.agents <= 1 for s in master.of_type(AccessStats))  # never more than was sent


async def test_stopping_the_relay_flushes_what_is_buffered(make_relay, master, pki, open_agent):
    relay = await make_relay()
    async with open_agent(relay, pki.agent()) as ws:
        for n in range(50):
            await ws.send(result(f"c-{n}"))
        await eventually(lambda: relay.metrics.frames_in == 50, "all frames accepted")
    await relay.stop()
    assert [f["id"] for _, f in master.relayed()] == [f"c-{n}" for n in range(50)]
    assert isinstance(master.frames[-1], AgentDisconnected)


async def test_a_relay_stops_promptly_while_agents_are_held_back_by_a_full_buffer(make_relay, master, pki, open_agent):
    relay = await make_relay(buffer_frames=1)
    async with open_agent(relay, pki.agent()) as ws:
        await master.stop()
        await eventually(lambda: not relay.link.is_up, "the relay to notice")
        for n in range(3):
            await ws.send(result(f"c-{n}"))
        await eventually(lambda: len(relay.link.buffer) == 1, "a full buffer")
        await asyncio.wait_for(relay.stop(), 5)
        await asyncio.wait_for(ws.wait_closed(), 1)
    assert ws.close_code == 1001


async def test_the_hello_names_the_https_url_renters_reach_tunnels_at(make_relay, master):
    relay = await make_relay()
    assert master.hellos[-1].http_url == f"https://127.0.0.1:{relay.http.port}"
    await make_relay(http_public_url="https://relay-1.example.net:443")
    assert master.hellos[-1].http_url == "https://relay-1.example.net:443"

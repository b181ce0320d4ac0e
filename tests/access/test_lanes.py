"""Issue 29 at the relay: control ahead of telemetry, telemetry bounded in bytes (latest wins, loss counted), the
Master's report pace passed on to agents, and new sessions admitted at the pace the Master advertises."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.exceptions import InvalidStatus

from access.upstream import DISCONNECTED, FrameBuffer, Outbound
from common.wire import AccessStats, DirectoryNews, RelayEntry, ReportPace
from tests.access.conftest import eventually, heartbeat, next_json, result


def entry(agent: str, kind: str, size: int = 10, tag: str = "") -> Outbound:
    return Outbound(agent, kind, f"{agent}:{kind}:{tag}".encode().ljust(size, b"."))


def test_a_result_goes_ahead_of_heartbeats_queued_before_it():
    buffer = FrameBuffer(limit=100)
    buffer.coalesce = False
    for tag in "123":
        buffer.offer(entry("a1", "heartbeat", tag=tag))
    buffer.offer(entry("a2", "command_result"))
    buffer.offer(entry("a3", "hello"))
    assert buffer.kinds()[:2] == [("a2", "command_result"), ("a3", "hello")]
    taken = buffer.take(1, 1_000_000)
    assert [(e.agent_id, e.kind) for e in taken] == [("a2", "command_result")]


def test_a_result_goes_ahead_of_a_storms_hellos_queued_before_it():
    buffer = FrameBuffer(limit=100)
    buffer.coalesce = False
    for n in range(5):
        buffer.offer(entry(f"b{n}", "agent_connected"))
        buffer.offer(entry(f"b{n}", "hello", size=4000))
    buffer.offer(entry("a1", "command_result"))
    kinds = buffer.kinds()
    assert kinds.index(("a1", "command_result")) < kinds.index(("b0", "hello"))  # results pass the hellos ...
    assert kinds.index(("b4", "agent_connected")) < kinds.index(("b0", "hello"))  # ... as every notice does
    taken = buffer.take(6, 1_000_000)
    assert [e.kind for e in taken] == ["agent_connected"] * 5 + ["command_result"]


def test_past_the_coalescing_bound_only_each_agents_latest_heartbeat_waits():
    dropped: list[str] = []
    buffer = FrameBuffer(limit=1000, on_drop=dropped.append, telemetry_bytes=10_000, coalesce_bytes=30)
    buffer.coalesce = False  # the link is up: below the bound every heartbeat waits its turn
    for tag in "123":
        buffer.offer(entry("a1", "heartbeat", tag=tag))  # 30 bytes in all: the bound is reached with the third
    assert len(buffer) == 3
    buffer.offer(entry("a1", "heartbeat", tag="4"))
    assert len(buffer) == 3
    assert dropped == ["superseded"]
    assert buffer.telemetry_shed == 1


def test_telemetry_never_holds_more_than_its_byte_bound_and_every_eviction_is_counted():
    buffer = FrameBuffer(limit=1000, telemetry_bytes=100, coalesce_bytes=100)
    buffer.coalesce = False
    for n in range(25):
        buffer.offer(Outbound(f"a{n}", "telemetry", b"x" * 10))
        assert buffer.telemetry_size <= 100
    assert len(buffer) == 10
    assert buffer.telemetry_shed == 15
    assert buffer.offer(entry("a1", "command_result", size=500))  # control is bounded in frames, not by telemetry's bytes


def test_an_agent_that_leaves_takes_its_waiting_telemetry_with_it():
    dropped: list[str] = []
    buffer = FrameBuffer(limit=100, on_drop=dropped.append)
    buffer.offer(entry("a1", "heartbeat"))
    buffer.offer(entry("a1", "telemetry"))
    buffer.offer(entry("a2", "heartbeat"))
    buffer.forget_telemetry("a1")
    buffer.offer(entry("a1", DISCONNECTED), force=True)
    assert buffer.kinds() == [("a1", DISCONNECTED), ("a2", "heartbeat")]
    assert dropped == ["forgotten", "forgotten"]  # counted ...
    assert buffer.telemetry_shed == 0  # ... but not as shed: a departure is no overload to pace the fleet down for


async def welcome(relay, agent, ws) -> None:
    """The Master's welcome to ``agent`` through ``relay``, received on its connection ``ws``."""
    frame = {"type": "welcome", "version": 1, "agent_id": agent.identity.id, "heartbeat_s": 5.0, "telemetry_s": 10.0}
    assert await relay.agents.deliver(agent.identity.id, json.dumps(frame, separators=(",", ":")).encode())
    assert (await next_json(ws))["type"] == "welcome"


async def test_the_relay_tells_the_master_what_telemetry_it_shed(make_relay, master, pki, open_agent):
    relay = await make_relay(stats_interval_s=0.1)
    relay.link.buffer.telemetry_shed = 7  # as if it had let seven go
    await master.wait_for(lambda: [s for s in master.of_type(AccessStats) if s.telemetry_shed == 7], "stats with the shed")


async def test_the_masters_report_pace_reaches_each_agent_with_its_next_frame_and_each_agent_welcomed_later(
    make_relay, master, pki, open_agent
):
    relay = await make_relay()
    first = pki.agent()
    async with open_agent(relay, first) as ws:
        await master.wait_for(lambda: relay.agents.sessions, "the agent's session")
        await welcome(relay, first, ws)
        await master.send(ReportPace(heartbeat_s=7.5, telemetry_s=40.0, factor=4.0))
        await eventually(lambda: relay.link.pace is not None and relay.link.pace.factor == 4.0, "the pace at the relay")
        await ws.send(heartbeat(1))  # told with its next frame, not all agents at once
        told = await next_json(ws)
        assert told == {"type": "config", "heartbeat_s": 7.5, "telemetry_s": 40.0}
        await ws.send(heartbeat(2))  # told once
        await master.wait_for(lambda: [f for _, f in master.relayed(first.identity.id) if f.get("seq") == 2], "its heartbeat")
        with pytest.raises(TimeoutError):
            await next_json(ws, timeout=0.3)  # nothing more was sent it
        assert "idlegrid_access_report_pace_factor" in relay.metrics.render().decode()
    later = pki.agent()
    async with open_agent(relay, later) as ws:
        await eventually(lambda: later.identity.id in relay.agents.sessions, "the later agent's session")
        await welcome(relay, later, ws)
        assert await next_json(ws) == {"type": "config", "heartbeat_s": 7.5, "telemetry_s": 40.0}
        await master.send(ReportPace(heartbeat_s=5.0, telemetry_s=10.0, factor=1.0))
        await eventually(lambda: relay.link.pace is not None and relay.link.pace.factor == 1.0, "the normal pace at the relay")
        await ws.send(heartbeat(1))
        assert await next_json(ws) == {"type": "config", "heartbeat_s": 5.0, "telemetry_s": 10.0}


async def test_the_masters_directory_news_reaches_each_agent_with_its_next_frame_once(make_relay, master, pki, open_agent):
    """One ``directory_news`` frame on the link, not one per agent: each agent here is told with its next frame; an
    agent welcomed after the news is not told again (its welcome carries the directory)."""
    relay = await make_relay()
    await master.wait_for(lambda: master.hellos, "the relay's hello")
    assert master.hellos[-1].directory_news  # the Master knows it may send the news once
    relays = [RelayEntry(relay_id="relay-b", region="us", url="wss://b:1")]
    told = {"type": "relay_directory", "relays": [{"relay_id": "relay-b", "region": "us", "url": "wss://b:1"}]}
    first = pki.agent()
    async with open_agent(relay, first) as ws:
        await master.wait_for(lambda: relay.agents.sessions, "the agent's session")
        await welcome(relay, first, ws)
        await master.send(DirectoryNews(relays=relays))
        await eventually(lambda: relay.agents._directory_frame is not None, "the news at the relay")
        with pytest.raises(TimeoutError):
            await next_json(ws, timeout=0.3)  # not all at once: with the agent's next frame
        await ws.send(heartbeat(1))
        assert await next_json(ws) == told
        await ws.send(heartbeat(2))  # told once
        await master.wait_for(lambda: [f for _, f in master.relayed(first.identity.id) if f.get("seq") == 2], "its heartbeat")
        with pytest.raises(TimeoutError):
            await next_json(ws, timeout=0.3)
    later = pki.agent()
    async with open_agent(relay, later) as ws:
        await eventually(lambda: later.identity.id in relay.agents.sessions, "the later agent's session")
        await welcome(relay, later, ws)
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: [f for _, f in master.relayed(later.identity.id) if f.get("seq") == 1], "its heartbeat")
        with pytest.raises(TimeoutError):
            await next_json(ws, timeout=0.3)  # its welcome had the directory


async def test_new_sessions_wait_for_the_masters_admission_while_agents_already_in_carry_on(make_relay, master, pki, open_agent):
    relay = await make_relay()
    inside = pki.agent()
    async with open_agent(relay, inside) as ws:
        await master.wait_for(lambda: relay.agents.sessions, "the agent already in")
        await master.send(ReportPace(heartbeat_s=5.0, telemetry_s=10.0, admit_per_s=0.001, admit_burst=1))
        await eventually(lambda: relay.link.pace is not None, "the pace at the relay")
        async with open_agent(relay, pki.agent()):
            pass  # the one session the bucket holds
        with pytest.raises(InvalidStatus) as refused:
            async with open_agent(relay, pki.agent()):
                pass
        assert refused.value.response.status_code == 503
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        assert 'reason="admission"' in relay.metrics.render().decode()
        # the agent already in is neither refused nor held up
        await ws.send(result("cmd-1"))
        await ws.send(heartbeat(1))
        await master.wait_for(
            lambda: [f for _, f in master.relayed(inside.identity.id) if f["type"] == "command_result"], "its result"
        )


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("result"), st.sampled_from("abcd"), st.integers(1, 40)),
        st.tuples(st.just("heartbeat"), st.sampled_from("abcd"), st.integers(1, 40)),
        st.tuples(st.just("send"), st.integers(1, 5), st.booleans()),
        st.tuples(st.just("coalesce"), st.booleans(), st.none()),
    ),
    max_size=150,
)


@settings(max_examples=200, deadline=None)
@given(_ops)
def test_the_relay_buffer_keeps_its_lanes_bounds_and_order_under_any_sequence(ops):
    buffer = FrameBuffer(limit=10_000, telemetry_bytes=120, coalesce_bytes=60)
    buffer.coalesce = False
    serial, results_in, sent = 0, [], []
    for op, a, b in ops:
        serial += 1
        if op == "result":
            data = f"{a}:{serial}:".encode().ljust(b, b".")
            assert buffer.offer(Outbound(a, "command_result", data))
            results_in.append(data)
        elif op == "heartbeat":
            buffer.offer(Outbound(a, "heartbeat", f"{a}:{serial}:".encode().ljust(b, b".")))
        elif op == "coalesce":
            buffer.coalesce = a
        else:
            taken = buffer.take(a, 1_000_000)
            kinds = [e.kind for e in taken]
            assert kinds == sorted(kinds, key=lambda k: k == "heartbeat")  # control before telemetry in a batch
            if b:
                sent.extend(taken)
                buffer.done()
            else:
                buffer.send_failed()
        waiting = [e for e in buffer.entries() if e.kind == "heartbeat"]
        assert buffer.telemetry_size == sum(len(e.data) for e in waiting) <= 120
    while taken := buffer.take(100, 1_000_000):
        sent.extend(taken)
        buffer.done()
    assert [e.data for e in sent if e.kind == "command_result"] == results_in  # every result, once, in order
    for agent in "abcd":
        serials = [int(e.data.split(b":")[1]) for e in sent if e.kind == "heartbeat" and e.agent_id == agent]
        assert serials == sorted(serials)  # an agent's heartbeats in the order it sent them


async def test_frames_for_an_agent_that_keeps_up_are_delivered_without_a_turn_of_the_event_loop_each(
    make_relay, master, pki, open_agent
):
    """The Master link's reader delivers frame after frame: each must not cost a turn of the loop, which in a
    reconnect storm (thousands of TLS handshakes taking a step per turn) lasts 100-200 ms."""
    relay = await make_relay()
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await master.wait_for(lambda: relay.agents.sessions, "the agent's session")
        turned = asyncio.Event()
        asyncio.get_running_loop().call_soon(turned.set)  # runs at the loop's next turn, not before
        for n in range(20):
            assert await relay.agents.deliver(agent.identity.id, json.dumps({"type": "ping", "nonce": str(n)}).encode())
        assert not turned.is_set()
        assert [(await next_json(ws))["nonce"] for _ in range(20)] == [str(n) for n in range(20)]  # all of them, in order

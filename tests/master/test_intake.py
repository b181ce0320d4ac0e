"""Issue 29 at the Master: a relay link's frames are read at once and handled control first (master/intake.py);
telemetry past its bound is coalesced and counted; agents are told to report less often while telemetry is shed
and back to normal once it is not (master/pacing.py); each relay is told its share of admission."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from common.lanes import Lane, LaneBounds
from common.pki import server_tls_context
from common.wire import (
    PROTOCOL_VERSIONS,
    AccessHello,
    AccessWelcome,
    AgentConnected,
    AgentDisconnected,
    AgentReports,
    LinkFrame,
    Relay,
    ReportPace,
    decode_link_frame,
    encode,
)
from master.intake import lane_of
from master.link import AccessLink, RelayHub
from master.pacing import PaceSettings, Pressure, ReportPacer
from tests.access.conftest import TestPki, eventually


def relayed(agent: str, frame: dict[str, Any]) -> bytes:
    return b'{"type":"relay","agent_id":"%s","frame":%s}' % (agent.encode(), json.dumps(frame, separators=(",", ":")).encode())


def heartbeat(agent: str, seq: int) -> bytes:
    return relayed(agent, {"type": "heartbeat", "seq": seq, "ts": float(seq)})


def batch(*frames: bytes) -> bytes:
    return b"[" + b",".join(frames) + b"]"


# --- pure parts --------------------------------------------------------------------------------------


def test_frames_are_sorted_into_lanes_by_what_they_carry():
    def lane(data: bytes) -> Lane:
        return lane_of(decode_link_frame(data))[0]

    assert lane(heartbeat("a1", 1)) is Lane.TELEMETRY
    assert lane(relayed("a1", {"type": "telemetry", "ts": 1.0, "samples": []})) is Lane.TELEMETRY
    assert lane(relayed("a1", {"type": "hello", "versions": [1]})) is Lane.ADMISSION
    assert lane(relayed("a1", {"type": "command_result", "id": "c1", "ok": True})) is Lane.CONTROL
    assert lane(encode(AgentConnected(agent_id="a1", serial="s", cert_not_after=1.0))) is Lane.CONTROL
    # an agent hiding its type further in only gets an earlier turn, never a telemetry slot it could coalesce away
    assert lane(relayed("a1", {"seq": 1, "type": "heartbeat", "ts": 1.0})) is Lane.CONTROL
    assert lane_of(decode_link_frame(heartbeat("a1", 1)))[1] == ("a1", "heartbeat")


def test_the_pacer_slows_reports_down_under_pressure_and_back_only_after_a_calm_spell():
    pacer = ReportPacer(PaceSettings(heartbeat_s=5.0, telemetry_s=10.0, max_telemetry_factor=8.0, calm_checks=3))
    calm, shed = Pressure(shed=0, backlogged=False), Pressure(shed=5, backlogged=False)
    assert pacer.check(calm) is None
    assert pacer.check(shed) is not None and pacer.factor == 2.0
    backlogged = Pressure(shed=0, backlogged=True)
    assert pacer.check(backlogged) is None  # one check's backlog is a moment's stall, drained by the Master itself
    assert pacer.check(backlogged) is not None and pacer.factor == 4.0  # two in a row: the Master does not keep up
    for _ in range(3):
        pacer.check(shed)
    assert pacer.factor == 8.0  # never past the maximum
    assert pacer.pace.telemetry_s == 80.0
    assert pacer.pace.heartbeat_s == 7.5  # heartbeats slow down at most 1.5x: silence is judged on the configured interval
    assert pacer.check(calm) is None and pacer.check(calm) is None
    eased = pacer.check(calm)
    assert eased is not None and eased.factor == 6.0  # back up slowly: x0.75 per calm spell
    for _ in range(3 * 7):
        pacer.check(calm)
    assert pacer.factor == 1.0 and pacer.pace.telemetry_s == 10.0
    for _ in range(10):  # a backlog at every other check is never pressure
        assert pacer.check(backlogged) is None and pacer.check(calm) is None
    assert pacer.factor == 1.0


def test_with_clear_headroom_the_pace_comes_back_at_every_calm_check_not_every_calm_spell():
    pacer = ReportPacer(PaceSettings(heartbeat_s=5.0, telemetry_s=10.0, max_telemetry_factor=8.0, calm_checks=5))
    for _ in range(3):
        pacer.check(Pressure(shed=10, backlogged=False, busy=1.0))
    assert pacer.factor == 8.0  # a ramp's hellos kept the handlers busy and telemetry was shed
    busy = Pressure(shed=0, backlogged=False, busy=0.7)
    assert [pacer.check(busy) for _ in range(4)] == [None] * 4  # calm but busy: back only after a calm spell
    assert pacer.check(busy) is not None and pacer.factor == 6.0
    idle = Pressure(shed=0, backlogged=False, busy=0.2)
    factors = []
    while pacer.factor > 1.0:
        assert pacer.check(idle) is not None  # headroom: a step back at every check
        factors.append(pacer.factor)
    assert factors == [4.5, 3.375, 2.531, 1.898, 1.423, 1.067, 1.0]
    # headroom but a backlog past the coalescing bound: no quick step (the backlog is the Master not keeping up)
    pacer.check(Pressure(shed=1, backlogged=False, busy=0.2))
    assert pacer.factor == 2.0
    assert pacer.check(Pressure(shed=0, backlogged=True, busy=0.2)) is None and pacer.factor == 2.0


# --- a real hub, a relay's link over TLS on 127.0.0.1 ----------------------------------------------


class Recorder:
    """The Master's side of the hub in these tests: records each frame; the first one it holds until released."""

    def __init__(self) -> None:
        self.frames: list[LinkFrame | AgentReports] = []
        self.gate = asyncio.Event()
        self.closed = 0
        self.held_kinds: set[str] = set()  # agent frames of these types are held until released too

    async def on_frame(self, link: AccessLink, frame: LinkFrame | AgentReports) -> None:
        self.frames.append(frame)
        held = isinstance(frame, Relay) and json.loads(bytes(frame.frame))["type"] in self.held_kinds
        if len(self.frames) == 1 or held:
            await self.gate.wait()  # a slow Master: everything after this frame waits to be handled

    async def on_close(self, link: AccessLink) -> None:
        self.closed += 1

    def agents_frames(self) -> list[tuple[str, str]]:
        return [(f.agent_id, json.loads(bytes(f.frame))["type"]) for f in self.frames if isinstance(f, Relay)]


@pytest.fixture
async def hub_and_link(tmp_path: Path) -> AsyncIterator[tuple[RelayHub, Recorder, ClientConnection, ReportPace]]:
    pki = TestPki(tmp_path)
    recorder = Recorder()
    hub = RelayHub(
        server_tls_context(pki.master.cert, pki.master.key, pki.ca_file, require_client_cert=True),
        recorder.on_frame,
        recorder.on_close,
        lambda: [],
        lanes=LaneBounds(control_bytes=64 * 1024, telemetry_bytes=2048, coalesce_bytes=512),
        pace=PaceSettings(check_s=0.05, calm_checks=2, admit_agents_per_s=100.0, admit_burst=50),
    )
    port = await hub.start("127.0.0.1", 0)
    relay = await connect(f"wss://127.0.0.1:{port}/link", ssl=pki.client_context(pki.relay))
    await relay.send(encode(AccessHello(versions=list(PROTOCOL_VERSIONS), relay_id=pki.relay.identity.id, region="t")))
    assert isinstance(decode_link_frame(await relay.recv()), AccessWelcome)
    pace = decode_link_frame(await relay.recv())
    assert isinstance(pace, ReportPace)
    try:
        yield hub, recorder, relay, pace
    finally:
        recorder.gate.set()
        await relay.close()
        await hub.stop()


async def test_a_result_is_handled_before_heartbeats_that_came_ahead_of_it(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(heartbeat("a0", 0))  # held by the slow handler
    await eventually(lambda: recorder.frames, "the first frame handled")
    await relay.send(batch(*(heartbeat(f"a{n}", 1) for n in range(1, 4))))
    await relay.send(relayed("a9", {"type": "command_result", "id": "c1", "ok": True}))
    await eventually(lambda: hub.intake.frames >= 5, "every frame read while the handler is held")
    recorder.gate.set()
    await eventually(lambda: len(recorder.frames) == 5, "every frame handled")
    assert recorder.agents_frames()[:2] == [("a0", "heartbeat"), ("a9", "command_result")]


async def test_past_its_bound_the_intake_keeps_each_agents_latest_heartbeat_and_counts_the_rest(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(heartbeat("a0", 0))
    await eventually(lambda: recorder.frames, "the first frame handled")
    for seq in range(1, 41):
        await relay.send(batch(heartbeat("a1", seq), heartbeat("a2", seq)))
    await eventually(lambda: hub.intake.frames >= 81, "every frame read")
    link = next(iter(hub.links.values()))
    assert link.intake is not None and link.intake.queue.bytes(Lane.TELEMETRY) <= 2048
    recorder.gate.set()
    await eventually(lambda: hub.intake.shed > 0 and link.intake.queue.telemetry_waiting == 0, "the backlog handled")
    heartbeats = [json.loads(bytes(f.frame))["seq"] for f in recorder.frames[1:] if isinstance(f, Relay) and f.agent_id == "a1"]
    assert heartbeats == sorted(heartbeats) and heartbeats[-1] == 40  # in order, the newest kept
    assert len(recorder.frames) - 1 + hub.intake.shed == 80  # nothing lost without being counted
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    hub.register_metrics(registry)
    text = generate_latest(registry).decode()
    assert 'idlegrid_master_telemetry_shed_total{reason="replaced"}' in text


async def test_shedding_telemetry_tells_relays_to_have_agents_report_less_often_then_normally_again(hub_and_link):
    hub, recorder, relay, first = hub_and_link
    assert first.factor == 1.0 and (first.admit_per_s, first.admit_burst) == (100.0, 50)  # the one relay's share: all
    recorder.gate.set()
    hub.intake.replaced += 3  # as if three heartbeats had been coalesced away
    slower = decode_link_frame(await asyncio.wait_for(relay.recv(), 5))
    assert isinstance(slower, ReportPace) and slower.factor == 2.0 and slower.telemetry_s == 20.0
    factors: list[float] = []
    while not factors or factors[-1] > 1.0:  # back step by step once calm
        again = decode_link_frame(await asyncio.wait_for(relay.recv(), 5))
        assert isinstance(again, ReportPace)
        factors.append(again.factor)
    assert factors == [1.5, 1.125, 1.0] and isinstance(again, ReportPace) and again.telemetry_s == 10.0


async def test_an_agent_is_heard_when_its_frame_is_read_not_when_a_slow_master_gets_to_it(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(heartbeat("a0", 0))  # held by the slow handler
    await eventually(lambda: recorder.frames, "the first frame handled")
    before = time.time()
    await relay.send(batch(*(heartbeat(f"a{n}", 1) for n in range(1, 4))))
    await eventually(lambda: hub.intake.frames >= 4, "every frame read while the handler is held")
    assert len(recorder.frames) == 1  # none of them handled yet ...
    assert all(hub.heard[f"a{n}"] >= before for n in range(1, 4))  # ... and every agent heard at once
    await relay.send(encode(AgentDisconnected(agent_id="a2", reason="gone")))
    await eventually(lambda: "a2" not in hub.heard, "a departed agent no longer heard")
    await asyncio.sleep(0.2)
    recorder.gate.set()
    await eventually(lambda: len(recorder.frames) == 4, "every frame handled (a2's heartbeat went with it)")
    assert hub.intake.busy_s >= 0.2  # the time the handler spent on a frame counts as busy (the pacer's headroom)


async def test_a_reader_waiting_for_room_says_so_for_the_liveness_sweep(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(relayed("a0", {"type": "command_result", "id": "c", "ok": True}))  # held by the slow handler
    await eventually(lambda: recorder.frames, "the first frame handled")
    padding = "x" * 4000
    for n in range(40):  # 160 KB of results: past the control lane's 64 KiB, so the reader waits
        await relay.send(relayed(f"a{n}", {"type": "command_result", "id": f"c{n}", "ok": True, "error": padding}))
    link = next(iter(hub.links.values()))
    assert link.intake is not None
    await eventually(lambda: link.intake is not None and link.intake.stalled_since is not None, "the reader waiting")
    assert hub.intake.waits > 0 and link.intake.stalled_within(time.time(), 0.0)
    assert hub.heard_within(time.time(), 15.0) is not hub.heard  # its agents count as heard while it waits
    recorder.gate.set()
    await eventually(lambda: len(recorder.frames) == 41, "every result handled")
    assert link.intake.stalled_since is None and link.intake.stalled_until > 0
    assert not link.intake.stalled_within(time.time() + 60, 15.0)  # a wait long past says nothing any more


async def test_an_agent_that_leaves_takes_its_waiting_telemetry_and_control_is_handled_before_the_links_close(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(heartbeat("a0", 0))
    await eventually(lambda: recorder.frames, "the first frame handled")
    await relay.send(heartbeat("a1", 1))
    await relay.send(encode(AgentDisconnected(agent_id="a1", reason="gone")))
    await relay.send(relayed("a2", {"type": "command_result", "id": "c2", "ok": True}))
    await eventually(lambda: hub.intake.frames >= 4, "every frame read")
    await relay.close()
    recorder.gate.set()
    await eventually(lambda: recorder.closed == 1, "the link's close handled")
    kinds = [type(f).__name__ for f in recorder.frames]
    assert kinds == ["Relay", "AgentDisconnected", "Relay"]  # a1's heartbeat went with it, counted
    assert recorder.agents_frames()[-1] == ("a2", "command_result")
    assert hub.intake.forgotten == 1


def hello(agent: str) -> bytes:
    return relayed(agent, {"type": "hello", "agent_id": agent})


async def test_a_result_is_handled_while_a_hello_is_but_never_while_its_own_agents_hello_is(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(hello("a1"))  # held by the slow handler, as a hello is by its store writes in a storm
    await eventually(lambda: recorder.frames, "the hello being handled")
    await relay.send(relayed("a2", {"type": "command_result", "id": "c2", "ok": True}))
    await eventually(lambda: len(recorder.frames) == 2, "another agent's result handled while the hello is")
    await relay.send(relayed("a1", {"type": "command_result", "id": "c1", "ok": True}))
    await relay.send(heartbeat("a3", 1))
    await relay.send(heartbeat("a1", 2))
    await eventually(lambda: hub.intake.frames >= 5, "every frame read")
    await asyncio.sleep(0.2)
    # a1's result and heartbeat wait for its hello; another agent's heartbeat does not (the hello is handled aside)
    assert recorder.agents_frames() == [("a1", "hello"), ("a2", "command_result"), ("a3", "heartbeat")]
    recorder.gate.set()
    await eventually(lambda: len(recorder.frames) == 5, "every frame handled")
    handled = recorder.agents_frames()
    assert handled[3:] == [("a1", "command_result"), ("a1", "heartbeat")]
    assert handled.index(("a1", "command_result")) < handled.index(("a1", "heartbeat"))  # control first, as before


async def test_hellos_of_different_agents_are_handled_at_once_and_an_agents_own_frames_wait_for_its_hello(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    recorder.held_kinds = {"hello"}
    for n in range(3):
        await relay.send(hello(f"h{n}"))  # each held by the slow handler, as by its store writes
    await eventually(lambda: len(recorder.frames) == 3, "three hellos being handled at once")
    await relay.send(heartbeat("h0", 1))
    await relay.send(heartbeat("x", 2))
    await eventually(lambda: hub.intake.frames >= 5, "every frame read")
    await asyncio.sleep(0.2)
    assert recorder.agents_frames() == [("h0", "hello"), ("h1", "hello"), ("h2", "hello")]  # h0's heartbeat waits
    recorder.gate.set()
    await eventually(lambda: len(recorder.frames) == 5, "every frame handled")
    assert sorted(recorder.agents_frames()[3:]) == [("h0", "heartbeat"), ("x", "heartbeat")]


async def test_an_agents_hello_waits_for_its_control_read_before_it(hub_and_link):
    hub, recorder, relay, _ = hub_and_link
    await relay.send(relayed("b", {"type": "command_result", "id": "cb", "ok": True}))  # held: control is slow
    await eventually(lambda: recorder.frames, "the first result being handled")
    await relay.send(batch(relayed("a", {"type": "command_result", "id": "ca", "ok": True}), hello("a")))
    await eventually(lambda: hub.intake.frames >= 3, "every frame read")
    await asyncio.sleep(0.2)
    assert recorder.agents_frames() == [("b", "command_result")]  # a's hello does not pass a's result
    recorder.gate.set()
    await eventually(lambda: len(recorder.frames) == 3, "every frame handled")
    assert recorder.agents_frames() == [("b", "command_result"), ("a", "command_result"), ("a", "hello")]


def test_a_waiting_frame_holds_only_its_own_bytes_not_its_whole_batch():
    import sys

    from common.wire import decode_link_message
    from master.intake import detached

    message = batch(*(heartbeat(f"a{n}", n) for n in range(1000)))
    frames = decode_link_message(message)
    assert isinstance(frames[0], Relay)
    held = detached(frames[0])
    before = sys.getrefcount(message)
    del frames
    assert sys.getrefcount(message) < before  # the decoded batch let go of it ...
    assert bytes(held.frame) == json.dumps({"type": "heartbeat", "seq": 0, "ts": 0.0}, separators=(",", ":")).encode()
    assert sys.getrefcount(message) == 2  # ... and the waiting frame holds none of it (the count is the name and the call)

"""FrameBuffer, the relay's queue towards the Master: ordered, bounded, never losing what must be kept."""

from __future__ import annotations

import asyncio

from access.upstream import CONNECTED, DISCONNECTED, FrameBuffer, Outbound


def entry(agent: str, kind: str, tag: str = "") -> Outbound:
    return Outbound(agent, kind, f"{agent}:{kind}:{tag}".encode())


def drain(buffer: FrameBuffer) -> list[bytes]:
    sent = []
    while (head := buffer.peek()) is not None:
        sent.append(head.data)
        buffer.done()
    return sent


def test_frames_leave_in_the_order_they_came():
    buffer = FrameBuffer(limit=10)
    for tag in "abc":
        buffer.offer(entry("a1", "command_result", tag))
    assert drain(buffer) == [b"a1:command_result:a", b"a1:command_result:b", b"a1:command_result:c"]
    assert len(buffer) == 0


def test_while_coalescing_only_the_newest_heartbeat_and_telemetry_of_each_agent_wait():
    dropped: list[str] = []
    buffer = FrameBuffer(limit=10, on_drop=dropped.append)
    for tag in "123":
        buffer.offer(entry("a1", "heartbeat", tag))
        buffer.offer(entry("a2", "heartbeat", tag))
        buffer.offer(entry("a1", "telemetry", tag))
    assert sorted(drain(buffer)) == [b"a1:heartbeat:3", b"a1:telemetry:3", b"a2:heartbeat:3"]
    assert dropped == ["superseded"] * 6


def test_without_coalescing_every_heartbeat_waits_its_turn():
    buffer = FrameBuffer(limit=10)
    buffer.coalesce = False
    for tag in "12":
        buffer.offer(entry("a1", "heartbeat", tag))
    assert drain(buffer) == [b"a1:heartbeat:1", b"a1:heartbeat:2"]


def test_when_full_the_oldest_heartbeat_makes_room_for_a_result():
    dropped: list[str] = []
    buffer = FrameBuffer(limit=2, on_drop=dropped.append)
    buffer.offer(entry("a1", "heartbeat"))
    buffer.offer(entry("a2", "command_result", "x"))
    assert buffer.offer(entry("a3", "command_result", "y"))
    assert drain(buffer) == [b"a2:command_result:x", b"a3:command_result:y"]
    assert dropped == ["evicted"]


def test_when_full_of_results_a_result_is_refused_and_a_heartbeat_is_let_go():
    buffer = FrameBuffer(limit=1)
    buffer.offer(entry("a1", "command_result"))
    assert not buffer.offer(entry("a2", "command_ack"))
    assert buffer.offer(entry("a2", "heartbeat"))  # taken care of: there will be a newer one
    assert buffer.kinds() == [("a1", "command_result")]


async def test_put_waits_for_room_instead_of_dropping():
    buffer = FrameBuffer(limit=1)
    buffer.offer(entry("a1", "command_result", "first"))
    waiting = asyncio.create_task(buffer.put(entry("a1", "command_result", "second")))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    head = buffer.peek()
    assert head is not None
    buffer.done()
    await asyncio.wait_for(waiting, 1)
    assert drain(buffer) == [b"a1:command_result:second"]


def test_notices_may_go_over_the_limit():
    buffer = FrameBuffer(limit=1)
    buffer.offer(entry("a1", "command_result"))
    assert buffer.offer(entry("a2", CONNECTED), force=True)
    assert len(buffer) == 2


def test_a_visit_with_nothing_said_is_withdrawn_but_not_one_being_sent():
    buffer = FrameBuffer(limit=10)
    buffer.offer(entry("a1", CONNECTED))
    assert buffer.cancel_connect("a1")
    assert len(buffer) == 0

    buffer.offer(entry("a1", CONNECTED))
    buffer.offer(entry("a1", "hello"))
    assert not buffer.cancel_connect("a1")  # it said something: the Master must hear of the visit

    buffer = FrameBuffer(limit=10)
    buffer.offer(entry("a2", CONNECTED))
    assert buffer.peek() is not None  # the sender has it on the wire
    assert not buffer.cancel_connect("a2")


def test_between_links_notices_of_agents_gone_are_withdrawn_and_first_kinds_named():
    buffer = FrameBuffer(limit=10)
    buffer.offer(entry("gone", CONNECTED))
    buffer.offer(entry("gone", "command_result"))
    buffer.offer(entry("here", CONNECTED))
    buffer.offer(entry("here", "hello"))
    buffer.offer(entry("gone", DISCONNECTED))
    buffer.offer(entry("back", "heartbeat"))
    assert buffer.withdraw_connects(keep={"here", "back"}) == {"gone": "command_result", "here": CONNECTED, "back": "heartbeat"}
    assert buffer.kinds() == [
        ("gone", "command_result"),
        ("here", CONNECTED),
        ("gone", DISCONNECTED),
        ("here", "hello"),  # hellos after every control frame, before telemetry
        ("back", "heartbeat"),
    ]


def test_superseded_entries_do_not_pile_up():
    rounds = 5000
    buffer = FrameBuffer(limit=10)
    for n in range(rounds):
        buffer.offer(entry("a1", "heartbeat", str(n)))
    assert len(buffer) == 1
    assert all(len(lane) < 2000 for lane in buffer.queue._lanes)  # superseded slots are compacted away
    assert drain(buffer) == [f"a1:heartbeat:{rounds - 1}".encode()]


def test_a_heartbeat_given_back_after_a_failed_send_makes_room_again():
    """docs/overload.md, "One queue type": the buffer before it kept such a heartbeat for good, under any load."""
    dropped: list[str] = []
    buffer = FrameBuffer(limit=2, on_drop=dropped.append)
    buffer.coalesce = False
    buffer.offer(entry("a1", "heartbeat"))
    assert buffer.peek() is not None  # on the wire: not to be evicted
    assert buffer.offer(entry("a1", "command_result", "x"))
    assert not buffer.offer(entry("a2", "command_result", "y"))
    buffer.send_failed()
    assert buffer.offer(entry("a2", "command_result", "y"))
    assert buffer.kinds() == [("a1", "command_result"), ("a2", "command_result")]
    assert dropped == ["evicted"]


def test_a_heartbeat_larger_than_the_telemetry_lane_goes_alone():
    """docs/overload.md, "One queue type": the buffer before it evicted every waiting heartbeat first."""
    dropped: list[str] = []
    buffer = FrameBuffer(limit=10, on_drop=dropped.append, telemetry_bytes=100, coalesce_bytes=100)
    buffer.coalesce = False
    buffer.offer(Outbound("a1", "heartbeat", b"x" * 50))
    assert buffer.offer(Outbound("a2", "heartbeat", b"x" * 101))
    assert buffer.kinds() == [("a1", "heartbeat")]
    assert dropped == ["evicted"] and buffer.telemetry_shed == 1

"""Frames to an agent are posted and written together once a turn of the event loop (``AgentConnection.post``): one
write (one TLS record, one syscall) for every frame the Master's messages of one read brought the agent, in order,
and a lone frame at the next turn, never held for a window."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from access.ratelimit import FrameBudget
from access.relay import AgentConnection
from common.pki import CertRole, Identity


class RecordingTransport:
    """A transport that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.unsent = 0

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return self.unsent


class FakeConnection:
    def __init__(self) -> None:
        self.protocol = Protocol(Side.SERVER, state=State.OPEN)
        self.transport = RecordingTransport()


def _session() -> tuple[AgentConnection, FakeConnection]:
    connection = FakeConnection()
    identity = Identity(role=CertRole.AGENT, id="agt-1", serial="01", not_after=2e9)
    session = AgentConnection(identity, cast(Any, connection), "127.0.0.1:1", FrameBudget(10, 10, 10, 0.0))
    return session, connection


def _frames(data: bytes) -> list[Frame]:
    """What an agent's side reads from these bytes."""
    reader = Protocol(Side.CLIENT, state=State.OPEN)
    reader.receive_data(data)
    return [event for event in reader.events_received() if isinstance(event, Frame)]


async def test_frames_posted_in_one_turn_are_one_write_in_order() -> None:
    session, connection = _session()
    sent = [b'{"type":"worker_answer","call_id":"wc-%d","status":204}' % n for n in range(3)]
    assert all(session.post(frame) for frame in sent)
    assert connection.transport.writes == []  # nothing yet: the turn is not over
    assert session.backlog() == sum(len(frame) for frame in sent)  # what waits counts against the agent's backlog

    await asyncio.sleep(0)

    assert len(connection.transport.writes) == 1
    frames = _frames(connection.transport.writes[0])
    assert [(f.opcode, f.data) for f in frames] == [(Opcode.TEXT, frame) for frame in sent]
    assert session.backlog() == 0


async def test_a_lone_frame_is_written_at_the_next_turn() -> None:
    session, connection = _session()
    session.post(b'{"type":"ping","nonce":"n"}')
    await asyncio.sleep(0)
    assert [f.data for f in _frames(b"".join(connection.transport.writes))] == [b'{"type":"ping","nonce":"n"}']
    session.post(b'{"type":"result_ack","id":"cmd-1"}')  # a later turn: a write of its own
    await asyncio.sleep(0)
    assert len(connection.transport.writes) == 2


async def test_nothing_is_posted_or_written_once_the_connection_is_not_open() -> None:
    session, connection = _session()
    assert session.post(b'{"type":"ping","nonce":"a"}')
    connection.protocol.state = State.CLOSING  # a close began before the turn ended: what waited is dropped
    assert not session.post(b'{"type":"ping","nonce":"b"}')
    await asyncio.sleep(0)
    assert connection.transport.writes == []
    assert session.backlog() == 0


async def test_flush_writes_at_once_what_waits() -> None:
    """What the relay does before it closes a session: what was posted goes before the close frame."""
    session, connection = _session()
    session.post(b'{"type":"error","code":"x","message":"m"}')
    assert session.flush() == 1
    assert len(connection.transport.writes) == 1
    await asyncio.sleep(0)  # the turn's flush finds nothing more to write
    assert len(connection.transport.writes) == 1

"""The Master's frames to a relay that takes batches go several to a message (master/link.py ``AccessLink.send``):
the frames sent in one turn of the event loop as one JSON array, in order; to a relay that does not say it takes
them (an older relay), one frame per message, as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Close

from common.pki import server_tls_context
from common.wire import (
    PROTOCOL_VERSIONS,
    AccessHello,
    AccessWelcome,
    Relay,
    ReportPace,
    decode_link_frame,
    decode_link_message,
    decode_master_frame,
    encode,
)
from master.link import LINK_BATCH_BYTES, AccessLink, RelayHub
from tests.access.conftest import TestPki, eventually
from tests.master.linked import RecordingConnection


def link(*, batches: bool, connection: object | None = None) -> AccessLink:
    return AccessLink(relay_id="relay-a", region="eu", connection=connection or RecordingConnection(), batches=batches)  # type: ignore[arg-type]


def pinged(n: int) -> bytes:
    return b'{"type":"ping","nonce":"n%d"}' % n


def agents_and_frames(sent: list[bytes | str]) -> list[list[tuple[str, bytes]]]:
    """Each message sent, as the (agent, frame) pairs it carried."""
    messages = []
    for data in sent:
        frames = decode_link_message(data)
        assert all(isinstance(f, Relay) for f in frames)
        messages.append([(f.agent_id, bytes(f.frame)) for f in frames if isinstance(f, Relay)])
    return messages


async def test_frames_sent_in_one_turn_go_to_a_relay_that_takes_batches_as_one_message_in_order():
    to = link(batches=True)
    went = await asyncio.gather(*(to.send_to_agent(f"agt-{n}", pinged(n)) for n in range(5)))
    assert went == [True] * 5
    assert agents_and_frames(to.connection.sent) == [[(f"agt-{n}", pinged(n)) for n in range(5)]]  # type: ignore[attr-defined]
    assert to.connection.sent[0].startswith(b"[")  # type: ignore[attr-defined]
    assert await to.send_to_agent("agt-9", pinged(9))  # a later turn: a message of its own, a frame as before
    assert not to.connection.sent[1].startswith(b"[")  # type: ignore[attr-defined]
    assert agents_and_frames(to.connection.sent[1:]) == [[("agt-9", pinged(9))]]  # type: ignore[attr-defined]


async def test_a_relay_that_does_not_take_batches_gets_one_frame_per_message():
    to = link(batches=False)
    await asyncio.gather(*(to.send_to_agent(f"agt-{n}", pinged(n)) for n in range(3)))
    sent = to.connection.sent  # type: ignore[attr-defined]
    assert not any(m.startswith(b"[") for m in sent)
    assert agents_and_frames(sent) == [[(f"agt-{n}", pinged(n))] for n in range(3)]


async def test_a_batch_stays_under_its_byte_bound():
    to = link(batches=True)
    big = b'{"type":"ping","nonce":"%s"}' % (b"x" * (LINK_BATCH_BYTES // 3))
    await asyncio.gather(*(to.send_to_agent(f"agt-{n}", big) for n in range(5)))
    sent = to.connection.sent  # type: ignore[attr-defined]
    assert len(sent) > 1 and all(len(m) <= LINK_BATCH_BYTES + 1024 for m in sent)
    assert [a for message in agents_and_frames(sent) for a, _ in message] == [f"agt-{n}" for n in range(5)]


class _Closed(RecordingConnection):
    async def send(self, data: bytes | str, text: bool = False) -> None:
        raise ConnectionClosedOK(Close(1000, "bye"), Close(1000, "bye"), True)


async def test_every_sender_of_a_batch_hears_that_its_link_closed():
    to = link(batches=True, connection=_Closed())
    assert await asyncio.gather(*(to.send_to_agent(f"agt-{n}", pinged(n)) for n in range(3))) == [False] * 3


async def test_a_sender_cancelled_while_it_waits_holds_back_no_other_frame_of_its_message():
    to = link(batches=True)
    first = asyncio.create_task(to.send_to_agent("agt-0", pinged(0)))
    second = asyncio.create_task(to.send_to_agent("agt-1", pinged(1)))
    await asyncio.sleep(0)  # both are waiting for their message now
    first.cancel()
    assert await second
    assert agents_and_frames(to.connection.sent) == [[("agt-0", pinged(0)), ("agt-1", pinged(1))]]  # type: ignore[attr-defined]


async def test_the_hub_batches_to_a_relay_whose_hello_says_it_takes_batches_and_not_to_one_that_does_not(tmp_path: Path):
    pki = TestPki(tmp_path)

    async def nothing(*_: object) -> None:
        pass

    hub = RelayHub(
        server_tls_context(pki.master.cert, pki.master.key, pki.ca_file, require_client_cert=True), nothing, nothing, list
    )
    port = await hub.start("127.0.0.1", 0)
    try:
        for batches in (True, False):
            relay = await connect(f"wss://127.0.0.1:{port}/link", ssl=pki.client_context(pki.relay))
            hello = AccessHello(versions=list(PROTOCOL_VERSIONS), relay_id=pki.relay.identity.id, region="t", batches=batches)
            await relay.send(encode(hello))
            assert isinstance(decode_link_frame(await relay.recv()), AccessWelcome)
            assert isinstance(decode_link_frame(await relay.recv()), ReportPace)
            await eventually(lambda: pki.relay.identity.id in hub.links, "the link registered")
            linked = hub.links[pki.relay.identity.id]
            assert linked.batches is batches
            await asyncio.gather(*(linked.send_to_agent(f"agt-{n}", pinged(n)) for n in range(3)))
            messages = [await relay.recv() for _ in range(1 if batches else 3)]
            got = [f for m in messages for f in decode_link_message(m)]
            assert [decode_master_frame(bytes(f.frame)) for f in got if isinstance(f, Relay)] == [
                decode_master_frame(pinged(n)) for n in range(3)
            ]
            await relay.close()
            await eventually(lambda: pki.relay.identity.id not in hub.links, "the link gone")
    finally:
        await hub.stop()

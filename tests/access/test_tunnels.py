"""Renters' tunnels through a real relay: both ends meet by ticket, bytes pass untouched within the tunnel's rate,
bad tickets and bad frames are refused with their close codes, and the agents' control path is not held up.

The renter's end is the renter's own client (management/client/tunnel.py) or, where a test must send what that
client never would, a bare WebSocket; the agent's end is a real mutual-TLS WebSocket to /tunnel/<id>.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

import access.http
import access.relay
from access.daemon import AccessRelay
from access.tunnels import MAX_MESSAGE_BYTES
from common.pki import CertificateAuthority, CommandSigner
from common.tunnel import (
    MAX_TUNNEL_PAYLOAD,
    TICKET_HEADER,
    Op,
    Ticket,
    TicketBody,
    TunnelFrame,
    TunnelKind,
    encode_frame,
    encode_ticket,
    new_ticket_id,
    sign_ticket,
)
from common.wire import (
    CLOSE_REVOKED,
    CLOSE_TICKET_REFUSED,
    CLOSE_TUNNEL_BAD_FRAME,
    CLOSE_TUNNEL_LIMIT,
    CLOSE_TUNNEL_PEER_GONE,
    CLOSE_TUNNEL_UNMET,
    AgentConnected,
    Relay,
)
from management.client.tunnel import Tunnel
from management.services.tunnels import TunnelGrant
from tests.access.conftest import Credentials, TestPki, eventually, heartbeat

MiB = 1024 * 1024


@dataclass
class Issuer:
    """Mints tickets as the Master does: a command-signing key the platform CA endorsed."""

    pki: TestPki
    signer: CommandSigner
    endorsement: str

    def ticket(self, agent: Credentials, **fields: Any) -> Ticket:
        now = time.time()
        values: dict[str, Any] = {
            "id": new_ticket_id(),
            "kind": TunnelKind.EXEC.value,
            "account": "acct-renter",
            "workload": "wl-1",
            "agent_id": agent.identity.id,
            "container": "idlegrid-wl-1",
            "relay_id": self.pki.relay.identity.id,
            "issued_at": now,
            "expires_at": now + 30,
            "key_id": self.signer.key_id,
        }
        values.update(fields)
        return sign_ticket(TicketBody(**values), self.signer, self.endorsement)


@pytest.fixture
def issuer(pki: TestPki) -> Issuer:
    signer = CommandSigner.generate()
    return Issuer(pki, signer, pki.ca.endorse_command_key(signer.public_key_b64()))


def grant(relay: AccessRelay, pki: TestPki, ticket: Ticket, text: str | None = None) -> TunnelGrant:
    body = ticket.body
    return TunnelGrant(
        id=body.id,
        kind=body.kind,
        workload=body.workload,
        agent_id=body.agent_id,
        relay_id=body.relay_id,
        url=f"wss://127.0.0.1:{relay.http.port}/tunnel",
        ticket=encode_ticket(ticket) if text is None else text,
        ca_pem=pki.ca_file.read_text(),
        expires_at=body.expires_at,
    )


async def renter(relay: AccessRelay, pki: TestPki, ticket: Ticket, text: str | None = None) -> Tunnel:
    return await Tunnel.open(grant(relay, pki, ticket, text), timeout_s=5)


@asynccontextmanager
async def bare_renter(relay: AccessRelay, pki: TestPki, ticket: Ticket) -> AsyncIterator[ClientConnection]:
    """A renter's end that can send what the renter's client never would."""
    async with connect(
        f"wss://127.0.0.1:{relay.http.port}/tunnel",
        ssl=pki.client_context(),
        additional_headers={TICKET_HEADER: encode_ticket(ticket)},
        max_size=None,
        open_timeout=5,
    ) as ws:
        yield ws


@asynccontextmanager
async def agent_end(
    relay: AccessRelay, pki: TestPki, who: Credentials, ticket: Ticket, *, text: str | None = None, ticket_id: str | None = None
) -> AsyncIterator[ClientConnection]:
    """The agent's data connection for ``ticket``, with ``who``'s certificate."""
    async with connect(
        f"{relay.agent_url}/tunnel/{ticket_id or ticket.body.id}",
        ssl=pki.client_context(who),
        additional_headers={TICKET_HEADER: encode_ticket(ticket) if text is None else text},
        max_size=None,
        open_timeout=5,
        compression=None,
    ) as ws:
        yield ws


async def closed_with(ws: ClientConnection, timeout: float = 5.0) -> tuple[int, str]:
    """Read (and drop) until the relay closes ``ws``; its close code and reason."""
    try:
        async with asyncio.timeout(timeout):
            while True:
                await ws.recv()
    except ConnectionClosed as exc:
        assert exc.rcvd is not None, f"closed without a close frame: {exc}"
        return exc.rcvd.code, exc.rcvd.reason


async def renter_closed_with(tunnel: Tunnel, timeout: float = 5.0) -> tuple[int | None, str]:
    async with asyncio.timeout(timeout):
        while await tunnel.receive() is not None:
            pass
    return tunnel.close_code, tunnel.close_reason


async def waiting(relay: AccessRelay, ticket: Ticket) -> None:
    await eventually(lambda: ticket.body.id in relay.tunnels.tunnels, "the first end to be waiting at the relay")


def sample(relay: AccessRelay, name: str, **labels: str) -> float:
    return relay.metrics.registry.get_sample_value(name, {"relay": relay.config.relay_id, **labels}) or 0.0


# --- meeting ------------------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["renter", "agent"])
async def test_a_renter_and_an_agent_meet_and_exchange_frames_both_ways_in_order(relay, pki, issuer, first, caplog):
    caplog.set_level(logging.INFO, logger="access.tunnels")
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    tunnel: Tunnel | None = None
    if first == "renter":
        tunnel = await renter(relay, pki, ticket)
        await waiting(relay, ticket)
    async with agent_end(relay, pki, agent, ticket) as ws:
        if tunnel is None:
            await waiting(relay, ticket)
            tunnel = await renter(relay, pki, ticket)
        for i in range(50):
            await tunnel.send(Op.DATA, 0, f"stdin {i}\n".encode())
        for i in range(50):
            assert await asyncio.wait_for(ws.recv(), 5) == encode_frame(Op.DATA, 0, f"stdin {i}\n".encode())
        big = bytes(range(256)) * (MAX_TUNNEL_PAYLOAD // 256)
        await ws.send(encode_frame(Op.DATA, 0, big))
        await ws.send(encode_frame(Op.STDERR, 0, b"warning\n"))
        await ws.send(encode_frame(Op.EXIT, 0, b'{"code":0}'))
        assert [await tunnel.receive() for _ in range(3)] == [
            TunnelFrame(Op.DATA, 0, big),
            TunnelFrame(Op.STDERR, 0, b"warning\n"),
            TunnelFrame(Op.EXIT, 0, b'{"code":0}'),
        ]
        await ws.close(1000, "command exited")
    # A normal close stays normal, with its reason.
    assert await renter_closed_with(tunnel) == (1000, "command exited")
    await eventually(lambda: not relay.tunnels.tunnels, "the relay to let go of the tunnel")
    assert sample(relay, "idlegrid_access_tunnels_opened_total", kind="exec") == 1
    assert sample(relay, "idlegrid_access_tunnel_bytes_total", direction="to_agent") == 50 * 5 + sum(
        len(f"stdin {i}\n") for i in range(50)
    )
    assert sample(relay, "idlegrid_access_tunnel_bytes_total", direction="to_renter") == 3 * 5 + len(big) + 8 + 10
    assert sample(relay, "idlegrid_access_tunnels_open") == 0
    closed = [r for r in caplog.records if r.getMessage() == "tunnel closed"]
    assert len(closed) == 1
    line = closed[0].__dict__
    assert (line["tunnel"], line["kind"], line["workload"], line["agent"]) == (ticket.body.id, "exec", "wl-1", agent.identity.id)
    assert (line["ended_by"], line["close_code"], line["bytes_to_renter"]) == ("agent", 1000, 3 * 5 + len(big) + 8 + 10)
    assert line["duration_s"] >= 0
    text = encode_ticket(ticket)
    assert not any(text in r.getMessage() or text in str(r.__dict__) for r in caplog.records), "a ticket in the logs"


# --- refusals -----------------------------------------------------------------------------------


def forged(issuer: Issuer, agent: Credentials) -> Ticket:
    ticket = issuer.ticket(agent)
    return msgspec.structs.replace(ticket, body=msgspec.structs.replace(ticket.body, workload="wl-someone-elses"))


def unendorsed(issuer: Issuer, agent: Credentials) -> Ticket:
    ticket = issuer.ticket(agent)
    stranger = CertificateAuthority.create("another platform's CA")
    return msgspec.structs.replace(ticket, endorsement=stranger.endorse_command_key(ticket.public_key))


REFUSED_TICKETS = {
    "forged signature": (forged, "signature"),
    "unendorsed key": (unendorsed, "endorse"),
    "expired": (lambda issuer, agent: issuer.ticket(agent, expires_at=time.time() - 1), "expired"),
    "another relay": (lambda issuer, agent: issuer.ticket(agent, relay_id="relay-elsewhere"), "relay-elsewhere"),
}


@pytest.mark.parametrize("case", list(REFUSED_TICKETS))
async def test_a_bad_ticket_is_refused_at_either_end_saying_why(relay, pki, issuer, case):
    make, needle = REFUSED_TICKETS[case]
    agent = pki.agent()
    ticket = make(issuer, agent)
    tunnel = await renter(relay, pki, ticket)
    code, reason = await renter_closed_with(tunnel)
    assert code == CLOSE_TICKET_REFUSED
    assert needle in reason.lower(), reason
    async with agent_end(relay, pki, agent, ticket) as ws:
        code, reason = await closed_with(ws)
    assert code == CLOSE_TICKET_REFUSED
    assert needle in reason.lower(), reason
    assert not relay.tunnels.tunnels
    assert sample(relay, "idlegrid_access_tunnels_refused_total", reason="ticket") == 2


async def test_a_garbage_ticket_header_is_refused(relay, pki, issuer):
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    tunnel = await renter(relay, pki, ticket, text="%%% not a ticket %%%")
    code, reason = await renter_closed_with(tunnel)
    assert (code, "not a ticket" in reason) == (CLOSE_TICKET_REFUSED, True)
    async with agent_end(relay, pki, agent, ticket, text="QUFB" * 1000) as ws:  # base64 of "AAA...", not JSON
        code, reason = await closed_with(ws)
    assert (code, "not a ticket" in reason) == (CLOSE_TICKET_REFUSED, True)


async def test_a_request_without_a_ticket_or_upgrade_gets_a_clear_http_error(relay, pki, issuer):
    ticket = encode_ticket(issuer.ticket(pki.agent()))
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{relay.http_url}/tunnel", ssl=pki.client_context()) as response:
            assert response.status == 401
            assert TICKET_HEADER in (await response.json())["error"]["message"]
        async with session.get(f"{relay.http_url}/tunnel", ssl=pki.client_context(), headers={TICKET_HEADER: ticket}) as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "not_websocket"


async def test_an_agent_whose_certificate_is_not_the_tickets_agent_is_refused(relay, pki, issuer):
    agent, other = pki.agent(), pki.agent()
    ticket = issuer.ticket(agent)
    async with agent_end(relay, pki, other, ticket) as ws:
        code, reason = await closed_with(ws)
    assert code == CLOSE_TICKET_REFUSED
    assert f"for agent {agent.identity.id}, not {other.identity.id}" in reason
    async with agent_end(relay, pki, agent, ticket, ticket_id="tun-another") as ws:  # the path must name the ticket
        code, reason = await closed_with(ws)
    assert (code, "tun-another" in reason) == (CLOSE_TICKET_REFUSED, True)
    assert sample(relay, "idlegrid_access_tunnels_refused_total", reason="wrong_agent") == 1


async def test_a_ticket_lets_each_end_in_once(relay, pki, issuer):
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    first = await renter(relay, pki, ticket)
    await waiting(relay, ticket)
    again = await renter(relay, pki, ticket)
    code, reason = await renter_closed_with(again)
    assert (code, "used already by the renter" in reason) == (CLOSE_TICKET_REFUSED, True)
    async with agent_end(relay, pki, agent, ticket) as ws:
        async with agent_end(relay, pki, agent, ticket) as replay:
            code, reason = await closed_with(replay)
        assert (code, "used already by the agent" in reason) == (CLOSE_TICKET_REFUSED, True)
        await first.send(Op.DATA, 0, b"still joined")
        assert await asyncio.wait_for(ws.recv(), 5) == encode_frame(Op.DATA, 0, b"still joined")
        await ws.close()
    await renter_closed_with(first)
    # Over, and still remembered: neither end gets back in with it.
    late = await renter(relay, pki, ticket)
    code, reason = await renter_closed_with(late)
    assert (code, "used already" in reason) == (CLOSE_TICKET_REFUSED, True)
    assert sample(relay, "idlegrid_access_tunnels_refused_total", reason="used") == 3


async def test_an_end_whose_peer_does_not_come_is_closed_after_the_ticket_expires(make_relay, pki, issuer):
    relay = await make_relay(tunnel_grace_s=0.2)
    agent = pki.agent()
    ticket = issuer.ticket(agent, expires_at=time.time() + 0.5)
    started = time.monotonic()
    tunnel = await renter(relay, pki, ticket)
    code, reason = await renter_closed_with(tunnel)
    assert (code, reason) == (CLOSE_TUNNEL_UNMET, "the agent did not arrive before the ticket expired")
    assert time.monotonic() - started >= 0.6
    assert not relay.tunnels.tunnels
    # The agent arriving after all is told the tunnel is over (here: its ticket has expired, too).
    async with agent_end(relay, pki, agent, ticket) as ws:
        assert (await closed_with(ws))[0] == CLOSE_TICKET_REFUSED


async def test_an_end_arriving_after_its_peer_left_is_told_the_tunnel_is_over(relay, pki, issuer):
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    tunnel = await renter(relay, pki, ticket)
    await waiting(relay, ticket)
    await tunnel.close()
    await eventually(lambda: not relay.tunnels.tunnels, "the relay to let go of the waiting tunnel")
    async with agent_end(relay, pki, agent, ticket) as ws:
        code, reason = await closed_with(ws)
    assert code == CLOSE_TUNNEL_PEER_GONE
    assert f"tunnel {ticket.body.id} is over" in reason


async def test_tunnels_over_the_relays_or_an_agents_cap_are_refused(make_relay, pki, issuer):
    relay = await make_relay(max_tunnels=2, max_tunnels_per_agent=1)
    busy, other, third = pki.agent(), pki.agent(), pki.agent()
    held = [await renter(relay, pki, issuer.ticket(busy))]
    over_agent = await renter(relay, pki, issuer.ticket(busy))
    code, reason = await renter_closed_with(over_agent)
    assert (code, reason) == (CLOSE_TUNNEL_LIMIT, f"agent {busy.identity.id} has 1 tunnels open here, its limit")
    held.append(await renter(relay, pki, issuer.ticket(other)))
    await eventually(lambda: len(relay.tunnels.tunnels) == 2, "two tunnels waiting")
    over_relay = await renter(relay, pki, issuer.ticket(third))
    code, reason = await renter_closed_with(over_relay)
    assert (code, reason) == (CLOSE_TUNNEL_LIMIT, "this relay has 2 tunnels open, its limit")
    assert sample(relay, "idlegrid_access_tunnels_open") == 2
    await held[0].close()
    await eventually(lambda: len(relay.tunnels.tunnels) == 1, "a tunnel to close")
    fits = issuer.ticket(third)
    room = await renter(relay, pki, fits)
    await waiting(relay, fits)  # a slot freed is a slot taken
    for tunnel in [*held, room]:
        await tunnel.close()


# --- what passes --------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["text", "oversized"])
async def test_a_message_that_is_not_a_tunnel_frame_ends_that_tunnel_only(relay, master, pki, issuer, open_agent, bad):
    agent, bystander = pki.agent(), pki.agent()
    ticket, other_ticket = issuer.ticket(agent), issuer.ticket(bystander)
    async with (
        open_agent(relay, bystander) as control,
        bare_renter(relay, pki, ticket) as ws_renter,
        agent_end(relay, pki, agent, ticket) as ws_agent,
        agent_end(relay, pki, bystander, other_ticket) as other_agent,
    ):
        other = await renter(relay, pki, other_ticket)
        await eventually(lambda: len(relay.tunnels.tunnels) == 2, "both tunnels")
        if bad == "text":
            await ws_renter.send("ls -l")
            code, reason = await closed_with(ws_renter)
            assert (code, reason) == (
                CLOSE_TUNNEL_BAD_FRAME,
                "the renter sent a text message; a tunnel carries binary frames only",
            )
            peer_code, peer_reason = await closed_with(ws_agent)
        else:
            await ws_agent.send(b"\x01\x00\x00\x00\x00" + b"x" * (MAX_TUNNEL_PAYLOAD + 1))
            code, reason = await closed_with(ws_agent)
            assert code == CLOSE_TUNNEL_BAD_FRAME
            assert (
                reason == f"the agent sent a {MAX_MESSAGE_BYTES + 1}-byte message; a tunnel frame is at most {MAX_MESSAGE_BYTES}"
            )
            peer_code, peer_reason = await closed_with(ws_renter)
        assert (peer_code, peer_reason) == (CLOSE_TUNNEL_PEER_GONE, reason)
        # The other tunnel and the agents' control path carry on.
        await other.send(Op.DATA, 0, b"unaffected")
        assert await asyncio.wait_for(other_agent.recv(), 5) == encode_frame(Op.DATA, 0, b"unaffected")
        await control.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(bystander.identity.id), "the bystander's heartbeat")
        await other.close()
    assert sample(relay, "idlegrid_access_tunnels_refused_total", reason="bad_frame") == 1


@pytest.mark.parametrize("who_closes", ["renter", "agent"])
async def test_one_end_closing_closes_the_other_with_its_reason(relay, pki, issuer, who_closes):
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    async with bare_renter(relay, pki, ticket) as ws_renter, agent_end(relay, pki, agent, ticket) as ws_agent:
        await eventually(lambda: relay.tunnels.tunnels[ticket.body.id].state.value == "joined", "the tunnel to join")
        closing, other = (ws_renter, ws_agent) if who_closes == "renter" else (ws_agent, ws_renter)
        await closing.close(4100, "container is gone")
        assert await closed_with(other) == (CLOSE_TUNNEL_PEER_GONE, "container is gone")


async def test_an_end_that_drops_without_a_close_closes_the_other(relay, pki, issuer):
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    tunnel = await renter(relay, pki, ticket)
    async with agent_end(relay, pki, agent, ticket) as ws_agent:
        await eventually(lambda: relay.tunnels.tunnels[ticket.body.id].state.value == "joined", "the tunnel to join")
        ws_agent.transport.abort()
        code, reason = await renter_closed_with(tunnel)
    assert code == CLOSE_TUNNEL_PEER_GONE
    assert reason == "connection lost"


async def test_revoking_an_agents_certificate_ends_its_tunnels_and_keeps_it_out(relay, pki, issuer):
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    tunnel = await renter(relay, pki, ticket)
    async with agent_end(relay, pki, agent, ticket) as ws_agent:
        await eventually(lambda: relay.tunnels.tunnels[ticket.body.id].state.value == "joined", "the tunnel to join")
        await relay.agents.revoke([agent.identity.serial])
        assert await closed_with(ws_agent) == (CLOSE_REVOKED, "certificate revoked")
    assert await renter_closed_with(tunnel) == (CLOSE_TUNNEL_PEER_GONE, "certificate revoked")
    again = issuer.ticket(agent)
    async with agent_end(relay, pki, agent, again) as ws_agent:
        assert (await closed_with(ws_agent))[0] == CLOSE_REVOKED


async def test_tunnel_connections_do_not_count_as_reconnects_of_the_control_session(make_relay, pki, issuer, open_agent):
    relay = await make_relay(reconnect_burst_per_agent=1, reconnect_rate_per_agent=0.01)
    agent = pki.agent()
    async with open_agent(relay, agent) as control:
        await control.send(heartbeat(1))
        tickets = [issuer.ticket(agent) for _ in range(3)]
        async with agent_end(relay, pki, agent, tickets[0]), agent_end(relay, pki, agent, tickets[1]):
            async with agent_end(relay, pki, agent, tickets[2]):
                await eventually(lambda: len(relay.tunnels.tunnels) == 3, "three tunnels waiting")


# --- rate, backpressure, and the control path ---------------------------------------------------


async def send_all(ws: ClientConnection, total: int) -> None:
    payload = b"\xab" * MAX_TUNNEL_PAYLOAD
    for _ in range(total // MAX_TUNNEL_PAYLOAD):
        await ws.send(encode_frame(Op.DATA, 0, payload))


async def receive_bytes(tunnel: Tunnel, total: int) -> None:
    got = 0
    while got < total:
        frame = await tunnel.receive()
        assert frame is not None, tunnel.why()
        got += len(frame.payload)


@pytest.mark.parametrize("rate_from", ["ticket", "relay"])
async def test_a_tunnels_bandwidth_is_capped_at_its_tickets_rate_or_the_relays_default(make_relay, pki, issuer, rate_from):
    rate = MiB
    relay = await make_relay(tunnel_bytes_per_s=rate if rate_from == "relay" else 64 * MiB)
    agent = pki.agent()
    ticket = issuer.ticket(agent, bytes_per_s=rate if rate_from == "ticket" else 0)
    total = 2 * MiB
    tunnel = await renter(relay, pki, ticket)
    async with agent_end(relay, pki, agent, ticket) as ws_agent:
        started = time.monotonic()
        sending = asyncio.create_task(send_all(ws_agent, total))
        await asyncio.wait_for(receive_bytes(tunnel, total), 15)
        elapsed = time.monotonic() - started
        await sending
    # The bucket starts full (one frame's worth at this rate), then refills at `rate`. Behaviour, not speed: the lower
    # bound is the pacing itself (faster would mean no limit); the upper one, three times the floor, that it is not stuck.
    floor = (total - MAX_MESSAGE_BYTES) / rate
    assert 0.9 * floor <= elapsed <= 3 * floor, elapsed
    await tunnel.close()


async def test_a_renter_that_does_not_read_holds_the_agent_back(make_relay, pki, issuer):
    relay = await make_relay(tunnel_bytes_per_s=1024 * MiB)
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    tunnel = await renter(relay, pki, ticket)
    sent = 0

    async with agent_end(relay, pki, agent, ticket) as ws_agent:
        payload = encode_frame(Op.DATA, 0, b"\x00" * MAX_TUNNEL_PAYLOAD)

        async def flood() -> None:
            nonlocal sent
            while True:
                await ws_agent.send(payload)
                sent += len(payload)

        flooding = asyncio.create_task(flood())
        await asyncio.sleep(0.5)  # the renter reads nothing meanwhile: what the flood achieves is what is held
        stalled_at = sent
        await asyncio.sleep(0.3)
        assert sent == stalled_at, "the agent's sends should be waiting, not buffered without bound"
        assert sent < 32 * MiB, sent
        flooding.cancel()
        # Nothing the agent's sends accepted was dropped: the renter, reading at last, gets all of it, then the close.
        draining = asyncio.create_task(read_until_closed(tunnel))
        await ws_agent.close(1000, "done")
        received = await asyncio.wait_for(draining, 10)
    assert received >= sent // len(payload) * MAX_TUNNEL_PAYLOAD
    assert (tunnel.close_code, tunnel.close_reason) == (1000, "done")


async def read_until_closed(tunnel: Tunnel) -> int:
    received = 0
    while (frame := await tunnel.receive()) is not None:
        received += len(frame.payload)
    return received


async def test_a_tunnel_moving_tens_of_megabytes_does_not_hold_up_control_frames(make_relay, master, pki, issuer, open_agent):
    """A sanity bound, generous for a shared test machine; the real figure is the benchmark's."""
    relay = await make_relay(tunnel_bytes_per_s=1024 * MiB)
    agent, bystander = pki.agent(), pki.agent()
    ticket = issuer.ticket(agent)
    total = 32 * MiB
    tunnel = await renter(relay, pki, ticket)
    async with agent_end(relay, pki, agent, ticket) as ws_agent, open_agent(relay, bystander) as control:
        await master.wait_for(lambda: master.of_type(AgentConnected), "the bystander's control session")
        moving = asyncio.gather(send_all(ws_agent, total), receive_bytes(tunnel, total))
        latencies: list[float] = []
        seq = 0
        while not moving.done():
            seq += 1
            sent = time.monotonic()
            frame = json.dumps({"type": "ping", "nonce": f"n-{seq}"}).encode()
            await master.send(Relay(agent_id=bystander.identity.id, frame=msgspec.Raw(frame)))
            assert await asyncio.wait_for(control.recv(decode=False), 5) == frame
            latencies.append(time.monotonic() - sent)
            await asyncio.sleep(0.01)
        await moving
    assert len(latencies) >= 3, "the transfer ended before control frames could be measured"
    assert max(latencies) < 0.5, sorted(latencies)[-5:]
    assert sample(relay, "idlegrid_access_tunnel_bytes_total", direction="to_renter") == total * (
        MAX_MESSAGE_BYTES / MAX_TUNNEL_PAYLOAD
    )
    await tunnel.close()


@pytest.mark.parametrize("silent", ["agent", "renter"])
async def test_an_end_that_stops_answering_pings_is_dropped_and_its_peer_told(relay, pki, issuer, monkeypatch, silent):
    """A host (or a renter) that vanished without a close: its connection no longer answers pings."""
    monkeypatch.setattr(access.relay, "PING_INTERVAL_S", 0.2)
    monkeypatch.setattr(access.http, "PING_INTERVAL_S", 0.2)
    monkeypatch.setattr(access.relay, "CLOSE_TIMEOUT_S", 0.5)
    agent = pki.agent()
    ticket = issuer.ticket(agent)
    async with bare_renter(relay, pki, ticket) as ws_renter, agent_end(relay, pki, agent, ticket) as ws_agent:
        await eventually(lambda: relay.tunnels.tunnels[ticket.body.id].state.value == "joined", "the tunnel to join")
        vanished, peer = (ws_agent, ws_renter) if silent == "agent" else (ws_renter, ws_agent)
        vanished.transport.pause_reading()  # reads nothing more, so answers no ping
        code, reason = await closed_with(peer, timeout=5)
        assert code == CLOSE_TUNNEL_PEER_GONE, (code, reason)
        vanished.transport.abort()


async def test_an_agent_opening_tunnel_connections_too_often_gets_429(make_relay, pki, issuer):
    relay = await make_relay(tunnel_open_burst_per_agent=1, tunnel_open_rate_per_agent=0.01)
    agent = pki.agent()
    async with agent_end(relay, pki, agent, issuer.ticket(agent)):
        with pytest.raises(InvalidStatus) as refused:
            async with agent_end(relay, pki, agent, issuer.ticket(agent)):
                pass
    assert refused.value.response.status_code == 429
    assert int(refused.value.response.headers["Retry-After"]) >= 5

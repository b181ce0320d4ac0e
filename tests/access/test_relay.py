"""The agent-facing server: who gets in, whose frames they are, and how bad frames are answered."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time

import msgspec
import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from common.pki import CertificateAuthority, CertRole
from common.wire import (
    CLOSE_POLICY,
    CLOSE_REVOKED,
    HARD_FRAME_BYTES,
    MAX_FRAME_BYTES,
    AgentConnected,
    AgentDisconnected,
    Relay,
    Revocations,
)
from tests.access.conftest import eventually, heartbeat, next_json, result

HANDSHAKE_FAILURES = (ssl.SSLError, OSError, ConnectionClosed, InvalidHandshake, asyncio.TimeoutError)


async def test_frames_go_upstream_under_the_certificates_agent_id_whatever_the_frame_claims(relay, master, pki, open_agent):
    agent = pki.agent()
    victim = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1, agent_id=victim.identity.id))
        await ws.send(json.dumps({"type": "event", "kind": "gpu_xid", "ts": 1.0, "code": 79, "agent_id": victim.identity.id}))
        relayed = await master.wait_for(lambda: len(master.relayed()) == 2 and master.relayed(), "two relayed frames")

    assert [agent_id for agent_id, _ in relayed] == [agent.identity.id, agent.identity.id]
    # the frame itself is untouched (the event, control, may have gone ahead of the heartbeat: issue 29's lanes)
    assert [f for _, f in relayed if f["type"] == "heartbeat"] == [json.loads(heartbeat(1, agent_id=victim.identity.id))]
    connected = master.of_type(AgentConnected)[0]
    assert (connected.agent_id, connected.serial) == (agent.identity.id, agent.identity.serial)
    assert master.frames.index(connected) < next(i for i, f in enumerate(master.frames) if isinstance(f, Relay))


async def test_the_master_hears_when_an_agent_leaves(relay, master, pki, open_agent):
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(), "the heartbeat")
    gone = await master.wait_for(lambda: master.of_type(AgentDisconnected), "agent_disconnected")
    assert gone[0].agent_id == agent.identity.id
    assert isinstance(master.frames[-1], AgentDisconnected)  # after the agent's frames, never before


async def test_frames_from_the_master_reach_the_named_agent_only(relay, master, pki, open_agent):
    one, two = pki.agent(), pki.agent()
    async with open_agent(relay, one) as ws1, open_agent(relay, two) as ws2:
        await master.wait_for(lambda: len(master.of_type(AgentConnected)) == 2, "both agents announced")
        frame = b'{"type":"ping","nonce":"n-1"}'
        await master.send(Relay(agent_id=two.identity.id, frame=msgspec.Raw(frame)))
        assert await asyncio.wait_for(ws2.recv(decode=False), 3) == frame
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ws1.recv(), 0.2)
        await master.send(Relay(agent_id="agt-not-here", frame=msgspec.Raw(frame)))  # dropped: the Master resends what matters
        await ws2.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(two.identity.id), "the relay still serving")


async def test_a_connection_without_a_client_certificate_fails_the_handshake(relay, open_agent):
    with pytest.raises(HANDSHAKE_FAILURES):
        async with open_agent(relay, None) as ws:
            await asyncio.wait_for(ws.recv(), 3)


async def test_a_certificate_from_another_ca_fails_the_handshake(relay, pki, open_agent):
    stranger = pki.issue(CertRole.AGENT, "agt-stranger", ca=CertificateAuthority.create("someone else's CA"))
    with pytest.raises(HANDSHAKE_FAILURES):
        async with open_agent(relay, stranger) as ws:
            await asyncio.wait_for(ws.recv(), 3)


async def test_a_certificate_for_another_role_is_refused_with_4003(relay, master, pki, open_agent):
    operator = pki.issue(CertRole.OPERATOR, "ops-1")
    async with open_agent(relay, operator) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 3)
    received = closed.value.rcvd
    assert received is not None and received.code == CLOSE_POLICY and "agent" in received.reason
    assert not master.of_type(AgentConnected)


async def test_a_serial_revoked_before_connecting_is_refused(make_relay, master, pki, open_agent):
    agent = pki.agent()
    master.revoked = [agent.identity.serial]  # the Master's list, sent in access_welcome
    relay = await make_relay()
    async with open_agent(relay, agent) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 3)
    received = closed.value.rcvd
    assert received is not None and (received.code, received.reason) == (CLOSE_REVOKED, "certificate revoked")
    assert not master.of_type(AgentConnected)


async def test_a_revocations_frame_cuts_off_a_connected_agent_within_a_second(relay, master, pki, open_agent):
    doomed, bystander = pki.agent(), pki.agent()
    async with open_agent(relay, doomed) as ws, open_agent(relay, bystander) as other:
        await master.wait_for(lambda: len(master.of_type(AgentConnected)) == 2, "both agents announced")
        loop = asyncio.get_running_loop()
        started = loop.time()
        await master.send(Revocations(serials=[doomed.identity.serial]))
        await asyncio.wait_for(ws.wait_closed(), 1.0)
        assert loop.time() - started < 1.0
        assert (ws.close_code, ws.close_reason) == (CLOSE_REVOKED, "certificate revoked")
        await other.send(heartbeat(7))
        await master.wait_for(lambda: master.relayed(bystander.identity.id), "the bystander still relayed")
    async with open_agent(relay, doomed) as ws:  # and it cannot come back
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 3)


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("{this is not json", "bad_json"),
        (json.dumps({"type": "steal_gpus"}), "unknown_type"),
        (heartbeat(1, pad="x" * (MAX_FRAME_BYTES + 10)), "frame_too_large"),
        (json.dumps({"type": "heartbeat", "seq": "one", "ts": "noon"}), "schema_violation"),
    ],
    ids=["bad_json", "unknown_type", "frame_too_large", "schema_violation"],  # not the 256 KiB payload as an id
)
async def test_a_bad_frame_gets_an_error_frame_and_the_connection_and_others_keep_working(
    relay, master, pki, open_agent, payload, code
):
    noisy, quiet = pki.agent(), pki.agent()
    async with open_agent(relay, noisy) as ws, open_agent(relay, quiet) as other:
        await ws.send(payload)
        error = await next_json(ws)
        assert (error["type"], error["code"]) == ("error", code)
        await ws.send(heartbeat(2))
        await other.send(heartbeat(3))
        await master.wait_for(
            lambda: master.relayed(noisy.identity.id) and master.relayed(quiet.identity.id), "both agents' heartbeats"
        )
    assert [f["seq"] for _, f in master.relayed(noisy.identity.id)] == [2]  # the bad frame never went upstream
    assert f'code="{code}"' in relay.metrics.render().decode()


async def test_a_message_over_the_transport_limit_closes_only_that_connection(relay, master, pki, open_agent):
    flooder, quiet = pki.agent(), pki.agent()
    async with open_agent(relay, flooder) as ws, open_agent(relay, quiet) as other:
        await ws.send("x" * (HARD_FRAME_BYTES + 1))
        await asyncio.wait_for(ws.wait_closed(), 3)
        assert ws.close_code == 1009
        await other.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(quiet.identity.id), "the other agent still relayed")


async def test_over_the_rate_limit_frames_are_refused_but_command_results_always_pass(make_relay, master, pki, open_agent):
    relay = await make_relay(rate_per_agent=1.0, burst=3)
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        for seq in range(1, 9):
            await ws.send(heartbeat(seq))
        errors = [await next_json(ws) for _ in range(5)]
        assert {(e["type"], e["code"]) for e in errors} == {("error", "rate_limited")}
        for n in range(5):
            await ws.send(result(f"cmd-{n}"))
        await master.wait_for(lambda: len(master.relayed()) == 3 + 5, "3 heartbeats and 5 results")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(ws.recv(), 0.2)  # no error for any result
    kinds = [f["type"] for _, f in master.relayed()]
    assert sorted(kinds) == ["command_result"] * 5 + ["heartbeat"] * 3  # results may go ahead of heartbeats (lanes)


async def test_the_same_agent_connecting_again_replaces_its_older_connection(relay, master, pki, open_agent):
    agent = pki.agent()
    async with open_agent(relay, agent) as old:
        await master.wait_for(lambda: master.of_type(AgentConnected), "first announcement")
        async with open_agent(relay, agent) as new:
            await asyncio.wait_for(old.wait_closed(), 3)
            assert old.close_code == 4008
            await new.send(heartbeat(1))
            await master.wait_for(lambda: master.relayed(), "the newer connection relayed")
            assert len(master.of_type(AgentConnected)) == 2
            # The older connection's end must not tell the Master the agent left: it has not.
            assert not master.of_type(AgentDisconnected)
            assert relay.agents.agent_count == 1


async def test_too_many_openings_at_once_get_503_until_they_finish(make_relay, pki, open_agent):
    relay = await make_relay(max_handshakes=1, handshake_timeout_s=0.5)
    port = int(relay.agent_url.rsplit(":", 1)[1])
    # A client that opens TCP and never starts TLS holds an opening slot until the TLS time limit.
    stalled = socket.create_connection(("127.0.0.1", port))
    try:
        await eventually(lambda: relay.agents._opening.count(time.monotonic()) == 1, "the stalled opening")
        with pytest.raises(InvalidStatus) as refused:
            async with open_agent(relay, pki.agent()):
                pass
        assert refused.value.response.status_code == 503
    finally:
        stalled.close()
    await asyncio.sleep(1.6)  # asyncio aborts the stalled TLS handshake; its slot expires with it
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
    assert 'reason="busy"' in relay.metrics.render().decode()


async def test_an_agent_that_stops_reading_is_cut_off_and_does_not_hold_up_the_others(relay, master, pki, open_agent):
    stuck, healthy = pki.agent(), pki.agent()
    big = msgspec.Raw(json.dumps({"type": "ping", "nonce": "x" * 200_000}).encode())
    async with open_agent(relay, stuck, max_queue=1, close_timeout=0.5), open_agent(relay, healthy) as other:
        await master.wait_for(lambda: len(master.of_type(AgentConnected)) == 2, "both agents announced")
        for _ in range(200):  # the stuck agent never calls recv(): its socket and then the relay's buffer fill up
            await master.send(Relay(agent_id=stuck.identity.id, frame=big))
            if stuck.identity.id not in relay.agents.sessions or not relay.agents.sessions[stuck.identity.id].open:
                break
        await eventually(lambda: stuck.identity.id not in relay.agents.sessions, "the stuck agent cut off", timeout=5)
        await master.send(Relay(agent_id=healthy.identity.id, frame=msgspec.Raw(b'{"type":"ping","nonce":"ok"}')))
        assert json.loads(await asyncio.wait_for(other.recv(), 3))["nonce"] == "ok"
    assert 'reason="too_slow"' in relay.metrics.render().decode()

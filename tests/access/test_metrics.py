"""The relay's /metrics: what a person running it looks at, counted as it happens, in series whose labels never
name an agent or an address, and clean by ``promtool check metrics``."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import msgspec

from common.wire import CLOSE_REPLACED, EnrollResponse, Relay
from tests.access.conftest import eventually, heartbeat, result
from tests.support.prometheus import check_metrics, names, sample, samples

CSR = "-----BEGIN CERTIFICATE REQUEST-----\nMII...\n-----END CERTIFICATE REQUEST-----\n"


async def scrape(relay, pki) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{relay.http_url}/metrics", ssl=pki.client_context()) as response:
            assert response.status == 200
            return await response.text()


async def enroll(relay, pki) -> int:
    async with aiohttp.ClientSession() as session:
        body = {"token": "igjt_x", "csr_pem": CSR}
        async with session.post(f"{relay.http_url}/enroll", json=body, ssl=pki.client_context()) as response:
            return response.status


async def test_frames_are_counted_by_type_and_direction(relay, master, pki, open_agent):
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1))
        await ws.send(heartbeat(2))
        await ws.send(result("cmd-1"))
        await master.wait_for(lambda: len(master.relayed()) == 3, "three frames relayed")
        await master.send(Relay(agent_id=agent.identity.id, frame=msgspec.Raw(b'{"type":"ping","nonce":"n"}')))
        await master.send(Relay(agent_id=agent.identity.id, frame=msgspec.Raw(b'{"type":"result_ack","id":"cmd-1"}')))
        await asyncio.wait_for(ws.recv(), 3)
        await asyncio.wait_for(ws.recv(), 3)
        text = await scrape(relay, pki)

    assert sample(text, "idlegrid_access_frames_in_total", type="heartbeat") == 2
    assert sample(text, "idlegrid_access_frames_in_total", type="command_result") == 1
    assert sample(text, "idlegrid_access_frames_in_total", type="telemetry") == 0  # every type present from the start
    assert sample(text, "idlegrid_access_frames_out_total", type="ping") == 1
    assert sample(text, "idlegrid_access_frames_out_total", type="result_ack") == 1


async def test_a_frame_of_a_type_the_relay_does_not_know_is_counted_as_other(relay, master, pki, open_agent):
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await master.wait_for(lambda: relay.agents.agent_count == 1, "the agent in")
        for frame in (b'{"type":"from_a_newer_master","x":1}', b'{"nonce":"no type tag first"}'):
            await master.send(Relay(agent_id=agent.identity.id, frame=msgspec.Raw(frame)))
            await asyncio.wait_for(ws.recv(), 3)
    assert sample(relay.metrics.render(), "idlegrid_access_frames_out_total", type="other") == 2


async def test_sessions_are_counted_opened_and_closed_by_close_code(relay, master, pki, open_agent):
    agent = pki.agent()
    async with open_agent(relay, agent):
        await eventually(lambda: relay.agents.agent_count == 1, "the first connection in")
        async with open_agent(relay, agent):  # the same agent again: the older connection is closed with 4008
            await eventually(
                lambda: sample(relay.metrics.render(), "idlegrid_access_connections_closed_total", code=str(CLOSE_REPLACED)),
                "the replaced connection counted",
            )
    await eventually(
        lambda: sample(relay.metrics.render(), "idlegrid_access_connections_closed_total", code="1000"), "the normal close"
    )
    text = relay.metrics.render()
    assert sample(text, "idlegrid_access_connections_opened_total") == 2


async def test_enrollments_are_counted_by_outcome_and_an_unknown_refusal_code_is_not_a_label(relay, master, pki):
    assert await enroll(relay, pki) == 200
    master.answer_enroll = lambda req: EnrollResponse(req_id=req.req_id, ok=False, error_code="token_used", error_message="no")
    assert await enroll(relay, pki) == 409
    master.answer_enroll = lambda req: EnrollResponse(
        req_id=req.req_id, ok=False, error_code="agt-7f3a-something-unbounded", error_message="no"
    )
    assert await enroll(relay, pki) == 400
    text = relay.metrics.render()
    assert sample(text, "idlegrid_access_enrollments_total", outcome="ok") == 1
    assert sample(text, "idlegrid_access_enrollments_total", outcome="token_used") == 1
    assert sample(text, "idlegrid_access_enrollments_total", outcome="refused") == 1
    assert {labels["outcome"] for labels, _ in samples(text, "idlegrid_access_enrollments_total")} == {
        "ok",
        "token_used",
        "refused",
    }


async def test_http_requests_are_counted_by_route_and_status_with_their_latency(relay, pki):
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/healthz", "/no-such-page", "/speedtest/speedtest/random350x350.jpg"):
            async with session.get(f"{relay.http_url}{path}", ssl=pki.client_context()) as response:
                await response.read()
    text = relay.metrics.render()
    assert sample(text, "idlegrid_access_http_requests_total", route="/healthz", method="GET", status="200") == 2
    assert sample(text, "idlegrid_access_http_requests_total", route="unmatched", status="404") == 1
    image_route = "/speedtest/speedtest/{image}"
    assert sample(text, "idlegrid_access_http_requests_total", route=image_route, status="200") == 1
    assert sample(text, "idlegrid_access_http_request_duration_seconds_count", route="/healthz") == 2
    assert sample(text, "idlegrid_access_http_request_duration_seconds_bucket", route="/healthz", le="+Inf") == 2


async def test_the_master_link_state_and_its_dials_are_counted(make_relay, master, pki):
    relay = await make_relay()
    assert sample(relay.metrics.render(), "idlegrid_access_master_link_dials_total", outcome="up") == 1
    await master.stop()
    await eventually(lambda: not relay.link.is_up, "the link down")
    await eventually(
        lambda: (sample(relay.metrics.render(), "idlegrid_access_master_link_dials_total", outcome="failed") or 0) >= 1,
        "a failed redial counted",
    )
    await master.start()
    await relay.link.wait_up(5)
    text = relay.metrics.render()
    assert sample(text, "idlegrid_access_master_link_dials_total", outcome="up") == 2
    assert sample(text, "idlegrid_access_master_link_up") == 1


async def test_process_metrics_come_from_the_relays_own_registry(relay):
    present = names(relay.metrics.render())
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= present


async def test_no_label_names_an_agent_or_an_address(relay, master, pki, open_agent):
    agents = [pki.agent() for _ in range(3)]
    for agent in agents:
        async with open_agent(relay, agent) as ws:
            # a result, not a heartbeat: an agent's heartbeat still waiting when it leaves goes with it (issue 29)
            await ws.send(result("cmd-1"))
            await ws.send("{not json")
            await asyncio.wait_for(ws.recv(), 3)
    await enroll(relay, pki)
    await master.wait_for(lambda: len(master.relayed()) == 3, "every result relayed")
    text = await scrape(relay, pki)
    label_values = {
        value for line in text.splitlines() if "{" in line and not line.startswith("#") for value in _label_values(line)
    }
    for agent in agents:
        assert agent.identity.id not in label_values and agent.identity.serial not in label_values
    assert not any("127.0.0.1" in value for value in label_values)


async def test_the_relays_metrics_pass_promtool_after_traffic(relay, master, pki, open_agent):
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
        await ws.send(json.dumps({"type": "steal_gpus"}))
        await asyncio.wait_for(ws.recv(), 3)
    await enroll(relay, pki)
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{relay.http_url}/speedtest/speedtest/random350x350.jpg", ssl=pki.client_context()) as r:
            await r.read()
    check = check_metrics(await scrape(relay, pki))
    assert check.clean, check.findings


def _label_values(line: str) -> list[str]:
    labels = line[line.index("{") + 1 : line.rindex("}")]
    return [part.split("=", 1)[1].strip('"') for part in labels.split('",') if "=" in part]

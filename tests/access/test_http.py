"""The HTTPS endpoint: enrollment through the Master link, /healthz and /metrics."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from common.wire import EnrollRequest, EnrollResponse
from tests.access.conftest import eventually, heartbeat

CSR = "-----BEGIN CERTIFICATE REQUEST-----\nMII...\n-----END CERTIFICATE REQUEST-----\n"


async def call(relay, pki, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.request(method, f"{relay.http_url}{path}", ssl=pki.client_context(), **kwargs) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text)
            except ValueError:
                return response.status, text


async def test_enrollment_goes_through_the_master_link_and_back(relay, master, pki):
    status, body = await call(relay, pki, "POST", "/enroll", json={"token": "igjt_x", "csr_pem": CSR, "region": "eu"})
    assert status == 200
    assert body == {
        "agent_id": "agt-new",
        "cert_pem": "CERT",
        "ca_pem": "CA",
        "command_keys": {"k1": "pub"},
        "key_endorsements": {"k1": "sig"},
        "agent_url": relay.agent_url,
        "relays": [{"relay_id": "relay-2", "region": "us-east", "url": "wss://relay-2.example:7200"}],  # passed on
    }
    request = master.of_type(EnrollRequest)[0]
    assert (request.token, request.csr_pem, request.region, request.remote) == ("igjt_x", CSR, "eu", "127.0.0.1")
    assert len(request.req_id) == 32


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("token_unknown", 401),
        ("token_invalid", 401),
        ("token_used", 409),
        ("token_expired", 410),
        ("bad_csr", 400),
        ("bad_request", 400),
    ],
)
async def test_a_refused_enrollment_maps_to_its_http_status(relay, master, pki, code, status):
    master.answer_enroll = lambda req: EnrollResponse(req_id=req.req_id, ok=False, error_code=code, error_message=f"no: {code}")
    got, body = await call(relay, pki, "POST", "/enroll", json={"token": "t", "csr_pem": CSR})
    assert (got, body) == (status, {"error": {"code": code, "message": f"no: {code}"}})


async def test_enrollment_while_the_master_is_unreachable_is_a_503(relay, master, pki):
    await master.stop()
    await eventually(lambda: not relay.link.is_up, "the relay to notice")
    status, body = await call(relay, pki, "POST", "/enroll", json={"token": "t", "csr_pem": CSR})
    assert status == 503
    assert body["error"]["code"] == "master_unavailable" and "unreachable" in body["error"]["message"]


async def test_enrollment_the_master_does_not_answer_is_a_504(make_relay, master, pki):
    relay = await make_relay(enroll_timeout_s=0.3)
    master.answer_enroll = lambda req: None
    status, body = await call(relay, pki, "POST", "/enroll", json={"token": "t", "csr_pem": CSR})
    assert (status, body["error"]["code"]) == (504, "master_timeout")


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (json.dumps({"token": "t"}).encode(), "csr_pem"),
        (json.dumps({"token": 5, "csr_pem": CSR}).encode(), "token"),
        (b"[]", "token"),
    ],
)
async def test_a_malformed_enrollment_request_is_a_400_saying_what_is_wrong(relay, master, pki, payload, needle):
    status, body = await call(relay, pki, "POST", "/enroll", data=payload)
    assert status == 400 and body["error"]["code"] == "bad_request"
    assert needle in body["error"]["message"]
    assert not master.of_type(EnrollRequest)


async def test_an_oversized_enrollment_body_is_refused(relay, master, pki):
    status, body = await call(relay, pki, "POST", "/enroll", json={"token": "t", "csr_pem": "x" * 70_000})
    assert status == 413 and body["error"]["code"] == "too_large"
    assert not master.of_type(EnrollRequest)


async def test_enrollment_is_rate_limited_per_address(make_relay, master, pki):
    relay = await make_relay(enroll_rate_per_ip=0.01, enroll_burst=2)
    statuses = [(await call(relay, pki, "POST", "/enroll", json={"token": "t", "csr_pem": CSR}))[0] for _ in range(3)]
    assert statuses == [200, 200, 429]


async def test_healthz_says_ok_with_the_master_link_up_and_counts_agents(relay, pki, open_agent):
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
        await eventually(lambda: relay.agents.agent_count == 1, "the agent in")
        status, body = await call(relay, pki, "GET", "/healthz")
    assert status == 200
    assert (body["status"], body["master_link"], body["agents"]) == ("ok", "up", 1)


async def test_metrics_are_prometheus_text_with_connected_agents_and_link_state(relay, pki, open_agent):
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
        await eventually(lambda: relay.metrics.frames_in == 1, "the frame counted")
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{relay.http_url}/metrics", ssl=pki.client_context()) as response:
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain")
                text = await response.text()
    relay_label = f'relay="{pki.relay.identity.id}"'
    assert f"idlegrid_access_agents_connected{{{relay_label}}} 1.0" in text
    assert f"idlegrid_access_master_link_up{{{relay_label}}} 1.0" in text
    assert f'idlegrid_access_frames_in_total{{{relay_label},type="heartbeat"}} 1.0' in text


async def test_two_relays_in_one_process_keep_separate_metrics(make_relay, relay, pki, open_agent):
    other = await make_relay()
    async with open_agent(relay, pki.agent()):
        await eventually(lambda: relay.agents.agent_count == 1, "the agent in")
        assert "idlegrid_access_agents_connected" in other.metrics.render().decode()
        assert relay.metrics.agents._value.get() == 1 and other.metrics.agents._value.get() == 0


async def test_the_speed_test_is_mounted(relay, pki):
    status, _ = await call(relay, pki, "GET", "/speedtest/")  # its own tests cover what it serves
    assert status == 200

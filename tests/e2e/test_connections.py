"""Acceptance 2 and 6: only agents with a valid, unrevoked certificate get in; bad frames get error frames
and the relay and the Master keep serving everyone else."""

import asyncio
import json

import pytest
from websockets.asyncio.client import connect

from common.pki import CertificateAuthority, CertRole, client_tls_context, write_private_key
from common.wire import MAX_FRAME_BYTES
from tests.support.grid import refused, wait_for


def enrolled(grid, name):
    relay = grid.relays["relay-1"]
    assert grid.enroll(name, relay).returncode == 0
    d = grid.agent_dir(name)
    return grid.agent_id(name), client_tls_context(d / "ca.crt", d / "agent.crt", d / "agent.key")


async def test_agents_without_a_valid_certificate_cannot_connect(grid, tmp_path):
    url = grid.relays["relay-1"].agent_url
    no_cert = client_tls_context(grid.authority.ca_file)
    assert await refused(url, no_cert)

    other_ca = CertificateAuthority.create("someone else's CA")
    key_pem, cert_pem = other_ca.issue_keypair(CertRole.AGENT, "agt-impostor", valid_s=3600)
    write_private_key(tmp_path / "x.key", key_pem)
    (tmp_path / "x.crt").write_bytes(cert_pem)
    assert await refused(url, client_tls_context(grid.authority.ca_file, tmp_path / "x.crt", tmp_path / "x.key"))


async def test_a_revoked_certificate_is_refused_and_a_connected_one_is_cut_off_within_5_seconds(grid):
    url = grid.relays["relay-1"].agent_url
    agent_id, context = enrolled(grid, "doomed")
    async with connect(url, ssl=context, open_timeout=5) as ws:
        status, _ = await asyncio.to_thread(grid.call, "POST", f"/api/v1/agents/{agent_id}/revoke")
        assert status == 200
        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(ws.wait_closed(), timeout=5)
        assert loop.time() - started < 5
    assert await refused(url, context)
    assert (await asyncio.to_thread(grid.agent, agent_id))["state"] == "retired"


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        ("{this is not json", "bad_json"),
        (json.dumps({"type": "steal_gpus"}), "unknown_type"),
        (json.dumps({"type": "heartbeat", "seq": 1, "ts": 1.0, "pad": "x" * (MAX_FRAME_BYTES + 10)}), "frame_too_large"),
        (json.dumps({"type": "heartbeat", "seq": "one", "ts": "noon"}), "schema_violation"),
    ],
    ids=["bad_json", "unknown_type", "frame_too_large", "schema_violation"],
)
async def test_bad_frames_get_error_frames_and_everyone_else_is_served(grid, payload, code):
    grid.enroll("good", grid.relays["relay-1"])
    good_id = grid.agent_id("good")
    grid.start_agent("good", simulate="l4:1")
    await asyncio.to_thread(grid.wait_state, good_id, "ready")

    _, context = enrolled(grid, "noisy")
    async with connect(grid.relays["relay-1"].agent_url, ssl=context, open_timeout=5) as ws:
        await ws.send(payload)
        error = json.loads(await asyncio.wait_for(ws.recv(), timeout=5))
        assert error["type"] == "error" and error["code"] == code
        await ws.send(payload)  # the same connection still answers
        assert json.loads(await asyncio.wait_for(ws.recv(), timeout=5))["code"] == code

    command = await asyncio.to_thread(
        grid.command, good_id, "create_container", {"name": "after-noise", "image": "none", "command": ["sleep", "30"]}
    )
    result = await asyncio.to_thread(grid.wait_command, command)
    assert result["state"] == "succeeded", result
    assert grid.relays["relay-1"].daemon.alive() and grid.master.alive()


async def _next_error(ws) -> dict:
    """The next error frame on a relay's link to the Master. The Master also tells every relay, unasked, its report
    pace and share of admission when a relay links or goes (``report_pace``, docs/overload.md): those are skipped."""
    for _ in range(10):
        frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=5))
        if frame["type"] == "error":
            return frame
        assert frame["type"] == "report_pace", frame
    raise AssertionError("no error frame among the next 10 frames")


async def test_bad_frames_on_the_master_link_get_error_frames_and_the_master_keeps_serving(grid, tmp_path):
    cert, key, ca = grid.authority.write_server_identity(tmp_path / "rogue", CertRole.ACCESS, "relay-rogue")
    context = client_tls_context(ca, cert, key)
    async with connect(f"wss://127.0.0.1:{grid.link_port}/link", ssl=context, open_timeout=5) as ws:
        await ws.send(json.dumps({"type": "access_hello", "versions": [1], "relay_id": "relay-rogue", "region": "x"}))
        welcome = json.loads(await asyncio.wait_for(ws.recv(), timeout=5))
        assert welcome["type"] == "access_welcome"
        for payload, code in [
            ("{{", "bad_json"),
            ('{"type": "nope"}', "unknown_type"),
            ('{"type": "relay"}', "schema_violation"),
        ]:
            await ws.send(payload)
            error = await _next_error(ws)
            assert error["code"] == code
    health = await asyncio.to_thread(grid.get, "/healthz", auth=False)
    assert "relay-1" in health["relays"]
    wait_for(lambda: grid.relay_health(grid.relays["relay-1"])["master_link"] == "up", 5, "relay-1 still linked")

"""Enrollment, against a real HTTPS endpoint speaking the relay's /enroll answer: what lands in the state directory,
with which modes, and the relay directory it carries."""

from __future__ import annotations

import stat
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization

from agent.directory import DIRECTORY_FILE, load_directory
from agent.enroll import enroll
from common.pki import CertificateAuthority, CertRole, CommandSigner, server_tls_context, write_private_key
from common.wire import RelayEntry

RELAYS = [
    {"relay_id": "relay-1", "region": "eu-west", "url": "wss://relay-1.example:7443"},
    {"relay_id": "relay-2", "region": "us-east", "url": "wss://relay-2.example:7443"},
]


@pytest.fixture
async def endpoint(tmp_path: Path) -> AsyncIterator[tuple[str, Path, dict]]:
    """An HTTPS /enroll endpoint certifying any CSR; ``answer_extra`` is merged into its answer."""
    ca = CertificateAuthority.create()
    ca.save(tmp_path / "ca")
    key_pem, cert_pem = ca.issue_keypair(CertRole.ACCESS, "relay-1", valid_s=3600, ip_addresses=["127.0.0.1"])
    write_private_key(tmp_path / "relay.key", key_pem)
    (tmp_path / "relay.crt").write_bytes(cert_pem)
    signer = CommandSigner.generate()
    answer_extra: dict = {}

    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        cert = ca.sign_csr(body["csr_pem"].encode(), CertRole.AGENT, "agt-enrolled", valid_s=3600)
        payload = {
            "agent_id": "agt-enrolled",
            "cert_pem": cert.public_bytes(serialization.Encoding.PEM).decode(),
            "ca_pem": ca.chain_pem().decode(),
            "command_keys": {signer.key_id: signer.public_key_b64()},
            "key_endorsements": {signer.key_id: ca.endorse_command_key(signer.public_key_b64())},
            "agent_url": "wss://relay-1.example:7443",
            **answer_extra,
        }
        return web.json_response(payload)

    app = web.Application()
    app.router.add_post("/enroll", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    ca_file = tmp_path / "ca" / "ca.crt"
    context = server_tls_context(tmp_path / "relay.crt", tmp_path / "relay.key", ca_file, require_client_cert=False)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"https://127.0.0.1:{port}", ca_file, answer_extra
    finally:
        await runner.cleanup()


async def test_enrollment_keeps_the_relay_directory_and_every_file_private(endpoint, tmp_path):
    url, ca_file, answer_extra = endpoint
    answer_extra["relays"] = RELAYS
    state = tmp_path / "agent"

    identity = await enroll(state, token="tok", access_http_url=url, ca_file=ca_file)

    assert identity.agent_id == "agt-enrolled"
    assert load_directory(state) == [RelayEntry(**entry) for entry in RELAYS]
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for path in state.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path.name


async def test_an_answer_without_a_directory_or_with_a_malformed_one_leaves_an_empty_one(endpoint, tmp_path):
    url, ca_file, answer_extra = endpoint
    await enroll(tmp_path / "plain", token="tok", access_http_url=url, ca_file=ca_file)
    assert load_directory(tmp_path / "plain") == []

    answer_extra["relays"] = [{"relay_id": "relay-1"}]  # no region, no URL
    await enroll(tmp_path / "odd", token="tok", access_http_url=url, ca_file=ca_file)
    assert load_directory(tmp_path / "odd") == []
    assert (tmp_path / "odd" / DIRECTORY_FILE).exists()

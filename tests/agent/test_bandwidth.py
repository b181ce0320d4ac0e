"""The bandwidth test: speedtest-cli's mini mode against a real aiohttp server carrying the relay's
speed-test routes, over plain HTTP and over HTTPS with a private CA, with name resolution fenced
to 127.0.0.1 so that any attempt to reach speedtest.net (or anywhere else) fails the test."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

import access.speedtest
from access.speedtest import add_speedtest_routes, image_bytes
from agent.bandwidth import BandwidthError, SpeedtestPlan, measure_bandwidth
from common.pki import CertificateAuthority, CertRole, server_tls_context

# Small enough that both phases finish in well under a second on loopback.
QUICK = SpeedtestPlan(
    download_sides=(350, 500), downloads_per_side=2, upload_bytes=(32_768, 131_072), uploads_per_size=2, phase_s=2.0
)
LOCAL_HOSTS = {"127.0.0.1", "localhost"}


@dataclass
class Relay:
    base_url: str
    ca_file: Path | None
    paths: list[str] = field(default_factory=list)


@pytest.fixture
def resolved_hosts(monkeypatch) -> list[str]:
    """Every host name looked up during the test; any host but loopback is refused."""
    real_getaddrinfo = socket.getaddrinfo
    hosts: list[str] = []

    def loopback_only(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        hosts.append(name)
        if name not in LOCAL_HOSTS:
            raise socket.gaierror(socket.EAI_NONAME, f"test fence: {name} is not loopback")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_only)
    return hosts


async def _serve(ssl_context=None) -> tuple[web.AppRunner, Relay]:
    relay = Relay(base_url="", ca_file=None)

    @web.middleware
    async def record(request: web.Request, handler):
        relay.paths.append(request.path)
        return await handler(request)

    app = web.Application(middlewares=[record])
    add_speedtest_routes(app)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    relay.base_url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    return runner, relay


@pytest.fixture
async def http_relay(resolved_hosts) -> AsyncIterator[Relay]:
    runner, relay = await _serve()
    yield relay
    await runner.cleanup()


@pytest.fixture
async def https_relay(resolved_hosts, tmp_path) -> AsyncIterator[Relay]:
    ca = CertificateAuthority.create()
    key_pem, cert_pem = ca.issue_keypair(CertRole.ACCESS, "relay-test", valid_s=3600, ip_addresses=["127.0.0.1"])
    (tmp_path / "ca.crt").write_bytes(ca.chain_pem())
    (tmp_path / "relay.crt").write_bytes(cert_pem)
    (tmp_path / "relay.key").write_bytes(key_pem)
    context = server_tls_context(tmp_path / "relay.crt", tmp_path / "relay.key", tmp_path / "ca.crt", require_client_cert=False)
    runner, relay = await _serve(context)
    relay.ca_file = tmp_path / "ca.crt"
    yield relay
    await runner.cleanup()


def _assert_measured_against_the_relay_only(result, relay: Relay, resolved_hosts: list[str]) -> None:
    assert result.download_mbps > 0 and result.upload_mbps > 0
    assert 0 < result.latency_ms < 1000
    assert result.server == relay.base_url + "/speedtest"
    assert set(resolved_hosts) <= LOCAL_HOSTS
    assert "/speedtest/speedtest/random350x350.jpg" in relay.paths
    assert "/speedtest/speedtest/upload.php" in relay.paths


async def test_measures_download_upload_and_latency_over_http_without_leaving_loopback(http_relay, resolved_hosts):
    result = await measure_bandwidth(http_relay.base_url, plan=QUICK, timeout_s=10)

    _assert_measured_against_the_relay_only(result, http_relay, resolved_hosts)


async def test_measures_over_https_trusting_the_platform_ca(https_relay, resolved_hosts):
    result = await measure_bandwidth(https_relay.base_url, ca_file=https_relay.ca_file, plan=QUICK, timeout_s=10)

    _assert_measured_against_the_relay_only(result, https_relay, resolved_hosts)


async def test_https_relay_not_signed_by_the_given_ca_is_refused(https_relay, tmp_path):
    stranger = tmp_path / "other-ca.crt"
    stranger.write_bytes(CertificateAuthority.create().chain_pem())

    with pytest.raises(BandwidthError, match="certificate verify failed"):
        await measure_bandwidth(https_relay.base_url, ca_file=stranger, plan=QUICK, timeout_s=10)
    assert not any("random" in path for path in https_relay.paths)


async def test_unreachable_relay_fails_quickly_with_a_bandwidth_error(resolved_hosts):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]  # nothing listens once the socket closes

    started = time.monotonic()
    with pytest.raises(BandwidthError, match="Connection refused") as caught:
        await measure_bandwidth(f"http://127.0.0.1:{closed_port}", plan=QUICK, timeout_s=10)
    assert caught.value.code == "bandwidth_failed"
    # Behaviour, not speed: a refused connection fails at once, not retried until the 10 s limit.
    assert time.monotonic() - started < 2


async def test_a_url_that_is_not_http_is_refused_before_anything_runs():
    with pytest.raises(BandwidthError, match="http"):
        await measure_bandwidth("wss://127.0.0.1:8443", plan=QUICK)


async def test_long_phases_are_cut_to_fit_the_time_limit(http_relay):
    # 4000x4000 images are 32 MB each: a minute of them would overrun the limit many times over.
    plan = SpeedtestPlan(
        download_sides=(4000,) * 8, downloads_per_side=4, upload_bytes=(1_048_576,), uploads_per_size=20, phase_s=60.0
    )

    started = time.monotonic()
    result = await measure_bandwidth(http_relay.base_url, plan=plan, timeout_s=1.5)

    # Behaviour, not speed: the phases (a minute of 32 MB images) are cut to the 1.5 s limit the caller gave; 5 s leaves
    # a loaded machine room past the limit, and is still a twelfth of the uncut plan.
    assert time.monotonic() - started < 5
    assert result.download_mbps > 0 and result.upload_mbps > 0


async def test_a_relay_that_accepts_but_never_answers_gives_up_at_the_time_limit(resolved_hosts):
    held: list[asyncio.StreamWriter] = []

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # keep the connection open and say nothing

    server = await asyncio.start_server(stall, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    started = time.monotonic()
    try:
        with pytest.raises(BandwidthError):
            await measure_bandwidth(f"http://127.0.0.1:{port}", plan=QUICK, timeout_s=0.5)
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    # Behaviour, not speed: it gives up at the 0.5 s limit rather than waiting on a relay that never answers.
    assert time.monotonic() - started < 1.5


def test_a_plan_with_upload_sizes_speedtest_cli_cannot_fill_is_refused():
    with pytest.raises(ValueError, match=r"upload sizes \[65536\] would stall"):
        SpeedtestPlan(upload_bytes=(32_768, 65_536))


# ---------------------------------------------------------------- the relay's routes on their own


async def test_images_have_the_requested_size_and_identical_content_each_time(http_relay):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        url = f"{http_relay.base_url}/speedtest/speedtest/random750x750.jpg"
        first, second = [await (await session.get(url)).read() for _ in range(2)]
        too_big = await session.get(f"{http_relay.base_url}/speedtest/speedtest/random9999x9999.jpg")
        index = await (await session.get(f"{http_relay.base_url}/speedtest?x=1")).text()

    assert len(first) == image_bytes(750) and first == second
    assert too_big.status == 404
    assert 'uploadExtension: "php"' in index


async def test_upload_sink_counts_the_body_and_refuses_oversized_ones(http_relay, monkeypatch):
    import aiohttp

    monkeypatch.setattr(access.speedtest, "UPLOAD_CAP_BYTES", 150_000)
    url = f"{http_relay.base_url}/speedtest/speedtest/upload.php"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=b"x" * 100_000) as ok:
            assert ok.status == 200 and await ok.text() == "size=100000"
        async with session.post(url, data=b"x" * 200_000) as too_big:
            assert too_big.status == 413


async def test_an_upload_cut_off_mid_body_does_not_disturb_the_server(http_relay):
    host, port = http_relay.base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /speedtest/speedtest/upload.php HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
    writer.write(b"x" * 1000)
    await writer.drain()
    writer.close()
    await writer.wait_closed()

    result = await measure_bandwidth(http_relay.base_url, plan=QUICK, timeout_s=10)
    assert result.upload_mbps > 0

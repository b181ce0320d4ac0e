"""The relay's speed-test endpoint, limited per client address: a few transfers at once and a byte budget per
window; over either the client gets 429 with Retry-After and a text saying which limit, and agents are served on."""

from __future__ import annotations

import asyncio

import aiohttp

from access.speedtest import image_bytes
from agent.bandwidth import measure_bandwidth
from tests.access.conftest import eventually, heartbeat
from tests.support.prometheus import sample, samples

SIDE = 1000  # random1000x1000.jpg: 2 MB
BUDGET = 16 * image_bytes(SIDE)  # 32 MB per window: just over the largest image, the least the relay accepts


def image_url(relay, side: int = SIDE) -> str:
    return f"{relay.http_url}/speedtest/speedtest/random{side}x{side}.jpg"


async def test_a_client_looping_on_downloads_is_refused_with_429_once_its_bytes_are_spent(make_relay, master, pki, open_agent):
    relay = await make_relay(speedtest_bytes_per_window=BUDGET, speedtest_window_s=3600.0)
    served = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(40):  # far more than the budget covers: unlimited, this would serve 80 MB
            async with session.get(image_url(relay), ssl=pki.client_context()) as response:
                if response.status != 200:
                    refused, text, retry = response.status, await response.text(), response.headers.get("Retry-After")
                    break
                served += len(await response.read())
        else:
            raise AssertionError(f"served {served} bytes to one client and never refused")

    assert served == BUDGET
    assert refused == 429 and retry is not None and int(retry) >= 1
    assert "speed-test limit" in text and "bytes per 3600 s" in text
    metrics = relay.metrics.render()
    assert sample(metrics, "idlegrid_access_speedtest_bytes_total", direction="download") == BUDGET
    assert sample(metrics, "idlegrid_access_speedtest_refused_total", reason="bytes") == 1
    # the relay keeps serving agents meanwhile
    async with open_agent(relay, pki.agent()) as ws:
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(), "the agent's heartbeat relayed")


async def test_transfers_at_once_are_capped_per_client_address(make_relay, pki):
    relay = await make_relay(speedtest_transfers_per_ip=2)
    async with aiohttp.ClientSession() as session:
        # Two downloads of the largest image, their bodies left unread: both are still in progress.
        held = [await session.get(image_url(relay, 4000), ssl=pki.client_context()) for _ in range(2)]
        try:
            assert [r.status for r in held] == [200, 200]
            async with session.get(image_url(relay, 350), ssl=pki.client_context()) as third:
                assert third.status == 429 and "at most 2 transfers at once" in await third.text()
                assert third.headers["Retry-After"] == "1"
            async with session.get(f"{relay.http_url}/speedtest/speedtest/latency.txt", ssl=pki.client_context()) as probe:
                assert (probe.status, await probe.text()) == (200, "test=test")  # cheap routes are never limited
        finally:
            for response in held:
                response.close()
        await eventually(lambda: relay.http.speedtest_gate.transfers("127.0.0.1") == 0, "the held downloads to end")
        async with session.get(image_url(relay, 350), ssl=pki.client_context()) as later:
            assert later.status == 200 and len(await later.read()) == image_bytes(350)


async def test_uploads_count_against_the_same_byte_budget(make_relay, pki):
    relay = await make_relay(speedtest_bytes_per_window=BUDGET)
    url = f"{relay.http_url}/speedtest/speedtest/upload.php"
    chunk = b"x" * (BUDGET // 4)
    async with aiohttp.ClientSession() as session:
        statuses = []
        for _ in range(5):
            async with session.post(url, data=chunk, ssl=pki.client_context()) as response:
                statuses.append(response.status)
    assert statuses == [200, 200, 200, 200, 429]


async def test_a_whole_default_measurement_fits_in_the_default_limits(relay, pki):
    # speedtest-cli's mini mode, the plan the agent uses (up to 413 MB down and 58 MB up, 2 threads), against
    # the relay's real HTTPS endpoint: nothing refused, both directions measured.
    result = await measure_bandwidth(relay.http_url, ca_file=pki.ca_file, timeout_s=12)

    assert result.download_mbps > 0 and result.upload_mbps > 0
    metrics = relay.metrics.render()
    assert not samples(metrics, "idlegrid_access_speedtest_refused_total")
    assert (sample(metrics, "idlegrid_access_speedtest_bytes_total", direction="upload") or 0) > 0


async def test_two_addresses_have_separate_allowances(make_relay, pki):
    # 127.0.0.1 and 127.0.0.2 are both loopback on Linux: two clients, two budgets.
    relay = await make_relay(speedtest_bytes_per_window=BUDGET)
    port = relay.http.port

    async def fetch_all(address: str) -> list[int]:
        connector = aiohttp.TCPConnector(local_addr=(address, 0), ssl=pki.client_context())
        async with aiohttp.ClientSession(connector=connector) as session:
            url = f"https://127.0.0.1:{port}/speedtest/speedtest/random{SIDE}x{SIDE}.jpg"
            statuses = []
            for _ in range(17):
                async with session.get(url) as response:
                    await response.read()
                    statuses.append(response.status)
            return statuses

    first, second = await asyncio.gather(fetch_all("127.0.0.1"), fetch_all("127.0.0.2"))
    assert first == second == [200] * 16 + [429]

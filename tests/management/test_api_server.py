"""The API as the Master's process serves it (management/app.py): slow clients cut off, request metrics.

A raw socket plays the hostile client; aiohttp's own client plays everyone else.
"""

from __future__ import annotations

import asyncio
import math

import aiohttp
import pytest

from management.api import ApiSettings
from management.app import MasterServer
from master.config import MasterConfig
from tests.management.hosts import add_agent
from tests.support.prometheus import check_metrics

HEADER_TIMEOUT_S = 1.0
SLACK_S = 1.5  # the loop's timer granularity (aiohttp rounds timeouts over 5 s up) and a busy 2-core machine


class AuthedServer(MasterServer):
    """The server with the operator's Authorization header at hand."""

    auth: dict[str, str]


@pytest.fixture
async def server(tmp_path):
    server = AuthedServer(
        MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0), ApiSettings(header_timeout_s=HEADER_TIMEOUT_S)
    )
    await server.start()
    server.auth = {"Authorization": f"Bearer {server.operator_token_file.read_text().strip()}"}
    yield server
    await server.stop()


async def held_open_for(port: int, first: bytes, trickle: bytes, every_s: float, give_up_s: float) -> float:
    """Send ``first``, then one byte of ``trickle`` every ``every_s``; seconds until the server closed (inf: never).

    A ``408 Request Timeout`` before the close is what a server says of a head that came too late: allowed."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = loop.time()
    try:
        writer.write(first)
        to_send = list(trickle * 1000)
        while loop.time() - started < give_up_s:
            try:
                data = await asyncio.wait_for(reader.read(1024), every_s)
            except TimeoutError:
                if to_send:
                    writer.write(bytes([to_send.pop(0)]))
                    await writer.drain()
                continue
            if data.startswith(b"HTTP/1.1 408 "):
                continue  # the server's word that the head came too late; the close follows
            assert data == b"", f"the server answered a request it never fully got: {data[:80]!r}"
            return loop.time() - started
        return math.inf
    except (ConnectionResetError, BrokenPipeError):
        return loop.time() - started
    finally:
        writer.close()


async def test_a_client_trickling_its_headers_is_cut_off_while_others_are_served(server):
    async def others_served() -> list[int]:
        statuses = []
        async with aiohttp.ClientSession() as session:
            for _ in range(10):
                async with session.get(f"{server.api_url}/api/v1/agents", headers=server.auth) as response:
                    statuses.append(response.status)
                await asyncio.sleep(0.2)
        return statuses

    first = b"GET /api/v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    trickled, statuses = await asyncio.gather(
        held_open_for(server.api_port, first, b"X-Slow: yes\r\n", 0.2, give_up_s=HEADER_TIMEOUT_S + 10), others_served()
    )
    assert trickled <= HEADER_TIMEOUT_S + SLACK_S
    assert statuses == [200] * 10


async def test_a_connection_that_never_sends_a_request_is_closed_too(server):
    held = await held_open_for(server.api_port, b"", b"", 0.2, give_up_s=HEADER_TIMEOUT_S + 10)
    assert held <= HEADER_TIMEOUT_S + SLACK_S


async def test_api_requests_are_counted_by_route_pattern_and_status_never_by_raw_path(server):
    await add_agent(server.master, "agt-a", "a10:1")
    async with aiohttp.ClientSession(headers=server.auth) as session:
        for path in ("/api/v1/agents/agt-a", "/api/v1/agents/agt-b", "/api/v1/agents/agt-c", "/nothing/here/123"):
            async with session.get(f"{server.api_url}{path}"):
                pass
        async with session.request("PROPFIND", f"{server.api_url}/api/v1/agents"):
            pass
        async with session.get(f"{server.api_url}/metrics") as response:
            text = await response.text()
    assert 'idlegrid_api_requests_total{method="GET",route="/api/v1/agents/{agent_id}",status="200"} 1.0' in text
    assert 'idlegrid_api_requests_total{method="GET",route="/api/v1/agents/{agent_id}",status="404"} 2.0' in text
    assert 'idlegrid_api_request_seconds_bucket{le="0.05",method="GET",route="/api/v1/agents/{agent_id}",status="200"}' in text
    assert 'route="unmatched",status="404"' in text
    assert 'method="other"' in text
    assert "agt-b" not in text and "/nothing/here" not in text and "PROPFIND" not in text
    assert 'idlegrid_agents{region="eu-west",state="ready"} 1.0' in text  # the fleet gauges share the registry
    assert 'idlegrid_workloads{state="queued"} 0.0' in text  # and the market series


async def test_the_metrics_page_passes_promtool(server):
    async with aiohttp.ClientSession(headers=server.auth) as session:
        async with session.get(f"{server.api_url}/api/v1/gpus"):
            pass
        async with session.get(f"{server.api_url}/metrics") as response:
            body = await response.read()
    checked = check_metrics(body)
    assert checked.clean, checked.findings


async def test_an_offer_search_as_long_as_the_api_accepts_is_answered_by_the_api(server):
    """schemathesis found aiohttp refusing it before the API saw it (400, plain text): ``q`` takes 2000 characters,
    and 2000 "Ø" are 24000 bytes percent-encoded, past aiohttp's default 8190-byte request line."""
    async with aiohttp.ClientSession() as session:
        params = {"q": "Ø" * 2000}
        async with session.get(f"{server.api_url}/api/v1/offers", params=params, headers=server.auth) as response:
            assert response.content_type == "application/json"
            body = await response.json()
    assert (response.status, body["error"]["code"]) == (400, "bad_request"), body  # the query language refuses it

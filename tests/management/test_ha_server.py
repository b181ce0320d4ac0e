"""Two Masters with ``ha`` on, in this process, sharing one store and one state directory (docs/ha.md): the first to
take the lease serves; the other is a standby whose API answers 503 ``not_leader`` naming the leader, whose /healthz
says standby, and whose relay endpoint refuses relays with 4011 naming the leader's link. A clean stop hands over.

Both run on one SQLite file here (fast; the lease is the same code path); MongoDB is tests/e2e/test_failover.py."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from common.errors import Fenced
from common.pki import CertRole, client_tls_context
from common.wire import CLOSE_NOT_LEADER, PROTOCOL_VERSIONS, AccessHello, AccessWelcome, decode_link_frame, encode
from management.app import LEADER_HEADER, MasterServer
from management.endpoints.requests import RequestBook
from management.endpoints.spec import EndpointRecord, EndpointScaling, EndpointSpec
from management.http.errors import errors_middleware
from management.store import endpoint_repo
from master.authority import Authority
from master.config import MasterConfig
from master.port import CallOutcome, WorkerRef
from master.records import EventRecord


def ha_server(state_dir: Path, node: str) -> MasterServer:
    return MasterServer(
        MasterConfig(
            state_dir=str(state_dir),
            link_port=0,
            api_port=0,
            ha=True,
            node_id=node,
            lease_ttl_s=1.0,  # fast leases, so a takeover happens within the test
            lease_renew_s=0.2,
            lease_margin_s=0.3,
        )
    )


async def eventually(predicate: Callable[[], Awaitable[Any]], what: str, timeout: float = 5.0) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (value := await predicate()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
    return value


async def get(server: MasterServer, path: str, key: str = "") -> tuple[int, dict[str, str], Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{server.api_url}{path}", headers=headers) as response:
            return response.status, dict(response.headers), await response.json()


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[MasterServer, MasterServer]]:
    a, b = ha_server(tmp_path / "master", "master-a"), ha_server(tmp_path / "master", "master-b")
    started: list[MasterServer] = []
    try:
        await a.start()
        started.append(a)
        await eventually(lambda: _serves(a), "master-a to lead and serve")
        await b.start()
        started.append(b)
        await eventually(lambda: _knows_leader(b), "master-b to stand by, naming master-a")
        yield a, b
    finally:
        for server in started:
            await server.stop()


def relay_context(tmp_path: Path) -> ssl.SSLContext:
    """A relay's client TLS, its certificate from the pair's CA."""
    authority = Authority.open(tmp_path / "master")
    cert, key, ca = authority.write_server_identity(tmp_path / "relay", CertRole.ACCESS, "relay-1", names=("localhost",))
    return client_tls_context(ca, cert, key)


async def _is(server: MasterServer, role: str) -> bool:
    return server.master.role == role


async def _serves(server: MasterServer) -> bool:
    """Leads and has loaded the state it took over: what its API and relay links wait for."""
    return server.master.serves()


async def _knows_leader(server: MasterServer) -> bool:
    leadership = server.master.leadership
    return leadership is not None and leadership.role.value == "standby" and bool(leadership.leader_url())


async def test_the_standby_answers_healthz_as_standby_naming_the_leader(pair: tuple[MasterServer, MasterServer]) -> None:
    a, b = pair
    status, _, body = await get(b, "/healthz")
    assert status == 200
    assert (body["role"], body["ready"], body["leader"]) == ("standby", False, a.api_url)
    _, _, leader = await get(a, "/healthz")
    assert (leader["role"], leader["ready"], leader["leader"]) == ("leader", True, "")


async def test_the_standby_answers_every_api_route_503_not_leader_with_the_leaders_url(
    pair: tuple[MasterServer, MasterServer],
) -> None:
    a, b = pair
    key = a.operator_token_file.read_text().strip()
    assert (await get(a, "/api/v1/agents", key))[0] == 200
    for path in ("/api/v1/agents", "/api/v1/commands", "/metrics", "/api/v1/nowhere"):
        status, headers, body = await get(b, path, key)
        assert status == 503, path
        assert body["error"]["code"] == "not_leader" and body["error"]["leader"] == a.api_url
        assert headers[LEADER_HEADER] == a.api_url and headers["Retry-After"] == "1"


async def test_the_standby_refuses_a_relay_link_with_4011_naming_the_leaders_link(
    pair: tuple[MasterServer, MasterServer], tmp_path: Path
) -> None:
    a, b = pair
    async with connect(f"wss://127.0.0.1:{b.master.link_port}/link", ssl=relay_context(tmp_path)) as ws:
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert ws.close_code == CLOSE_NOT_LEADER
    assert ws.close_reason == f"wss://127.0.0.1:{a.master.link_port}/link"


async def test_a_clean_stop_of_the_leader_hands_over_to_the_standby_at_once(pair: tuple[MasterServer, MasterServer]) -> None:
    a, b = pair
    key = a.operator_token_file.read_text().strip()
    await a.stop()
    await eventually(lambda: _is(b, "leader"), "master-b to lead", timeout=2.0)  # released: no ttl to wait out
    await eventually(lambda: _serves(b), "master-b to load what it took over")  # leading comes before serving
    status, _, body = await get(b, "/api/v1/agents", key)
    assert status == 200, body
    lease = await b.master.store.leases.current()
    assert lease is not None and (lease.holder, lease.epoch) == ("master-b", 2)


async def test_a_leader_whose_lease_was_taken_steps_down_hands_its_relays_over_refuses_writes_and_answers_as_a_standby(
    pair: tuple[MasterServer, MasterServer], tmp_path: Path
) -> None:
    a, b = pair
    key = a.operator_token_file.read_text().strip()
    relay = await connect(f"wss://127.0.0.1:{a.master.link_port}/link", ssl=relay_context(tmp_path))
    await relay.send(encode(AccessHello(versions=list(PROTOCOL_VERSIONS), relay_id="relay-1", region="eu")), text=True)
    assert isinstance(decode_link_frame(await relay.recv()), AccessWelcome)
    # A third Master whose clock runs a minute ahead takes the lease (the skew docs/ha.md says must not happen).
    taken = await b.master.store.leases.acquire("master-c", "wss://c:7100/link", "http://c:7000", 60.0, time.time() + 60)
    assert taken is not None and taken.epoch == 2
    await eventually(lambda: _is(a, "stepped_down"), "master-a to step down")
    await asyncio.wait_for(relay.wait_closed(), 5)
    assert (relay.close_code, relay.close_reason) == (CLOSE_NOT_LEADER, "wss://c:7100/link")
    assert a.master.leadership is not None and a.master.leadership.deposed.is_set()
    with pytest.raises(Fenced):
        await a.master.store.events.append(EventRecord(ts=time.time(), kind="test.after", subject="a"))
    status, headers, body = await get(a, "/api/v1/agents", key)
    assert status == 503 and body["error"]["leader"] == "http://c:7000" == headers[LEADER_HEADER]
    assert b.master.role == "standby"


async def test_a_write_fenced_while_a_call_was_under_way_answers_503_fenced() -> None:
    """The call passed the standby gate, then the Master lost the lead before it wrote: retry at the leader."""

    async def handler(request: web.Request) -> web.Response:
        raise Fenced("Master master-a is stepped_down, not the leader (epoch 1): its store writes are refused")

    app = web.Application(middlewares=[errors_middleware])
    app.router.add_post("/api/v1/commands", handler)
    async with TestClient(TestServer(app)) as client:
        response = await client.post("/api/v1/commands")
        assert response.status == 503
        assert (await response.json())["error"]["code"] == "fenced"


async def test_endpoint_requests_and_bounds_survive_a_takeover_and_the_new_leader_hands_them_to_workers(
    pair: tuple[MasterServer, MasterServer],
) -> None:
    """Issue 39 point 5: what the leader's book stored is the next leader's, loaded when it takes over (the queued
    request in its place, the one in progress still its worker's), with each endpoint's bounds."""
    a, b = pair
    scaling = EndpointScaling(max_workers=2, concurrency=3)
    spec = EndpointSpec(name="echo", image="none", scaling=scaling, ttl_s=900.0, execution_timeout_s=300.0)
    await endpoint_repo(a.master.store).put(EndpointRecord(id="ep-ha", account="ana", spec=spec, created_at=1.0, updated_at=1.0))
    await a.composition.services.endpoints.load()  # as if made through the API (which keeps the bounds itself)
    book_a = book_of(a)
    running = await book_a.submit("ep-ha", {"n": 1}, account="ana")
    waiting = await book_a.submit("ep-ha", {"n": 2}, account="ana")
    worker = WorkerRef("ep-ha", "w-1", "agt-1")
    taken = await book_a.take(worker, 0)
    assert taken is not None and taken.id == running.id

    await a.stop()
    await eventually(lambda: _serves(b), "master-b to take over and load")
    book_b = book_of(b)
    assert b.composition.services.endpoints.limits_of("ep-ha").concurrency == 3
    held = await book_b.status(running.id)
    assert held is not None and (held.state, held.worker_id) == ("in_progress", "w-1")
    assert await book_b.result(worker, running.id, {"done": 1}) == CallOutcome.OK  # its worker finishes it on b
    again = await book_b.take(WorkerRef("ep-ha", "w-2", "agt-2"), 0)
    assert again is not None and again.id == waiting.id and again.input == {"n": 2}
    done = await book_b.status(running.id)
    assert done is not None and done.state == "completed"


def book_of(server: MasterServer) -> RequestBook:
    book = dict(server.composition.state)["endpoint requests"]
    assert isinstance(book, RequestBook)
    return book

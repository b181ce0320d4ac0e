"""The request routes (docs/endpoints.md, "The request routes") on a real Master server (SQLite, its loops running,
its HTTP API on a port): RunPod's shape for run, runsync, status, stream, cancel, retry and health; invocation keys
taken there and nowhere else; bodies bounded; webhooks through the egress rule; a deleted endpoint's requests ended.

The endpoint's worker is played through the composed book's worker calls (``take``, ``partial``, ``result``...), as
the Master calls them for a real worker's agent (tests/e2e/test_endpoint_workers.py runs real workers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from management.access_control import Action, Resource
from management.api.route import DeclarationError, Route
from management.api.routing import ROUTES
from management.app import MasterServer
from management.endpoints.queue import RequestState
from management.endpoints.requests import RequestBook
from management.services import endpoint_requests
from master.config import MasterConfig
from master.port import WorkerError, WorkerRef
from tests.management.hosts import api_key

SPEC: dict[str, Any] = {
    "name": "echo",
    "image": "none",
    "command": ["python", "handler.py"],
    "constraints": {"allow_process_runtime": True},
    "scaling": {"max_workers": 2, "concurrency": 2},
    "max_retries": 1,
}


@dataclass
class Receiver:
    """A webhook receiver on 127.0.0.1: answers each POST with the next status of ``statuses`` (then 200)."""

    url: str
    got: list[tuple[dict[str, str], Any]]
    statuses: list[int]
    arrived: asyncio.Event


@dataclass
class Grid:
    server: MasterServer
    http: aiohttp.ClientSession
    operator: dict[str, str]
    ana: dict[str, str]
    bo: dict[str, str]
    provider: dict[str, str]
    receiver: Receiver

    @property
    def book(self) -> RequestBook:
        book = dict(self.server.composition.state)["endpoint requests"]
        assert isinstance(book, RequestBook)
        return book

    async def call(self, method: str, path: str, headers: dict[str, str], **kw: Any) -> tuple[int, Any]:
        async with self.http.request(method, path, headers=headers, **kw) as answer:
            text = await answer.text()
            return answer.status, json.loads(text) if text else None

    async def endpoint(self, headers: dict[str, str], **overrides: Any) -> tuple[str, dict[str, str]]:
        """A new endpoint and the Authorization header of an invocation key of it."""
        status, made = await self.call("POST", "/api/v1/endpoints", headers, json=SPEC | overrides)
        assert status == 201, made
        status, key = await self.call("POST", f"/api/v1/endpoints/{made['id']}/keys", headers, json={"name": "ci"})
        assert status == 201, key
        return made["id"], {"Authorization": f"Bearer {key['key']}"}


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    got: list[tuple[dict[str, str], Any]] = []
    statuses: list[int] = []
    arrived = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        got.append((dict(request.headers), await request.json()))
        arrived.set()
        return web.Response(status=statuses.pop(0) if statuses else 200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield Receiver(f"http://127.0.0.1:{port}/hook", got, statuses, arrived)
    await runner.cleanup()


@pytest.fixture
async def grid(tmp_path: Path, receiver: Receiver) -> AsyncIterator[Grid]:
    port = receiver.url.split(":")[2].split("/")[0]
    # The receiver is on loopback, which the egress rule refuses unless the operator allows it by name.
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0, egress_allow=[f"127.0.0.1:{port}"])
    server = MasterServer(config)
    await server.start()
    try:
        operator = {"Authorization": f"Bearer {server.operator_token_file.read_text().strip()}"}
        async with aiohttp.ClientSession(server.api_url) as http:
            yield Grid(
                server,
                http,
                operator,
                await api_key(server.master, "renter", "ana"),
                await api_key(server.master, "renter", "bo"),
                await api_key(server.master, "provider", "acme"),
                receiver,
            )
    finally:
        await server.stop()


def worker(endpoint_id: str, name: str = "w1") -> WorkerRef:
    return WorkerRef(endpoint_id, name, "agent-1")


async def test_a_request_runs_and_its_status_answers_in_runpods_shape(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    status, ran = await grid.call("POST", f"/api/v1/endpoints/{endpoint}/run", key, json={"input": {"prompt": "hi"}})
    assert status == 200, ran
    assert ran["status"] == "IN_QUEUE" and ran["id"].startswith("req-")
    assert set(ran) == {"id", "status", "attempt"}  # what a request does not have yet is left out
    rid = ran["id"]
    path = f"/api/v1/endpoints/{endpoint}/status/{rid}"
    assert (await grid.call("GET", path, key))[1]["status"] == "IN_QUEUE"

    w1 = worker(endpoint)
    taken = await grid.book.take(w1, 0)
    assert taken is not None and (taken.id, taken.input) == (rid, {"prompt": "hi"})
    await grid.book.progress(w1, rid, {"step": 1})
    status, running = await grid.call("GET", path, key)
    assert running["status"] == "IN_PROGRESS" and running["progress"] == {"step": 1}
    assert isinstance(running["delayTime"], int) and "executionTime" not in running
    status, health = await grid.call("GET", f"/api/v1/endpoints/{endpoint}/health", key)
    assert status == 200 and health["jobs"]["inProgress"] == 1 and health["workers"] == {"ready": 1, "running": 1, "idle": 0}

    await grid.book.result(w1, rid, {"echo": "hi"})
    status, done = await grid.call("GET", path, key)
    assert status == 200 and done["status"] == "COMPLETED" and done["output"] == {"echo": "hi"}
    assert isinstance(done["executionTime"], int) and "error" not in done

    await grid.call("POST", f"/api/v1/endpoints/{endpoint}/run", key, json={"input": 2})
    failing = await grid.book.take(w1, 0)
    assert failing is not None
    await grid.book.error(w1, failing.id, WorkerError("ValueError", "no such prompt", "Traceback ..."))
    status, failed = await grid.call("GET", f"/api/v1/endpoints/{endpoint}/status/{failing.id}", key)
    assert failed["status"] == "FAILED" and failed["error"] == "ValueError: no such prompt"
    assert failed["errorDetail"] == {"type": "ValueError", "message": "no such prompt", "traceback": "Traceback ..."}
    status, health = await grid.call("GET", f"/api/v1/endpoints/{endpoint}/health", key)
    assert health["jobs"] == {"inQueue": 0, "inProgress": 0, "completed": 1, "failed": 1, "cancelled": 0, "timedOut": 0}


async def test_runsync_waits_for_the_output_and_answers_the_status_so_far_when_the_wait_ends_first(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    status, pending = await grid.call("POST", f"/api/v1/endpoints/{endpoint}/runsync?wait=50", key, json={"input": 1})
    assert status == 200 and pending["status"] == "IN_QUEUE"  # no worker within 50 ms: the status so far

    waiting = asyncio.create_task(grid.call("POST", f"/api/v1/endpoints/{endpoint}/runsync", key, json={"input": "x"}))
    w1 = worker(endpoint)
    taken = [await grid.book.take(w1, 5), await grid.book.take(w1, 5)]
    mine = next(t for t in taken if t is not None and t.input == "x")
    await grid.book.partial(w1, mine.id, 0, "part")
    await grid.book.result(w1, mine.id, {"upper": "X"})
    status, done = await asyncio.wait_for(waiting, 30)
    assert status == 200 and (done["id"], done["status"], done["output"]) == (mine.id, "COMPLETED", {"upper": "X"})

    for bad in ("wait=-1", "wait=300001", "wait=soon", "timeout=1"):
        status, refused = await grid.call("POST", f"/api/v1/endpoints/{endpoint}/runsync?{bad}", key, json={"input": 1})
        assert status == 400, (bad, refused)


async def test_a_stream_answers_the_partial_outputs_after_those_already_read(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    rid = (await grid.call("POST", f"/api/v1/endpoints/{endpoint}/run", key, json={"input": 3}))[1]["id"]
    stream = f"/api/v1/endpoints/{endpoint}/stream/{rid}"
    assert (await grid.call("GET", f"{stream}?wait=0", key))[1] == {"id": rid, "status": "IN_QUEUE", "stream": []}
    w1 = worker(endpoint)
    await grid.book.take(w1, 0)
    await grid.book.partial(w1, rid, 0, "a")
    await grid.book.partial(w1, rid, 1, {"b": 2})
    status, first = await grid.call("GET", stream, key)
    assert status == 200 and first["status"] == "IN_PROGRESS"
    assert first["stream"] == [{"output": "a", "seq": 0}, {"output": {"b": 2}, "seq": 1}]
    assert (await grid.call("GET", f"{stream}?wait=0", key))[1]["stream"] == []  # read already

    later = asyncio.create_task(grid.call("GET", f"{stream}?wait=20000", key))  # a long poll, woken by the next one
    await asyncio.sleep(0.1)
    await grid.book.partial(w1, rid, 2, "c")
    assert (await asyncio.wait_for(later, 30))[1]["stream"] == [{"output": "c", "seq": 2}]
    assert [i["seq"] for i in (await grid.call("GET", f"{stream}?after=0&wait=0", key))[1]["stream"]] == [1, 2]

    await grid.book.result(w1, rid, "abc")
    for _ in range(2):  # ended, and every output read already: nothing more, however often it is asked
        assert (await grid.call("GET", stream, key))[1] == {"id": rid, "status": "COMPLETED", "stream": []}
    assert (await grid.call("GET", f"{stream}?after=-2", key))[0] == 400


async def test_cancel_and_retry_follow_the_requests_state(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    base = f"/api/v1/endpoints/{endpoint}"
    rid = (await grid.call("POST", f"{base}/run", key, json={"input": 1}))[1]["id"]
    status, retried_open = await grid.call("POST", f"{base}/retry/{rid}", key)
    assert status == 409 and "queued" in retried_open["error"]["message"]
    status, cancelled = await grid.call("POST", f"{base}/cancel/{rid}", key)
    assert status == 200 and cancelled["status"] == "CANCELLED" and cancelled["reason"] == "cancelled"
    assert (await grid.call("POST", f"{base}/cancel/{rid}", key))[0] == 409
    status, again = await grid.call("POST", f"{base}/retry/{rid}", key)
    assert status == 200 and (again["status"], again["attempt"]) == ("IN_QUEUE", 2)

    w1 = worker(endpoint)
    taken = await grid.book.take(w1, 0)
    assert taken is not None and taken.attempt == 2
    status, cancelled = await grid.call("POST", f"{base}/cancel/{rid}", key)
    assert cancelled["status"] == "CANCELLED"
    assert await grid.book.heartbeat(w1, [rid]) == [rid]  # its worker learns it at its next heartbeat
    await grid.call("POST", f"{base}/retry/{rid}", key)
    await grid.book.take(w1, 0)
    await grid.book.result(w1, rid, "ok")
    status, refused = await grid.call("POST", f"{base}/retry/{rid}", key)
    assert status == 409 and "completed" in refused["error"]["message"]


async def test_invocation_keys_open_their_own_endpoints_request_routes_and_nothing_else(grid: Grid) -> None:
    a, key_a = await grid.endpoint(grid.ana, name="a")
    b, key_b = await grid.endpoint(grid.ana, name="b")
    rid_a = (await grid.call("POST", f"/api/v1/endpoints/{a}/run", key_a, json={"input": 1}))[1]["id"]
    rid_b = (await grid.call("POST", f"/api/v1/endpoints/{b}/run", key_b, json={"input": 1}))[1]["id"]
    routes = [
        ("POST", "run", {"input": 1}),
        ("POST", "runsync?wait=0", {"input": 1}),
        ("GET", f"status/{rid_b}", None),
        ("GET", f"stream/{rid_b}?wait=0", None),
        ("POST", f"cancel/{rid_b}", None),
        ("POST", f"retry/{rid_b}", None),
        ("GET", "health", None),
    ]
    for method, tail, body in routes:
        status, refused = await grid.call(method, f"/api/v1/endpoints/{b}/{tail}", key_a, json=body)
        assert status == 403 and f"invokes endpoint {a} only" in refused["error"]["message"], (tail, refused)
    assert (await grid.call("GET", f"/api/v1/endpoints/{b}/status/{rid_b}", key_b))[0] == 200
    # A request id of another endpoint is not found on this one, whoever asks.
    for headers in (key_a, grid.ana, grid.operator):
        assert (await grid.call("GET", f"/api/v1/endpoints/{a}/status/{rid_b}", headers))[0] == 404
        assert (await grid.call("POST", f"/api/v1/endpoints/{a}/cancel/{rid_b}", headers))[0] == 404

    # The owner's API key and the operator's work as RunPod's users' API keys do; another renter's finds nothing.
    for headers in (grid.ana, grid.operator):
        assert (await grid.call("GET", f"/api/v1/endpoints/{a}/status/{rid_a}", headers))[0] == 200
    assert (await grid.call("GET", f"/api/v1/endpoints/{a}/status/{rid_a}", grid.bo))[0] == 404
    assert (await grid.call("POST", f"/api/v1/endpoints/{a}/run", grid.bo, json={"input": 1}))[0] == 404
    assert (await grid.call("GET", f"/api/v1/endpoints/{a}/health", grid.provider))[0] == 403

    # Every other route, the endpoint's own included, still answers an invocation key 401.
    for method, path in [
        ("GET", f"/api/v1/endpoints/{a}"),
        ("GET", f"/api/v1/endpoints/{a}/keys"),
        ("POST", f"/api/v1/endpoints/{a}/keys"),
        ("DELETE", f"/api/v1/endpoints/{a}"),
        ("GET", "/api/v1/endpoints"),
        ("GET", "/api/v1/whoami"),
        ("POST", "/api/v1/workloads"),
    ]:
        status, _ = await grid.call(method, path, key_a, json={} if method == "POST" else None)
        assert status == 401, (method, path)

    for wrong in ("Bearer igek_never-issued", "Bearer igak_not-a-key", "Basic abc", ""):
        status, refused = await grid.call("GET", f"/api/v1/endpoints/{a}/health", {"Authorization": wrong})
        assert status == 401, (wrong, refused)
    # A disabled owner's keys are refused as its API keys are (403), and work again once it is enabled.
    for disabled, status in ((True, 403), (False, 200)):
        changed, _ = await grid.call("PATCH", "/api/v1/accounts/ana", grid.operator, json={"disabled": disabled})
        assert changed == 200
        assert (await grid.call("GET", f"/api/v1/endpoints/{a}/health", key_a))[0] == status
    key_id = (await grid.call("GET", f"/api/v1/endpoints/{a}/keys", grid.ana))[1]["items"][0]["id"]
    await grid.call("POST", f"/api/v1/endpoints/{a}/keys/{key_id}/revoke", grid.ana)
    status, refused = await grid.call("GET", f"/api/v1/endpoints/{a}/health", key_a)
    assert status == 401 and "was revoked" in refused["error"]["message"]


async def _raw(grid: Grid, head: str, body: bytes = b"", *, more: bytes = b"") -> tuple[int, bytes]:
    """Send ``head`` and ``body`` on a raw connection (``more`` is never sent: the server must answer first)."""
    host, port = grid.server.api_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode() + body)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
        rest = await asyncio.wait_for(reader.read(65536), 30)
        return int(line.split()[1]), rest
    finally:
        writer.close()


async def test_bodies_are_bounded_and_bad_input_is_refused_while_the_server_keeps_serving(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    run = f"/api/v1/endpoints/{endpoint}/run"
    too_large = {"input": "x" * (1 << 20)}  # its JSON is 2 bytes over 1 MiB: the body fits, the input does not
    status, refused = await grid.call("POST", run, key, json=too_large)
    assert status == 413 and refused["error"]["code"] == "request_too_large", refused
    assert "1048576 bytes" in refused["error"]["message"]

    # A body past the bound is refused from its Content-Length, before the body is sent at all.
    head = f"POST {run} HTTP/1.1\r\nHost: x\r\nAuthorization: {key['Authorization']}\r\nContent-Type: application/json\r\n"
    status, said = await _raw(grid, head + "Content-Length: 50000000\r\nConnection: close\r\n\r\n", b'{"input": "')
    assert status == 413 and b"request_too_large" in said
    # Chunked, with no length given: refused once past the bound, while the rest is still to come.
    chunk = b"x" * (64 << 10)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(18))  # 1.125 MiB
    status, said = await _raw(grid, head + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n", chunks)
    assert status == 413 and b"request_too_large" in said

    for body, says in [
        (b'{"input": ', "not valid JSON"),
        (b"{}", "input"),
        (b'{"prompt": "no input"}', "prompt"),
        (b'{"input": 1, "inputs": 2}', "inputs"),
        (b'{"input": 1, "webhook": 5}', "webhook"),
        (b"[1, 2]", "body"),
    ]:
        status, refused = await grid.call("POST", run, key, data=body)
        assert status == 400 and says in refused["error"]["message"], (body, refused)
    status, ran = await grid.call("POST", run, key, json={"input": None})
    assert status == 200 and ran["status"] == "IN_QUEUE"  # null is an input like any other


async def test_a_webhook_gets_the_status_answer_once_the_request_ends_through_the_egress_rule(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    run = f"/api/v1/endpoints/{endpoint}/run"
    hooked = {"input": 1, "webhook": grid.receiver.url}
    rid = (await grid.call("POST", run, key, json=hooked))[1]["id"]
    assert grid.receiver.got == []  # nothing until it ends
    w1 = worker(endpoint)
    await grid.book.take(w1, 0)
    grid.receiver.statuses.append(503)  # the first attempt is answered 503: tried again
    await grid.book.result(w1, rid, {"done": True})
    for _ in range(2):
        await asyncio.wait_for(grid.receiver.arrived.wait(), 30)
        grid.receiver.arrived.clear()
    (headers, first), (_, second) = grid.receiver.got
    assert first == second == {"id": rid, "status": "COMPLETED", "output": {"done": True}, "delayTime": first["delayTime"],
                               "executionTime": first["executionTime"], "attempt": 1}  # fmt: skip
    assert headers["X-Idlegrid-Request"] == rid

    # Targets the rule refuses are refused at /run, checked without connecting: loopback on another port, private
    # and link-local addresses, names for this machine, credentials, other schemes.
    for url in [
        "http://127.0.0.1:9/hook",
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://localhost/hook",
        "http://[::1]/hook",
        "http://user:pw@hooks.example.com/",
        "ftp://hooks.example.com/",
        "https://hooks.example.com/" + "x" * 2100,
    ]:
        status, refused = await grid.call("POST", run, key, json={"input": 1, "webhook": url})
        assert status == 400, (url, refused)
    assert grid.book.open_of(endpoint) == []  # none of them was queued


async def test_deleting_an_endpoint_ends_its_open_requests_and_their_waiters(grid: Grid) -> None:
    endpoint, key = await grid.endpoint(grid.ana)
    base = f"/api/v1/endpoints/{endpoint}"
    queued = (await grid.call("POST", f"{base}/run", key, json={"input": 1}))[1]["id"]
    waiting = asyncio.create_task(grid.call("POST", f"{base}/runsync", key, json={"input": 2}))
    w1 = worker(endpoint)
    taken = await grid.book.take(w1, 5)
    assert taken is not None and taken.id == queued

    async def both_open() -> None:
        while len(grid.book.open_of(endpoint)) < 2:  # the runsync's request has arrived
            await asyncio.sleep(0.01)

    await asyncio.wait_for(both_open(), 30)
    assert (await grid.call("DELETE", base, grid.ana))[0] == 200
    status, ended = await asyncio.wait_for(waiting, 30)
    assert status == 200 and ended["status"] == "CANCELLED"  # the waiter was not left to its 90 s
    assert grid.book.open_of(endpoint) == []
    stored = await grid.book.status(queued)
    assert stored is not None and stored.state == RequestState.CANCELLED
    assert await grid.book.heartbeat(w1, [queued]) == [queued]  # its worker drops it
    assert (await grid.call("GET", f"{base}/status/{queued}", grid.ana))[0] == 404
    assert (await grid.call("GET", f"{base}/health", key))[0] == 401  # its keys went with it


def test_only_a_route_naming_an_endpoint_may_take_its_invocation_keys() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    taking = {(r.method, r.path) for r in ROUTES if r.invocation}
    assert taking == {
        ("POST", "/api/v1/endpoints/{endpoint_id}/run"),
        ("POST", "/api/v1/endpoints/{endpoint_id}/runsync"),
        ("GET", "/api/v1/endpoints/{endpoint_id}/status/{request_id}"),
        ("GET", "/api/v1/endpoints/{endpoint_id}/stream/{request_id}"),
        ("POST", "/api/v1/endpoints/{endpoint_id}/cancel/{request_id}"),
        ("POST", "/api/v1/endpoints/{endpoint_id}/retry/{request_id}"),
        ("GET", "/api/v1/endpoints/{endpoint_id}/health"),
    }
    for path, resource, action in [("/api/v1/workloads", Resource.ENDPOINTS, Action.READ), ("/api/v1/endpoints/{x}", None, None)]:
        with pytest.raises(DeclarationError, match="invocation key"):
            Route("GET", path, handler, resource, action, "s", {200: None}, tag="t", invocation=True)


async def test_an_endpoints_open_requests_are_bounded_and_a_full_queue_answers_429(grid: Grid, monkeypatch) -> None:
    monkeypatch.setattr(endpoint_requests, "MAX_OPEN_REQUESTS", 2)
    endpoint, key = await grid.endpoint(grid.ana)
    run = f"/api/v1/endpoints/{endpoint}/run"
    first = (await grid.call("POST", run, key, json={"input": 1}))[1]["id"]
    assert (await grid.call("POST", run, key, json={"input": 2}))[0] == 200
    status, refused = await grid.call("POST", run, key, json={"input": 3})
    assert status == 429 and refused["error"]["code"] == "queue_full"
    assert f"endpoint {endpoint} holds 2 open requests" in refused["error"]["message"]
    other, other_key = await grid.endpoint(grid.ana, name="other")  # each endpoint its own bound
    assert (await grid.call("POST", f"/api/v1/endpoints/{other}/run", other_key, json={"input": 1}))[0] == 200
    await grid.call("POST", f"/api/v1/endpoints/{endpoint}/cancel/{first}", key)
    assert (await grid.call("POST", run, key, json={"input": 3}))[0] == 200  # one ended: room again
    assert (await grid.call("POST", f"/api/v1/endpoints/{endpoint}/retry/{first}", key))[0] == 429  # a retry counts too

    monkeypatch.setattr(endpoint_requests, "MAX_OPEN_REQUESTS", 100)
    monkeypatch.setattr(endpoint_requests, "MAX_OPEN_INPUT_CHARS", 1000)
    assert (await grid.call("POST", run, key, json={"input": "x" * 1000}))[0] == 200
    status, refused = await grid.call("POST", run, key, json={"input": 4})
    assert status == 429 and "characters of input" in refused["error"]["message"]


async def test_requests_leave_no_audit_event_and_what_changes_an_endpoint_does(grid: Grid) -> None:
    """An endpoint's request routes are not audited per request (its record is its trail), whoever calls them; making
    the endpoint and its key are audited as any change."""
    endpoint_id, key = await grid.endpoint(grid.ana, name="audited")
    for headers in (key, grid.ana):
        status, ran = await grid.call("POST", f"/api/v1/endpoints/{endpoint_id}/run", headers, json={"input": 1})
        assert status == 200, ran
        assert (await grid.call("POST", f"/api/v1/endpoints/{endpoint_id}/cancel/{ran['id']}", headers))[0] == 200
    status, events = await grid.call("GET", "/api/v1/events?kind=audit&limit=1000", grid.operator)
    assert status == 200
    routes = [e["data"]["route"] for e in events["items"] if e["kind"] == "audit"]
    assert "/api/v1/endpoints" in routes and "/api/v1/endpoints/{endpoint_id}/keys" in routes
    assert not [r for r in routes if r.endswith(("/run", "/runsync", "/cancel/{request_id}"))], routes


async def test_a_requests_own_policy_shortens_its_bounds_and_may_not_widen_the_endpoints(grid: Grid) -> None:
    """RunPod's per-request ``policy`` (ms): each bound at most the endpoint's, kept on the request, which the sweep
    reads; past the endpoint's, or of a field RunPod's policy does not have here, a 400 that says which."""
    endpoint, key = await grid.endpoint(grid.ana, execution_timeout_s=600, ttl_s=3600)
    run = f"/api/v1/endpoints/{endpoint}/run"
    status, ran = await grid.call("POST", run, key, json={"input": 1, "policy": {"executionTimeout": 1500, "ttl": 60_000}})
    assert status == 200, ran
    rec = await grid.book.status(ran["id"])
    assert rec is not None and (rec.execution_timeout_s, rec.ttl_s) == (1.5, 60.0)
    status, ran = await grid.call("POST", run, key, json={"input": 2, "policy": {"ttl": 120_000}})
    rec = await grid.book.status(ran["id"])
    assert rec is not None and (rec.execution_timeout_s, rec.ttl_s) == (600.0, 120.0)  # the one not given: the endpoint's
    status, ran = await grid.call("POST", run, key, json={"input": 3})
    rec = await grid.book.status(ran["id"])
    assert rec is not None and (rec.execution_timeout_s, rec.ttl_s) == (600.0, 3600.0)

    for policy, says in [
        ({"executionTimeout": 601_000}, "policy.executionTimeout is 601000 ms, past this endpoint's execution_timeout_s (600 s)"),
        ({"ttl": 7_200_000}, "policy.ttl is 7200000 ms, past this endpoint's ttl_s (3600 s)"),
        ({"executionTimeout": 0}, "executionTimeout"),
        ({"lowPriority": True}, "lowPriority"),
    ]:
        status, refused = await grid.call(
            "POST", f"/api/v1/endpoints/{endpoint}/runsync", key, json={"input": 4, "policy": policy}
        )
        assert status == 400 and says in refused["error"]["message"], (policy, refused)
    assert grid.book.open_load(endpoint)[0] == 3  # the refused ones queued nothing

"""Endpoint requests end to end: real processes (the Master with its request book, a relay, agents with the process
runtime), the real handler library in each worker container, the worker API on a unix socket the agent serves, the
calls carried over the host link to the Master's book, and the renters' requests sent over HTTP with the endpoints'
invocation keys (docs/endpoints.md, "The request routes").

The workers are started here by raw ``create_container`` commands whose spec names the endpoint (``endpoint_worker``):
the autoscaler's shell, which will start them, is another part of issue 39."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.endpoint_worker.client import RequestGone, TokenRefused, WorkerAPI
from common.inventory import HostInfo
from common.wire import WorkerCall, WorkerOp, encode
from management.client.api import ApiClient, ApiRequest
from management.devgrid.carried_worker import CODE_ENV, SYSTEM_PYTHON, carrying, worker_zip
from tests.e2e.test_hostile_agent import enroll_hostile, hostile_link
from tests.support.grid import REPO, Grid, wait_for

HOST = HostInfo(
    hostname="second", cpu_model="x", cpu_cores=1, ram_mib=1024, disk_total_gib=1, disk_free_gib=1, os="linux", kernel="6"
)
# One handler for every case, chosen by the input: an echo, a generator streamed, a request that runs until cancelled,
# and one that fails its first attempt.
HANDLER = """
import time
from common.endpoint_worker import serve


def handler(request):
    given = request.input
    kind = given.get("kind") if isinstance(given, dict) else None
    if kind == "stream":
        def tokens():
            for i in range(given["n"]):
                yield {"token": i}
                time.sleep(0.05)
            return {"tokens": given["n"]}
        return tokens()
    if kind == "slow":
        while not request.cancelled:
            time.sleep(0.05)
        return "stopped"
    if kind == "fail_first" and request.attempt == 1:
        raise ValueError("the first attempt fails")
    return {"echo": given}


serve(handler)
"""
# A sandboxed worker sees none of the host's /tmp (a fresh tmpfs there), where a CI's clone may lie: it carries the
# library as an image would, here a zip in its environment written to its working directory and imported from there.
LIBRARY_ENV = CODE_ENV
CARRIED_HANDLER = carrying("from idlegrid_worker import serve; serve(lambda request: {'echo': request.input})")
ENDPOINT = {"image": "none", "command": ["python3", "handler.py"], "constraints": {"allow_process_runtime": True}}


def _library_zip() -> str:
    """common/endpoint_worker/ as the package ``idlegrid_worker`` in a zip, base64 (its imports are relative)."""
    return worker_zip(echo_worker=False)


class Endpoint:
    """An endpoint made through the API (as the operator, for renter ana) and one invocation key of it."""

    def __init__(self, grid: Grid, name: str, **spec: Any) -> None:
        status, made = grid.call("POST", "/api/v1/endpoints", ENDPOINT | {"name": name, "account": "ana"} | spec)
        assert status == 201, made
        self.id: str = made["id"]
        status, key = grid.call("POST", f"/api/v1/endpoints/{self.id}/keys", {"name": "client"})
        assert status == 201, key
        self.key: str = key["key"]
        self.client = ApiClient(grid.api_url, self.key)

    def call(self, method: str, tail: str, body: Any = None, *, endpoint: str | None = None) -> tuple[int, Any]:
        """One request route, with this endpoint's key (on ``endpoint``'s path when given)."""
        return self.client.exchange(ApiRequest(method, f"/api/v1/endpoints/{endpoint or self.id}/{tail}", body=body))

    def run(self, value: Any) -> str:
        status, ran = self.call("POST", "run", {"input": value})
        # IN_PROGRESS when a worker's take was waiting: the request went straight to it
        assert status == 200 and ran["status"] in ("IN_QUEUE", "IN_PROGRESS"), ran
        return str(ran["id"])

    def status(self, request_id: str) -> dict[str, Any]:
        status, answer = self.call("GET", f"status/{request_id}")
        assert status == 200, answer
        return dict(answer)

    def ended(self, request_id: str, timeout: float = 30) -> dict[str, Any]:
        open_states = ("IN_QUEUE", "IN_PROGRESS")
        return wait_for(
            lambda: (s := self.status(request_id))["status"] not in open_states and s, timeout, f"{request_id} to end"
        )


@pytest.fixture
def endpoint_grid(tmp_path: Path) -> Iterator[Grid]:
    """A grid with no host yet: the endpoints are made first, while nothing says their workers could never run here (the
    tests' hosts isolate nothing, so the scheduler would not place a renter's work on them; these workers are started
    by hand)."""
    g = Grid(tmp_path / "grid")
    try:
        g.start_master()
        g.start_relay("relay-1", "eu-west")
        assert g.client.create_account("ana", "renter")["id"] == "ana"
        yield g
    finally:
        g.stop()


def _worker_spec(name: str, endpoint_id: str, worker_id: str, token: str, python: str = sys.executable) -> dict[str, Any]:
    return {
        "name": name,
        "image": "none",
        "command": [python, "-c", HANDLER],
        "env": {"PYTHONPATH": str(REPO), "IDLEGRID_WORKER_HEARTBEAT_S": "0.5"},
        "endpoint_worker": {"endpoint_id": endpoint_id, "worker_id": worker_id, "token": token},
    }


def _start_worker(grid: Grid, agent_id: str, spec: dict[str, Any]) -> None:
    created = grid.wait_command(grid.command(agent_id, "create_container", spec))
    assert created["state"] == "succeeded", created


def _socket_of(grid: Grid, host: str, container: str) -> Path:
    [api] = [p for p in grid.agent_dir(host).rglob("api.sock") if p.parent.name == container]
    return api


def test_requests_run_stream_cancel_retry_and_expire_each_endpoint_on_its_own_workers(endpoint_grid):
    grid = endpoint_grid
    a, b = Endpoint(grid, "a"), Endpoint(grid, "b")
    idle = Endpoint(grid, "idle", ttl_s=2, execution_timeout_s=1)  # no worker: its requests wait, then time out
    agent_id, daemon = grid.run_agent("ep-host", simulate="a10:1")
    _start_worker(grid, agent_id, _worker_spec("a-w1", a.id, "w-a", "token-of-w-a-0123456789"))
    _start_worker(grid, agent_id, _worker_spec("b-w1", b.id, "w-b", "token-of-w-b-0123456789"))

    # run + status: each endpoint's request on its own worker.
    first, second = a.run({"prompt": "for a"}), b.run({"prompt": "for b"})
    done = a.ended(first)
    assert done["status"] == "COMPLETED" and done["output"] == {"echo": {"prompt": "for a"}}, f"{done}\n{daemon.tail()}"
    assert b.ended(second)["output"] == {"echo": {"prompt": "for b"}}

    # runsync: the output in the answer.
    status, synced = a.call("POST", "runsync?wait=30000", {"input": [1, 2, 3]})
    assert status == 200 and (synced["status"], synced["output"]) == ("COMPLETED", {"echo": [1, 2, 3]}), synced

    # A generator handler, streamed: every partial once, in order, then the result.
    streamed = a.run({"kind": "stream", "n": 5})
    items: list[Any] = []
    while True:
        status, page = a.call("GET", f"stream/{streamed}?wait=5000")
        assert status == 200, page
        items += [item["output"] for item in page["stream"]]
        if page["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            break
    assert page["status"] == "COMPLETED" and items == [{"token": i} for i in range(5)]
    assert a.status(streamed)["output"] == {"tokens": 5}

    # cancel: the running request ends at once, its worker drops it at its next heartbeat and takes the next one.
    slow = a.run({"kind": "slow"})
    wait_for(lambda: a.status(slow)["status"] == "IN_PROGRESS", 20, "the slow request to start")
    status, cancelled = a.call("POST", f"cancel/{slow}")
    assert status == 200 and cancelled["status"] == "CANCELLED"
    after = a.run("after the cancel")
    assert a.ended(after)["output"] == {"echo": "after the cancel"}  # the worker (concurrency 1) was freed
    assert a.status(slow)["status"] == "CANCELLED"  # its late result changed nothing

    # retry: a failed request runs again as attempt 2.
    flaky = a.run({"kind": "fail_first"})
    failed = a.ended(flaky)
    assert failed["status"] == "FAILED" and failed["error"] == "ValueError: the first attempt fails"
    status, again = a.call("POST", f"retry/{flaky}")
    assert status == 200 and (again["status"], again["attempt"]) == ("IN_QUEUE", 2)
    assert a.ended(flaky) | {"delayTime": 0, "executionTime": 0} == {
        "id": flaky, "status": "COMPLETED", "attempt": 2, "output": {"echo": {"kind": "fail_first"}},
        "delayTime": 0, "executionTime": 0,
    }  # fmt: skip

    # TTL: a request no worker takes ends TIMED_OUT with the reason.
    waiting = idle.run("nobody takes this")
    expired = idle.ended(waiting, timeout=30)
    assert expired["status"] == "TIMED_OUT" and expired["reason"] == "ttl", expired

    # Keys of one endpoint are refused on another's routes, and another endpoint's request is not found.
    status, refused = a.call("GET", f"status/{second}", endpoint=b.id)
    assert status == 403 and f"invokes endpoint {a.id} only" in refused["error"]["message"]
    assert a.call("GET", f"status/{second}")[0] == 404
    assert a.call("POST", "run", {"input": 1}, endpoint=b.id)[0] == 403
    assert grid.call("GET", f"/api/v1/endpoints/{a.id}", None)[0] == 200  # (the operator's key)
    assert a.client.exchange(ApiRequest("GET", f"/api/v1/endpoints/{a.id}"))[0] == 401  # no other route

    status, health = a.call("GET", "health")
    assert status == 200 and health["jobs"]["completed"] == 5 and health["workers"]["ready"] == 1, health


def test_a_hostile_worker_of_one_endpoint_never_gets_anothers_requests(endpoint_grid):
    """B's worker (played by this test, with B's real token on B's real socket) asks for work while A's requests wait:
    it gets none of them, its reports on A's requests are refused, and A's socket refuses B's token; A's own worker,
    started afterwards, takes and completes them."""
    grid = endpoint_grid
    a, b = Endpoint(grid, "a"), Endpoint(grid, "b")
    agent_id, daemon = grid.run_agent("ep-host", simulate="a10:1")
    b_token = "token-of-w-b-0123456789"
    spec = _worker_spec("b-w1", b.id, "w-b", b_token)
    spec["command"] = [sys.executable, "-c", "import time; time.sleep(3600)"]  # a container that serves no handler
    _start_worker(grid, agent_id, spec)
    hostile = WorkerAPI(f"unix://{_socket_of(grid, 'ep-host', 'b-w1')}", b_token)

    wanted = [a.run({"secret": i}) for i in range(3)]
    assert hostile.take(wait_s=1.0) is None  # A's requests are not B's to take
    for request_id in wanted:
        with pytest.raises(RequestGone):
            hostile.report(request_id, "result", {"output": "forged by b"})
    assert [a.status(r)["status"] for r in wanted] == ["IN_QUEUE"] * 3

    _start_worker(grid, agent_id, _worker_spec("a-w1", a.id, "w-a", "token-of-w-a-0123456789"))
    with pytest.raises(TokenRefused):  # A's socket does not know B's token
        WorkerAPI(f"unix://{_socket_of(grid, 'ep-host', 'a-w1')}", b_token).take(wait_s=0.1)
    for i, request_id in enumerate(wanted):
        done = a.ended(request_id)
        assert done["output"] == {"echo": {"secret": i}}, f"{done}\n{daemon.tail()}"
    assert hostile.take(wait_s=0.5) is None

    # A worker deleted mid-request: the Master tells the book, and its request goes back to the queue.
    slow = a.run({"kind": "slow"})
    wait_for(lambda: a.status(slow)["status"] == "IN_PROGRESS", 20, "the slow request to start")
    api = _socket_of(grid, "ep-host", "a-w1")
    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "a-w1"}))
    assert deleted["state"] == "succeeded", deleted
    requeued = wait_for(lambda: (s := a.status(slow))["status"] == "IN_QUEUE" and s, 20, "the request to be requeued")
    assert requeued["attempt"] == 2
    assert not api.exists()


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="the sandbox needs root and a system Python")
def test_a_sandboxed_worker_reaches_its_socket_bound_into_its_mount_namespace(endpoint_grid):
    """As root, the process runtime runs a worker as a uid of its own in namespaces of its own (isolation sandbox):
    it sees its socket's directory bound at /idlegrid/mnt/idlegrid/worker, owned by its uid, and nothing else of the
    agent's state."""
    grid = endpoint_grid
    a = Endpoint(grid, "a")
    agent_id, daemon = grid.run_agent("sandbox-host", simulate="a10:1", env={"IDLEGRID_AGENT_PROCESS_USER": "dynamic"})
    spec = _worker_spec("a-w1", a.id, "w-a", "token-of-w-a-0123456789", python=SYSTEM_PYTHON)
    spec["command"] = [SYSTEM_PYTHON, "-c", CARRIED_HANDLER]
    spec["env"] = {LIBRARY_ENV: _library_zip()}
    _start_worker(grid, agent_id, spec)
    done = a.ended(a.run({"prompt": "sandboxed"}))
    assert done["output"] == {"echo": {"prompt": "sandboxed"}}, f"{done}\n{daemon.tail()}"


async def test_a_second_host_cannot_answer_for_the_first_hosts_worker(endpoint_grid, tmp_path):
    """A host speaks for its own containers only: a second host (played by this test, with a real enrolled
    certificate) sending calls that name the first host's worker is refused 403 by the Master, and the book never
    sees them; the first host's worker goes on working."""
    grid = endpoint_grid
    a = Endpoint(grid, "a")
    first, daemon = grid.run_agent("first-host", simulate="a10:1")
    _start_worker(grid, first, _worker_spec("a-w1", a.id, "w-1", "token-of-w-1-0123456789"))
    warm = a.run("warm")
    assert (await asyncio.to_thread(a.ended, warm))["output"] == {"echo": "warm"}, daemon.tail()

    _, pair = enroll_hostile(grid, tmp_path)

    def forged(call_id: str, op: WorkerOp, **fields: Any) -> str:
        call = WorkerCall(call_id=call_id, container="a-w1", endpoint_id=a.id, worker_id="w-1", op=op, **fields)
        return encode(call).decode()

    pending = a.run({"kind": "slow"})  # held by the first host's worker while the second host forges its result
    await asyncio.to_thread(wait_for, lambda: a.status(pending)["status"] == "IN_PROGRESS", 20, "the slow request to start")
    async with hostile_link(grid, pair, [], HOST, "eu-west") as ws:
        await ws.send(forged("forged-1", WorkerOp.RESULT, request_id=pending, payload="forged"))
        await ws.send(forged("forged-2", WorkerOp.TAKE, wait_s=1.0))
        answers: dict[str, int] = {}
        while len(answers) < 2:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=15))
            if frame["type"] == "worker_answer":
                answers[frame["call_id"]] = frame["status"]
    assert answers == {"forged-1": 403, "forged-2": 403}
    assert a.status(pending)["status"] == "IN_PROGRESS"  # the forged result never arrived
    assert a.call("POST", f"cancel/{pending}")[0] == 200
    mine = a.run("still mine")
    assert (await asyncio.to_thread(a.ended, mine))["output"] == {"echo": "still mine"}

"""The worker API's agent side (agent/worker_api.py): each endpoint worker container's own API on a unix socket, served
to the real handler library (common/endpoint_worker/) running in a subprocess, every call carried as a ``worker_call``.

What stands in for the Master is ``MasterStandIn``, which answers the frames the agent sends as the Master's
``worker_answer`` would (the Master's side has its own tests: tests/master/test_worker_calls.py)."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.worker_api import MAX_BODY_BYTES, Refusal, WorkerAPIs, judge
from common.containers import ContainerSpec, EndpointWorkerSpec
from common.endpoint_worker import contract
from common.endpoint_worker.client import AgentUnavailable, TokenRefused, WorkerAPI
from common.wire import WorkerAnswer, WorkerCall, WorkerOp

TOKEN = "worker-token-0123456789"
WAIT_S = 20.0  # how long a test waits for what it expects before it fails (never an assertion on speed)
WORKER = ContainerSpec(
    name="ep-a-w-1",
    image="none",
    endpoint_worker=EndpointWorkerSpec(endpoint_id="ep-a", worker_id="w-1", token=TOKEN, concurrency=2),
)

HANDLER = textwrap.dedent(
    """
    from common.endpoint_worker import serve
    serve(lambda request: {"echo": request.input, "attempt": request.attempt})
    """
)


class MasterStandIn:
    """Answers the agent's frames as the Master would: takes from ``queue``, records every call."""

    def __init__(self) -> None:
        self.apis: WorkerAPIs | None = None
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.calls: list[WorkerCall] = []
        self.linked = True
        self.changed = asyncio.Event()

    async def send(self, call: WorkerCall) -> bool:
        if not self.linked:
            return False
        self.calls.append(call)
        self.changed.set()
        if call.op is not WorkerOp.GONE:
            asyncio.get_running_loop().create_task(self._answer(call))
        return True

    async def _answer(self, call: WorkerCall) -> None:
        status, body = 204, None
        if call.op is WorkerOp.TAKE:
            try:
                status, body = 200, await asyncio.wait_for(self.queue.get(), call.wait_s)
            except TimeoutError:
                status, body = 204, None
            if status == 200 and call.most:
                body = {"requests": [body]}
        elif call.op is WorkerOp.HEARTBEAT:
            status, body = 200, {"cancel": []}
        elif call.op is WorkerOp.RESULTS:
            status, body = 200, {"outcomes": [204] * len(call.payload)}
        assert self.apis is not None
        self.apis.on_answer(WorkerAnswer(call_id=call.call_id, status=status, body=body))

    async def wait_for(self, op: WorkerOp) -> WorkerCall:
        async def seen() -> WorkerCall:
            while True:
                for call in self.calls:
                    if call.op is op:
                        return call
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(seen(), WAIT_S)


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[WorkerAPIs, MasterStandIn]]:
    master = MasterStandIn()
    apis = WorkerAPIs(tmp_path / "worker-api", master.send)
    master.apis = apis
    yield apis, master
    await apis.close_all()


async def test_a_request_flows_from_the_master_to_a_handler_in_a_subprocess_and_its_result_back(served, tmp_path):
    apis, master = served
    spec, mounts = await apis.prepare(WORKER, runtime=None)  # no mounts: the process shares the host's files
    assert mounts == [] and spec.env[contract.ENV_TOKEN] == TOKEN and spec.env[contract.ENV_CONCURRENCY] == "2"
    socket_path = tmp_path / "worker-api" / WORKER.name / "api.sock"
    assert spec.env[contract.ENV_API] == f"unix://{socket_path}"
    assert (socket_path.parent.stat().st_mode & 0o777) == 0o700
    master.queue.put_nowait({"id": "r1", "input": {"prompt": "hi"}, "attempt": 1})
    worker = subprocess.Popen([sys.executable, "-c", HANDLER], env={**spec.env, "PYTHONPATH": str(Path.cwd())})
    try:
        result = await master.wait_for(WorkerOp.RESULTS)
    finally:
        worker.kill()
        worker.wait()
    assert result.payload == [{"id": "r1", "output": {"echo": {"prompt": "hi"}, "attempt": 1}}]
    # The worker is named from the signed spec, never from what the call says.
    assert {(c.container, c.endpoint_id, c.worker_id) for c in master.calls} == {("ep-a-w-1", "ep-a", "w-1")}


async def test_a_wrong_token_is_refused_401_and_never_reaches_the_master(served):
    apis, master = served
    spec, _ = await apis.prepare(WORKER, runtime=None)
    wrong = WorkerAPI(spec.env[contract.ENV_API], "not-the-token-0123456789")
    with pytest.raises(TokenRefused):
        await asyncio.to_thread(wrong.heartbeat, [])
    assert master.calls == []
    right = WorkerAPI(spec.env[contract.ENV_API], TOKEN)
    assert await asyncio.to_thread(right.heartbeat, ["r1"]) == []
    assert [c.in_flight for c in master.calls] == [["r1"]]


async def test_with_no_link_to_the_master_a_call_is_a_503_the_worker_retries(served):
    apis, master = served
    spec, _ = await apis.prepare(WORKER, runtime=None)
    master.linked = False
    with pytest.raises(AgentUnavailable, match="503"):
        await asyncio.to_thread(WorkerAPI(spec.env[contract.ENV_API], TOKEN).heartbeat, [])


async def test_a_container_closed_tells_the_master_its_worker_is_gone_and_its_socket_goes(served, tmp_path):
    apis, master = served
    spec, _ = await apis.prepare(WORKER, runtime=None)
    await apis.close(WORKER.name)
    gone = await master.wait_for(WorkerOp.GONE)
    assert (gone.endpoint_id, gone.worker_id, gone.container) == ("ep-a", "w-1", "ep-a-w-1")
    assert not (tmp_path / "worker-api" / WORKER.name).exists() and not apis.serves(WORKER.name)
    with pytest.raises(AgentUnavailable):
        await asyncio.to_thread(WorkerAPI(spec.env[contract.ENV_API], TOKEN, call_timeout_s=2).heartbeat, [])


async def test_a_container_that_is_no_endpoint_worker_gets_nothing(served):
    apis, _ = served
    plain = ContainerSpec(name="job-1", image="none", env={"A": "1"})
    assert await apis.prepare(plain, runtime=None) == (plain, [])
    assert not apis.serves("job-1")


def _judge(path: str, body: bytes = b"{}", *, method: str = "POST", token: str = TOKEN) -> WorkerCall | Refusal:
    assert WORKER.endpoint_worker is not None
    return judge(WORKER.endpoint_worker, WORKER.name, "c-1", method, path, f"Bearer {token}", body)


def test_each_report_path_is_its_call_with_the_body_as_payload():
    partial = _judge(contract.request_path("r/1", "partial"), b'{"seq": 3, "output": [1]}')
    assert isinstance(partial, WorkerCall)
    assert (partial.op, partial.request_id, partial.seq, partial.payload) == (WorkerOp.PARTIAL, "r/1", 3, [1])
    error = _judge(contract.request_path("r1", "error"), b'{"error": {"type": "E", "message": "m"}}')
    assert isinstance(error, WorkerCall) and error.payload == {"type": "E", "message": "m"}
    take = _judge(contract.TAKE, b'{"wait_s": 3600}')
    assert isinstance(take, WorkerCall) and take.wait_s == 30.0 and take.most == 0  # capped; a take of one
    several = _judge(contract.TAKE, b'{"wait_s": 1, "max": 5000}')
    assert isinstance(several, WorkerCall) and several.most == 1000  # capped
    results = _judge(contract.RESULTS, b'{"results": [{"id": "r1", "output": 1}, {"id": "r/2", "output": null}]}')
    assert isinstance(results, WorkerCall) and results.op == WorkerOp.RESULTS
    assert results.payload == [{"id": "r1", "output": 1}, {"id": "r/2", "output": None}]


def test_bodies_that_only_the_standard_librarys_json_reads_are_taken_as_before():
    """The library writes its bodies with ``json.dumps``: a handler's NaN or infinity becomes a bare NaN / Infinity,
    and a large integer stays whole; msgspec reads the rest, these are read by ``json.loads`` as before."""
    nan = _judge(contract.request_path("r1", "result"), b'{"output": [NaN, Infinity, -Infinity]}')
    assert isinstance(nan, WorkerCall) and nan.payload[1] == math.inf and nan.payload[2] == -math.inf
    assert math.isnan(nan.payload[0])
    big = _judge(contract.RESULTS, b'{"results": [{"id": "r1", "output": 123456789012345678901234567890}]}')
    assert isinstance(big, WorkerCall) and big.payload == [{"id": "r1", "output": 123456789012345678901234567890}]
    assert isinstance(_judge(contract.TAKE, b'{"wait_s": 1, "max": 2'), Refusal)  # neither reads it: 400 as before


@pytest.mark.parametrize(
    ("path", "body", "method", "token", "status"),
    [
        ("/v1/take", b"{}", "POST", "wrong-token", 401),
        ("/v1/take", b"{}", "GET", TOKEN, 405),
        ("/v1/requests/r1/launch", b"{}", "POST", TOKEN, 404),
        ("/v1/requests//result", b"{}", "POST", TOKEN, 404),
        ("/v1/take", b"[1]", "POST", TOKEN, 400),
        ("/v1/take", b'{"wait_s": "soon"}', "POST", TOKEN, 400),
        ("/v1/requests/r1/partial", b'{"seq": -1}', "POST", TOKEN, 400),
        ("/v1/heartbeat", b'{"in_flight": "r1"}', "POST", TOKEN, 400),
        ("/v1/take", b'{"max": 0}', "POST", TOKEN, 400),
        ("/v1/take", b'{"max": true}', "POST", TOKEN, 400),
        ("/v1/results", b'{"results": []}', "POST", TOKEN, 400),
        ("/v1/results", b'{"results": [{"id": "r1"}]}', "POST", TOKEN, 400),
        ("/v1/results", b'{"results": [{"id": "", "output": 1}]}', "POST", TOKEN, 400),
        ("/v1/results", b'{"results": [{"id": "r1", "output": 1, "extra": 2}]}', "POST", TOKEN, 400),
        ("/v1/requests/r1/result", b"x" * (MAX_BODY_BYTES + 1), "POST", TOKEN, 413),
    ],
)
def test_what_the_agent_refuses_itself(path, body, method, token, status):
    judged = _judge(path, body, method=method, token=token)
    assert isinstance(judged, Refusal) and judged.status == status


async def test_a_socket_deeper_than_a_socket_address_holds_is_served_and_reached(tmp_path):
    """A unix socket's address holds 107 bytes; an agent's state directory may be deeper: bound and reached through
    the directory's descriptor."""
    master = MasterStandIn()
    apis = WorkerAPIs(tmp_path / ("deep-" * 20) / "worker-api", master.send)
    master.apis = apis
    try:
        spec, _ = await apis.prepare(WORKER, runtime=None)
        assert len(spec.env[contract.ENV_API]) > 120
        assert await asyncio.to_thread(WorkerAPI(spec.env[contract.ENV_API], TOKEN).heartbeat, []) == []
    finally:
        await apis.close_all()


async def test_a_started_worker_missing_from_two_runtime_listings_in_a_row_is_gone(served):
    apis, master = served
    await apis.prepare(WORKER, runtime=None)
    await apis.lost(set())  # not started yet: a create in progress is never lost
    await apis.lost(set())
    assert apis.serves(WORKER.name)
    apis.started(WORKER.name)
    await apis.lost(set())  # one listing without it may predate its create
    await apis.lost({WORKER.name})
    await apis.lost(set())
    assert apis.serves(WORKER.name) and master.calls == []
    await apis.lost(set())
    gone = await master.wait_for(WorkerOp.GONE)
    assert gone.container == WORKER.name and not apis.serves(WORKER.name)


async def test_a_worker_with_too_many_calls_waiting_is_answered_429(served, monkeypatch):
    monkeypatch.setattr("agent.worker_api.MAX_CALLS_PER_WORKER", 1)
    apis, master = served
    spec, _ = await apis.prepare(WORKER, runtime=None)
    client = WorkerAPI(spec.env[contract.ENV_API], TOKEN)
    waiting = asyncio.create_task(asyncio.to_thread(client.take, 5.0))  # waits: nothing queued
    await master.wait_for(WorkerOp.TAKE)
    with pytest.raises(AgentUnavailable, match="429"):
        await asyncio.to_thread(client.heartbeat, [])
    master.queue.put_nowait({"id": "r1", "input": None, "attempt": 1})
    assert (await waiting).id == "r1"  # type: ignore[union-attr]
    assert await asyncio.to_thread(client.heartbeat, []) == []


async def test_calls_share_a_kept_connection_and_closing_the_worker_closes_it(served):
    apis, master = served
    spec, _ = await apis.prepare(WORKER, runtime=None)
    api = WorkerAPI(spec.env[contract.ENV_API], TOKEN)

    def beat_twice() -> None:  # one thread: its calls go on its one connection
        api.heartbeat(["r1"])
        api.heartbeat(["r2"])

    await asyncio.to_thread(beat_twice)
    assert [c.in_flight for c in master.calls] == [["r1"], ["r2"]]
    assert len(apis._connections[WORKER.name]) == 1  # both calls on it, still open
    await apis.close(WORKER.name)
    assert WORKER.name not in apis._connections  # hung up: the gone worker's kept connection carries nothing more
    with pytest.raises(AgentUnavailable):
        await asyncio.to_thread(api.heartbeat, ["r3"])
    assert [c.op for c in master.calls] == [WorkerOp.HEARTBEAT, WorkerOp.HEARTBEAT, WorkerOp.GONE]

"""The request book composed into a real Master (management/app.py): once the composition starts, the endpoint
workers' calls that reach the Master over a relay link are the book's; a stopped composition answers them 503.

Real parts: the Master on SQLite, its relay-link handlers, the composition's book over the Master's store. The
worker's host is played by frames on the relay link (tests/master/linked.py), as in tests/master/test_worker_calls.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from common.containers import ContainerSpec, EndpointWorkerSpec
from common.wire import CommandResult, WorkerCall, WorkerOp
from management.app import compose
from management.endpoints.queue import RequestState
from management.endpoints.requests import RequestBook
from master.config import MasterConfig
from master.master import Master
from tests.master.linked import connect, relay, relay_link
from tests.master.test_worker_calls import _answer

TOKEN = "worker-token-0123456789"


@pytest.fixture
async def master(tmp_path: Path) -> Any:
    running = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0, relay_directory_coalesce_s=0.05))
    await running.start()
    yield running
    await running.stop()


def _call(op: WorkerOp, call_id: str, **fields: Any) -> WorkerCall:
    return WorkerCall(call_id=call_id, container="w-1-c", endpoint_id="ep-a", worker_id="w-1", op=op, **fields)


async def test_the_composed_book_answers_the_workers_calls_while_it_runs(master: Master) -> None:
    composition = compose(master)
    await composition.load()
    book = dict(composition.state)["endpoint requests"]
    assert isinstance(book, RequestBook)
    link = relay_link()
    await connect(master, link, "agt-a")
    spec = ContainerSpec(
        name="w-1-c", image="none", endpoint_worker=EndpointWorkerSpec(endpoint_id="ep-a", worker_id="w-1", token=TOKEN)
    )
    command = await master.create_command("agt-a", spec)
    await relay(master, link, "agt-a", CommandResult(id=command.id, ok=True))

    await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "before"))
    assert (await _answer(link, "agt-a", "before")).status == 503  # loaded, not started: no handler yet

    composition.start()
    try:
        submitted = await book.submit("ep-a", {"prompt": "hi"}, account="renter")
        await relay(master, link, "agt-a", _call(WorkerOp.TAKE, "take", wait_s=5.0))
        taken = await _answer(link, "agt-a", "take")
        assert (taken.status, taken.body) == (200, {"id": submitted.id, "input": {"prompt": "hi"}, "attempt": 1})
        await relay(master, link, "agt-a", _call(WorkerOp.RESULT, "result", request_id=submitted.id, payload={"echo": "hi"}))
        assert (await _answer(link, "agt-a", "result")).status == 204
        done = await book.status(submitted.id)
        assert done is not None and (done.state, done.output) == (RequestState.COMPLETED.value, '{"echo":"hi"}')
        # A second result of the same request is no longer this worker's to give: 404 from the book, through the Master.
        await relay(master, link, "agt-a", _call(WorkerOp.RESULT, "again", request_id=submitted.id, payload=1))
        assert (await _answer(link, "agt-a", "again")).status == 404
    finally:
        await composition.stop()
    await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "after"))
    assert (await _answer(link, "agt-a", "after")).status == 503

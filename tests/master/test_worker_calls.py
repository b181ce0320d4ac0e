"""Endpoint workers' calls through the real Master's relay-link handlers (master/worker_calls.py): passed to the
``WorkerCalls`` handler management registers through the port, answered on the agent's connection, and only from the
agent the worker's container was created on.

The handler here is an in-memory fake (``FakeQueue``): the real request queue (management/endpoints/) is another
part of issue 39, merged separately; these tests are about the Master's side only."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from common.containers import ContainerSpec, EndpointWorkerSpec
from common.wire import CommandResult, WorkerAnswer, WorkerCall, WorkerOp
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.port import CallOutcome, TakenRequest, WorkerError, WorkerRef
from master.worker_calls import WorkerPlaces
from tests.master.linked import connect, relay, relay_link, to_agent

TOKEN = "worker-token-0123456789"
WAIT_S = 10.0  # how long a test waits for an answer before it fails (never an assertion on speed)


class FakeQueue:
    """An in-memory stand-in for the request queue: hands out what a test puts in, records every report."""

    def __init__(self) -> None:
        self.waiting: asyncio.Queue[TakenRequest] = asyncio.Queue()
        self.reports: list[tuple[str, WorkerRef, Any]] = []
        self.gone: list[WorkerRef] = []

    async def take(self, worker: WorkerRef, wait_s: float) -> TakenRequest | None:
        try:
            return await asyncio.wait_for(self.waiting.get(), wait_s)
        except TimeoutError:
            return None

    async def take_many(self, worker: WorkerRef, wait_s: float, most: int) -> list[TakenRequest]:
        first = await self.take(worker, wait_s)
        found = [] if first is None else [first]
        while len(found) < most and not self.waiting.empty():
            found.append(self.waiting.get_nowait())
        return found

    async def heartbeat(self, worker: WorkerRef, in_flight: list[str]) -> list[str]:
        self.reports.append(("heartbeat", worker, in_flight))
        return [rid for rid in in_flight if rid.startswith("cancel-")]

    async def partial(self, worker: WorkerRef, request_id: str, seq: int, output: Any) -> CallOutcome:
        self.reports.append(("partial", worker, (request_id, seq, output)))
        return CallOutcome.OK

    async def progress(self, worker: WorkerRef, request_id: str, progress: Any) -> CallOutcome:
        return CallOutcome.OK

    async def result(self, worker: WorkerRef, request_id: str, output: Any) -> CallOutcome:
        self.reports.append(("result", worker, (request_id, output)))
        return CallOutcome.GONE if request_id == "gone" else CallOutcome.OK

    async def results(self, worker: WorkerRef, results: list[tuple[str, Any]]) -> list[CallOutcome]:
        return [await self.result(worker, request_id, output) for request_id, output in results]

    async def error(self, worker: WorkerRef, request_id: str, error: WorkerError) -> CallOutcome:
        self.reports.append(("error", worker, (request_id, error)))
        return CallOutcome.OK

    async def release(self, worker: WorkerRef, request_id: str) -> CallOutcome:
        return CallOutcome.OK

    async def worker_gone(self, worker: WorkerRef) -> None:
        self.gone.append(worker)


async def _place_worker(master: Master, link: AccessLink, agent_id: str, worker_id: str = "w-1") -> None:
    """An endpoint worker's container is created on ``agent_id`` (its create command succeeded there)."""
    spec = ContainerSpec(
        name=f"{worker_id}-c",
        image="none",
        endpoint_worker=EndpointWorkerSpec(endpoint_id="ep-a", worker_id=worker_id, token=TOKEN),
    )
    command = await master.create_command(agent_id, spec)
    await relay(master, link, agent_id, CommandResult(id=command.id, ok=True))


def _call(op: WorkerOp, call_id: str, *, endpoint_id: str = "ep-a", worker_id: str = "w-1", **fields: Any) -> WorkerCall:
    return WorkerCall(call_id=call_id, container=f"{worker_id}-c", endpoint_id=endpoint_id, worker_id=worker_id, op=op, **fields)


async def _answer(link: AccessLink, agent_id: str, call_id: str) -> WorkerAnswer:
    async def seen() -> WorkerAnswer:
        while True:
            for frame in to_agent(link, agent_id):
                if isinstance(frame, WorkerAnswer) and frame.call_id == call_id:
                    return frame
            await asyncio.sleep(0.01)

    return await asyncio.wait_for(seen(), WAIT_S)


async def test_with_no_handler_registered_a_call_is_answered_503(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "c1"))
    assert (await _answer(link, "agt-a", "c1")).status == 503


async def test_a_take_and_a_result_reach_the_handler_as_the_worker_of_the_agent_it_was_created_on(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    queue.waiting.put_nowait(TakenRequest(id="r1", input={"prompt": "hi"}, attempt=2))
    await relay(master, link, "agt-a", _call(WorkerOp.TAKE, "c1", wait_s=1.0))
    taken = await _answer(link, "agt-a", "c1")
    assert (taken.status, taken.body) == (200, {"id": "r1", "input": {"prompt": "hi"}, "attempt": 2})
    await relay(master, link, "agt-a", _call(WorkerOp.RESULT, "c2", request_id="r1", payload={"echo": "hi"}))
    assert (await _answer(link, "agt-a", "c2")).status == 204
    assert queue.reports == [("result", WorkerRef("ep-a", "w-1", "agt-a"), ("r1", {"echo": "hi"}))]
    await relay(master, link, "agt-a", _call(WorkerOp.RESULT, "c3", request_id="gone", payload=1))
    assert (await _answer(link, "agt-a", "c3")).status == 404


async def test_a_take_of_several_answers_the_requests_queued_as_a_list_and_a_take_of_one_as_the_request(
    master: Master,
) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    for n in range(3):
        queue.waiting.put_nowait(TakenRequest(id=f"r{n}", input=n))
    await relay(master, link, "agt-a", _call(WorkerOp.TAKE, "c1", wait_s=1.0, most=2))
    taken = await _answer(link, "agt-a", "c1")
    assert (taken.status, taken.body) == (200, {"requests": [{"id": f"r{n}", "input": n, "attempt": 1} for n in (0, 1)]})
    await relay(master, link, "agt-a", _call(WorkerOp.TAKE, "c2", wait_s=1.0))
    assert (await _answer(link, "agt-a", "c2")).body == {"id": "r2", "input": 2, "attempt": 1}
    await relay(master, link, "agt-a", _call(WorkerOp.TAKE, "c3", wait_s=0.0, most=5))
    assert (await _answer(link, "agt-a", "c3")).status == 204


async def test_several_results_in_one_call_are_answered_each_its_outcome(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    payload = [{"id": "r1", "output": {"echo": 1}}, {"id": "gone", "output": 2}]
    await relay(master, link, "agt-a", _call(WorkerOp.RESULTS, "c1", payload=payload))
    answer = await _answer(link, "agt-a", "c1")
    assert (answer.status, answer.body) == (200, {"outcomes": [204, 404]})
    worker = WorkerRef("ep-a", "w-1", "agt-a")
    assert queue.reports == [("result", worker, ("r1", {"echo": 1})), ("result", worker, ("gone", 2))]
    await relay(master, link, "agt-a", _call(WorkerOp.RESULTS, "c2", payload=[{"output": 1}]))  # a host's bad frame
    assert (await _answer(link, "agt-a", "c2")).status == 400


async def test_another_host_cannot_speak_for_a_worker_it_does_not_hold(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await connect(master, link, "agt-b")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    await relay(master, link, "agt-b", _call(WorkerOp.RESULT, "c1", request_id="r1", payload="forged"))
    assert (await _answer(link, "agt-b", "c1")).status == 403
    # Nor for a worker of another endpoint on its own host, named with the right worker id.
    await relay(master, link, "agt-a", _call(WorkerOp.RESULT, "c2", endpoint_id="ep-b", request_id="r1", payload="x"))
    assert (await _answer(link, "agt-a", "c2")).status == 403
    assert queue.reports == []


async def test_a_long_poll_take_does_not_hold_back_the_agents_other_frames(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    await relay(master, link, "agt-a", _call(WorkerOp.TAKE, "take", wait_s=30.0))  # waits: nothing queued
    await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "beat", in_flight=["r1", "cancel-r2"]))
    beat = await _answer(link, "agt-a", "beat")
    assert (beat.status, beat.body) == (200, {"cancel": ["cancel-r2"]})
    queue.waiting.put_nowait(TakenRequest(id="r3", input=None))
    assert (await _answer(link, "agt-a", "take")).body["id"] == "r3"


async def test_a_worker_gone_reaches_the_handler_and_is_not_answered(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    await relay(master, link, "agt-a", _call(WorkerOp.GONE, "g1"))
    await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "after"))
    assert (await _answer(link, "agt-a", "after")).status == 403  # gone: its place is forgotten
    assert queue.gone == [WorkerRef("ep-a", "w-1", "agt-a")]
    assert not any(isinstance(f, WorkerAnswer) and f.call_id == "g1" for f in to_agent(link, "agt-a"))


async def test_after_a_restart_a_workers_place_is_read_back_from_its_create_for_its_own_host_only(tmp_path: Path) -> None:
    config = MasterConfig(state_dir=str(tmp_path / "master"), link_port=0)
    first = Master(config)
    await first.start()
    link = relay_link()
    await connect(first, link, "agt-a")
    await connect(first, link, "agt-b")
    await _place_worker(first, link, "agt-a")
    await first.stop()

    master = Master(config)
    await master.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a")
        await connect(master, link, "agt-b")
        queue = FakeQueue()
        master.serve_worker_calls(queue)
        await relay(master, link, "agt-b", _call(WorkerOp.HEARTBEAT, "c1"))
        assert (await _answer(link, "agt-b", "c1")).status == 403
        await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "c2", in_flight=["r1"]))
        assert (await _answer(link, "agt-a", "c2")).status == 200
        assert queue.reports == [("heartbeat", WorkerRef("ep-a", "w-1", "agt-a"), ["r1"])]
    finally:
        await master.stop()


def test_workers_said_gone_are_remembered_up_to_a_bound_oldest_forgotten_first() -> None:
    places = WorkerPlaces(remember_gone=2)
    for worker in ("w-1", "w-2", "w-3"):
        places.created("ep-a", worker, "agt-a", f"{worker}-c")
        places.forget("ep-a", worker)
    assert [places.is_gone("ep-a", w) for w in ("w-1", "w-2", "w-3")] == [False, True, True]
    places.created("ep-a", "w-2", "agt-b", "w-2-c")  # created again (elsewhere): no longer gone
    assert not places.is_gone("ep-a", "w-2")


async def test_a_host_with_too_many_calls_waiting_is_answered_429_until_some_end(master: Master, monkeypatch) -> None:
    monkeypatch.setattr("master.agent_channel.MAX_CALLS_IN_FLIGHT_PER_AGENT", 2)
    link = relay_link()
    await connect(master, link, "agt-a")
    await _place_worker(master, link, "agt-a")
    queue = FakeQueue()
    master.serve_worker_calls(queue)
    for call_id in ("t1", "t2"):  # two long polls wait: nothing is queued
        await relay(master, link, "agt-a", _call(WorkerOp.TAKE, call_id, wait_s=30.0))
    await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, "over"))
    assert (await _answer(link, "agt-a", "over")).status == 429
    queue.waiting.put_nowait(TakenRequest(id="r1", input=None))
    queue.waiting.put_nowait(TakenRequest(id="r2", input=None))
    assert {(await _answer(link, "agt-a", t)).status for t in ("t1", "t2")} == {200}
    for attempt in range(100):  # the ended polls' slots free as their tasks finish, just after their answers
        await relay(master, link, "agt-a", _call(WorkerOp.HEARTBEAT, f"after-{attempt}"))
        if (await _answer(link, "agt-a", f"after-{attempt}")).status == 200:
            break
    else:
        raise AssertionError("the host's calls stayed refused after its long polls ended")

"""The handler library (common/endpoint_worker/) against a stand-in of the agent's side: a real HTTP server on
127.0.0.1 (agent_standin.py). serve() runs on a thread and ends when the test sets its stop event."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest

from common.endpoint_worker import Request, TokenRefused, serve
from common.endpoint_worker.client import TakenRequest, WorkerAPI
from common.endpoint_worker.contract import ENV_CONCURRENCY, RESULTS, request_path
from common.endpoint_worker.serve import _Worker, settings_from_env
from tests.common.endpoint_worker.agent_standin import WAIT_S, AgentStandIn


@contextlib.contextmanager
def logged(text: str) -> Iterator[threading.Event]:
    """An event set when the library logs a line that holds ``text``: what a test waits on instead of a clock."""
    seen = threading.Event()

    class Watch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if text in record.getMessage():
                seen.set()

    logger = logging.getLogger("common.endpoint_worker.serve")
    watch = Watch(logging.WARNING)
    logger.addHandler(watch)
    try:
        yield seen
    finally:
        logger.removeHandler(watch)


@pytest.fixture
def agent() -> Iterator[AgentStandIn]:
    standin = AgentStandIn().start()
    yield standin
    standin.stop()


class Serving:
    """serve(handler) on a thread, stopped (and joined) by the test."""

    def __init__(self, handler: Callable[[Request], Any], env: dict[str, str], **options: Any) -> None:
        self.stop = threading.Event()
        self.raised: BaseException | None = None
        self.thread = threading.Thread(target=self.run, args=(handler, env, options), daemon=True)
        self.thread.start()

    def run(self, handler: Callable[[Request], Any], env: dict[str, str], options: dict[str, Any]) -> None:
        try:
            serve(handler, stop=self.stop, env=env, take_wait_s=0.2, drain_s=5.0, **options)
        except BaseException as exc:  # handed to the test
            self.raised = exc

    def end(self) -> None:
        self.stop.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "serve() did not return after its stop"


@pytest.fixture
def serving() -> Iterator[Callable[..., Serving]]:
    started: list[Serving] = []

    def start(handler: Callable[[Request], Any], env: dict[str, str], **options: Any) -> Serving:
        started.append(Serving(handler, env, **options))
        return started[-1]

    yield start
    for one in started:
        one.end()


def test_a_taken_request_gets_its_handlers_output_as_its_result(agent, serving):
    serving(lambda request: {"echo": request.input, "attempt": request.attempt}, agent.env())
    agent.submit("r1", {"prompt": "hi"}, attempt=2)
    agent.wait_for(lambda: "r1" in agent.results)
    assert agent.results["r1"] == {"echo": {"prompt": "hi"}, "attempt": 2}
    assert set(agent.authorizations) == {"Bearer worker-token"}


def test_a_generator_handler_streams_each_item_in_order_and_its_return_value_is_the_result(agent, serving):
    def handler(request: Request) -> Generator[str, None, str]:
        yield from request.input.split()
        return "done"

    serving(handler, agent.env())
    agent.submit("r1", "one two three")
    agent.wait_for(lambda: "r1" in agent.results)
    assert agent.partials["r1"] == [(0, "one"), (1, "two"), (2, "three")]
    assert agent.results["r1"] == "done"


def test_coroutine_and_async_generator_handlers_run_too(agent, serving):
    async def handler(request: Request) -> Any:
        await asyncio.sleep(0)
        return request.input * 2

    async def streaming(request: Request) -> Any:
        for n in range(request.input):
            await asyncio.sleep(0)
            yield n

    streamer = AgentStandIn().start()
    try:
        serving(handler, agent.env())
        serving(streaming, streamer.env())
        agent.submit("a", 21)
        streamer.submit("b", 3)
        agent.wait_for(lambda: "a" in agent.results)
        streamer.wait_for(lambda: "b" in streamer.results)
    finally:
        streamer.stop()
    assert agent.results["a"] == 42
    assert streamer.partials["b"] == [(0, 0), (1, 1), (2, 2)] and streamer.results["b"] is None


def test_a_handler_that_raises_fails_its_request_with_the_reason_and_the_worker_goes_on(agent, serving):
    def handler(request: Request) -> Any:
        if request.input == "bad":
            raise RuntimeError("the model ran out of memory")
        return "fine"

    serving(handler, agent.env())
    agent.submit("r1", "bad")
    agent.submit("r2", "good")
    agent.wait_for(lambda: "r1" in agent.errors and "r2" in agent.results)
    error = agent.errors["r1"]
    assert error["type"] == "RuntimeError" and error["message"] == "the model ran out of memory"
    assert "raise RuntimeError" in error["traceback"]
    assert agent.results["r2"] == "fine" and "r1" not in agent.results


def test_an_output_that_is_not_json_fails_the_request(agent, serving):
    serving(lambda request: object(), agent.env())
    agent.submit("r1", None)
    agent.wait_for(lambda: "r1" in agent.errors)
    assert agent.errors["r1"]["type"] == "TypeError" and "could not be sent" in agent.errors["r1"]["message"]


def test_concurrency_from_the_environment_runs_that_many_requests_at_once(agent, serving):
    together = threading.Barrier(3, timeout=WAIT_S)  # breaks (and fails each request) unless 3 run at the same time

    def handler(request: Request) -> Any:
        together.wait()
        return request.input

    serving(handler, agent.env(**{ENV_CONCURRENCY: "3"}))
    for n in range(3):
        agent.submit(f"r{n}", n)
    agent.wait_for(lambda: len(agent.results) + len(agent.errors) == 3)
    assert agent.results == {"r0": 0, "r1": 1, "r2": 2} and agent.errors == {}


def test_one_worker_runs_one_request_at_a_time_by_default(agent, serving):
    finish = threading.Event()

    def handler(request: Request) -> Any:
        finish.wait(WAIT_S)
        return request.input

    serving(handler, agent.env())
    agent.submit("r0", 0)
    agent.submit("r1", 1)
    agent.wait_for(lambda: ["r0"] in agent.heartbeats)
    seen = len(agent.heartbeats)
    agent.wait_for(lambda: len(agent.heartbeats) >= seen + 3)  # a while, counted in heartbeats, with r0 in flight
    assert agent.pending.qsize() == 1 and all(len(held) <= 1 for held in agent.heartbeats)
    finish.set()
    agent.wait_for(lambda: len(agent.results) == 2)


def test_progress_updates_and_heartbeats_reach_the_agent(agent, serving):
    finish = threading.Event()

    def handler(request: Request) -> Any:
        request.progress({"percent": 50})
        finish.wait(WAIT_S)
        return "ok"

    serving(handler, agent.env())
    agent.submit("r1", None)
    agent.wait_for(lambda: ["r1"] in agent.heartbeats)  # in flight, said by a heartbeat
    finish.set()
    agent.wait_for(lambda: "r1" in agent.results)
    assert agent.progress["r1"] == [{"percent": 50}]


def test_a_refused_token_ends_serve_with_token_refused(agent, serving):
    worker = serving(lambda request: None, agent.env() | {"IDLEGRID_WORKER_TOKEN": "stolen"})
    worker.thread.join(WAIT_S)
    assert isinstance(worker.raised, TokenRefused)


def test_a_request_cancelled_through_the_heartbeat_stops_its_stream_and_sends_no_result(agent, serving):
    closed = threading.Event()

    def handler(request: Request) -> Iterator[int]:
        try:
            n = 0
            while True:
                yield n
                n += 1
                beats = len(agent.heartbeats)
                agent.wait_for(lambda: len(agent.heartbeats) > beats)  # noqa: B023 (one item a heartbeat: a cancel can come)
        finally:
            closed.set()

    serving(handler, agent.env())
    agent.submit("r1", None)
    agent.wait_for(lambda: len(agent.partials["r1"]) >= 2)
    agent.cancel.add("r1")
    assert closed.wait(WAIT_S)
    closed.clear()
    agent.submit("r2", None)  # the worker takes the next one: it sends r2's partials, never r1's result
    agent.wait_for(lambda: len(agent.partials["r2"]) >= 1)
    agent.cancel.add("r2")
    assert closed.wait(WAIT_S)
    assert "r1" not in agent.results and "r1" not in agent.errors


def test_a_request_the_agent_no_longer_has_is_dropped_without_an_error(agent, serving):
    closed = threading.Event()

    def handler(request: Request) -> Iterator[int]:
        try:
            yield 1
            agent.record(lambda: agent.gone.add(request.id))
            yield 2
            yield 3
        finally:
            closed.set()

    serving(handler, agent.env())
    agent.submit("r1", None)
    assert closed.wait(WAIT_S)
    agent.submit("r2", None)
    agent.wait_for(lambda: agent.partials["r2"] == [(0, 1)])
    assert agent.partials["r1"] == [(0, 1)] and "r1" not in agent.errors and "r1" not in agent.results


def test_the_agent_going_away_and_returning_loses_no_result_and_the_worker_takes_again(agent, serving):
    finish = threading.Event()

    def handler(request: Request) -> Any:
        if request.input == "slow":
            finish.wait(WAIT_S)
        return request.input

    serving(handler, agent.env())
    agent.submit("r1", "slow")
    agent.wait_for(lambda: ["r1"] in agent.heartbeats)
    agent.stop()  # the agent goes away while the handler works
    with logged("result of r1 not delivered yet") as failed:
        finish.set()
        assert failed.wait(WAIT_S)  # the worker tried, and found nobody
    agent.start()  # the agent comes back on the same port: the result is sent again until it lands
    agent.wait_for(lambda: "r1" in agent.results)
    agent.submit("r2", "next")
    agent.wait_for(lambda: "r2" in agent.results)
    assert agent.results == {"r1": "slow", "r2": "next"}


@pytest.mark.parametrize(
    "answer",
    [
        (200, b"not json"),
        (200, b'{"input": 1}'),  # no id
        (200, b'{"id": "x", "input": 1, "attempt": 0}'),
        (418, b"{}"),
        (500, b"{}"),
        (503, b""),
    ],
    ids=["not-json", "no-id", "bad-attempt", "unknown-status", "server-error", "unavailable"],
)
def test_a_bad_answer_to_take_is_survived_and_the_worker_takes_again(agent, serving, answer):
    agent.canned["/v1/take"] = [answer, answer]
    agent.canned["/v1/heartbeat"] = [(200, b"[1, 2]"), (200, b'{"cancel": "all"}')]
    serving(lambda request: request.input, agent.env())
    agent.submit("r1", "after")
    agent.wait_for(lambda: "r1" in agent.results)
    assert agent.canned["/v1/take"] == []


def test_a_report_answered_with_a_server_error_is_sent_again(agent, serving):
    agent.canned[RESULTS] = [(500, b"{}"), (502, b"")]
    serving(lambda request: "landed", agent.env())
    agent.submit("r/1", None)
    agent.wait_for(lambda: "r/1" in agent.results)
    assert agent.canned[RESULTS] == [] and agent.results["r/1"] == "landed"


def test_an_agent_without_the_results_call_gets_each_result_by_its_own_path(agent, serving):
    agent.no_results = True
    path = request_path("r/1", "result")  # an id that needs quoting in a path
    agent.canned[path] = [(500, b"{}")]
    serving(lambda request: request.input, agent.env(**{ENV_CONCURRENCY: "2"}))
    for n in range(3):
        agent.submit(f"r/{n}", n)
    agent.wait_for(lambda: len(agent.results) == 3)
    assert agent.results == {"r/0": 0, "r/1": 1, "r/2": 2} and agent.canned[path] == []
    assert len(agent.result_calls) == 1  # asked once, then never again


def test_takes_ask_for_the_room_left_and_an_agent_answering_one_request_is_understood(agent, serving):
    finish = threading.Event()

    def handler(request: Request) -> Any:
        finish.wait(WAIT_S)
        return request.input

    for n in range(3):
        agent.submit(f"r{n}", n)
    serving(handler, agent.env(**{ENV_CONCURRENCY: "4"}))
    agent.wait_for(lambda: len(agent.heartbeats) > 0 and len(agent.heartbeats[-1]) == 3)  # all three in one take
    assert agent.takes[0] == 4
    agent.wait_for(lambda: len(agent.takes) >= 2)
    assert agent.takes[1] == 1  # the room left
    agent.single_take = True
    agent.submit("r3", 3)
    finish.set()
    agent.wait_for(lambda: len(agent.results) == 4)
    assert agent.results == {"r0": 0, "r1": 1, "r2": 2, "r3": 3}


def test_the_thread_that_takes_a_request_runs_it_while_another_takes_the_next(agent, serving, monkeypatch):
    takers: list[threading.Thread] = []
    real_take_many = WorkerAPI.take_many

    def take_many(api: WorkerAPI, most: int, wait_s: float) -> Any:
        takers.append(threading.current_thread())
        return real_take_many(api, most, wait_s)

    monkeypatch.setattr(WorkerAPI, "take_many", take_many)
    ran_on: list[threading.Thread] = []
    next_take = threading.Event()

    def handler(request: Request) -> Any:
        ran_on.append(threading.current_thread())
        agent.wait_for(lambda: len(takers) >= 2)  # the next take goes out while this request runs
        next_take.set()
        return request.input

    agent.submit("r0", 0)
    serving(handler, agent.env(**{ENV_CONCURRENCY: "2"}))
    agent.wait_for(lambda: agent.results == {"r0": 0})
    assert next_take.is_set()
    assert ran_on == [takers[0]]  # no hand-over between threads: the taker ran it
    assert takers[1] is not takers[0]


def test_a_stop_lets_the_request_in_flight_finish_first(agent):
    started, finish = threading.Event(), threading.Event()

    def handler(request: Request) -> Any:
        started.set()
        finish.wait(WAIT_S)
        return "finished"

    worker = Serving(handler, agent.env())
    agent.submit("r1", None)
    assert started.wait(WAIT_S)
    worker.stop.set()
    finish.set()
    worker.end()
    assert agent.results == {"r1": "finished"}


def test_a_request_taken_as_the_worker_stops_goes_back_to_the_queue(agent):
    agent.take_gate = threading.Event()
    worker = Serving(lambda request: "never run", agent.env())
    agent.wait_for(lambda: len(agent.authorizations) >= 1)  # the first take is out, held by the gate
    worker.end()  # nothing in flight: serve() returns without waiting for the take
    agent.submit("r1", None)
    agent.take_gate.set()  # the take held over the stop gets r1
    agent.wait_for(lambda: agent.released == ["r1"])
    assert agent.results == {}


def test_an_output_the_agent_finds_too_large_fails_the_request(agent, serving):
    agent.canned[RESULTS] = [(200, b'{"outcomes": [413]}')]
    serving(lambda request: "x" * 1000, agent.env())
    agent.submit("r1", None)
    agent.wait_for(lambda: "r1" in agent.errors)
    assert agent.errors["r1"]["type"] == "BodyTooLarge" and "r1" not in agent.results


def test_settings_name_what_is_missing_or_wrong():
    with pytest.raises(ValueError, match="IDLEGRID_WORKER_API and IDLEGRID_WORKER_TOKEN not set"):
        settings_from_env({})
    env = {"IDLEGRID_WORKER_API": "http://127.0.0.1:1", "IDLEGRID_WORKER_TOKEN": "t"}
    assert settings_from_env(env) == ("http://127.0.0.1:1", "t", 1, 5.0)
    with pytest.raises(ValueError, match="IDLEGRID_WORKER_CONCURRENCY"):
        settings_from_env(env | {ENV_CONCURRENCY: "0"})
    with pytest.raises(ValueError, match="must be numbers"):
        settings_from_env(env | {ENV_CONCURRENCY: "many"})


def test_a_worker_api_on_a_unix_socket_is_served_as_over_tcp(serving, tmp_path):
    """The agent serves each container's worker API on a unix socket in the container's own files (hosts never
    listen on a network port): ``unix:///PATH`` in the environment is HTTP over that socket."""
    standin = AgentStandIn(socket_path=str(tmp_path / "api.sock")).start()
    try:
        serving(lambda request: {"echo": request.input}, standin.env())
        standin.submit("r1", {"prompt": "hi"})
        standin.wait_for(lambda: "r1" in standin.results)
        assert standin.results["r1"] == {"echo": {"prompt": "hi"}}
        standin.wait_for(lambda: bool(standin.heartbeats))
        assert set(standin.authorizations) == {"Bearer worker-token"}
    finally:
        standin.stop()


@pytest.mark.parametrize("url", ["unix://relative/api.sock", "unix://", "ftp://host/x", "http://"])
def test_a_worker_api_url_other_than_unix_or_http_is_refused(url):
    with pytest.raises(ValueError, match="IDLEGRID_WORKER_API must be"):
        WorkerAPI(url, "t")


def test_a_runner_hands_its_result_over_and_goes_on_while_another_sends_and_the_sender_settles_both(agent):
    """A runner whose result finds a results call under way does not wait for its outcome (a thread's wake for every
    request): the sending thread settles it, with its own, once the agent answered."""
    opened = threading.Event()
    held = agent.answer_results

    def answer_results(results: list[dict[str, Any]]) -> tuple[int, Any]:
        opened.wait(WAIT_S)  # the first call is held until the test opens it (at most WAIT_S, never forever)
        return held(results)

    agent.answer_results = answer_results
    worker = _Worker(
        lambda request: None,
        WorkerAPI(agent.url, agent.token),
        concurrency=2,
        heartbeat_s=60.0,
        take_wait_s=0.2,
        stop=threading.Event(),
    )
    for request_id in ("a", "b"):
        worker.in_flight[request_id] = Request(TakenRequest(request_id, None), worker.api)
    sender = threading.Thread(target=worker.results.hand, args=("a", b"1", 1), daemon=True)
    sender.start()
    agent.wait_for(lambda: worker.results.sending)  # a's call is under way, held by the agent

    assert worker.results.hand("b", b"2", 2)  # handed over: back at once, not after the held call
    assert not opened.is_set()
    assert set(worker.in_flight) == {"a", "b"}  # in flight until the sender settles them

    opened.set()
    agent.wait_for(lambda: agent.results == {"a": 1, "b": 2})
    sender.join(WAIT_S)
    assert not sender.is_alive()
    assert worker.in_flight == {} and not worker.results.sending
    assert [sorted(ids) for ids in agent.result_calls] == [["a"], ["b"]]

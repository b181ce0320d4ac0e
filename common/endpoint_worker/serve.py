"""``serve(handler)``: take requests from the agent's worker API, run the handler on them, report what it made.

Threads, not asyncio, so any handler runs as written (blocking GPU calls included): ``concurrency`` threads, each of
which runs a request taken for it, or, when none waits, no other thread is taking and the worker has room (fewer than
``concurrency`` in flight), takes: one long poll for as many requests as there is room for, in one call. The thread
that took runs the first of them itself and leaves the rest to the others (a leader and its followers), so a request
alone goes from its take to its handler without crossing threads. One more thread heartbeats the requests in flight
and learns which were cancelled. Reports that must arrive (partials, results, errors, releases) are retried with
backoff while the agent is away; a progress is sent once (the next replaces it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import random
import signal
import threading
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import contract
from .client import (
    AgentUnavailable,
    BadAnswer,
    BodyTooLarge,
    CallUnknown,
    RequestGone,
    TakenRequest,
    TokenRefused,
    WorkerAPI,
)

log = logging.getLogger(__name__)

Handler = Callable[["Request"], Any]
# Results sent together in one /v1/results call: at most this many bytes of outputs (a larger output goes alone, by its
# request's /result), so the call fits the agent's frame to the Master.
RESULTS_BATCH_BYTES = 128 * 1024
DROPPED = 0  # a result's outcome when it could not be sent (the token refused, the drain after a stop ran out)


class Request:
    """One request as a handler sees it: its ``id``, its ``input`` (JSON), which ``attempt`` this is, whether it was
    ``cancelled`` (a long handler may look, and stop early), and ``progress(value)`` to tell the caller how far it is."""

    def __init__(self, taken: TakenRequest, api: WorkerAPI) -> None:
        self.id = taken.id
        self.input = taken.input
        self.attempt = taken.attempt
        self._api = api
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def progress(self, value: Any) -> None:
        """Send a progress update (any JSON value). Best effort: one try; the next update replaces this one."""
        try:
            self._api.report(self.id, contract.PROGRESS, {"progress": value})
        except RequestGone:
            self.cancel()
        except (AgentUnavailable, BadAnswer, BodyTooLarge) as exc:
            log.warning("progress of %s not sent: %s", self.id, exc)


@dataclass
class Backoff:
    """Exponential backoff with jitter (each pause drawn from half to all of its step, so workers that lost the agent
    together do not come back together), reset by a success."""

    first_s: float = 0.05
    most_s: float = 5.0
    _next_s: float = field(default=0.0, init=False)

    def pause_s(self) -> float:
        self._next_s = min(self.most_s, self._next_s * 2 if self._next_s else self.first_s)
        return random.uniform(self._next_s / 2, self._next_s)

    def reset(self) -> None:
        self._next_s = 0.0


class _Worker:
    def __init__(
        self,
        handler: Handler,
        api: WorkerAPI,
        *,
        concurrency: int,
        heartbeat_s: float,
        take_wait_s: float,
        stop: threading.Event,
    ) -> None:
        self.handler = handler
        self.api = api
        self.concurrency = concurrency
        self.pending: deque[Request] = deque()  # taken, in flight, not started yet: the next free thread runs each
        self.taking = False  # a thread is taking (or backing off after a failed take) now
        self.take_backoff = Backoff()
        self.heartbeat_s = heartbeat_s
        self.take_wait_s = take_wait_s
        self.stop = stop
        self.abandon = threading.Event()  # set when the drain after a stop ran out: undelivered reports are dropped
        self.done = threading.Event()  # the takers ended: heartbeats (which keep a draining worker alive) end too
        self.in_flight: dict[str, Request] = {}
        self.delivering = 0  # reports being sent for requests no longer in flight (releases)
        self.lock = threading.Lock()
        self.settled = threading.Condition(self.lock)  # notified as a request leaves in_flight
        self.turn = threading.Condition(self.lock)  # notified when a thread may have something to do: run, take, end
        self.fatal: TokenRefused | None = None
        self.results = _ResultSender(self)

    def refused(self, exc: TokenRefused) -> None:
        log.error("the agent refused this worker's token; stopping: %s", exc)
        self.fatal = exc
        self.stop.set()
        self.abandon.set()
        self.done.set()
        self.wake_all()

    def wake_all(self) -> None:
        """Every thread waiting for its turn looks again (the worker stops)."""
        with self.lock:
            self.turn.notify_all()
            self.settled.notify_all()

    # the threads: each takes or runs, in turn

    def work_loop(self) -> None:
        """One of the ``concurrency`` threads: run a request taken and not started yet; else take, when no other
        thread is taking and the worker has room, and run the first of what came; else wait for a turn. Ends once the
        worker stops and nothing taken waits to run. A request counts as in flight from its take (the heartbeat names
        it) until its reports are sent."""
        while True:
            with self.lock:
                while True:
                    if self.pending:
                        request: Request | None = self.pending.popleft()
                        break
                    if self.stop.is_set():
                        self.turn.notify()  # the next thread waiting sees the stop too
                        return
                    if not self.taking and len(self.in_flight) < self.concurrency:
                        self.taking, request = True, None
                        room = self.concurrency - len(self.in_flight)
                        break
                    self.turn.wait()
            if request is None:
                request = self.take(room)
            if request is not None:
                self.run(request)

    def take(self, room: int) -> Request | None:
        """One take of up to ``room`` requests (this thread is the one taking): the first to run here, the rest left
        for the other threads; None when none came, or the take failed (after a backoff: no other thread takes
        meanwhile)."""
        try:
            taken = self.api.take_many(room, self.take_wait_s)
        except TokenRefused as exc:
            taken = []
            self.refused(exc)
        except (AgentUnavailable, BadAnswer, BodyTooLarge) as exc:
            taken = []
            log.warning("take failed, retrying: %s", exc)
            self.stop.wait(self.take_backoff.pause_s())
        else:
            self.take_backoff.reset()
        if self.stop.is_set() and taken:  # taken as the worker stops: back to the queue for another worker
            with self.lock:
                self.taking = False
                self.turn.notify()
            for one in taken:
                self.release(one.id)
            return None
        requests = [Request(one, self.api) for one in taken]
        with self.lock:  # in flight before another thread may take: no take asks for more than the room left
            for request in requests:
                self.in_flight[request.id] = request
            self.pending.extend(requests[1:])
            self.taking = False
            self.turn.notify(len(requests))  # one for each left to run, and one to take if room is left
        return requests[0] if requests else None

    def release(self, request_id: str) -> None:
        with self.lock:
            self.delivering += 1
        try:
            self.deliver(request_id, contract.RELEASE, {})
        finally:
            with self.lock:
                self.delivering -= 1
                self.settled.notify_all()

    def run(self, request: Request) -> None:
        handed = False  # its result handed to the results sender, which settles the request once it is sent
        try:
            output = self.handler(request)
            output = self.drive(request, output)
        except RequestGone:
            log.info("request %s is no longer this worker's: dropped", request.id)
        except TokenRefused as exc:
            self.refused(exc)
        except Exception as exc:  # the handler's failure is the request's, never the worker's
            self.deliver(request.id, contract.ERROR, {"error": describe(exc)})
        else:
            if request.cancelled:
                log.info("request %s was cancelled: its result is dropped", request.id)
            else:
                handed = self.deliver_result(request.id, output)
        finally:
            if not handed:
                with self.lock:
                    self.in_flight.pop(request.id, None)
                    self.settled.notify_all()  # this thread looks for its next turn itself: it may take the room made

    def settle(self, request_ids: list[str]) -> None:
        """Requests whose results the results sender delivered leave in_flight; a thread waiting for its turn may take
        the room made (the runners went on without waiting for their results: no thread looks by itself)."""
        with self.lock:
            for request_id in request_ids:
                self.in_flight.pop(request_id, None)
            self.settled.notify_all()
            if not self.taking:
                self.turn.notify()

    def drive(self, request: Request, output: Any) -> Any:
        """The handler's final output: a plain value as it is; a coroutine awaited; a generator's (or an async
        generator's) items streamed as partial outputs, its return value the result."""
        if inspect.iscoroutine(output):
            return asyncio.run(output)
        if inspect.isgenerator(output):
            return self.stream(request, output)
        if inspect.isasyncgen(output):
            loop = asyncio.new_event_loop()
            try:
                items = _sync_items(loop, output)
                return self.stream(request, items)
            finally:
                loop.run_until_complete(output.aclose())
                loop.close()
        return output

    def stream(self, request: Request, items: Any) -> Any:
        seq = 0
        try:
            while not request.cancelled:
                try:
                    item = next(items)
                except StopIteration as end:
                    return end.value
                partial = {"seq": seq, "output": item}
                self.deliver(request.id, contract.PARTIAL, partial, raise_gone=True, raise_unsendable=True)
                seq += 1
            return None
        finally:
            items.close()

    def deliver_result(self, request_id: str, output: Any) -> bool:
        """The result, with the others finished meanwhile in one call (``_ResultSender``): True when it was handed
        to the sender, which settles the request once it is sent, while this thread goes on (it waited for its
        outcome before: a thread's wake for every request, most of the library's CPU under load); alone, by its
        request's own path, when it is large or the agent has no results call."""
        try:
            encoded = json.dumps(output).encode()
        except (TypeError, ValueError) as exc:
            self.deliver_error(request_id, exc)
            return False
        if len(encoded) <= RESULTS_BATCH_BYTES and self.results.hand(request_id, encoded, output):
            return True
        self.result_sent(request_id, output, None)
        return False

    def result_sent(self, request_id: str, output: Any, outcome: int | None) -> None:
        """What follows a result's outcome: None, it goes alone by its own path (the agent has no results call); 413
        an error report; 404, 409 dropped."""
        if outcome is None:
            try:
                self.deliver(request_id, contract.RESULT, {"output": output}, raise_unsendable=True)
            except (TypeError, ValueError, BodyTooLarge) as exc:
                self.deliver_error(request_id, exc)
        elif outcome == 413:
            self.deliver_error(request_id, BodyTooLarge(f"{contract.RESULTS}: the agent refused a result this large (413)"))
        elif outcome in (404, 409):
            log.info("result of %s: the request is no longer this worker's", request_id)

    def deliver_error(self, request_id: str, exc: Exception) -> None:
        self.deliver(request_id, contract.ERROR, {"error": describe(exc, what="the handler's output could not be sent")})

    def deliver_results(self, batch: list[tuple[str, bytes]]) -> list[int | None]:
        """Send results together until the agent answers them: each one's status (204, 404, 409, 413); None for each
        when the agent has no results call (they go alone then), or when the drain after a stop ran out (dropped)."""
        ids = ", ".join(request_id for request_id, _ in batch)
        backoff = Backoff()
        while True:
            try:
                return list(self.api.results(batch))
            except CallUnknown:
                self.results.unknown = True
                return [None] * len(batch)
            except TokenRefused as exc:
                self.refused(exc)
                return [DROPPED] * len(batch)  # this worker can never report
            except (AgentUnavailable, BadAnswer) as exc:
                if self.abandon.is_set():
                    break
                log.warning("result of %s not delivered yet: %s", ids, exc)
                self.abandon.wait(backoff.pause_s())
        log.error("result of %s dropped: the worker stopped before the agent came back", ids)
        return [DROPPED] * len(batch)

    def deliver(
        self, request_id: str, report: str, body: dict[str, Any], *, raise_gone: bool = False, raise_unsendable: bool = False
    ) -> None:
        """Send a report until the agent answers it (or the request is gone, or the drain after a stop ran out: then
        it is tried once more, and dropped)."""
        backoff = Backoff()
        while True:
            try:
                self.api.report(request_id, report, body)
                return
            except RequestGone:
                if raise_gone:
                    raise
                log.info("%s of %s: the request is no longer this worker's", report, request_id)
                return
            except TokenRefused as exc:
                return self.refused(exc)
            except (TypeError, ValueError, BodyTooLarge) as exc:
                if raise_unsendable:
                    raise
                log.error("%s of %s cannot be sent: %s", report, request_id, exc)
                return
            except (AgentUnavailable, BadAnswer) as exc:
                if self.abandon.is_set():
                    break
                log.warning("%s of %s not delivered yet: %s", report, request_id, exc)
                self.abandon.wait(backoff.pause_s())
        log.error("%s of %s dropped: the worker stopped before the agent came back", report, request_id)

    # heartbeats

    def heartbeat_loop(self) -> None:
        while not self.done.wait(self.heartbeat_s):
            with self.lock:
                held = sorted(self.in_flight)
            try:
                cancel = self.api.heartbeat(held)
            except TokenRefused as exc:
                return self.refused(exc)
            except (AgentUnavailable, BadAnswer) as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            with self.lock:
                for request_id in cancel:
                    if request_id in self.in_flight:
                        self.in_flight[request_id].cancel()


@dataclass(slots=True)
class _Result:
    request_id: str
    encoded: bytes
    output: Any  # sent alone, by its own path, if the agent turns out to have no results call


class _ResultSender:
    """Results sent together, in the way of a group commit: a runner whose result finds no call under way sends it,
    with every result handed over meanwhile, and goes on sending while more wait; the others go on with their next
    request, and the sender settles theirs (``_Worker.result_sent``, ``_Worker.settle``). So one request alone costs
    one call, and requests finishing together share one."""

    def __init__(self, worker: _Worker) -> None:
        self.worker = worker
        self.lock = threading.Lock()
        self.pending: list[_Result] = []
        self.sending = False
        self.unknown = False  # the agent has no results call: every result goes alone

    def hand(self, request_id: str, encoded: bytes, output: Any) -> bool:
        """Hand a result over to be sent with the others; False: send it alone (the agent has no results call). The
        thread that finds no call under way sends, for as long as results wait."""
        if self.unknown:
            return False
        with self.lock:
            self.pending.append(_Result(request_id, encoded, output))
            lead, self.sending = not self.sending, True
        if lead:
            self._lead()
        return True

    def _lead(self) -> None:
        while True:
            with self.lock:
                batch: list[_Result] = []
                size = 0
                while self.pending and len(batch) < contract.MAX_RESULTS:
                    if batch and size + len(self.pending[0].encoded) > RESULTS_BATCH_BYTES:
                        break
                    batch.append(self.pending.pop(0))
                    size += len(batch[-1].encoded)
                if not batch:
                    self.sending = False
                    return
            outcomes: list[int | None] = [DROPPED] * len(batch)
            try:
                if not self.unknown:  # else the agent has no results call: each goes alone
                    outcomes = self.worker.deliver_results([(one.request_id, one.encoded) for one in batch])
                else:
                    outcomes = [None] * len(batch)
                for one, outcome in zip(batch, outcomes, strict=True):
                    if outcome != 204:
                        self.worker.result_sent(one.request_id, one.output, outcome)
            except BaseException:
                with self.lock:
                    self.sending = False
                raise
            finally:  # whatever happened, no request stays in flight for good
                self.worker.settle([one.request_id for one in batch])


def _sync_items(loop: asyncio.AbstractEventLoop, agen: Any) -> Any:
    while True:
        try:
            yield loop.run_until_complete(agen.__anext__())
        except StopAsyncIteration:
            return None


def describe(exc: BaseException, *, what: str | None = None) -> dict[str, str]:
    message = str(exc) if what is None else f"{what}: {exc}"
    return {
        "type": exc.__class__.__name__,
        "message": message,
        "traceback": "".join(traceback.format_exception(exc))[-8_000:],
    }


def settings_from_env(env: dict[str, str] | None = None) -> tuple[str, str, int, float]:
    """The API's URL, the token, the concurrency and the heartbeat period, from the environment."""
    env = dict(os.environ) if env is None else env
    missing = [name for name in (contract.ENV_API, contract.ENV_TOKEN) if not env.get(name)]
    if missing:
        raise ValueError(f"{' and '.join(missing)} not set: serve() runs inside an endpoint worker, which the agent starts")
    try:
        concurrency = int(env.get(contract.ENV_CONCURRENCY) or contract.DEFAULT_CONCURRENCY)
        heartbeat_s = float(env.get(contract.ENV_HEARTBEAT_S) or contract.DEFAULT_HEARTBEAT_S)
    except ValueError as exc:
        raise ValueError(f"{contract.ENV_CONCURRENCY} and {contract.ENV_HEARTBEAT_S} must be numbers: {exc}") from exc
    if concurrency < 1 or heartbeat_s <= 0:
        raise ValueError(f"{contract.ENV_CONCURRENCY} must be 1 or more and {contract.ENV_HEARTBEAT_S} more than 0")
    return env[contract.ENV_API], env[contract.ENV_TOKEN], concurrency, heartbeat_s


def serve(
    handler: Handler,
    *,
    concurrency: int | None = None,
    stop: threading.Event | None = None,
    drain_s: float = 30.0,
    take_wait_s: float = contract.DEFAULT_TAKE_WAIT_S,
    env: dict[str, str] | None = None,
) -> None:
    """Run ``handler`` on this worker's requests until ``stop`` is set (or SIGTERM, when called from the main
    thread). Requests in flight then finish; reports still undelivered ``drain_s`` later are dropped. Raises
    ``TokenRefused`` if the agent refuses the token: the worker can never work, and its process should end."""
    url, token, env_concurrency, heartbeat_s = settings_from_env(env)
    concurrency = env_concurrency if concurrency is None else concurrency
    if concurrency < 1:
        raise ValueError("concurrency must be 1 or more")
    stop = threading.Event() if stop is None else stop
    if not callable(handler):
        raise TypeError(f"serve() needs a callable handler(request), not {handler!r}")
    api = WorkerAPI(url, token)
    worker = _Worker(handler, api, concurrency=concurrency, heartbeat_s=heartbeat_s, take_wait_s=take_wait_s, stop=stop)
    previous = _on_sigterm(stop)
    threads = [threading.Thread(target=worker.work_loop, name=f"work-{n}", daemon=True) for n in range(concurrency)]
    beats = threading.Thread(target=worker.heartbeat_loop, name="heartbeat", daemon=True)
    for thread in [*threads, beats]:
        thread.start()
    try:
        while not stop.wait(1.0):
            pass
        worker.wake_all()  # the threads waiting for a turn see the stop
        # Requests in flight finish (their reports sent) within drain_s. A thread still in a take's long poll is not
        # waited for: what it gets now it releases, and what a worker that ended held the agent sends back to the
        # queue anyway (as for a worker killed outright).
        with worker.settled:
            worker.settled.wait_for(lambda: not worker.in_flight and not worker.delivering, timeout=drain_s)
        worker.abandon.set()
        worker.done.set()
        beats.join()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if worker.fatal is not None:
        raise worker.fatal


def _on_sigterm(stop: threading.Event) -> Any:
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

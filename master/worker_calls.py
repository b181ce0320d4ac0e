"""Endpoint workers' calls, as the Master passes them on: the ``WorkerCalls`` handler management registers (the request
queue: docs/endpoints.md), the names it is called with, and how each call's outcome becomes the HTTP status the agent
gives the worker (common/endpoint_worker/contract.py).

A worker is one container of one endpoint, named by the ``endpoint_worker`` of its create command's spec. The agent
checks the worker's token; the Master checks that the agent calling is the one the worker's container was created
on (``WorkerPlaces``), and hands the handler a ``WorkerRef`` it built itself, so a handler never takes a host's word
for whose worker it speaks for. With no handler registered every call is answered 503, which the worker retries.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

import msgspec

from common.wire import MAX_WORKER_TAKE_WAIT_S, WorkerCall, WorkerOp, WorkerResults

MAX_GONE_REMEMBERED = 100_000  # workers said gone that one Master process keeps refusing (oldest forgotten first)
# Calls of one agent's workers being answered at once (long polls mostly): past it a call is answered 429 at once,
# which the worker retries, so a host cannot pile up waiting tasks on the Master. A host of 8 workers running 64
# requests each stays well within.
MAX_CALLS_IN_FLIGHT_PER_AGENT = 1024
BUSY_STATUS = 429
NO_QUEUE_STATUS = 503  # no handler registered: the worker's library retries with backoff


@dataclass(frozen=True, slots=True)
class WorkerRef:
    """One worker: its endpoint, its id, and the agent its container was created on (checked by the Master)."""

    endpoint_id: str
    worker_id: str
    agent_id: str


@dataclass(frozen=True, slots=True)
class TakenRequest:
    id: str
    input: Any
    attempt: int = 1


class WorkerError(msgspec.Struct, frozen=True):
    """A handler's failure as its worker reported it (kept in the request's record as it is)."""

    type: str = ""
    message: str = ""
    traceback: str = ""


class CallOutcome(enum.Enum):
    OK = 204
    GONE = 404  # the request is no longer this worker's: its outputs are dropped
    TOO_LARGE = 413


class WorkerCalls(Protocol):
    """What the Master hands each worker call to. ``take`` is a long poll of at most ``wait_s`` seconds."""

    async def take(self, worker: WorkerRef, wait_s: float) -> TakenRequest | None: ...
    async def take_many(self, worker: WorkerRef, wait_s: float, most: int) -> list[TakenRequest]: ...
    async def heartbeat(self, worker: WorkerRef, in_flight: list[str]) -> list[str]: ...
    async def partial(self, worker: WorkerRef, request_id: str, seq: int, output: Any) -> CallOutcome: ...
    async def progress(self, worker: WorkerRef, request_id: str, progress: Any) -> CallOutcome: ...
    async def result(self, worker: WorkerRef, request_id: str, output: Any) -> CallOutcome: ...
    async def results(self, worker: WorkerRef, results: list[tuple[str, Any]]) -> list[CallOutcome]: ...
    async def error(self, worker: WorkerRef, request_id: str, error: WorkerError) -> CallOutcome: ...
    async def release(self, worker: WorkerRef, request_id: str) -> CallOutcome: ...
    async def worker_gone(self, worker: WorkerRef) -> None: ...


class WorkerPlaces:
    """Which agent each worker's container was created on: (endpoint id, worker id) -> (agent id, container name),
    learned from the create commands that succeed. In memory: after a Master restart the agent channel reads a
    worker's place back from its create command in the store at the worker's first call."""

    def __init__(self, *, remember_gone: int = MAX_GONE_REMEMBERED) -> None:
        self._places: dict[tuple[str, str], tuple[str, str]] = {}
        # Workers said gone, newest last: never read back from the store (their containers may linger until deleted).
        self._gone: dict[tuple[str, str], None] = {}
        self._remember_gone = remember_gone

    def created(self, endpoint_id: str, worker_id: str, agent_id: str, container: str) -> None:
        self._places[(endpoint_id, worker_id)] = (agent_id, container)
        self._gone.pop((endpoint_id, worker_id), None)

    def forget(self, endpoint_id: str, worker_id: str) -> None:
        self._places.pop((endpoint_id, worker_id), None)
        self._gone[(endpoint_id, worker_id)] = None
        if len(self._gone) > self._remember_gone:
            del self._gone[next(iter(self._gone))]

    def is_gone(self, endpoint_id: str, worker_id: str) -> bool:
        return (endpoint_id, worker_id) in self._gone

    def ref(self, agent_id: str, call: WorkerCall) -> WorkerRef | None:
        """The worker the call names, if ``agent_id`` holds its container; None: no agent may speak for it."""
        if self._places.get((call.endpoint_id, call.worker_id)) != (agent_id, call.container):
            return None
        return WorkerRef(endpoint_id=call.endpoint_id, worker_id=call.worker_id, agent_id=agent_id)


async def answer_call(calls: WorkerCalls | None, worker: WorkerRef, call: WorkerCall) -> tuple[int, Any]:
    """The (HTTP status, JSON body) the worker gets for ``call``, from ``calls`` (None: 503)."""
    if calls is None:
        return NO_QUEUE_STATUS, {"error": "no request queue on this Master"}
    match call.op:
        case WorkerOp.TAKE if call.most > 0:  # a take of several: those queued now, or the first to come
            found = await calls.take_many(worker, min(call.wait_s, MAX_WORKER_TAKE_WAIT_S), call.most)
            if not found:
                return 204, None
            return 200, {"requests": [_taken(one) for one in found]}
        case WorkerOp.TAKE:
            taken = await calls.take(worker, min(call.wait_s, MAX_WORKER_TAKE_WAIT_S))
            if taken is None:
                return 204, None
            return 200, _taken(taken)
        case WorkerOp.HEARTBEAT:
            return 200, {"cancel": await calls.heartbeat(worker, list(call.in_flight))}
        case WorkerOp.GONE:
            await calls.worker_gone(worker)
            return 204, None
        case WorkerOp.RESULTS:
            results = _results_of(call.payload)
            if results is None:
                return 400, {"error": 'results is a list of objects of "id" (a request id) and "output"'}
            return 200, {"outcomes": [outcome.value for outcome in await calls.results(worker, results)]}
    if not call.request_id:
        return 400, {"error": "a report names its request"}
    outcome = await _report(calls, worker, call)
    return outcome.value, None


def _results_of(payload: Any) -> list[tuple[str, Any]] | None:
    """A results call's (request id, output) pairs; None for a payload that is not a list of ``WorkerResult`` (the
    agent checked it, but a frame is a host's word)."""
    try:
        results = msgspec.convert(payload, WorkerResults)
    except msgspec.ValidationError:
        return None
    return [(one.id, one.output) for one in results]


class TakenJson(TypedDict):
    """A taken request as the worker's take call answers it."""

    id: str
    input: Any
    attempt: int


def _taken(taken: TakenRequest) -> TakenJson:
    return {"id": taken.id, "input": taken.input, "attempt": taken.attempt}


async def _report(calls: WorkerCalls, worker: WorkerRef, call: WorkerCall) -> CallOutcome:
    request_id, payload = call.request_id, call.payload
    match call.op:
        case WorkerOp.PARTIAL:
            return await calls.partial(worker, request_id, call.seq, payload)
        case WorkerOp.PROGRESS:
            return await calls.progress(worker, request_id, payload)
        case WorkerOp.RESULT:
            return await calls.result(worker, request_id, payload)
        case WorkerOp.ERROR:
            fields = payload if isinstance(payload, dict) else {}
            error = WorkerError(
                type=str(fields.get("type", "")),
                message=str(fields.get("message", "")),
                traceback=str(fields.get("traceback", "")),
            )
            return await calls.error(worker, request_id, error)
        case _:
            return await calls.release(worker, request_id)

"""Endpoint requests' answers, in RunPod Serverless's shape so that its clients port as they are (docs/endpoints.md,
"The request routes"): ``{"id", "status", "delayTime", "executionTime", "output", "error"}``, the status one of
``IN_QUEUE``, ``IN_PROGRESS``, ``COMPLETED``, ``FAILED``, ``CANCELLED``, ``TIMED_OUT``; the fields a request does not
have yet are left out. Ours beside them: ``attempt``, ``reason`` (why it ended other than by its result),
``progress`` (its latest) and ``errorDetail`` (the handler's exception: type, message, traceback)."""

from __future__ import annotations

from typing import Any

import msgspec

from management.endpoints.queue import EndpointRequestRecord, EndReason, Partial, RequestState, value_of
from management.services.endpoint_requests import EndpointHealthReport, StreamRead
from management.views.base import View

JSON = Any

STATUS = {
    RequestState.QUEUED: "IN_QUEUE",
    RequestState.IN_PROGRESS: "IN_PROGRESS",
    RequestState.COMPLETED: "COMPLETED",
    RequestState.FAILED: "FAILED",
    RequestState.CANCELLED: "CANCELLED",
    RequestState.TIMED_OUT: "TIMED_OUT",
}
REASON_SAID = {
    EndReason.CANCELLED: "cancelled",
    EndReason.TTL: "waited in the queue past the endpoint's ttl_s",
    EndReason.EXECUTION_TIMEOUT: "ran past the endpoint's execution_timeout_s",
    EndReason.WORKER_LOST: "its workers were lost more than the endpoint's max_retries times",
}


class Answer(View, omit_defaults=True):
    """Base of these answers: a field a request does not have is left out (RunPod's clients test for presence)."""


class ErrorDetail(Answer):
    type: str
    message: str
    traceback: str = ""


class RequestStatusView(Answer):
    id: str
    status: str  # IN_QUEUE | IN_PROGRESS | COMPLETED | FAILED | CANCELLED | TIMED_OUT
    attempt: int  # 1 the first time; higher after a lost worker or a retry
    delayTime: int | None = None  # ms from submission (this run's) to its worker taking it
    executionTime: int | None = None  # ms its last worker worked on it, once it ended
    output: JSON = None  # a completed request's output
    error: str | None = None  # why it did not complete, in words
    errorDetail: ErrorDetail | None = None  # the handler's exception
    reason: str | None = None  # error | cancelled | ttl | execution_timeout | worker_lost
    progress: JSON = None  # the latest progress its handler sent


class StreamItem(Answer):
    output: JSON
    seq: int  # counts from 0 within an attempt; a stream's ``after``


class RequestStreamView(Answer):
    id: str
    status: str
    stream: list[StreamItem]


class HealthJobs(Answer):
    inQueue: int
    inProgress: int
    completed: int
    failed: int
    cancelled: int
    timedOut: int


class HealthWorkers(Answer):
    ready: int  # heard from lately
    running: int  # holding a request
    idle: int


class EndpointHealthView(Answer):
    jobs: HealthJobs
    workers: HealthWorkers


def _ms(start: float | None, end: float | None) -> int | None:
    return None if start is None or end is None else max(0, round((end - start) * 1000))


def _error(rec: EndpointRequestRecord) -> tuple[str | None, ErrorDetail | None]:
    if rec.error is not None:
        detail = ErrorDetail(type=rec.error.type, message=rec.error.message, traceback=rec.error.traceback)
        return f"{rec.error.type}: {rec.error.message}", detail
    if rec.reason and rec.reason != EndReason.CANCELLED:
        return REASON_SAID.get(EndReason(rec.reason), rec.reason), None
    return None, None


def request_status_view(rec: EndpointRequestRecord) -> RequestStatusView:
    error, detail = _error(rec)
    return RequestStatusView(
        id=rec.id,
        status=STATUS[RequestState(rec.state)],
        delayTime=_ms(rec.submitted_at, rec.started_at),
        executionTime=_ms(rec.started_at, rec.ended_at),
        output=value_of(rec.output) if rec.state == RequestState.COMPLETED else None,
        error=error,
        errorDetail=detail,
        reason=rec.reason or None,
        progress=value_of(rec.progress),
        attempt=rec.attempt,
    )


def request_status_body(rec: EndpointRequestRecord) -> bytes:
    """A webhook's body: the status answer, as GET .../status/{id} gives it."""
    return msgspec.json.encode(request_status_view(rec))


def _item(p: Partial) -> StreamItem:
    return StreamItem(output=p.value(), seq=p.seq)


def request_stream_view(read: StreamRead) -> RequestStreamView:
    rec = read.request
    return RequestStreamView(id=rec.id, status=STATUS[RequestState(rec.state)], stream=[_item(p) for p in read.partials])


def endpoint_health_view(report: EndpointHealthReport) -> EndpointHealthView:
    jobs = report.jobs
    return EndpointHealthView(
        jobs=HealthJobs(
            inQueue=jobs.get(RequestState.QUEUED.value, 0),
            inProgress=jobs.get(RequestState.IN_PROGRESS.value, 0),
            completed=jobs.get(RequestState.COMPLETED.value, 0),
            failed=jobs.get(RequestState.FAILED.value, 0),
            cancelled=jobs.get(RequestState.CANCELLED.value, 0),
            timedOut=jobs.get(RequestState.TIMED_OUT.value, 0),
        ),
        workers=HealthWorkers(
            ready=report.workers, running=report.busy_workers, idle=max(0, report.workers - report.busy_workers)
        ),
    )

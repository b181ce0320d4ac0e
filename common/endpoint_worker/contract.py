"""The worker API: what a worker process inside an endpoint's container and the agent's local side of it say.

The one owner of these facts: the handler library (serve.py) calls them, and the agent's side (to come) serves them.
Standard library only and no import of the rest of idlegrid, so this folder can be copied into any image.

The worker finds the API in its environment:

- ``IDLEGRID_WORKER_API``: where the agent's local endpoint for this one container is: ``unix:///PATH`` (the agent's
  socket inside the container's own files, ``/idlegrid/worker/api.sock``: hosts never listen on a network port), or
  ``http://HOST:PORT`` (the tests' stand-in);
- ``IDLEGRID_WORKER_TOKEN``: the bearer token, sent as ``Authorization: Bearer <token>`` on every call; it names this
  worker of this endpoint, so the agent hands it that endpoint's requests and no other's;
- ``IDLEGRID_WORKER_CONCURRENCY``: requests one worker process runs at once (the endpoint's per-worker concurrency);
- ``IDLEGRID_WORKER_HEARTBEAT_S``: seconds between heartbeats (optional).

Every call is ``POST`` with a JSON body (``Content-Type: application/json``) and answers JSON or nothing (204):

=============================  =====================================  ==========================================
path                           body                                   answer
=============================  =====================================  ==========================================
``/v1/take``                   ``{"wait_s": 20}``                     200 ``{"id", "input", "attempt"}``; 204 when
                                                                      none came within ``wait_s`` (a long poll)
``/v1/take``                   ``{"wait_s": 20, "max": 8}``           200 ``{"requests": [{"id", "input",
                                                                      "attempt"}, ...]}``: 1 to ``max`` of them
                                                                      (those queued, or the first to arrive);
                                                                      204 as above
``/v1/heartbeat``              ``{"in_flight": [id, ...]}``           200 ``{"cancel": [id, ...]}``: requests
                                                                      cancelled (or past their TTL) to drop
``/v1/requests/{id}/partial``  ``{"seq": 0, "output": ...}``          204 (a streamed partial output; ``seq``
                                                                      counts from 0, a resend is the same seq)
``/v1/requests/{id}/progress`` ``{"progress": ...}``                  204 (the latest replaces the one before)
``/v1/requests/{id}/result``   ``{"output": ...}``                    204 (the request succeeded)
``/v1/requests/{id}/error``    ``{"error": {"type", "message",        204 (the handler failed)
                               "traceback"}}``
``/v1/requests/{id}/release``  ``{}``                                 204 (taken but not worked: back to the
                                                                      queue, as when the worker stops)
``/v1/results``                ``{"results": [{"id", "output"},       200 ``{"outcomes": [204 | 404 | 409 | 413,
                               ...]}``                                ...]}``: each result's own answer, as its
                                                                      ``/result`` would have had; a 404 for the
                                                                      call itself is an agent from before it
=============================  =====================================  ==========================================

Answers other than these: 401/403, the token is refused (the worker stops: it can never work); 404/409 on a request's
path, the request is no longer this worker's (cancelled, past its TTL, given to another worker): its outputs are
dropped; 413, a body too large; 429 and 5xx, or no answer, the agent is not there right now: the call is retried with
backoff. A result, error, partial or release is sent until it is answered, at least once: the agent takes each by
(request id, kind, seq) once. A connection may carry one call after another (HTTP/1.1 keep-alive); the agent closes
one left idle.
"""

from __future__ import annotations

from urllib.parse import quote

ENV_API = "IDLEGRID_WORKER_API"
ENV_TOKEN = "IDLEGRID_WORKER_TOKEN"
ENV_CONCURRENCY = "IDLEGRID_WORKER_CONCURRENCY"
ENV_HEARTBEAT_S = "IDLEGRID_WORKER_HEARTBEAT_S"

TAKE = "/v1/take"
HEARTBEAT = "/v1/heartbeat"
RESULTS = "/v1/results"
MAX_RESULTS = 1024  # results one /v1/results call carries, at most (the agent's own bound: common/wire.py)
PARTIAL = "partial"
PROGRESS = "progress"
RESULT = "result"
ERROR = "error"
RELEASE = "release"
REQUEST_REPORTS = (PARTIAL, PROGRESS, RESULT, ERROR, RELEASE)


def request_path(request_id: str, report: str) -> str:
    """The path of one report about one request (``report`` one of ``REQUEST_REPORTS``)."""
    if report not in REQUEST_REPORTS:
        raise ValueError(f"no report {report!r}: one of {', '.join(REQUEST_REPORTS)}")
    if not request_id:
        raise ValueError("a request id cannot be empty")
    return f"/v1/requests/{quote(request_id, safe='')}/{report}"


DEFAULT_TAKE_WAIT_S = 20.0  # a take's long poll; the agent answers 204 when nothing came by then
DEFAULT_HEARTBEAT_S = 5.0
DEFAULT_CONCURRENCY = 1
CALL_TIMEOUT_S = 30.0  # any call but a take, whose timeout is its wait plus this
MAX_BODY_BYTES = 16 * 1024 * 1024  # an answer or a report larger than this is refused

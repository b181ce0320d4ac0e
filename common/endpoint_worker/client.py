"""The worker API's client: one call is one HTTP request on the standard library's ``http.client``, with the bearer
token; answers are sorted into what the caller does next (contract.py says what each means). Each thread keeps its
connection to the agent open from one call to the next (HTTP/1.1 keep-alive): a connection per call cost the worker and
the agent a connect, an accept and a close for every take and every report."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from . import contract


class WorkerAPIError(Exception):
    """Base of the worker API's failures."""


class TokenRefused(WorkerAPIError):
    """401/403: the agent refuses this worker's token; it can never take work."""


class RequestGone(WorkerAPIError):
    """404/409 on a request's path: the request is no longer this worker's; its outputs are dropped."""


class BodyTooLarge(WorkerAPIError):
    """413: the agent refuses a report this large (an output over the endpoint's bound)."""


class AgentUnavailable(WorkerAPIError):
    """No answer, 429 or 5xx: the agent is not there right now; the call is worth retrying."""


class BadAnswer(WorkerAPIError):
    """An answer the contract does not allow (a status, a body that is not the JSON it should be)."""


class CallUnknown(WorkerAPIError):
    """404 or 400 for a call the agent does not have (``/v1/results`` to an agent from before it)."""


@dataclass(frozen=True, slots=True)
class TakenRequest:
    id: str
    input: Any
    attempt: int = 1


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the agent serves each container's worker API on a socket inside the container's own
    files (``unix:///idlegrid/worker/api.sock``), since a host never listens on a network port."""

    def __init__(self, socket_path: str, *, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            if len(self.socket_path.encode()) < 100:
                sock.connect(self.socket_path)
            else:  # a socket address holds 107 bytes: a longer path is reached through its directory's descriptor
                directory, _, name = self.socket_path.rpartition("/")
                fd = os.open(directory or "/", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    sock.connect(f"/proc/self/fd/{fd}/{name}")
                finally:
                    os.close(fd)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class WorkerAPI:
    """Calls to the agent's worker API at ``base_url``: ``unix:///PATH/TO/SOCKET`` (what the agent gives a container)
    or ``http://host:port``."""

    def __init__(self, base_url: str, token: str, *, call_timeout_s: float = contract.CALL_TIMEOUT_S) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.socket_path = parts.path if parts.scheme == "unix" and not parts.netloc else ""
        if parts.scheme == "unix" and not self.socket_path:
            raise ValueError(f"{contract.ENV_API} must be unix:///PATH (three slashes, an absolute path), not {base_url!r}")
        if parts.scheme not in ("http", "unix") or (parts.scheme == "http" and not parts.hostname):
            raise ValueError(f"{contract.ENV_API} must be unix:///PATH or http://HOST:PORT, not {base_url!r}")
        self.host = parts.hostname or ""
        self.port = parts.port or 80
        self.prefix = "" if self.socket_path else parts.path.rstrip("/")
        self.token = token
        self.call_timeout_s = call_timeout_s
        self._kept = threading.local()  # each thread's open connection to the agent

    def take(self, wait_s: float = contract.DEFAULT_TAKE_WAIT_S) -> TakenRequest | None:
        """One request for this worker, or None when none came within ``wait_s``."""
        status, answer = self._call(contract.TAKE, {"wait_s": wait_s}, timeout_s=wait_s + self.call_timeout_s)
        return None if status == 204 else _taken(answer)

    def take_many(self, most: int, wait_s: float = contract.DEFAULT_TAKE_WAIT_S) -> list[TakenRequest]:
        """Up to ``most`` requests for this worker, in one call: those queued now, or the first to arrive within
        ``wait_s`` (a long poll) with any queued by then; none when none came. An agent that answers a single request
        (one from before ``max``) is understood too."""
        body = {"wait_s": wait_s, "max": most}
        status, answer = self._call(contract.TAKE, body, timeout_s=wait_s + self.call_timeout_s)
        if status == 204:
            return []
        if isinstance(answer, dict) and "requests" in answer:
            found = answer["requests"]
            if not isinstance(found, list) or not 1 <= len(found) <= most:
                raise BadAnswer(f"take answered {str(answer)[:200]}: expected a list of 1 to {most} requests")
            return [_taken(one) for one in found]
        return [_taken(answer)]

    def heartbeat(self, in_flight: list[str]) -> list[str]:
        """Tell the agent this worker lives and what it holds; the answer names the requests to drop."""
        status, answer = self._call(contract.HEARTBEAT, {"in_flight": in_flight})
        if status == 204:
            return []
        cancel = answer.get("cancel", []) if isinstance(answer, dict) else None
        if not isinstance(cancel, list) or not all(isinstance(rid, str) for rid in cancel):
            raise BadAnswer(f"heartbeat answered {answer!r}: expected an object with a list of request ids to cancel")
        return cancel

    def report(self, request_id: str, report: str, body: dict[str, Any]) -> None:
        """One report about one request (partial, progress, result, error, release)."""
        self._call(contract.request_path(request_id, report), body)

    def results(self, encoded: list[tuple[str, bytes]]) -> list[int]:
        """Several results in one call, each a request id and its output already encoded as JSON: each one's answer
        (204 taken, 404 or 409 no longer this worker's, 413 too large). CallUnknown from an agent without the call."""
        parts = [b'{"id":' + json.dumps(request_id).encode() + b',"output":' + output + b"}" for request_id, output in encoded]
        payload = b'{"results":[' + b",".join(parts) + b"]}"
        status, raw = self._send(contract.RESULTS, payload, self.call_timeout_s)
        if status in (400, 404):
            raise CallUnknown(f"{contract.RESULTS}: the agent answered {status}")
        answer = _answer(contract.RESULTS, status, raw)
        outcomes = answer.get("outcomes") if isinstance(answer, dict) else None
        if (
            status != 200
            or not isinstance(outcomes, list)
            or len(outcomes) != len(encoded)
            or not all(o in (204, 404, 409, 413) for o in outcomes)
        ):
            raise BadAnswer(f"results answered {status} {str(answer)[:200]}: expected one outcome per result")
        return outcomes

    def _call(self, path: str, body: dict[str, Any], *, timeout_s: float | None = None) -> tuple[int, Any]:
        payload = json.dumps(body).encode()  # a TypeError or ValueError here is the caller's output, not the agent's
        status, raw = self._send(path, payload, timeout_s or self.call_timeout_s)
        return status, _answer(path, status, raw)

    def _send(self, path: str, payload: bytes, timeout: float) -> tuple[int, bytes]:
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "Content-Length": str(len(payload)),
        }
        kept: http.client.HTTPConnection | None = getattr(self._kept, "connection", None)
        self._kept.connection = None
        if kept is not None:
            try:
                return self._exchange(kept, path, payload, headers, timeout)
            except _ClosedWhileIdle:
                pass  # the agent had closed it (idle, or restarted) before reading the call: a fresh one sends it
        return self._exchange(self._connect(timeout), path, payload, headers, timeout)

    def _connect(self, timeout: float) -> http.client.HTTPConnection:
        if self.socket_path:
            return UnixHTTPConnection(self.socket_path, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _exchange(
        self, connection: http.client.HTTPConnection, path: str, payload: bytes, headers: dict[str, str], timeout: float
    ) -> tuple[int, bytes]:
        """One call on ``connection``, kept for this thread's next call when the agent keeps it open. A kept one that
        turns out closed before any answer raises ``_ClosedWhileIdle``: the agent never read the call."""
        reused = connection.sock is not None
        if reused and connection.sock is not None:
            connection.sock.settimeout(timeout)
        connection.timeout = timeout
        try:
            connection.request("POST", self.prefix + path, body=payload, headers=headers)
            response = connection.getresponse()
            status = response.status
            raw = response.read(contract.MAX_BODY_BYTES + 1)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            connection.close()
            if reused:
                raise _ClosedWhileIdle from exc
            raise AgentUnavailable(f"{path}: {exc.__class__.__name__}: {exc}") from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise AgentUnavailable(f"{path}: {exc.__class__.__name__}: {exc}") from exc
        if response.will_close:
            connection.close()
        else:
            self._kept.connection = connection
        return status, raw

    def close(self) -> None:
        """Close this thread's kept connection (the others close with their threads' ends, or the process's)."""
        kept = getattr(self._kept, "connection", None)
        self._kept.connection = None
        if kept is not None:
            kept.close()


class _ClosedWhileIdle(Exception):
    """A kept connection the agent had closed before the call reached it."""


def _taken(answer: Any) -> TakenRequest:
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), str) or not answer["id"] or "input" not in answer:
        raise BadAnswer(f"take answered {str(answer)[:200]}: expected an object with a string id and an input")
    attempt = answer.get("attempt", 1)
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise BadAnswer(f"take answered attempt {attempt!r}: expected a whole number from 1")
    return TakenRequest(id=answer["id"], input=answer["input"], attempt=attempt)


def _answer(path: str, status: int, raw: bytes) -> Any:
    if status in (401, 403):
        raise TokenRefused(f"{path}: the agent refused the worker token ({status})")
    if status in (404, 409) and path.startswith("/v1/requests/"):
        raise RequestGone(f"{path}: the request is no longer this worker's ({status})")
    if status == 413:
        raise BodyTooLarge(f"{path}: the agent refused a body this large (413)")
    if status == 429 or status >= 500:
        raise AgentUnavailable(f"{path}: the agent answered {status}")
    if status == 204:
        return None
    if status != 200:
        raise BadAnswer(f"{path}: the agent answered {status}, which the worker API does not use")  # 400, 404 too
    if len(raw) > contract.MAX_BODY_BYTES:
        raise BadAnswer(f"{path}: an answer over {contract.MAX_BODY_BYTES} bytes")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadAnswer(f"{path}: the answer is not JSON ({exc})") from exc

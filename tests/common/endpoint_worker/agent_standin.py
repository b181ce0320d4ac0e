"""A stand-in for the agent's side of the worker API (common/endpoint_worker/contract.py): a real HTTP server on
127.0.0.1 that hands out the requests a test queues and records every report, so the handler library is tested over
real sockets: TCP on 127.0.0.1, or a unix socket (``socket_path``) as the agent serves it. Like the agent, it keeps
each connection open from one call to the next (``single_take``: it answers a take of several with one request, as
an agent from before ``max`` does). It can be stopped (its open connections closed) and started again on the same
port, and told to answer badly."""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import socketserver
import threading
from collections import defaultdict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from common.endpoint_worker import contract

WAIT_S = 20.0  # how long a test waits for what it expects before it fails (never an assertion on speed)


class _UnixHTTPServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True


class AgentStandIn:
    def __init__(self, token: str = "worker-token", *, socket_path: str = "") -> None:
        self.token = token
        self.socket_path = socket_path
        self.pending: queue.Queue[dict[str, Any]] = queue.Queue()
        self.changed = threading.Condition()
        self.results: dict[str, Any] = {}
        self.errors: dict[str, dict[str, str]] = {}
        self.partials: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        self.progress: dict[str, list[Any]] = defaultdict(list)
        self.released: list[str] = []
        self.heartbeats: list[list[str]] = []
        self.authorizations: list[str] = []
        self.cancel: set[str] = set()  # named in every heartbeat's answer
        self.gone: set[str] = set()  # their reports answer 404
        self.take_gate: threading.Event | None = None  # when set up, a take waits for it before it answers
        self.canned: dict[str, list[tuple[int, bytes]]] = defaultdict(list)  # path -> next answers, used up in order
        self.takes: list[int | None] = []  # each take's max (None: a take of one, the form from before max)
        self.single_take = False
        self.result_calls: list[list[str]] = []  # the ids of each /v1/results call
        self.no_results = False  # /v1/results answers 404, as an agent from before it does
        self.connections: set[socket.socket] = set()  # open now
        self.port = 0
        self.server: socketserver.BaseServer | None = None

    # the test's side

    def start(self) -> AgentStandIn:
        if self.socket_path:
            self.server = _UnixHTTPServer(self.socket_path, _handler_for(self))
        else:
            tcp = ThreadingHTTPServer(("127.0.0.1", self.port), _handler_for(self))
            tcp.daemon_threads = True
            self.port = tcp.server_address[1]
            self.server = tcp
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        with self.changed:
            for connection in self.connections:  # the kept ones too: an agent that goes away closes them all
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    @property
    def url(self) -> str:
        return f"unix://{self.socket_path}" if self.socket_path else f"http://127.0.0.1:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        return {contract.ENV_API: self.url, contract.ENV_TOKEN: self.token, contract.ENV_HEARTBEAT_S: "0.05", **extra}

    def submit(self, request_id: str, value: Any, attempt: int = 1) -> None:
        self.pending.put({"id": request_id, "input": value, "attempt": attempt})

    def wait_for(self, what: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        with self.changed:
            assert self.changed.wait_for(what, timeout_s), "the stand-in never saw what the test waited for"

    # the server's side

    def record(self, change: Callable[[], None]) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def answer(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == contract.TAKE:
            if self.take_gate is not None:
                self.take_gate.wait(WAIT_S)
            most = body.get("max")
            self.record(lambda: self.takes.append(most))
            try:
                first = self.pending.get(timeout=float(body["wait_s"]))
            except queue.Empty:
                return 204, None
            if most is None or self.single_take:
                return 200, first
            found = [first]
            while len(found) < most:
                try:
                    found.append(self.pending.get_nowait())
                except queue.Empty:
                    break
            return 200, {"requests": found}
        if path == contract.HEARTBEAT:
            self.record(lambda: self.heartbeats.append(body["in_flight"]))
            return 200, {"cancel": sorted(self.cancel)}
        if path == contract.RESULTS:
            return self.answer_results(body["results"])
        _, _, _, request_id, report = path.split("/")
        request_id = unquote(request_id)
        if request_id in self.gone:
            return 404, {"error": "gone"}
        match report:
            case contract.RESULT:
                self.record(lambda: self.results.__setitem__(request_id, body["output"]))
            case contract.ERROR:
                self.record(lambda: self.errors.__setitem__(request_id, body["error"]))
            case contract.PARTIAL:
                self.record(lambda: self.partials[request_id].append((body["seq"], body["output"])))
            case contract.PROGRESS:
                self.record(lambda: self.progress[request_id].append(body["progress"]))
            case contract.RELEASE:
                self.record(lambda: self.released.append(request_id))
        return 204, None

    def answer_results(self, results: list[dict[str, Any]]) -> tuple[int, Any]:
        self.record(lambda: self.result_calls.append([one["id"] for one in results]))
        if self.no_results:
            return 404, {"error": "no call /v1/results"}
        outcomes = []
        for one in results:
            if one["id"] in self.gone:
                outcomes.append(404)
                continue
            self.record(lambda one=one: self.results.__setitem__(one["id"], one["output"]))  # type: ignore[misc]
            outcomes.append(204)
        return 200, {"outcomes": outcomes}


def _handler_for(standin: AgentStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            standin.record(lambda: standin.connections.add(self.connection))

        def finish(self) -> None:
            standin.record(lambda: standin.connections.discard(self.connection))
            super().finish()

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            auth = self.headers.get("Authorization", "")
            standin.record(lambda: standin.authorizations.append(auth))
            if standin.canned[self.path]:
                status, raw = standin.canned[self.path].pop(0)
                return self.send(status, raw)
            if auth != f"Bearer {standin.token}":
                return self.send(401, b'{"error": "unauthorized"}')
            status, answer = standin.answer(self.path, body)
            self.send(status, b"" if answer is None else json.dumps(answer).encode())

        def send(self, status: int, raw: bytes) -> None:
            self.send_response(status)
            if status != 204:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if status != 204:
                self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler

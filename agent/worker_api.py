"""The worker API's agent side: each endpoint worker container on this host gets its own local worker API
(common/endpoint_worker/contract.py), on a unix socket in a directory of its own, and each call goes to the Master as a
``worker_call`` frame; the Master's ``worker_answer`` is the HTTP answer (docs/endpoints.md, "The agent's side").

Hosts never listen on a network port: the socket is ``<state>/worker-api/<container>/api.sock``, 0700, bound into the
container at ``/idlegrid/worker`` (under the process runtime's sandbox, at its data root: ``/idlegrid/mnt/idlegrid/
worker``; a container that shares the host's files reaches the host path). ``IDLEGRID_WORKER_API`` names where.

Which containers are workers, and with which token: the create command's signed spec (``endpoint_worker``). The agent
mints nothing; it checks each call's bearer token against the spec's, in constant time, and names the worker in the
frame from the spec, never from the call: a worker can speak only for itself. The Master checks that this agent holds
the worker's container.

``judge`` (pure: an HTTP request in, a ``WorkerCall`` or a refusal out) decides; ``WorkerAPIs`` only moves bytes: it
serves the sockets, sends the frames, and waits for each answer (``answer_timeout_s``: a take's wait plus a margin;
no answer in time, or no link, is a 503 the worker retries). A container that ends, or is deleted, closes its socket
and the Master is told (``gone``), so its requests go back to the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import os
import shutil
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import msgspec

from agent.runtime.base import Mount, MountsData
from common.containers import ContainerSpec, EndpointWorkerSpec
from common.endpoint_worker import contract
from common.wire import (
    MAX_FRAME_BYTES,
    MAX_WORKER_TAKE_MOST,
    MAX_WORKER_TAKE_WAIT_S,
    WorkerAnswer,
    WorkerCall,
    WorkerOp,
    WorkerResults,
)

log = logging.getLogger(__name__)

CONTAINER_DIR = "/idlegrid/worker"  # where a container with files of its own sees its socket's directory
SOCKET_NAME = "api.sock"
MAX_BODY_BYTES = MAX_FRAME_BYTES - 16 * 1024  # a body must fit one frame with its fields: larger is a 413
ANSWER_MARGIN_S = 15.0  # beyond a take's wait, how long a call waits for the Master's answer before a 503
MAX_HEADER_BYTES = 16 * 1024
# A connection kept open between calls (HTTP/1.1 keep-alive) is closed after this long with no call on it: the library
# keeps one per thread, and calls on it every few seconds at least (its heartbeats, its takes' long polls).
IDLE_CONNECTION_S = 120.0
# Calls of one container waiting for the Master at once: past it a call is answered 429 at once (the worker retries),
# so a worker cannot flood the host link. A worker takes ``concurrency`` at a time, plus its heartbeat and reports.
MAX_CALLS_PER_WORKER = 256

_REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found"}
_REASONS |= {405: "Method Not Allowed", 409: "Conflict", 413: "Payload Too Large", 500: "Internal Server Error"}
_REASONS |= {429: "Too Many Requests", 503: "Service Unavailable"}
_REPORT_OPS = {op.value: op for op in (WorkerOp.PARTIAL, WorkerOp.PROGRESS, WorkerOp.RESULT, WorkerOp.ERROR, WorkerOp.RELEASE)}


@dataclass(frozen=True, slots=True)
class Refusal:
    """An answer the agent gives itself, without asking the Master."""

    status: int
    message: str


def judge(
    worker: EndpointWorkerSpec, container: str, call_id: str, method: str, path: str, authorization: str, body: bytes
) -> WorkerCall | Refusal:
    """What one HTTP request of a worker is: a call for the Master, or a refusal. Never raises."""
    if not hmac.compare_digest(authorization.encode(), f"Bearer {worker.token}".encode()):
        return Refusal(401, "the worker token is refused")
    if method != "POST":
        return Refusal(405, "the worker API takes POST only")
    if len(body) > MAX_BODY_BYTES:
        return Refusal(413, f"a body over {MAX_BODY_BYTES} bytes")
    try:
        fields = _json(body or b"{}")
    except ValueError:
        return Refusal(400, "the body is not JSON")
    if not isinstance(fields, dict):
        return Refusal(400, "the body is not a JSON object")
    names = {"call_id": call_id, "container": container, "endpoint_id": worker.endpoint_id, "worker_id": worker.worker_id}
    try:
        return _call(names, path, fields)
    except (msgspec.ValidationError, TypeError, ValueError) as exc:
        return Refusal(400, f"the body does not fit the call: {exc}")


def _json(body: bytes) -> Any:
    """``json.loads``, by msgspec where it can: a third of the time on a batch of results. What msgspec refuses and
    the standard library reads (NaN and Infinity, which ``json.dumps`` writes for a handler's float, integers past 64
    bits) is read as before; ValueError when neither reads it."""
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        return json.loads(body)


def _call(names: dict[str, str], path: str, fields: dict[str, Any]) -> WorkerCall | Refusal:
    if path == contract.TAKE:
        wait_s = fields.get("wait_s", contract.DEFAULT_TAKE_WAIT_S)
        if not isinstance(wait_s, (int, float)) or isinstance(wait_s, bool) or not wait_s >= 0:
            return Refusal(400, "wait_s is a number of seconds")
        most = fields.get("max", 0)  # none: a take of one, answered as the request itself (the library before max)
        if not isinstance(most, int) or isinstance(most, bool) or most < 0 or ("max" in fields and most < 1):
            return Refusal(400, "max is a whole number of requests from 1")
        wait = min(float(wait_s), MAX_WORKER_TAKE_WAIT_S)
        return msgspec.convert({**names, "op": "take", "wait_s": wait, "most": min(most, MAX_WORKER_TAKE_MOST)}, WorkerCall)
    if path == contract.HEARTBEAT:
        return msgspec.convert({**names, "op": "heartbeat", "in_flight": fields.get("in_flight", [])}, WorkerCall)
    if path == contract.RESULTS:
        return _results(names, fields.get("results"))
    parts = path.split("/")
    if len(parts) != 5 or parts[:3] != ["", "v1", "requests"] or parts[4] not in _REPORT_OPS or not parts[3]:
        return Refusal(404, f"no call {path}")
    op, request_id = _REPORT_OPS[parts[4]], unquote(parts[3])
    seq = fields.get("seq", 0) if op is WorkerOp.PARTIAL else 0
    payload = {
        WorkerOp.PARTIAL: fields.get("output"),
        WorkerOp.PROGRESS: fields.get("progress"),
        WorkerOp.RESULT: fields.get("output"),
        WorkerOp.ERROR: fields.get("error"),
        WorkerOp.RELEASE: None,
    }[op]
    return msgspec.convert(
        {**names, "op": op.value, "request_id": request_id, "seq": seq, "payload": payload}, WorkerCall, strict=True
    )


def _results(names: dict[str, str], results: Any) -> WorkerCall | Refusal:
    """Several results in one call: each an object of its request's ``id`` and its ``output`` (common/wire.py
    ``WorkerResult``); a ValidationError is the caller's 400."""
    msgspec.convert(results, WorkerResults)
    return msgspec.convert({**names, "op": WorkerOp.RESULTS.value, "payload": results}, WorkerCall)


class WorkerAPIs:
    """The worker API of every endpoint worker container on this host: one unix socket server each, the calls sent
    through ``send`` (False: no link now, a 503) and answered by ``on_answer``."""

    def __init__(self, root: Path, send: Callable[[WorkerCall], Awaitable[bool]]) -> None:
        self.root = root
        self._send = send
        self._servers: dict[str, tuple[EndpointWorkerSpec, asyncio.Server]] = {}
        self._started: set[str] = set()  # served containers known to exist (a create in progress is not yet)
        self._missing: set[str] = set()  # started ones the last runtime listing did not have
        self._calls_of: dict[str, int] = {}  # container -> its calls waiting for the Master now
        self._waiting: dict[str, asyncio.Future[WorkerAnswer]] = {}
        # container -> its open connections: a server's close leaves them open, so closing a worker closes them too
        self._connections: dict[str, set[asyncio.StreamWriter]] = {}
        self._ids = itertools.count(1)
        self._prefix = os.urandom(4).hex()  # call ids of an earlier agent process are never answered to this one

    def serves(self, name: str) -> bool:
        return name in self._servers

    def served(self) -> set[str]:
        return set(self._servers)

    def started(self, name: str) -> None:
        """``name``'s container exists now (created, or found running at a resume): from now on, a runtime listing
        without it means the container is lost (``lost``)."""
        if name in self._servers:
            self._started.add(name)

    async def lost(self, listed: set[str]) -> None:
        """Containers the runtime lists now (running or ended): a started worker missing from two listings in a row
        is gone (one alone may be a listing taken just before its create ended)."""
        missing = self._started - listed
        for name in sorted(missing & self._missing):
            log.warning("an endpoint worker's container is no longer there", extra={"container": name})
            await self.close(name)
        self._missing = missing - self._missing

    async def prepare(self, spec: ContainerSpec, runtime: object) -> tuple[ContainerSpec, list[Mount]]:
        """Serve ``spec``'s worker API (when it is an endpoint worker's) and give the container its environment and the
        socket's directory: ``spec`` as the runtime creates it, and the mount to add (none: it sees the host path)."""
        worker = spec.endpoint_worker
        if worker is None:
            return spec, []
        directory = self.root / spec.name
        await self.open(spec.name, worker, directory)
        # Kept beside (never inside) the container's directory, so a new agent process serves it again: ``resume``.
        record = self._record(spec.name)
        record.write_bytes(msgspec.json.encode(worker))
        os.chmod(record, 0o600)
        host_paths = not isinstance(runtime, MountsData) or runtime.host_paths
        if host_paths:
            where, mounts = str(directory), []
        else:
            where = getattr(runtime, "data_root", "") + CONTAINER_DIR
            mounts = [Mount(host=directory, container=CONTAINER_DIR, writable=True)]
        env = {
            **spec.env,
            contract.ENV_API: f"unix://{where}/{SOCKET_NAME}",
            contract.ENV_TOKEN: worker.token,
            contract.ENV_CONCURRENCY: str(worker.concurrency),
        }
        return msgspec.structs.replace(spec, env=env), mounts

    async def open(self, name: str, worker: EndpointWorkerSpec, directory: Path) -> Path:
        """Serve ``name``'s worker API at ``directory``/api.sock (again, after an agent restart); its path."""
        await self.close(name, tell=False)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(directory, 0o700)
        path = directory / SOCKET_NAME
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = await asyncio.start_unix_server(
            lambda reader, writer: self._serve(name, worker, reader, writer), sock=_bound(path), limit=MAX_HEADER_BYTES
        )
        os.chmod(path, 0o666)  # the directory (0700, the container's own) is the fence; any uid inside may connect
        self._servers[name] = (worker, server)
        return path

    async def resume(self, running: set[str]) -> None:
        """A new agent process: the workers whose containers still run are served again at the same socket; the
        records of the others are dropped (their ends reach the Master as exits, and its rules requeue their work)."""
        for record in sorted(self.root.glob("*.worker.json")) if self.root.is_dir() else []:
            name = record.name.removesuffix(".worker.json")
            try:
                worker = msgspec.json.decode(record.read_bytes(), type=EndpointWorkerSpec)
            except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("an endpoint worker's record is unreadable", extra={"container": name, "error": str(exc)})
                worker = None
            if worker is not None and name in running:
                await self.open(name, worker, self.root / name)
                self.started(name)
            else:
                record.unlink(missing_ok=True)
                shutil.rmtree(self.root / name, ignore_errors=True)

    def _record(self, name: str) -> Path:
        return self.root / f"{name}.worker.json"

    async def close(self, name: str, *, tell: bool = True) -> None:
        """``name`` ended or is deleted: its socket closes and (``tell``) the Master sends its requests back."""
        entry = self._servers.pop(name, None)
        self._started.discard(name)
        if entry is None:
            return
        worker, server = entry
        server.close()
        self._hang_up(name)
        shutil.rmtree(self.root / name, ignore_errors=True)
        self._record(name).unlink(missing_ok=True)
        if tell:
            call = WorkerCall(
                call_id=self._next_id(),
                container=name,
                endpoint_id=worker.endpoint_id,
                worker_id=worker.worker_id,
                op=WorkerOp.GONE,
            )
            try:
                await self._send(call)
            except Exception:  # no link now: the Master's own exit and loss rules requeue them
                log.warning("could not tell the Master an endpoint worker is gone", extra={"container": name})

    async def close_all(self) -> None:
        for name in list(self._servers):
            _, server = self._servers.pop(name)
            server.close()
            self._hang_up(name)
        self._started.clear()
        for future in self._waiting.values():
            future.cancel()

    def _hang_up(self, name: str) -> None:
        for writer in self._connections.pop(name, set()):
            writer.close()

    def on_answer(self, answer: WorkerAnswer) -> None:
        future = self._waiting.get(answer.call_id)
        if future is not None and not future.done():
            future.set_result(answer)

    def _next_id(self) -> str:
        return f"wc-{self._prefix}-{next(self._ids)}"

    async def _serve(
        self, name: str, worker: EndpointWorkerSpec, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One connection: its calls one after another, for as long as the worker keeps it open (and calls on it at
        least every IDLE_CONNECTION_S) and asks for no close; a request that is not HTTP ends it after its 400."""
        self._connections.setdefault(name, set()).add(writer)
        try:
            keep = True
            while keep:
                try:
                    async with asyncio.timeout(IDLE_CONNECTION_S):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError as exc:
                    if not exc.partial:
                        return  # closed by the worker between calls: nothing to answer
                    head = b""  # a part of a request, then the end: a 400
                except asyncio.LimitOverrunError:
                    head = b""
                except (TimeoutError, ConnectionError):
                    return  # idle too long, or gone
                try:
                    method, path, headers = _parse_head(head)
                    keep = headers.get("connection", "").lower() != "close"
                    length = int(headers.get("content-length", "0"))
                    if length > MAX_BODY_BYTES:  # its body is never read: the connection ends after the answer
                        keep, (status, body) = False, (413, {"error": f"a body over {MAX_BODY_BYTES} bytes"})
                    else:
                        raw = await reader.readexactly(length) if length > 0 else b""
                        status, body = await self._answer(name, worker, method, path, headers, raw)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
                    keep, (status, body) = False, (400, {"error": "not an HTTP request the worker API takes"})
                writer.write(_response(status, body, keep=keep))
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            self._connections.get(name, set()).discard(writer)

    async def _answer(
        self, name: str, worker: EndpointWorkerSpec, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        call_id = self._next_id()
        judged = judge(worker, name, call_id, method, path, headers.get("authorization", ""), body)
        if isinstance(judged, Refusal):
            return judged.status, {"error": judged.message}
        if len(msgspec.json.encode(judged)) > MAX_FRAME_BYTES:
            return 413, {"error": "the report does not fit one frame"}
        if self._calls_of.get(name, 0) >= MAX_CALLS_PER_WORKER:
            return 429, {"error": f"more than {MAX_CALLS_PER_WORKER} calls of this worker at once"}
        future: asyncio.Future[WorkerAnswer] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = future
        self._calls_of[name] = self._calls_of.get(name, 0) + 1
        try:
            try:
                sent = await self._send(judged)
            except Exception:
                sent = False
            if not sent:
                return 503, {"error": "the agent has no link to the Master now"}
            async with asyncio.timeout(judged.wait_s + ANSWER_MARGIN_S):  # no wait_for: its waiter and callbacks
                answer = await future
        except TimeoutError:
            return 503, {"error": "no answer from the Master in time"}
        finally:
            self._waiting.pop(call_id, None)
            left = self._calls_of.pop(name, 1) - 1
            if left:
                self._calls_of[name] = left
        return answer.status, answer.body


def _parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    method, path, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if line:
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
    return method, path, headers


def _response(status: int, body: Any, *, keep: bool) -> bytes:
    # The Master's answer as decoded from its frame (plain JSON values): msgspec writes it in a ninth of json.dumps's time
    # (a take of ten 1 KB inputs: 8 against 72 us).
    raw = b"" if status == 204 or body is None else msgspec.json.encode(body)
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n" + ("" if keep else "Connection: close\r\n")
    if status != 204:
        head += f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
    return (head + "\r\n").encode() + raw


def _bound(path: Path) -> socket.socket:
    """A unix socket bound at ``path``; a path over the 107 bytes a socket address holds is bound through its
    directory's descriptor (/proc/self/fd/N/api.sock), as a deep state directory would need."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if len(str(path).encode()) < 100:
            sock.bind(str(path))
        else:
            fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                sock.bind(f"/proc/self/fd/{fd}/{path.name}")
            finally:
                os.close(fd)
    except OSError:
        sock.close()
        raise
    return sock

"""The Docker API's raw streams: a hijacked ``exec`` connection and the multiplexed output format.

``POST /exec/{id}/start`` turns its HTTP connection into the command's terminal: after the response headers the
connection carries standard input up and output down. aiohttp's client cannot hand a connection over after the
headers, so ``hijack`` opens its own connection on the engine's unix socket, writes the request, reads the status
line and headers itself, and returns the stream. Docker and Podman both answer ``101 UPGRADED`` (``Upgrade: tcp``);
older engines answered ``200`` and then the raw stream, which is accepted too.

Without a tty the output is multiplexed: frames of an 8-byte header (stream type, three zero bytes, a big-endian
payload size) and the payload; ``read_frame`` takes one off any stream (an exec's, or a logs response body).
With a tty it is the terminal's raw bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent.runtime.base import STDERR, STDOUT, ExecSession
from common.errors import RuntimeFailure

FRAME_HEADER = struct.Struct(">BxxxI")  # stream type (0 stdin, 1 stdout, 2 stderr), payload size
MAX_HEAD_BYTES = 64 * 1024  # status line and headers of the upgrade answer
MAX_ERROR_BYTES = 16 * 1024
READ_CHUNK = 64 * 1024
EOF_CHARACTER = b"\x04"  # end of input on a terminal (VEOF at the start of a line)
STREAM_LIMIT = 1024 * 1024  # the asyncio reader's buffer; frames are read with readexactly, so any size passes

log = logging.getLogger(__name__)

ReadExactly = Callable[[int], Awaitable[bytes]]
ApiCall = Callable[..., Awaitable[tuple[int, Any]]]  # DockerRuntime._call: (method, path, *, params=...)
WAIT_FIRST_POLL_S = 0.02
# Podman applies the start's first size a moment after the connection is upgraded, so it can land after a renter's
# own early resize and undo it: a resize this soon after the start is applied again once this has passed.
FIRST_SIZE_SETTLE_S = 0.5
# How long a port bridge still carries the far side's answer after the caller closed its side (half-close or not,
# it cannot tell) before it stops the command: a caller that went away must not leave ``nc`` running for good.
BRIDGE_LINGER_S = 60.0
WAIT_MAX_POLL_S = 1.0


class DockerExecSession:
    """An ``ExecSession`` on a hijacked ``exec`` connection; resize, exit status and stop through the API. Input to a
    command that has ended raises ``BrokenPipeError`` (an ``OSError``), as a pipe would."""

    def __init__(
        self,
        exec_id: str,
        container: str,
        container_pid: int,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        tty: bool,
        call: ApiCall,
    ) -> None:
        self.exec_id = exec_id
        self.container = container
        self.tty = tty
        self._container_pid = container_pid  # the container's init, as the engine's host numbers it
        self._reader = reader
        self._writer = writer
        self._call = call
        self._stdin_closed = False
        self._started = time.monotonic()
        self._size: tuple[int, int] | None = None
        self._reapply: asyncio.Task[None] | None = None

    async def read(self) -> tuple[int, bytes] | None:
        if not self.tty:
            return await read_frame(self._reader.readexactly)
        data = await self._reader.read(READ_CHUNK)
        return (STDOUT, data) if data else None

    async def write(self, data: bytes) -> None:
        if self._stdin_closed:
            raise BrokenPipeError(errno.EPIPE, f"the input of the command in container {self.container!r} is already closed")
        try:
            self._writer.write(data)
            await self._writer.drain()
        except ConnectionError as exc:
            raise BrokenPipeError(
                errno.EPIPE, f"the command in container {self.container!r} has ended; it takes no more input"
            ) from exc

    async def close_stdin(self) -> None:
        """Without a tty a half-close, which the engine passes on as end of input; a terminal has no such thing, so
        with one it is the terminal's EOF character (as a person types it)."""
        if self._stdin_closed:
            return
        if self.tty:
            await self.write(EOF_CHARACTER)
            self._stdin_closed = True
            return
        self._stdin_closed = True
        with contextlib.suppress(OSError):  # the command ended and the engine closed the connection already
            if self._writer.can_write_eof():
                self._writer.write_eof()  # a half-close: the engine closes the command's stdin, output goes on

    async def resize(self, cols: int, rows: int) -> None:
        if not self.tty:
            return
        self._size = (cols, rows)
        await self._resize(cols, rows)
        settled_at = self._started + FIRST_SIZE_SETTLE_S
        if self._reapply is None and time.monotonic() < settled_at:
            self._reapply = asyncio.create_task(self._resize_again(settled_at))

    async def _resize(self, cols: int, rows: int) -> None:
        status, body = await self._call("POST", f"/exec/{self.exec_id}/resize", params={"h": str(rows), "w": str(cols)})
        if status in (200, 201, 204):
            return
        if not await self._running():
            return  # ended meanwhile: there is no terminal left to resize
        raise RuntimeFailure(
            f"resizing the terminal in container {self.container!r} failed: the engine answered {status}: {_message(body)}"
        )

    async def _resize_again(self, at: float) -> None:
        await asyncio.sleep(max(at - time.monotonic(), 0))
        if self._size is not None:
            with contextlib.suppress(RuntimeFailure):
                await self._resize(*self._size)

    async def wait(self) -> int:
        poll_s = WAIT_FIRST_POLL_S
        while True:
            info = await self._inspect()
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(poll_s)
            poll_s = min(poll_s * 2, WAIT_MAX_POLL_S)

    async def close(self) -> None:
        """Closing the connection does not end an exec (in Docker or Podman), so a command still running is killed."""
        if self._reapply is not None:
            self._reapply.cancel()
        try:
            info = await self._inspect()
            if info.get("Running") and info.get("Pid"):
                self._kill(int(info["Pid"]))
        except RuntimeFailure as exc:  # the engine forgot the exec (it ended long ago) or went away: nothing to stop
            log.info("not stopping a command in container %r: %s", self.container, exc)
        finally:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()

    async def _running(self) -> bool:
        return bool((await self._inspect()).get("Running"))

    async def _inspect(self) -> dict[str, Any]:
        status, body = await self._call("GET", f"/exec/{self.exec_id}/json")
        if status != 200 or not isinstance(body, dict):
            raise RuntimeFailure(
                f"asking the engine about the command in container {self.container!r} failed: "
                f"the engine answered {status}: {_message(body)}"
            )
        return body

    def _kill(self, pid: int) -> None:
        """SIGKILL the exec's process, by the pid the engine reports, only after checking it is in the container:
        the engine's API has no way to stop an exec, and the agent sees the processes of the engine's host."""
        try:
            same = os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{self._container_pid}/ns/pid")
            if same:
                os.kill(pid, signal.SIGKILL)
                return
        except (FileNotFoundError, ProcessLookupError):
            return  # it ended meanwhile
        except PermissionError:
            pass
        log.warning(
            "could not stop a command left running in container %r: the agent does not see the engine's processes",
            self.container,
            extra={"exec_id": self.exec_id, "pid": pid},
        )


async def hijack(
    socket_path: str, path: str, body: Mapping[str, Any], *, timeout_s: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """POST ``body`` to ``path`` asking for the connection, and return it once the engine has agreed."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(socket_path, limit=STREAM_LIMIT), timeout_s)
    except (OSError, TimeoutError) as exc:
        raise RuntimeFailure(f"cannot reach the Docker API at unix://{socket_path}: {_os_reason(exc)}") from exc
    try:
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
        )
        writer.write(head.encode() + payload)
        await writer.drain()
        status = await asyncio.wait_for(_read_status(reader), timeout_s)
        if status in (101, 200):
            return reader, writer
        detail = await _read_error(reader, timeout_s)
    except BaseException:
        writer.close()
        raise
    writer.close()
    raise RuntimeFailure(f"starting the command failed: the engine answered {status}: {detail}")


async def read_frame(read_exactly: ReadExactly) -> tuple[int, bytes] | None:
    """The next frame of a multiplexed stream as ``(STDOUT or STDERR, bytes)``; ``None`` at its end."""
    while True:
        try:
            kind, size = FRAME_HEADER.unpack(await read_exactly(FRAME_HEADER.size))
            data = await read_exactly(size) if size else b""
        except asyncio.IncompleteReadError:
            return None  # the stream ended, possibly inside a frame the engine never finished
        if data:
            return (STDERR if kind == 2 else STDOUT), data


async def _read_status(reader: asyncio.StreamReader) -> int:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        raise RuntimeFailure("the Docker API closed the connection before answering the exec start") from exc
    except asyncio.LimitOverrunError as exc:
        raise RuntimeFailure("the Docker API's answer to the exec start has oversized headers") from exc
    if len(head) > MAX_HEAD_BYTES:
        raise RuntimeFailure("the Docker API's answer to the exec start has oversized headers")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise RuntimeFailure(f"the Docker API answered the exec start with {status_line[:80]!r}, not HTTP")
    return int(parts[1])


async def _read_error(reader: asyncio.StreamReader, timeout_s: float) -> str:
    """The engine's JSON ``message`` from an error body (chunked or not), or what text there is."""
    with contextlib.suppress(TimeoutError):
        text = (await asyncio.wait_for(reader.read(MAX_ERROR_BYTES), timeout_s)).decode("utf-8", "replace")
        start, end = text.find("{"), text.rfind("}")
        if 0 <= start < end:
            with contextlib.suppress(ValueError):
                body = json.loads(text[start : end + 1])
                if isinstance(body, dict) and body.get("message"):
                    return str(body["message"])
        return text.strip() or "no details"
    return "no details"


async def exec_streams(session: ExecSession, tasks: set[asyncio.Task[None]]) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP-like stream pair over a command such as ``nc 127.0.0.1 PORT``: what is written goes to its stdin, its
    stdout comes back, and its stderr is logged. The pump, a task kept in ``tasks``, ends with the command, or
    ``BRIDGE_LINGER_S`` after the caller closed its side; it then stops the command."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours, limit=STREAM_LIMIT)
    far_reader, far_writer = await asyncio.open_connection(sock=theirs, limit=STREAM_LIMIT)

    async def down() -> None:
        while (output := await session.read()) is not None:
            channel, data = output
            if channel == STDOUT:
                far_writer.write(data)
                await far_writer.drain()
            else:
                log.info("the port bridge said: %s", data[:200].decode("utf-8", "replace").strip())
        far_writer.write_eof()

    async def up() -> None:
        while data := await far_reader.read(READ_CHUNK):
            await session.write(data)
        await session.close_stdin()

    async def pump() -> None:
        upward, downward = asyncio.ensure_future(up()), asyncio.ensure_future(down())
        try:
            done, _ = await asyncio.wait({upward, downward}, return_when=asyncio.FIRST_COMPLETED)
            if downward not in done:  # the caller has finished writing: the answer may still be on its way
                await asyncio.wait({downward}, timeout=BRIDGE_LINGER_S)
        finally:
            for side in (upward, downward):
                side.cancel()
            await asyncio.gather(upward, downward, return_exceptions=True)  # OSError, RuntimeFailure: the end anyway
            with contextlib.suppress(Exception):
                await session.close()
            far_writer.close()

    task = asyncio.create_task(pump(), name="port-bridge")
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return reader, writer


def _message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message") or body.get("cause") or body)
    return str(body or "no details").strip()


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__

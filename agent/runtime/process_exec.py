"""A renter's command beside a process-runtime container, as an ``ExecSession``: on pipes, or on a pseudo-terminal.

Input to a command that no longer reads it raises ``BrokenPipeError`` (an ``OSError``), as a pipe would: the tunnel
drops it and still sends the command's exit status.

``start_exec`` runs ``argv`` (which ProcessRuntime builds: into the container's namespaces, its limits, its user,
then the command, all under ``setsid`` so the command leads a session and process group of its own) and returns
the session. With a tty the command's three standard streams are the slave side of a new pty, which ``setsid
--ctty`` makes its controlling terminal; the agent keeps the master. Without one they are three pipes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import signal
import struct
import termios
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from agent.runtime.base import STDERR, STDOUT
from common.errors import RuntimeFailure

READ_CHUNK = 64 * 1024
EOF_CHARACTER = b"\x04"  # what "end of input" is on a terminal (VEOF at the start of a line)
WINSIZE = struct.Struct("HHHH")  # rows, cols, x pixels, y pixels
Watch = Callable[..., object]  # the event loop's add_reader / add_writer
Unwatch = Callable[[int], object]  # its remove_reader / remove_writer


async def start_exec(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, tty: bool, cols: int, rows: int, container: str
) -> PipeExecSession | PtyExecSession:
    """Start ``argv``; a program that cannot start at all is a ``RuntimeFailure`` naming the container."""
    try:
        if not tty:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=dict(env),
                cwd=cwd,
            )
            return PipeExecSession(proc, container)
        master, slave = os.openpty()
        try:
            set_size(slave, cols, rows)
            proc = await asyncio.create_subprocess_exec(*argv, stdin=slave, stdout=slave, stderr=slave, env=dict(env), cwd=cwd)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the command holds it now: when it (and its children) close it, reading the master ends
        return PtyExecSession(proc, master, container)
    except OSError as exc:
        raise RuntimeFailure(f"could not start a command in container {container!r}: {exc.strerror or exc}") from exc


def set_size(fd: int, cols: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, WINSIZE.pack(rows, cols, 0, 0))


class _HostExecSession:
    """What both kinds share: the exit status and stopping the command's process group."""

    def __init__(self, proc: asyncio.subprocess.Process, container: str) -> None:
        self._proc = proc
        self.container = container

    async def wait(self) -> int:
        code = await self._proc.wait()
        return 128 - code if code < 0 else code  # killed by signal N: 128 + N, as a shell reports it

    def _stop(self) -> None:
        """SIGKILL the command's process group (setsid made the command its leader) and the launcher above it."""
        if self._proc.returncode is not None:
            return
        for group in _child_pids(self._proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()


class PipeExecSession(_HostExecSession):
    """Standard input, output and error on three pipes: output keeps its channel."""

    def __init__(self, proc: asyncio.subprocess.Process, container: str) -> None:
        super().__init__(proc, container)
        self._output: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        assert proc.stdout is not None and proc.stderr is not None
        self._pumps = [
            asyncio.create_task(self._pump(STDOUT, proc.stdout)),
            asyncio.create_task(self._pump(STDERR, proc.stderr)),
        ]
        self._open_channels = len(self._pumps)

    async def read(self) -> tuple[int, bytes] | None:
        if self._open_channels == 0 and self._output.empty():
            return None
        while True:
            item = await self._output.get()
            if item is not None:
                return item
            self._open_channels -= 1
            if self._open_channels == 0:
                return None

    async def write(self, data: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None
        if stdin.is_closing():
            raise BrokenPipeError(errno.EPIPE, f"the input of the command in container {self.container!r} is already closed")
        try:
            stdin.write(data)
            await stdin.drain()
        except ConnectionError as exc:
            raise BrokenPipeError(errno.EPIPE, f"the command in container {self.container!r} no longer reads its input") from exc

    async def close_stdin(self) -> None:
        stdin = self._proc.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    async def resize(self, cols: int, rows: int) -> None:
        """No terminal, nothing to resize."""

    async def close(self) -> None:
        self._stop()
        await self.close_stdin()
        await self._proc.wait()
        for pump in self._pumps:
            pump.cancel()

    async def _pump(self, channel: int, stream: asyncio.StreamReader) -> None:
        try:
            while data := await stream.read(READ_CHUNK):
                await self._output.put((channel, data))
        finally:
            self._output.put_nowait(None)


class PtyExecSession(_HostExecSession):
    """A terminal: one output channel (STDOUT), a size, and end of input as the terminal's EOF character."""

    def __init__(self, proc: asyncio.subprocess.Process, master: int, container: str) -> None:
        super().__init__(proc, container)
        os.set_blocking(master, False)
        self._master: int | None = master
        self._ended = False

    async def read(self) -> tuple[int, bytes] | None:
        while not self._ended and self._master is not None:
            try:
                data = os.read(self._master, READ_CHUNK)
            except BlockingIOError:
                await self._ready(asyncio.get_running_loop().add_reader, asyncio.get_running_loop().remove_reader)
                continue
            except OSError as exc:
                if exc.errno != errno.EIO:  # EIO: every holder of the slave side has closed it
                    raise
                data = b""
            if data:
                return STDOUT, data
            self._ended = True
        return None

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._master is None or self._proc.returncode is not None:
                raise BrokenPipeError(
                    errno.EPIPE, f"the command in container {self.container!r} has ended; it takes no more input"
                )
            try:
                view = view[os.write(self._master, view) :]
            except BlockingIOError:
                await self._ready(asyncio.get_running_loop().add_writer, asyncio.get_running_loop().remove_writer)
            except OSError as exc:
                raise BrokenPipeError(exc.errno, f"the terminal of the command in container {self.container!r} is gone") from exc

    async def close_stdin(self) -> None:
        with contextlib.suppress(OSError):  # ended already: its input is closed anyway
            await self.write(EOF_CHARACTER)

    async def resize(self, cols: int, rows: int) -> None:
        if self._master is not None:
            set_size(self._master, cols, rows)  # the kernel sends SIGWINCH to the terminal's foreground group

    async def close(self) -> None:
        self._stop()
        await self._proc.wait()
        if self._master is not None:
            os.close(self._master)
            self._master = None

    async def _ready(self, watch: Watch, unwatch: Unwatch) -> None:
        assert self._master is not None
        fd = self._master
        ready = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        watch(fd, wake)
        try:
            await ready
        finally:
            unwatch(fd)


def _child_pids(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []

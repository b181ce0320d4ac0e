"""``idlegrid workload logs|exec|port-forward``: a renter's way into its containers, through the relays.

Each asks the API for a tunnel grant (management/services/tunnels.py) and dials the relay it names with the ticket
(management/client/tunnel.py); the host behind the relay never listens. Frames are common/tunnel.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import termios
import threading
import time
import tty
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from common.errors import IdlegridError
from common.tunnel import MAX_TUNNEL_PAYLOAD, Op, decode_exit, resize_payload
from management.client.api import API_PREFIX, AnswerJson, ApiRequest, BodyJson
from management.workloads.state_names import FINAL_WORKLOAD_STATES, AssignmentState, WorkloadState

if TYPE_CHECKING:  # the tunnel client (websockets) is imported by the commands that open one, not by every command line
    from management.client.tunnel import Tunnel, TunnelGrant

EXIT_TUNNEL_FAILED = 1
# A replica's container in these states has an output still to come.
OUTPUT_TO_COME = (AssignmentState.RUNNING, AssignmentState.EXITED, AssignmentState.DELETING)
REOPEN_ATTEMPTS = 5  # port-forward: a tunnel that ends is opened again this many times in a row at most
REOPEN_PAUSE_S = 1.0


class BadForward(IdlegridError):
    code = "bad_request"


def add_parsers(
    w_sub: argparse._SubParsersAction,
    make: Callable[..., argparse.ArgumentParser],
    connection: Callable[[argparse.ArgumentParser], None],
) -> None:
    logs = make(
        w_sub,
        "logs",
        "print a workload's output (and follow it)",
        "Print the output of a workload's container: the last --tail lines, then, with --follow, what it writes until it "
        "ends or you press Ctrl-C, and then how it ended. Works while it runs and after it has ended: the output of a "
        "deleted container (the workload finished, failed, was cancelled, preempted or requeued) is kept by the grid "
        "(its last 8 MiB by default) for a retention period; --attempt picks an earlier attempt's.",
    )
    logs.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing what it writes (default: no)")
    logs.add_argument("--tail", type=int, default=100, metavar="N", help="lines from the end, -1 for all (default: 100)")
    logs.add_argument("--replica", type=int, default=0, metavar="N", help="which replica of a gang (default: 0)")
    logs.add_argument(
        "--attempt", type=int, default=None, metavar="N", help="the output of this attempt (default: the current one)"
    )
    connection(logs)
    logs.set_defaults(func=run_logs)

    execute = make(
        w_sub,
        "exec",
        "run a command in a workload's container (a shell by default)",
        "Run a command inside a running workload's container, through the relay its host is linked to; the command "
        "follows '--' (default: /bin/sh). With a terminal on both ends it gets a terminal of its own (resized with "
        "yours); the command's exit status is this command's. Example:\n  idlegrid workload exec wl-1a2b -- bash",
    )
    execute.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    execute.add_argument(
        "-t", "--tty", action=argparse.BooleanOptionalAction, default=None, help="give it a terminal (default: when this is one)"
    )
    execute.add_argument("--replica", type=int, default=0, metavar="N", help="which replica of a gang (default: 0)")
    execute.add_argument("container_command", nargs="*", metavar="COMMAND", help="the command, after '--' (default: /bin/sh)")
    connection(execute)
    execute.set_defaults(func=run_exec)

    forward = make(
        w_sub,
        "port-forward",
        "reach a port of a workload's container from a local port",
        "Listen on a local port and carry each connection to a port of a running workload's container, through the "
        "relay its host is linked to (the host needs no open port). PORT is the container's; LOCAL:PORT picks the "
        "local one (default: the same number). Runs until Ctrl-C. Example, a Jupyter server:\n"
        "  idlegrid workload port-forward wl-1a2b 8888   then open http://127.0.0.1:8888",
    )
    forward.add_argument("workload_id", metavar="ID", help="the workload's id, wl-…")
    forward.add_argument("ports", metavar="[LOCAL:]PORT", help="the container's port, optionally after a local one")
    forward.add_argument("--address", default="127.0.0.1", help="local address to listen on (default: 127.0.0.1)")
    forward.add_argument("--replica", type=int, default=0, metavar="N", help="which replica of a gang (default: 0)")
    connection(forward)
    forward.set_defaults(func=run_port_forward)


def _grant(args: argparse.Namespace, request: BodyJson) -> TunnelGrant:
    from management.cli.connection import api_client

    client = api_client(args)[0]
    answer = client.open_tunnel(args.workload_id, {**request, "replica": args.replica})
    return grant_of(answer)


def grant_of(answer: Any) -> TunnelGrant:
    """The API's answer (times as RFC 3339) as the grant the tunnel client takes."""
    from management.client.api import instant
    from management.client.tunnel import TunnelGrant

    return msgspec.convert({**answer, "expires_at": instant(answer["expires_at"])}, TunnelGrant)


# --- logs -------------------------------------------------------------------------------------------------------------


def run_logs(args: argparse.Namespace) -> int:
    from management.cli.connection import api_client
    from management.client.api import ApiError

    client = api_client(args)[0]
    if args.attempt is None:
        try:
            grant = grant_of(
                client.open_tunnel(
                    args.workload_id, {"kind": "logs", "tail": args.tail, "follow": args.follow, "replica": args.replica}
                )
            )
        except ApiError as exc:
            if exc.status != 409:  # 409: its container no longer runs on a host; what was kept of it is below
                raise
        else:
            code = asyncio.run(_print_logs(grant))
            if args.follow:
                _print_end(client, args.workload_id, args.replica)
            return code
    query = {"tail": str(args.tail), "replica": str(args.replica)}
    if args.attempt is not None:
        query["attempt"] = str(args.attempt)
    path = f"{API_PREFIX}/workloads/{args.workload_id}/logs"
    _write(sys.stdout.buffer, client.raw(ApiRequest("GET", path, query)))
    if args.follow:
        _print_end(client, args.workload_id, args.replica)
    return 0


END_WAIT_S = 30.0  # after its output ends, how long `logs --follow` waits for the grid to record how it ended
END_POLL_S = 0.5


def _print_end(client: Any, workload_id: str, replica: int) -> None:
    """How the replica's container ended, on stderr: its exit status (once the grid knows it) and the workload's
    state and reason. The output can end a moment before the grid notices the exit: wait for it, boundedly."""
    deadline = time.monotonic() + END_WAIT_S
    while True:
        workload = client.workload(workload_id)
        ended = [o for o in workload.get("outputs", []) if o["replica"] == replica and o["attempt"] == workload["attempts"]]
        mine = [a["state"] for a in workload.get("assignments", []) if a["replica"] == replica]
        settled = bool(ended) and ended[-1]["state"] != "pending"
        expected = any(state in OUTPUT_TO_COME for state in mine)
        if settled or (workload["state"] in FINAL_WORKLOAD_STATES and not expected) or time.monotonic() > deadline:
            break
        time.sleep(END_POLL_S)
    code = ended[-1]["exit_code"] if ended else None
    if code is None and len(workload.get("exit_codes", [])) == 1:
        code = workload["exit_codes"][0]
    how = f"exit code {code}" if code is not None else "exit code not known"
    reason = workload["state_reason"].split("\n", 1)[0]
    sys.stderr.write(f"[idlegrid] replica {replica} ended: {how}; workload {workload['state']}: {reason}\n")
    sys.stderr.flush()


async def _print_logs(grant: TunnelGrant) -> int:
    from management.client.tunnel import Tunnel, TunnelClosed

    async with await Tunnel.open(grant) as tunnel:
        while (frame := await tunnel.receive()) is not None:
            if frame.op is Op.DATA:
                _write(sys.stdout.buffer, frame.payload)
            elif frame.op is Op.STDERR:
                _write(sys.stderr.buffer, frame.payload)
            elif frame.op is Op.ERROR:
                raise TunnelClosed(frame.payload.decode("utf-8", "replace"))
            elif frame.op is Op.EXIT:
                return 0
        if tunnel.close_code not in (None, 1000):
            raise TunnelClosed(tunnel.why())
    return 0


def _write(stream: Any, data: bytes) -> None:
    stream.write(data)
    stream.flush()


# --- exec -------------------------------------------------------------------------------------------------------------


def run_exec(args: argparse.Namespace) -> int:
    use_tty = args.tty if args.tty is not None else (sys.stdin.isatty() and sys.stdout.isatty())
    cols, rows = _terminal_size() if use_tty else (0, 0)
    request = {"kind": "exec", "command": list(args.container_command or []), "tty": use_tty, "cols": cols, "rows": rows}
    grant = _grant(args, request)
    with _raw_terminal(use_tty and sys.stdin.isatty()):
        return asyncio.run(_exec(grant, use_tty))


def _terminal_size() -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.columns, size.lines
    except OSError:
        return 80, 24


@contextlib.contextmanager
def _raw_terminal(raw: bool) -> Any:
    """The local terminal in raw mode while a remote one is attached (keys go through as typed), restored after."""
    if not raw:
        yield
        return
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _exec(grant: TunnelGrant, use_tty: bool) -> int:
    from management.client.tunnel import Tunnel, TunnelClosed

    loop = asyncio.get_running_loop()
    async with await Tunnel.open(grant) as tunnel:
        stdin: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)
        threading.Thread(target=_read_stdin, args=(loop, stdin), daemon=True, name="exec-stdin").start()
        if use_tty:
            loop.add_signal_handler(
                signal.SIGWINCH, lambda: loop.create_task(tunnel.send(Op.RESIZE, 0, resize_payload(*_terminal_size())))
            )
        feeding = asyncio.create_task(_feed(tunnel, stdin))
        try:
            while (frame := await tunnel.receive()) is not None:
                if frame.op is Op.DATA:
                    _write(sys.stdout.buffer, frame.payload)
                elif frame.op is Op.STDERR:
                    _write(sys.stderr.buffer, frame.payload)
                elif frame.op is Op.EXIT:
                    return decode_exit(frame.payload).code
                elif frame.op is Op.ERROR:
                    raise TunnelClosed(frame.payload.decode("utf-8", "replace"))
            raise TunnelClosed(tunnel.why() if tunnel.close_code not in (None, 1000) else "the tunnel ended before the command")
        finally:
            feeding.cancel()
            if use_tty:
                loop.remove_signal_handler(signal.SIGWINCH)


def _read_stdin(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[bytes]) -> None:
    """Standard input, read in a thread (it may be a terminal, a pipe or a file); b"" marks its end."""
    while True:
        try:
            data = os.read(sys.stdin.fileno(), MAX_TUNNEL_PAYLOAD)
        except OSError:
            data = b""
        asyncio.run_coroutine_threadsafe(queue.put(data), loop).result()
        if not data:
            return


async def _feed(tunnel: Tunnel, stdin: asyncio.Queue[bytes]) -> None:
    from management.client.tunnel import TunnelClosed

    with contextlib.suppress(TunnelClosed):
        while data := await stdin.get():
            await tunnel.send(Op.DATA, 0, data)
        await tunnel.send(Op.EOF, 0)


# --- port-forward -----------------------------------------------------------------------------------------------------


def parse_ports(text: str) -> tuple[int, int]:
    """``PORT`` or ``LOCAL:PORT`` -> (local, remote)."""
    local_text, _, remote_text = text.rpartition(":")
    try:
        remote = int(remote_text)
        local = int(local_text) if local_text else remote
    except ValueError:
        raise BadForward(f"ports: {text!r} is not PORT or LOCAL:PORT (numbers)") from None
    for name, port in (("local", local), ("container", remote)):
        if not 0 <= port <= 65535 or (name == "container" and port == 0):
            raise BadForward(f"ports: the {name} port {port} is not between 1 and 65535")
    return local, remote


def run_port_forward(args: argparse.Namespace) -> int:
    from management.cli.connection import api_client

    local, remote = parse_ports(args.ports)
    check_forwardable(api_client(args)[0].workload(args.workload_id), remote)
    forward = PortForward(lambda: _grant(args, {"kind": "port", "port": remote}), args.workload_id, remote)
    return asyncio.run(forward.run(args.address, local))


def check_forwardable(workload: AnswerJson, port: int) -> None:
    """Refuse at once, naming the fix, what no tunnel could reach: a port the workload does not declare (the API
    refuses a tunnel to it, docs/renter-access.md) or a workload that does not run."""
    name, declared = workload["id"], workload["spec"]["ports"]
    if port not in declared:
        has = f" (it declares {', '.join(map(str, declared))})" if declared else ""
        raise BadForward(
            f"workload {name} declares no port {port}{has}: submit it again with --port {port} (or ports = [{port}] "
            "in its spec file); a port-forward reaches only the ports a workload declares"
        )
    state = workload["state"]
    if state in FINAL_WORKLOAD_STATES:
        raise BadForward(f"workload {name} is {state}: it runs no more, so there is nothing to forward to")
    if state != WorkloadState.RUNNING:
        raise BadForward(
            f"workload {name} is {state}, not running yet: forward once it runs (idlegrid workload get {name} says "
            f"when, idlegrid workload explain {name} why it waits)"
        )


class PortForward:
    """One local listener; its connections ride one tunnel as streams 1, 2, 3… (common/tunnel.py, kind port).

    When the tunnel ends (the relay restarted, the ticket's host went away) the connections on it end and a new tunnel
    is opened for the next ones, a few times in a row at most.
    """

    def __init__(self, grant: Callable[[], TunnelGrant], workload_id: str, port: int) -> None:
        self._grant = grant
        self._workload = workload_id
        self._port = port
        self._tunnel: Tunnel | None = None
        self._ready = asyncio.Event()
        self._streams: dict[int, asyncio.StreamWriter] = {}
        self._next_stream = 1

    async def run(self, address: str, local_port: int) -> int:
        from management.client.tunnel import Tunnel, TunnelClosed

        first: TunnelGrant | None = await asyncio.to_thread(self._grant)  # refused (ApiError) before "Forwarding"
        server = await asyncio.start_server(self._accepted, address, local_port)
        bound = server.sockets[0].getsockname()
        print(
            f"Forwarding {bound[0]}:{bound[1]} -> {self._workload} port {self._port} (through its relay); Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        failures = 0
        async with server:
            while failures < REOPEN_ATTEMPTS:
                try:
                    grant = first if first is not None else await asyncio.to_thread(self._grant)
                    first = None  # the first tunnel only: every later one takes a fresh grant
                    tunnel = await Tunnel.open(grant)
                except TunnelClosed as exc:
                    failures += 1
                    print(f"tunnel: {exc}; trying again", file=sys.stderr, flush=True)
                    await asyncio.sleep(REOPEN_PAUSE_S)
                    continue
                failures = 0
                self._tunnel = tunnel
                self._ready.set()
                await self._serve(tunnel)
                self._ready.clear()
                self._tunnel = None
                self._end_streams()
                failures += 1
                print(f"tunnel: {tunnel.why()}; opening another", file=sys.stderr, flush=True)
                await asyncio.sleep(REOPEN_PAUSE_S)
        raise TunnelClosed(f"gave up after {REOPEN_ATTEMPTS} tunnels in a row ended or could not open")

    async def _serve(self, tunnel: Tunnel) -> None:
        """Frames from the agent, to the local connection of their stream."""
        while (frame := await tunnel.receive()) is not None:
            writer = self._streams.get(frame.stream)
            if writer is None:
                if frame.op is Op.ERROR and frame.stream == 0:  # the agent refused the whole tunnel: say why
                    print(f"tunnel: {frame.payload.decode('utf-8', 'replace')}", file=sys.stderr, flush=True)
                continue
            if frame.op is Op.DATA:
                writer.write(frame.payload)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
            elif frame.op is Op.EOF:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
            elif frame.op in (Op.CLOSE, Op.ERROR):
                if frame.op is Op.ERROR:
                    print(f"stream {frame.stream}: {frame.payload.decode('utf-8', 'replace')}", file=sys.stderr, flush=True)
                self._streams.pop(frame.stream, None)
                writer.close()

    def _end_streams(self) -> None:
        for writer in self._streams.values():
            writer.close()
        self._streams.clear()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from management.client.tunnel import TunnelClosed

        try:
            await asyncio.wait_for(self._ready.wait(), timeout=30)
        except TimeoutError:
            writer.close()
            return
        tunnel = self._tunnel
        if tunnel is None:
            writer.close()
            return
        stream = self._next_stream
        self._next_stream += 1
        self._streams[stream] = writer
        try:
            await tunnel.send(Op.OPEN, stream)
            while data := await reader.read(MAX_TUNNEL_PAYLOAD):
                await tunnel.send(Op.DATA, stream, data)
            await tunnel.send(Op.EOF, stream)
        except (TunnelClosed, ConnectionError):
            self._streams.pop(stream, None)
            writer.close()

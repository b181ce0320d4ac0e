"""Live logs and the terminal: a browser's WebSocket to the console, bridged to a renter-access tunnel.

The browser cannot trust the platform CA the relays' certificates chain to; the Master can. So the console opens
the tunnel itself, through the façade (``services.tunnels.open``, which checks the owner and mints the ticket),
dials the relay with ``management.client.tunnel.Tunnel`` and passes frames (common/tunnel.py) both ways unchanged:

- logs (``/console/workloads/{id}/logs``): the agent's frames go to the browser; anything the browser sends ends it.
- terminal (``/console/workloads/{id}/terminal``): an ``exec`` tunnel with a tty. The browser may send DATA, RESIZE
  and EOF frames on stream 0 only; any other frame (another op, another stream, a text message, a malformed frame)
  closes the socket with 1008 and says why.

Both sockets need a signed-in session and a same-origin handshake (management/console/middleware.py). Every tunnel
opened is an audit event the façade records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from common.errors import IdlegridError, ProtocolError
from common.tunnel import Op, Resize, decode_frame, encode_frame
from management.access_control import Scope
from management.client.tunnel import Tunnel
from management.http.keys import SERVICES_KEY
from management.services.tunnels import TunnelRequest

log = logging.getLogger(__name__)

FROM_BROWSER_TERMINAL = frozenset({Op.DATA, Op.RESIZE, Op.EOF})
LOG_TAIL = 200
MAX_BROWSER_MESSAGE = 64 * 1024 + 16
POLICY_VIOLATION = 1008


async def serve_logs(request: web.Request, scope: Scope, workload_id: str) -> web.StreamResponse:
    wanted = TunnelRequest(kind="logs", tail=LOG_TAIL, follow=True)
    return await _serve(request, scope, workload_id, wanted, allowed=frozenset())


async def serve_terminal(request: web.Request, scope: Scope, workload_id: str) -> web.StreamResponse:
    cols = _size(request.query.get("cols"), 80)
    rows = _size(request.query.get("rows"), 24)
    wanted = TunnelRequest(kind="exec", tty=True, cols=cols, rows=rows)
    return await _serve(request, scope, workload_id, wanted, allowed=FROM_BROWSER_TERMINAL)


def _size(value: str | None, default: int) -> int:
    return int(value) if value is not None and value.isdigit() and 1 <= int(value) <= 1000 else default


async def _serve(
    request: web.Request, scope: Scope, workload_id: str, wanted: TunnelRequest, *, allowed: frozenset[Op]
) -> web.StreamResponse:
    socket = web.WebSocketResponse(max_msg_size=MAX_BROWSER_MESSAGE, heartbeat=20)
    await socket.prepare(request)
    try:
        tunnel = await _open(request, scope, workload_id, wanted)
    except IdlegridError as exc:
        await socket.send_bytes(encode_frame(Op.ERROR, 0, str(exc).encode()))
        await socket.close(code=1011, message=b"tunnel not opened")
        return socket
    try:
        await _bridge(socket, tunnel, allowed)
    finally:
        await tunnel.close()
    return socket


async def _open(request: web.Request, scope: Scope, workload_id: str, wanted: TunnelRequest) -> Tunnel:
    """The tunnel, opened through the façade (which decides whether this account may) and dialled at the relay."""
    access = request.app[SERVICES_KEY].tunnels
    grant = await access.open(workload_id, wanted, account=scope.principal.account, owner=scope.owner)
    return await Tunnel.open(grant)


async def _bridge(socket: web.WebSocketResponse, tunnel: Tunnel, allowed: frozenset[Op]) -> None:
    async def to_browser() -> None:
        while (frame := await tunnel.receive()) is not None:
            await socket.send_bytes(encode_frame(frame.op, frame.stream, frame.payload))
        await socket.send_bytes(encode_frame(Op.CLOSE, 0, tunnel.why().encode()))

    async def from_browser() -> None:
        async for message in socket:
            refused = refusal(message, allowed)
            if refused:
                await socket.close(code=POLICY_VIOLATION, message=refused.encode()[:120])
                return
            frame = decode_frame(message.data)
            await tunnel.send(frame.op, frame.stream, frame.payload)

    tasks = [asyncio.ensure_future(to_browser()), asyncio.ensure_future(from_browser())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, IdlegridError, ConnectionError):
                await task
        if not socket.closed:
            await socket.close()


def refusal(message: Any, allowed: frozenset[Op]) -> str:
    """Why a browser's message may not go on to the tunnel ("" when it may)."""
    if message.type != WSMsgType.BINARY:
        return "send binary tunnel frames only"
    try:
        frame = decode_frame(message.data)
    except ProtocolError as exc:
        return f"not a tunnel frame: {exc}"
    if frame.op not in allowed:
        return f"op {frame.op.name} may not be sent here" if allowed else "this socket only receives"
    if frame.stream != 0:
        return f"stream {frame.stream}: the terminal uses stream 0 only"
    if frame.op is Op.RESIZE:
        try:
            msgspec.json.decode(frame.payload, type=Resize)
        except msgspec.ValidationError as exc:
            return f"RESIZE: {exc}"
        except msgspec.DecodeError:
            return 'RESIZE: the payload is JSON {"cols": N, "rows": N}'
    return ""

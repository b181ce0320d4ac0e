"""The two kinds of tunnel end the exchange (access/tunnels.py) joins, over the two WebSocket servers it has:
the renter's on the HTTPS port (aiohttp) and the agent's on the agent port (websockets)."""

from __future__ import annotations

from aiohttp import WSMsgType, web
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from access.tunnels import Closed, Side

LOST = Closed(1006, "connection lost")


class AgentTunnelEnd:
    """An agent's data connection: a websockets server connection on the agent port."""

    side = Side.AGENT

    def __init__(self, connection: ServerConnection, remote: str) -> None:
        self._ws = connection
        self.remote = remote

    async def receive(self) -> bytes | str | Closed:
        try:
            return await self._ws.recv()
        except ConnectionClosed as exc:
            return Closed(exc.rcvd.code, exc.rcvd.reason) if exc.rcvd is not None else LOST

    async def send(self, message: bytes) -> bool:
        try:
            await self._ws.send(message)  # waits while more than write_limit is unsent
        except ConnectionClosed:
            return False
        return True

    async def close(self, code: int, reason: str) -> None:
        await self._ws.close(code, reason)

    def abort(self) -> None:
        transport = self._ws.transport
        if transport is not None and not transport.is_closing():
            transport.abort()


class RenterTunnelEnd:
    """A renter's connection: an aiohttp WebSocket response on the HTTPS port, already prepared."""

    side = Side.RENTER

    def __init__(self, request: web.Request, ws: web.WebSocketResponse) -> None:
        self._request = request
        self._ws = ws
        self.remote = request.remote or ""

    async def receive(self) -> bytes | str | Closed:
        message = await self._ws.receive()
        if message.type is WSMsgType.BINARY or message.type is WSMsgType.TEXT:
            data: bytes | str = message.data
            return data
        if message.type is WSMsgType.CLOSE:
            return Closed(int(message.data), message.extra or "")
        if message.type is WSMsgType.ERROR:
            return Closed(self._ws.close_code or 1006, str(message.data))
        return LOST  # CLOSED, or CLOSING (the relay is closing it)

    async def send(self, message: bytes) -> bool:
        try:
            await self._ws.send_bytes(message)  # waits while the writer's buffer is over its limit
        except (OSError, RuntimeError):  # reset, or closing
            return False
        return True

    async def close(self, code: int, reason: str) -> None:
        await self._ws.close(code=code, message=reason.encode())

    def abort(self) -> None:
        transport = self._request.transport
        if transport is not None and not transport.is_closing():
            transport.abort()

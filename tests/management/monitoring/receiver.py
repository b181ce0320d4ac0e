"""A real webhook receiver (aiohttp on a free local port) for the alert tests: it records every request and answers
with the statuses it is told to, in order (then 200); a 3xx points at its own ``/target``, which records what follows
the redirect in ``followed``. And a black hole that accepts connections and never answers."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    body: bytes
    headers: dict[str, str]

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class WebhookReceiver:
    statuses: list[int] = field(default_factory=list)  # answers to give first, in order
    requests: list[Received] = field(default_factory=list)
    followed: list[Received] = field(default_factory=list)  # requests that came to /target (a redirect followed)
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        app.router.add_route("*", "/target", self._follow)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append(Received(body=await request.read(), headers=dict(request.headers)))
        self._arrived.set()
        status = self.statuses.pop(0) if self.statuses else 200
        if 300 <= status < 400:
            return web.Response(status=status, headers={"Location": f"http://127.0.0.1:{self.port}/target"})
        return web.Response(status=status)

    async def _follow(self, request: web.Request) -> web.Response:
        self.followed.append(Received(body=await request.read(), headers=dict(request.headers)))
        return web.Response(status=200)

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> list[Received]:
        """Until ``count`` requests arrived (or TimeoutError)."""

        async def enough() -> None:
            while len(self.requests) < count:
                self._arrived.clear()
                await self._arrived.wait()

        await asyncio.wait_for(enough(), timeout_s)
        return self.requests


@dataclass
class BlackHole:
    """A TCP server on 127.0.0.1 that accepts connections, reads what comes and never answers: a webhook receiver
    that holds every delivery until the sender gives up. Counts the connections it accepted (none: nothing tried)."""

    accepted: int = 0
    port: int = 0
    _server: asyncio.Server | None = None
    _held: list[asyncio.StreamWriter] = field(default_factory=list)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._hold, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _hold(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self._held.append(writer)
        while await reader.read(65536):
            pass

    async def stop(self) -> None:
        for writer in self._held:
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/hook"

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> None:
        """Until ``count`` connections were accepted (or TimeoutError)."""

        async def enough() -> None:
            while self.accepted < count:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(enough(), timeout_s)

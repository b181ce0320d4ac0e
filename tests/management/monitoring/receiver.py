"""A real webhook receiver (aiohttp on a free local port) for the alert tests: it records every request and answers
with the statuses it is told to, in order (then 200)."""

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
    _runner: web.AppRunner | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
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
        return web.Response(status=status)

    async def wait_for(self, count: int, timeout_s: float = 5.0) -> list[Received]:
        """Until ``count`` requests arrived (or TimeoutError)."""

        async def enough() -> None:
            while len(self.requests) < count:
                self._arrived.clear()
                await self._arrived.wait()

        await asyncio.wait_for(enough(), timeout_s)
        return self.requests

"""Runs the Master with the management API in one process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from management.api import build_app
from master.config import MasterConfig
from master.service import Master

log = logging.getLogger(__name__)

OPERATOR_TOKEN_FILE = "operator.token"


class MasterServer:
    """The Master plus its HTTP API; ``start``/``stop`` for tests and the daemon alike."""

    def __init__(self, config: MasterConfig) -> None:
        self.config = config
        self.master = Master(config)
        self._runner: web.AppRunner | None = None
        self.api_port = 0

    async def start(self) -> None:
        await self.master.start()
        await self._ensure_operator_token()
        self._runner = web.AppRunner(build_app(self.master), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.api_port)
        await site.start()
        self.api_port = self._runner.addresses[0][1]
        log.info("management API listening", extra={"url": self.api_url})

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.master.stop()

    @property
    def api_url(self) -> str:
        return f"http://{self.config.host}:{self.api_port}"

    @property
    def operator_token_file(self) -> Path:
        return self.config.state_path / OPERATOR_TOKEN_FILE

    async def _ensure_operator_token(self) -> None:
        """First start: mint an operator API key and leave it, 0600, where the operator can read it."""
        path = self.operator_token_file
        if path.exists():
            return
        key = await self.master.create_api_key("bootstrap operator")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(key + "\n")
        log.info("operator API key written", extra={"path": str(path)})


async def serve_master(config: MasterConfig) -> None:
    server = MasterServer(config)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"idlegrid master: API {server.api_url}  relay link {server.master.link_url}", flush=True)
    await stop.wait()
    await server.stop()

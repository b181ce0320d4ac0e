"""Runs the Master with the management API in one process."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from common.http import HttpServer
from management.api import ApiSettings, Handler, build_app, error_response
from management.operations import Operations
from master.accounts import BOOTSTRAP_ACCOUNT
from master.config import MasterConfig
from master.master import Master

log = logging.getLogger(__name__)

OPERATOR_TOKEN_FILE = "operator.token"
# How long a stopping Master lets API calls already accepted finish (a command is stored, then sent).
REQUEST_DRAIN_S = 10.0
RETRY_AFTER_S = 5
READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LEADER_HEADER = "Idlegrid-Leader"  # a standby's answer: the leader's API URL (docs/ha.md)
STEPPED_DOWN_EXIT = 75  # the exit status of a Master that lost the lease (EX_TEMPFAIL): its supervisor restarts it


class ApiGate:
    """Refuses API calls (503, Retry-After) once the Master stops, and lets the changes under way finish.

    A call answered 202 has stored what it did before answering, so letting those finish and
    turning the rest away with a status that says "retry" is what makes a stop lose nothing.
    Reads are refused too: the store they read is about to close. /healthz and /metrics still answer.
    """

    def __init__(self) -> None:
        self.open = True
        self._under_way = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def middleware(self) -> Middleware:
        @web.middleware
        async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith("/api/"):
                return await handler(request)
            if not self.open:
                response = error_response(503, "shutting_down", "the Master is shutting down; retry in a few seconds")
                response.headers["Retry-After"] = str(RETRY_AFTER_S)
                return response
            if request.method in READ_ONLY_METHODS:
                return await handler(request)
            self._under_way += 1
            self._idle.clear()
            try:
                return await handler(request)
            finally:
                self._under_way -= 1
                if not self._under_way:
                    self._idle.set()

        return gate

    async def close(self, timeout_s: float) -> None:
        """Refuse new calls; wait (up to ``timeout_s``) for the changes under way."""
        self.open = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            log.warning("stopping with API calls still under way", extra={"calls": self._under_way})


class StandbyGate:
    """A Master that does not lead (docs/ha.md) answers every route but /healthz with 503 ``not_leader``, naming the
    leader's API URL in the body (``error.leader``) and in an ``Idlegrid-Leader`` header ("" / absent when no leader is
    known yet), with Retry-After: a client retries there, or here in a moment. Outermost: nothing else runs first."""

    def __init__(self, master: Master) -> None:
        self._master = master

    def middleware(self) -> Middleware:
        @web.middleware
        async def standby(request: web.Request, handler: Handler) -> web.StreamResponse:
            leadership = self._master.leadership
            if leadership is None or self._master.serves() or request.path == "/healthz":
                return await handler(request)
            leader = leadership.leader_api_url()
            if leadership.leads():
                message = "this Master has just been elected and is loading its state; retry in a few seconds"
            elif leader:
                message = f"this Master is {leadership.role.value}, not the leader: the leader is {leader}"
            else:
                message = (
                    f"this Master is {leadership.role.value}, not the leader; no leader is known yet: retry in a few seconds"
                )
            response = web.json_response(
                {
                    "error": {
                        "code": "not_leader",
                        "message": message,
                        "leader": leader,
                    }
                },
                status=503,
            )
            response.headers["Retry-After"] = "1"
            if leader:
                response.headers[LEADER_HEADER] = leader
            return response

        return standby


class MasterServer:
    """The Master plus its HTTP API; ``start``/``stop`` for tests and the daemon alike."""

    def __init__(self, config: MasterConfig, api_settings: ApiSettings | None = None) -> None:
        self.config = config
        self.api_settings = api_settings or ApiSettings(
            key_rate_per_s=config.api_key_rate_per_s,
            key_burst=config.api_key_burst,
            account_rate_per_s=config.api_account_rate_per_s,
            account_burst=config.api_account_burst,
        )
        self.master = Master(config)
        self.operations = Operations(self.master)  # its scheduling loop runs while this server does
        self._http: HttpServer | None = None
        self.gate = ApiGate()
        self.api_port = 0

    async def start(self) -> None:
        if self.master.leadership is not None:
            await self._start_standby()
            return
        await self.master.start()
        await self._serve()
        await self._start_http()

    async def _start_standby(self) -> None:
        """High availability: listen (API and relay link) as a standby; serve once elected (``_serve``)."""
        self.master.on_elected.append(self._serve)
        await self._start_http()
        advertised = self.config.advertise_host or self.config.host
        await self.master.start_standby(f"http://{advertised}:{self.api_port}")

    async def _serve(self) -> None:
        """What the API needs beyond the Master: the operator's key, the workloads and market loaded, their loops."""
        await self._ensure_operator_token()
        await self.operations.prices.load()
        await self.operations.workloads.load()
        await self.operations.market.market.load()
        self.operations.scheduler.start()
        self.operations.outputs.start()
        self.operations.market.market.start()
        await self.operations.alert_settings.load()
        self.operations.alerts.start()

    async def _start_http(self) -> None:
        app = build_app(self.master, self.api_settings, self.operations)
        if self.master.leadership is not None:
            # Its startup hooks load workloads, prices and the market, once for good: a standby must not load a state
            # that the leader goes on changing. ``_serve`` loads them when this Master is elected.
            app.on_startup.clear()
        app.middlewares.append(self.gate.middleware())  # innermost: a caller is authenticated before it is told 503
        app.middlewares.insert(0, StandbyGate(self.master).middleware())  # outermost: a standby authenticates no one
        self._http = HttpServer(
            app,
            self.config.host,
            self.config.api_port,
            head_timeout_s=self.api_settings.header_timeout_s,
            access_log=None,
            keepalive_timeout=self.api_settings.idle_timeout_s,
            max_line_size=self.api_settings.max_request_line_bytes,
        )
        await self._http.start()
        self.api_port = self._http.port
        log.info("management API listening", extra={"url": self.api_url})

    async def stop(self) -> None:
        """Graceful: new changes get 503, those accepted finish, the Master drains its links and flushes, then
        the API closes (reads are served until then)."""
        await self.gate.close(REQUEST_DRAIN_S)
        await self.operations.scheduler.stop()
        await self.operations.outputs.stop()
        await self.operations.market.market.stop()
        await self.operations.alerts.stop()
        await self.master.stop()
        if self._http is not None:
            await self._http.stop()

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
        key = (await self.master.accounts.create_key(BOOTSTRAP_ACCOUNT, "bootstrap operator")).key
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
    leadership = server.master.leadership
    deposed = asyncio.ensure_future(leadership.deposed.wait() if leadership is not None else asyncio.Event().wait())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({deposed, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if leadership is not None and leadership.deposed.is_set():
        log.error("stepped down (%s); exiting so the supervisor starts this Master again as a standby", leadership.deposed_reason)
        await server.stop()
        raise SystemExit(STEPPED_DOWN_EXIT)
    log.info("shutting down: refusing API changes, draining relay links")
    await server.stop()

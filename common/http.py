"""Serving an aiohttp application with a deadline on request heads, which aiohttp itself does not have.

aiohttp waits for a request line and headers as long as the client keeps sending bytes: one that trickles a
header a byte every few seconds holds its connection (and, over TLS, its buffers) for as long as it likes.
``HttpServer`` serves an application the way ``web.TCPSite`` does, with one addition, in the style of
Go's ``ReadHeaderTimeout`` and hyper's ``header_read_timeout``: a request's head (its line and headers)
must arrive within ``head_timeout_s`` of the connection opening, or, on a kept-alive connection, of the
first byte of that request. Past it the client gets ``408 Request Timeout`` and the connection closes;
other connections are not affected. A TLS handshake is held to the same time limit.

How: every connection's aiohttp protocol is wrapped in a ``HeadDeadline``, which sees the bytes arrive,
and an outermost middleware tells it when a request reached the application (its head was complete) and
when the application was done with it. Idle kept-alive connections are aiohttp's ``keepalive_timeout``.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

HEAD_TIMEOUT_TEXT = b"request line and headers did not arrive in time; send them at once\n"
_HEAD_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n"
    b"Content-Length: " + str(len(HEAD_TIMEOUT_TEXT)).encode() + b"\r\n\r\n" + HEAD_TIMEOUT_TEXT
)


class HeadDeadline(asyncio.Protocol):
    """One connection's protocol (aiohttp's), wrapped: a request head that does not arrive in time ends it.

    Armed when the connection opens, and on a kept-alive connection when the next request's first byte
    arrives; disarmed while the application has a request. ``on_expired`` is told of every cut.
    """

    def __init__(self, inner: asyncio.Protocol, timeout_s: float, on_expired: Callable[[], None]) -> None:
        self.inner = inner
        self._timeout_s = timeout_s
        self._on_expired = on_expired
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        # When the head under way must have come (None: no head is awaited). The timer is not moved at every request:
        # it fires at the deadline it was set for and, when the deadline has moved since, sets itself for the new one.
        self._deadline: float | None = None
        self._in_request = False

    # --- what the application side says (the middleware) ---

    def request_began(self) -> None:
        self._in_request = True
        self._disarm()

    def request_ended(self) -> None:
        self._in_request = False  # the next byte starts the next head's clock

    # --- asyncio.Protocol, passed on to aiohttp ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self._arm()
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and not self._in_request:
            self._arm()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # --- the clock ---

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self._timeout_s
        if self._timer is None:  # one already set fires no later than this deadline, and looks again then
            self._timer = loop.call_later(self._timeout_s, self._expire)

    def _disarm(self) -> None:
        self._deadline = None  # the timer, if set, finds no deadline when it fires, and lets go

    def _cancel_timer(self) -> None:
        self._deadline = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._deadline is None:
            return
        left = self._deadline - asyncio.get_running_loop().time()
        if left > 0:  # the deadline moved (a later head) since this timer was set
            self._timer = asyncio.get_running_loop().call_later(left, self._expire)
            return
        self._deadline = None
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._on_expired()
        transport.write(_HEAD_TIMEOUT_RESPONSE)
        transport.close()  # the 408 goes out first; aiohttp hears connection_lost and lets go of the connection


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _mark_requests(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: tells the connection's ``HeadDeadline`` a request is in the application."""
    transport = request.transport
    guard = transport.get_protocol() if transport is not None else None
    if not isinstance(guard, HeadDeadline):
        return await handler(request)
    guard.request_began()
    try:
        return await handler(request)
    finally:
        guard.request_ended()


class HttpServer:
    """An aiohttp application on ``host:port`` (TLS when ``ssl_context`` is given), with request heads held to
    ``head_timeout_s``. Construct it before anything else starts the application: it adds a middleware.

    ``runner_options`` go to ``web.AppRunner`` (``access_log``, ``keepalive_timeout``, ...).
    """

    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        *,
        head_timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
        on_head_timeout: Callable[[], None] = lambda: None,
        backlog: int = 128,
        **runner_options: Any,
    ) -> None:
        if head_timeout_s <= 0:
            raise ValueError(f"head_timeout_s must be positive, got {head_timeout_s}")
        app.middlewares.insert(0, _mark_requests)
        self.app = app
        self.host = host
        self._port = port
        self.head_timeout_s = head_timeout_s
        self._ssl = ssl_context
        self._on_head_timeout = on_head_timeout
        self._backlog = backlog
        self._runner = web.AppRunner(app, handle_signals=False, **runner_options)
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The bound port (the one chosen by the system when ``port`` was 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the HTTP server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        await self._runner.setup()
        connections = self._runner.server
        assert connections is not None  # set by setup()

        def guarded() -> HeadDeadline:
            return HeadDeadline(connections(), self.head_timeout_s, self._on_head_timeout)

        try:
            self._server = await asyncio.get_running_loop().create_server(
                guarded,
                self.host,
                self._port,
                ssl=self._ssl,
                ssl_handshake_timeout=self.head_timeout_s if self._ssl is not None else None,
                backlog=self._backlog,
                reuse_address=True,
            )
        except BaseException:
            await self._runner.cleanup()
            raise

    async def stop(self) -> None:
        """Stop listening, then let aiohttp finish what is in progress and close every connection."""
        if self._server is not None:
            self._server.close()
            self._server = None
        await self._runner.cleanup()


UNMATCHED_ROUTE = "unmatched"  # every path no route knows, under one label: raw paths would be unbounded
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"  # a client may send any token as a method: labels stay bounded

RequestObserver = Callable[[str, str, int, float], None]  # (method, route pattern, status, seconds)


def timed_requests(observe: RequestObserver) -> Callable[..., Awaitable[web.StreamResponse]]:
    """A middleware telling ``observe`` of every request: its method (bounded), its route pattern (never the raw
    path), its status (500 for an exception that is not an HTTP answer) and how long it took."""

    @web.middleware
    async def timed(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else UNMATCHED_ROUTE
            method = request.method if request.method in KNOWN_METHODS else OTHER_METHOD
            observe(method, route, status, time.perf_counter() - started)

    return timed

"""The relay's HTTPS endpoint (server-auth TLS only): enrollment, the speed test, /healthz, /metrics and renters'
tunnels (``GET /tunnel``, a WebSocket handed to access/tunnels.py).

Routes only translate HTTP to calls on the Master link; enrollment itself happens on the Master.
"""

from __future__ import annotations

import logging
import ssl
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from access.config import AccessConfig
from access.metrics import CONTENT_TYPE_LATEST, RelayMetrics
from access.ratelimit import KeyedRateLimiter, TransferGate
from access.speedtest import add_speedtest_routes
from access.tunnel_ends import RenterTunnelEnd
from access.tunnels import PING_INTERVAL_S, TRANSPORT_MAX_BYTES, TunnelExchange
from access.upstream import MasterLink, MasterUnavailable
from common.http import HttpServer, timed_requests
from common.tunnel import RENTER_PATH, TICKET_HEADER
from common.wire import EnrollRequest, EnrollResponse

log = logging.getLogger(__name__)

# The Master's refusal codes, as HTTP statuses; any other refusal is the client's to fix (400).
ENROLL_STATUS = {
    "token_unknown": 401,
    "token_invalid": 401,
    "token_used": 409,
    "token_expired": 410,
    "bad_csr": 400,
}


class EnrollBody(msgspec.Struct, forbid_unknown_fields=False):
    token: str
    csr_pem: str
    region: str = ""


def error_response(status: int, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers or None)


def enroll_status(code: str) -> int:
    return ENROLL_STATUS.get(code, 400)


class RelayHttp:
    """aiohttp application and its HTTPS site."""

    def __init__(
        self,
        config: AccessConfig,
        ssl_context: ssl.SSLContext,
        link: MasterLink,
        metrics: RelayMetrics,
        *,
        agent_count: Callable[[], int],
        agent_url: Callable[[], str],
        tunnels: TunnelExchange,
    ) -> None:
        self.config = config
        self._tunnels = tunnels
        self._link = link
        self._metrics = metrics
        self._agent_count = agent_count
        self._agent_url = agent_url
        self._enroll_limiter = KeyedRateLimiter(config.enroll_rate_per_ip, config.enroll_burst)
        self.speedtest_gate = TransferGate(
            config.speedtest_transfers_per_ip, config.speedtest_bytes_per_window, config.speedtest_window_s
        )
        self.app = self._build_app()
        self._server = HttpServer(
            self.app,
            config.http_host,
            config.http_port,
            ssl_context=ssl_context,
            head_timeout_s=config.http_head_timeout_s,
            on_head_timeout=metrics.http_head_timeout,
            access_log=None,
        )

    def _build_app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[timed_requests(self._count_request)])
        app.router.add_post("/enroll", self._enroll)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/metrics", self._metrics_page)
        add_speedtest_routes(app, gate=self.speedtest_gate, meter=self._metrics)
        app.router.add_get(RENTER_PATH, self._tunnel)
        return app

    @property
    def port(self) -> int:
        return self._server.port

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop()

    def _count_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self._metrics.http_request(route, method, status, seconds)

    # --- routes -------------------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        up = self._link.is_up
        return web.json_response(
            {
                "status": "ok" if up else "degraded",
                "master_link": "up" if up else "down",
                "agents": self._agent_count(),
                "buffered": len(self._link.buffer),
                "relay_id": self.config.relay_id,
                "region": self.config.region,
            }
        )

    async def _metrics_page(self, request: web.Request) -> web.Response:
        response = web.Response(body=self._metrics.render())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _tunnel(self, request: web.Request) -> web.StreamResponse:
        """A renter's end of a tunnel: checked and joined by the exchange once upgraded, so a refusal has a close
        code and a reason the renter's client shows; only a request that cannot be a tunnel is refused in HTTP."""
        ticket = request.headers.get(TICKET_HEADER, "")
        if not ticket:
            self._metrics.tunnel_refused("ticket")
            return error_response(401, "ticket_missing", f"a tunnel needs its ticket in the {TICKET_HEADER} header")
        ws = web.WebSocketResponse(max_msg_size=TRANSPORT_MAX_BYTES, compress=False, autoping=True, heartbeat=PING_INTERVAL_S)
        if not ws.can_prepare(request).ok:
            return error_response(400, "not_websocket", f"GET {RENTER_PATH} is a WebSocket upgrade (Upgrade: websocket)")
        await ws.prepare(request)
        await self._tunnels.admit(RenterTunnelEnd(request, ws), ticket)
        return ws

    async def _enroll(self, request: web.Request) -> web.Response:
        remote = request.remote or ""
        if not self._enroll_limiter.allow(remote):
            self._metrics.enrollment("rate_limited")
            return error_response(
                429, "rate_limited", "too many enrollment requests from this address; wait and retry", **{"Retry-After": "5"}
            )
        body = await self._read_body(request)
        if isinstance(body, web.Response):
            self._metrics.enrollment("bad_request")
            return body
        enroll = EnrollRequest(req_id=uuid.uuid4().hex, token=body.token, csr_pem=body.csr_pem, region=body.region, remote=remote)
        try:
            answer = await self._link.enroll(enroll, self.config.enroll_timeout_s)
        except MasterUnavailable as exc:
            self._metrics.enrollment("master_unavailable")
            return error_response(503, exc.code, str(exc), **{"Retry-After": "5"})
        except TimeoutError:
            self._metrics.enrollment("timeout")
            log.warning("the Master did not answer an enrollment in time", extra={"req_id": enroll.req_id, "remote": remote})
            return error_response(
                504, "master_timeout", f"the Master did not answer within {self.config.enroll_timeout_s:g} s; retry"
            )
        return self._enroll_answer(answer, remote)

    async def _read_body(self, request: web.Request) -> EnrollBody | web.Response:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, "too_large", f"request body exceeds {self.config.max_body_bytes} bytes")
        try:
            return msgspec.json.decode(raw, type=EnrollBody)
        except msgspec.ValidationError as exc:
            return error_response(400, "bad_request", f"enrollment request needs token and csr_pem strings: {exc}")
        except msgspec.DecodeError as exc:
            return error_response(400, "bad_request", f"request body is not valid JSON: {exc}")

    def _enroll_answer(self, answer: EnrollResponse, remote: str) -> web.Response:
        if not answer.ok:
            self._metrics.enrollment(answer.error_code if answer.error_code in ENROLL_STATUS else "refused")
            log.info("enrollment refused", extra={"code": answer.error_code, "remote": remote})
            return error_response(
                enroll_status(answer.error_code),
                answer.error_code or "enrollment_refused",
                answer.error_message or "the Master refused the enrollment",
            )
        self._metrics.enrollment("ok")
        log.info("agent enrolled", extra={"agent": answer.agent_id, "remote": remote})
        payload: dict[str, Any] = {
            "agent_id": answer.agent_id,
            "cert_pem": answer.cert_pem,
            "ca_pem": answer.ca_pem,
            "command_keys": answer.command_keys,
            "key_endorsements": answer.key_endorsements,  # the agent trusts only keys the platform CA endorsed
            "agent_url": self._agent_url(),
            "relays": msgspec.to_builtins(answer.relays),  # the Master's relay directory: where to fail over to
        }
        return web.json_response(payload)

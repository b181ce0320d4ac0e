"""API errors: one JSON shape, ``{"error": {"code", "message"}}``, and one place mapping error codes to HTTP statuses.

A code the table does not map is a fault of the server, not of the client: it answers 500 (``internal``, no details)
and the failure is logged with the request's method and path, so that a bug never looks like the caller's mistake.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from common.errors import IdlegridError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The error codes a call may earn (common.errors, master/ and management/) and the statuses they answer with. Any other
# code is the server's fault: a 500 and a log line (``errors_middleware``). A new client-facing error class adds its
# code here.
STATUS_OF_CODE = {
    "not_found": 404,
    "conflict": 409,
    "invalid_transition": 409,
    "invalid_command": 400,
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "insufficient_funds": 402,  # the market: a balance that does not cover what was asked
    "tunnel_unavailable": 503,  # the host is not linked to a relay now (or its relay gave no address for renters)
    "tunnel_closed": 502,  # the relay or the host ended a tunnel the Master dialled (logs over HTTP)
    "fenced": 503,  # high availability: this Master lost the lead while serving the call; ask the leader (docs/ha.md)
    "bad_json": 400,
    "bad_cursor": 400,
    "invalid_workload_spec": 400,  # management/workloads/spec.py
    "invalid_tunnel": 400,  # management/services/tunnels.py
    "invalid_link": 400,  # management/services/links.py
    "unknown_template": 404,  # management/launch/catalog.py
    "invalid_template": 400,  # management/launch/catalog.py
    "invalid_ssh_key": 400,  # management/services/ssh_keys.py
    "invalid_endpoint_spec": 400,  # management/services/endpoints.py
    "invalid_endpoint_request": 400,  # management/services/endpoint_requests.py
    "request_too_large": 413,  # management/endpoints/requests.py: an input past its endpoint's bound
    "queue_full": 429,  # management/services/endpoint_requests.py: an endpoint holding all the open requests it may
    "invalid_ledger_request": 400,  # management/market/ledger.py
    "invalid_topup": 400,  # management/payments/topups.py: an amount out of bounds, negative, or finer than a cent
    "invalid_caps": 400,  # management/payments/caps.py: a spend cap the grid does not take
    "invalid_webhook": 400,  # management/payments/provider.py: a signature that does not verify, or no event
    "payments_not_configured": 503,  # management/payments/topups.py: the grid has no payment provider
    "payment_provider_error": 502,  # management/payments/provider.py: the provider refused or was unreachable
    "invalid_payment_method": 400,  # management/payments/provider.py: a token the provider does not know
    "payment_declined": 402,  # management/payments/provider.py: the provider declined a saved payment method
    "invalid_dispute": 400,  # management/payments/disputes.py: a dispute, answer or resolution the rules refuse
}
INTERNAL_MESSAGE = "internal error; see the Master's log"


def status_of(exc: IdlegridError) -> int | None:
    """The HTTP status ``exc`` answers with; None for a code no table maps (the server's fault: a 500)."""
    if isinstance(exc, ApiError):
        return exc.status
    return STATUS_OF_CODE.get(exc.code)


class ApiError(IdlegridError):
    """An answer decided by the API itself (bad request, authentication, role), with its HTTP status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message, code=code)
        self.status = status


class BadRequest(ApiError):
    def __init__(self, message: str, code: str = "bad_request") -> None:
        super().__init__(400, code, message)


class Unauthorized(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(401, "unauthorized", message)


class Forbidden(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(403, "forbidden", message)


def error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


_WHERE = re.compile(r" - at `\$\.?([^`]*)`")


def validation_message(exc: msgspec.ValidationError, where: str) -> str:
    """msgspec's message with its JSON path turned into words: "… - at `$.ttl_s`" -> "ttl_s: …"."""
    text = str(exc)
    match = _WHERE.search(text)
    if not match:
        return f"{where}: {text}"
    field = match.group(1) or where
    return f"{field}: {_WHERE.sub('', text)}"


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes the JSON error shape; an unexpected one (any exception but an IdlegridError whose code
    STATUS_OF_CODE maps, or an HTTP error) is logged and answers 500 without details."""
    try:
        return await handler(request)
    except Exception as exc:
        return error_answer(request, exc)


def error_answer(request: web.Request, exc: Exception) -> web.Response:
    """The JSON error answer to ``exc``, raised while serving ``request`` (called where it is handled); an HTTP
    answer below 400 (a redirect) is raised again, as it is an answer itself."""
    if isinstance(exc, IdlegridError):
        status = status_of(exc)
        if status is not None:
            return error_response(status, exc.code, str(exc))
        log_fault(request, f"API handler failed with an error code no table maps ({exc.code!r})")
        return error_response(500, "internal", INTERNAL_MESSAGE)
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return error_response(exc.status, (exc.reason or "error").lower().replace(" ", "_"), exc.text or exc.reason)
    log_fault(request, "API handler failed")
    return error_response(500, "internal", INTERNAL_MESSAGE)


def log_fault(request: web.Request, what: str) -> None:
    """Log the exception being handled with what identifies the request (there is no request id header: its method,
    path and the peer say which call it was)."""
    log.exception(
        "%s: %s %s",
        what,
        request.method,
        request.path,
        extra={"method": request.method, "path": request.path, "peer": request.remote},
    )

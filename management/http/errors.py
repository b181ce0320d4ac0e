"""API errors: one JSON shape, ``{"error": {"code", "message"}}``, and one place mapping error codes to HTTP statuses."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from common.errors import IdlegridError

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The Master's error codes (common.errors and master/) and the statuses they answer with; any other code is a 400.
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
}


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
    """Every failure becomes the JSON error shape; an unexpected one is logged and answers 500 without details."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.code, str(exc))
    except IdlegridError as exc:
        return error_response(STATUS_OF_CODE.get(exc.code, 400), exc.code, str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, (exc.reason or "error").lower().replace(" ", "_"), exc.text or exc.reason)
    except Exception:
        log.exception("API handler failed", extra={"path": request.path})
        return error_response(500, "internal", "internal error; see the Master's log")

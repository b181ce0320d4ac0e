"""What every console request goes through: who is signed in, the CSRF check, security headers, and errors as pages.

Only paths under /console are touched; the API keeps its own middlewares (bearer keys, JSON errors).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from urllib.parse import quote

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp_session import get_session

from common.errors import IdlegridError
from management.console.rendering import page
from management.console.session import (
    CSRF_FIELD,
    CSRF_HEADER,
    SIGNED_IN_KEY,
    ConsoleCookieStorage,
    SignInRequired,
    session_state,
)
from management.http.errors import status_of
from management.http.keys import SERVICES_KEY
from master.port import ConsoleSettings

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
CONSOLE_PREFIX = "/console"

# Only our own scripts and the vendored ones, served from this origin; no framing, no third-party anything.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _is_console(request: web.Request) -> bool:
    return request.path == CONSOLE_PREFIX or request.path.startswith(CONSOLE_PREFIX + "/")


def same_origin(request: web.Request) -> bool:
    """Whether the request's Origin (or, without one, its Referer) is this server's own; absent both, False."""
    here = f"{request.scheme}://{request.host}"
    origin = request.headers.get("Origin")
    if origin is not None:
        return origin == here
    referer = request.headers.get("Referer", "")
    return referer == here or referer.startswith(here + "/")


async def _csrf_ok(request: web.Request) -> bool:
    if not same_origin(request):
        return False
    expected = (await session_state(request)).csrf
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        form = await request.post()
        field = form.get(CSRF_FIELD)
        given = field if isinstance(field, str) else None
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def console_middleware(settings: ConsoleSettings, storage: ConsoleCookieStorage) -> Middleware:
    @web.middleware
    async def console(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not _is_console(request):
            return await handler(request)
        try:
            response = await _handle(request, handler, settings)
        except web.HTTPException as redirect:  # a redirect (to the sign-in page) is an answer too
            storage.retire_plain_cookie(request, redirect)
            raise
        storage.retire_plain_cookie(request, response)
        if not response.prepared:
            for name, value in SECURITY_HEADERS.items():
                response.headers.setdefault(name, value)
        return response

    return console


async def _load_account(request: web.Request, settings: ConsoleSettings) -> None:
    """Put the signed-in account on the request, or end a session that no longer holds (disabled, password changed,
    too old, account gone)."""
    session = await get_session(request)
    account_id = session.get("account")
    if not account_id:
        return
    why = ""
    try:
        account = await request.app[SERVICES_KEY].accounts.get_account(account_id)
    except IdlegridError:
        account = None
        why = "your account no longer exists"
    if account is not None:
        if account.disabled:
            why = "your account was disabled"
        elif account.password_epoch != session.get("epoch"):
            why = "your password was changed; sign in with the new one"
        elif time.time() - float(session.get("since", 0)) > settings.session_lifetime_s:
            why = "your session expired; sign in again"
    if why:
        session.invalidate()
        session = await get_session(request)
        session["flash"] = [why]
        return
    assert account is not None
    request[SIGNED_IN_KEY] = account


async def _handle(request: web.Request, handler: Handler, settings: ConsoleSettings) -> web.StreamResponse:
    wants_socket = request.headers.get("Upgrade", "").lower() == "websocket"
    try:
        await _load_account(request, settings)
        if wants_socket and not same_origin(request):
            return web.Response(status=403, text="cross-origin WebSocket refused")
        if request.method not in SAFE_METHODS and not await _csrf_ok(request):
            return await page(
                request,
                "error.html",
                status=403,
                title="Refused",
                message="This form was not sent from this console (its CSRF token is missing or wrong). "
                "Reload the page and try again.",
            )
        return await handler(request)
    except SignInRequired:
        if request.method in SAFE_METHODS and not request.headers.get("HX-Request") and not wants_socket:
            raise web.HTTPSeeOther(f"{CONSOLE_PREFIX}/signin?next={quote(request.path_qs, safe='')}") from None
        return web.Response(status=401, text="sign in first")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return await page(request, "error.html", status=exc.status, title=exc.reason, message=exc.text or exc.reason)
    except IdlegridError as exc:
        status = status_of(exc)
        if status is None:  # a code no table maps: the server's fault, as in the API (management/http/errors.py)
            log.exception("console page failed with an error code no table maps (%r)", exc.code, extra={"path": request.path})
            return await page(request, "error.html", status=500, title="Something went wrong", message=INTERNAL)
        return await page(request, "error.html", status=status, title=_title(status), message=str(exc))
    except Exception:
        log.exception("console page failed", extra={"path": request.path})
        return await page(request, "error.html", status=500, title="Something went wrong", message=INTERNAL)


INTERNAL = "The console could not show this page; the Master's log says why."


def _title(status: int) -> str:
    return {400: "Not possible", 401: "Sign in", 402: "Not enough credit", 403: "Not allowed", 404: "Not found"}.get(
        status, "Not possible"
    )

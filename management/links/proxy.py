"""The links' HTTP face: requests to ``/w/<workload>-<port>/...`` (or to ``<workload>-<port>.<domain>``) are let in or
refused (management/links/gate.py through ``Services.links``) and passed to the container through the link's tunnel:
HTTP with streamed bodies both ways, and WebSockets message by message.

Links are served by an application of their own (``links_app``) on a listener of their own (``[links] port``), never
by the API's and the console's: a link's pages come from the renter's image, and on the console's origin their
scripts could read console pages as the visitor. The API's listener answers a link's path with a redirect to the
link's own address and a link's host with 421 (``not_on_the_console``), serving neither.

What the container never sees: any of the platform's cookies (the console's, the link's own: every ``idlegrid…`` name),
the ``idlegrid_token`` query parameter, or an ``Authorization`` header that was the visitor's key or link token. What
the visitor never gets from it: a ``Set-Cookie`` of a platform cookie's name, with a ``Domain``, or scoped outside the
link's own path (management/http/cookies.py): cookies ignore ports, so such a cookie would reach the console. What the
container sees instead: ``X-Forwarded-Proto``, ``X-Forwarded-Host`` and, on a path link, ``X-Forwarded-Prefix`` (the
prefix is taken off the path, so an app that makes relative links works under it; one that needs its base URL can read
it there).

A token handed over in the URL (``?idlegrid_token=igl_...``, how the console opens a private link in a new tab) is
checked, set as an HttpOnly cookie scoped to the link (its path, or its host on the wildcard domain) and taken off the
URL by a redirect, so it stays out of the app's logs and the browser's history.

A public link on a path shares the links listener's origin with every other path link, so its pages are served in a
CSP sandbox (an opaque origin: no access to other links' cookies or pages); on the wildcard domain every link is an
origin of its own and needs none (docs/links.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import aiohttp
from aiohttp import WSMsgType, web
from multidict import CIMultiDict

from common.errors import IdlegridError
from management.http.cookies import cookie_header_without_platform, judge_set_cookie
from management.http.keys import SERVICES_KEY
from management.links.gate import Admitted, Refused
from management.links.names import (
    PATH_PREFIX,
    TOKEN_COOKIE,
    TOKEN_QUERY,
    LinkAddress,
    from_host,
    from_path,
    is_link_token,
)
from management.links.tunnels import LinkTunnel
from management.services.links import InvalidCredential

if TYPE_CHECKING:
    from management.services import Services

log = logging.getLogger(__name__)

# Headers that describe one connection, not the message (RFC 9110 7.6.1), and ours: never passed on.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"}
)
WS_HANDSHAKE = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-accept"})
SANDBOX = "sandbox allow-scripts allow-forms allow-popups allow-modals allow-downloads allow-popups-to-escape-sandbox"
BODY_CHUNK = 64 * 1024
WS_MAX_MESSAGE = 16 * 1024 * 1024


def links_app(services: Services) -> web.Application:
    """The links listener's application: path links under ``/w/`` (a wildcard domain's links by their Host, through
    ``host_middleware``), load-balanced endpoints under ``/e/``; anything else there is a 404, so nothing of the API
    or the console is ever on this origin."""
    # Load-balanced endpoints' URLs, /e/<endpoint>/ (endpoint_proxy.py reuses this module's header rules, so it is
    # imported here, once both are loaded).
    from management.links.endpoint_proxy import add_endpoint_routes

    app = web.Application(middlewares=[host_middleware])
    app[SERVICES_KEY] = services
    app.router.add_route("*", "/w/{name}", serve_path_link)
    app.router.add_route("*", "/w/{name}/{rest:.*}", serve_path_link)
    add_endpoint_routes(app)
    app.router.add_route("*", "/{rest:.*}", _nothing_here)
    return app


@web.middleware
async def not_on_the_console(request: web.Request, handler: aiohttp.typedefs.Handler) -> web.StreamResponse:
    """On the API's and the console's listener: a link is never served there (its scripts would share their origin).

    A link's path is redirected to the link's own address (computed from the path alone: nothing is looked up, so the
    answer says nothing about the workload); a request whose Host names a link (a proxy sending the wildcard domain
    to the wrong port) is 421, Misdirected Request."""
    links = request.app[SERVICES_KEY].links
    if from_host(request.host, links.settings.domain) is not None:
        why = f"{request.host} is a link: links are served by the Master's links listener, not its API's"
        return _refusal(Refused(421, "misdirected_request", why), request)
    if not request.path.startswith(PATH_PREFIX):
        return await handler(request)
    found = from_path(request.path)
    if found is None:
        return _refusal(Refused(404, "not_found", "no such link: a link's path is /w/<workload>-<port>/"), request)
    address, rest = found
    target = links.url(address) + rest.removeprefix("/")
    location = target + (f"?{request.query_string}" if request.query_string else "")
    # no-store: the links' address may change with the Master's configuration
    return web.Response(status=308, headers={"Location": location, "Cache-Control": "no-store"})


async def _nothing_here(request: web.Request) -> web.StreamResponse:
    why = "this address serves only links, /w/<workload>-<port>/, and endpoints, /e/<endpoint>/"
    return _refusal(Refused(404, "not_found", why), request)


@web.middleware
async def host_middleware(request: web.Request, handler: aiohttp.typedefs.Handler) -> web.StreamResponse:
    """A request whose Host is a link on the wildcard domain goes to the link, whatever its path."""
    services = request.app[SERVICES_KEY]
    address = from_host(request.host, services.links.settings.domain)
    if address is None:
        return await handler(request)
    return await _serve(request, address, request.path, on_path=False)


async def serve_path_link(request: web.Request) -> web.StreamResponse:
    found = from_path(request.path)
    if found is None:
        return _refusal(Refused(404, "not_found", "no such link: a link's path is /w/<workload>-<port>/"))
    address, rest = found
    links = request.app[SERVICES_KEY].links
    if links.settings.domain:  # each link on a host of its own: a path here would put them all in one origin
        target = links.url(address) + rest.removeprefix("/")
        raise web.HTTPPermanentRedirect(target + (f"?{request.query_string}" if request.query_string else ""))
    if not rest:  # the app's relative links need the trailing slash
        raise web.HTTPPermanentRedirect(address.prefix + (f"?{request.query_string}" if request.query_string else ""))
    return await _serve(request, address, rest, on_path=True)


async def _serve(request: web.Request, address: LinkAddress, path: str, *, on_path: bool) -> web.StreamResponse:
    links = request.app[SERVICES_KEY].links
    verdict = await links.admit(address, None)
    credential_used = ""
    if isinstance(verdict, Refused) and verdict.status == 401:
        try:
            handed, credential_used = await _credential(request, address)
        except InvalidCredential as exc:
            return _refusal(Refused(401, "unauthorized", f"{exc}; open the link again from the console"), request, address)
        if handed is not None:
            return handed
        visitor = await links.visitor(credential_used, address) if credential_used else None
        verdict = await links.admit(address, visitor)
    if isinstance(verdict, Refused):
        return _refusal(verdict, request, address)
    try:
        tunnel = await links.tunnels.get(address)
    except IdlegridError as exc:
        log.info("link %s: no tunnel: %s", address.name, exc)
        why = f"the link's container cannot be reached now: {exc}"
        return _refusal(Refused(502, "link_unavailable", why), request, address)
    tunnel.in_use += 1
    try:
        headers = _upstream_headers(request, address, on_path=on_path, strip_auth=credential_used)
        target = path + (f"?{_query_without_token(request)}" if request.query_string else "")
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await _websocket(request, tunnel, target, headers)
        return await _http(request, tunnel, target, headers, address, on_path=on_path, sandbox=on_path and verdict.link.public)
    finally:
        tunnel.in_use -= 1
        tunnel.last_used = time.monotonic()


async def _credential(request: web.Request, address: LinkAddress) -> tuple[web.StreamResponse | None, str]:
    """(a redirect that turns a URL's token into a cookie, or None; the credential the request carries, or "").

    InvalidCredential when a token in the URL or an Authorization header is presented and fails (a stale cookie
    is only ignored: the visitor is then asked to open the link again)."""
    links = request.app[SERVICES_KEY].links
    token = request.query.get(TOKEN_QUERY)
    if token:
        if not is_link_token(token):  # an API key never goes in a URL (logs, history) nor in a cookie
            raise InvalidCredential(f"{TOKEN_QUERY} takes a link token (igl_...), never an API key")
        await links.visitor(token, address)  # checked before it is set, so a bad one is refused here, not later
        response = web.HTTPSeeOther(_path_without_token(request))
        remaining = max(60, int(links.settings.browser_token_s))
        response.set_cookie(
            TOKEN_COOKIE,
            token,
            path=address.prefix if not from_host(request.host, links.settings.domain) else "/",
            max_age=remaining,
            httponly=True,
            samesite="Lax",
            secure=request.secure or links.url(address).startswith("https:"),
        )
        return response, ""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        await links.visitor(key.strip(), address)
        return None, key.strip()
    cookie = request.cookies.get(TOKEN_COOKIE, "")
    if cookie:
        try:
            await links.visitor(cookie, address)
        except InvalidCredential:
            return None, ""
    return None, cookie


def _path_without_token(request: web.Request) -> str:
    query = _query_without_token(request)
    return request.path + (f"?{query}" if query else "")


def _query_without_token(request: web.Request) -> str:
    kept = [(k, v) for k, v in request.query.items() if k != TOKEN_QUERY]
    return urlencode(kept) if len(kept) != len(request.query) else request.query_string


def _upstream_headers(request: web.Request, address: LinkAddress, *, on_path: bool, strip_auth: str) -> CIMultiDict[str]:
    return forwarded_headers(request, prefix=address.prefix.rstrip("/") if on_path else None, strip_auth=bool(strip_auth))


def forwarded_headers(request: web.Request, *, prefix: str | None, strip_auth: bool) -> CIMultiDict[str]:
    """The visitor's headers as the container gets them: no hop-by-hop or WebSocket handshake header, none of the
    platform's cookies, no ``Authorization`` when it was the grid's credential (``strip_auth``); the ``X-Forwarded-``
    ones added (``X-Forwarded-Prefix`` when the request came under a path ``prefix``). Links and load-balanced
    endpoints (endpoint_proxy.py) both send these."""
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in request.headers.items():
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in WS_HANDSHAKE or lower == "cookie":
            continue
        if lower == "authorization" and strip_auth:
            continue  # the visitor's own key or link token: the container never sees it
        headers.add(name, value)
    kept_cookies = cookie_header_without_platform(request.headers.getall("Cookie", []))
    if kept_cookies:
        headers["Cookie"] = kept_cookies
    headers["X-Forwarded-Proto"] = request.scheme
    headers["X-Forwarded-Host"] = request.host
    if prefix is not None:
        headers["X-Forwarded-Prefix"] = prefix
    return headers


async def _http(
    request: web.Request,
    tunnel: LinkTunnel,
    target: str,
    headers: CIMultiDict[str],
    address: LinkAddress,
    *,
    on_path: bool,
    sandbox: bool,
) -> web.StreamResponse:
    body = stream_body(request) if request.body_exists else None
    try:
        upstream = await tunnel.session.request(
            request.method, f"http://link{target}", headers=headers, data=body, allow_redirects=False
        )
    except (aiohttp.ClientError, OSError) as exc:
        return _refusal(Refused(502, "link_unavailable", f"the container did not answer on port {address.port}: {exc}"))
    async with upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        scope = address.prefix if on_path else "/"
        for name, value in upstream.headers.items():
            lower = name.lower()
            if lower in HOP_BY_HOP or lower == "set-cookie2":
                continue
            if lower == "set-cookie":
                why = judge_set_cookie(value, scope=scope, request_path=request.raw_path.partition("?")[0])
                if why:
                    log.info("link %s: a Set-Cookie dropped: %s", address.name, why)
                    continue
            if lower == "location" and on_path and value.startswith("/") and not value.startswith("//"):
                value = address.prefix.rstrip("/") + value  # the app's absolute redirect, kept under the link
            response.headers.add(name, value)
        if sandbox:
            response.headers["Content-Security-Policy"] = SANDBOX
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
                await asyncio.sleep(0)  # yield even when nothing waited: the Master's control work goes between chunks
        except (aiohttp.ClientError, ConnectionError) as exc:
            # The tunnel or the container ended mid-body: the visitor's connection is cut (a short body, never a
            # complete-looking one), and the next request opens the link's tunnel again.
            log.info("link %s: the body ended early: %s", address.name, exc)
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response


async def stream_body(request: web.Request) -> AsyncIterator[bytes]:
    async for chunk in request.content.iter_chunked(BODY_CHUNK):
        yield chunk
        await asyncio.sleep(0)


async def _websocket(request: web.Request, tunnel: LinkTunnel, target: str, headers: CIMultiDict[str]) -> web.StreamResponse:
    """The container's WebSocket first (so a refusal is an HTTP answer), then the visitor's; messages both ways."""
    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    headers.pop("Sec-WebSocket-Protocol", None)
    try:
        upstream = await tunnel.session.ws_connect(
            f"http://link{target}", headers=headers, protocols=protocols, autoclose=False, max_msg_size=WS_MAX_MESSAGE
        )
    except aiohttp.WSServerHandshakeError as exc:
        return _refusal(Refused(exc.status or 502, "link_refused", f"the container refused the WebSocket: {exc.message}"))
    except (aiohttp.ClientError, OSError) as exc:
        return _refusal(Refused(502, "link_unavailable", f"the container's WebSocket cannot be reached: {exc}"))
    visitor = web.WebSocketResponse(
        protocols=[upstream.protocol] if upstream.protocol else [], autoclose=False, max_msg_size=WS_MAX_MESSAGE
    )
    await visitor.prepare(request)
    pumps = [
        asyncio.ensure_future(_pump(upstream, visitor)),
        asyncio.ensure_future(_pump(visitor, upstream)),
    ]
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        for pump in pumps:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
                await pump
        await upstream.close()
        await visitor.close()
    return visitor


async def _pump(
    source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse
) -> None:
    async for message in source:
        if message.type is WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type is WSMsgType.BINARY:
            await sink.send_bytes(message.data)
            await asyncio.sleep(0)
        elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            break
    code = source.close_code or 1000
    await sink.close(code=code if 1000 <= code < 5000 and code not in (1005, 1006) else 1000)


REFUSAL_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;color:#1b2330}}
code{{background:#eef1f5;padding:2px 4px}}</style></head>
<body><h1>{title}</h1><p>{message}</p>{console}</body></html>"""


def _refusal(refused: Refused, request: web.Request | None = None, address: LinkAddress | None = None) -> web.Response:
    """JSON for programs; a short page for a browser (it asks for text/html), with the way in from the console."""
    if request is not None and "text/html" in request.headers.get("Accept", ""):
        console = ""
        if address is not None and refused.status in (401, 503):
            # Said, not linked: the link's address may be a host of its own, where the console must not be used.
            console = (
                "<p>Sign in to the grid's console as its owner, then open it from the workload's page "
                f"(My workloads, <code>{html.escape(address.workload)}</code>, Open port {address.port}).</p>"
            )
        page = REFUSAL_PAGE.format(
            title=html.escape(f"{refused.status} {refused.code.replace('_', ' ')}"),
            message=html.escape(refused.message),
            console=console,
        )
        response = web.Response(text=page, status=refused.status, content_type="text/html")
    else:
        response = web.json_response({"error": {"code": refused.code, "message": refused.message}}, status=refused.status)
    response.headers["Cache-Control"] = "no-store"
    if refused.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="idlegrid link"'
    return response


__all__ = [
    "Admitted",
    "forwarded_headers",
    "host_middleware",
    "links_app",
    "not_on_the_console",
    "serve_path_link",
    "stream_body",
]

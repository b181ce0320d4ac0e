"""The platform's cookies, and the cookies a link's container may set (pure: strings in, verdicts out).

The platform's own cookies all begin with ``idlegrid`` (``idlegrid_console``, ``__Host-idlegrid_console``,
``idlegrid_link``). Cookies are scoped by host, never by port, so the console's listener and the links' listener of one
host share the browser's cookie jar: a container behind a link must neither read the platform's cookies (they are
taken off the requests it gets) nor set one, nor set any cookie outside its own link (its ``Set-Cookie`` headers are
judged by ``judge_set_cookie`` and the proxy drops the refused ones).

``Set-Cookie`` is read the way a browser reads it (RFC 6265 section 5.2, and 6265bis for nameless cookies), not the way
``http.cookies.SimpleCookie`` does (it reads a ``Cookie`` header, takes ``Expires``' comma for a separator and drops
whole lines it dislikes): the name-value pair up to the first ``;``, then attributes, the last ``Path`` winning, and a
``Path`` that is empty or does not begin with ``/`` meaning the default path of the request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

PLATFORM_PREFIX = "idlegrid"  # every cookie of the console, the API and the links' gate begins with it
_NAME_PREFIXES = ("__host-", "__secure-", "__host-http-", "__http-")  # browsers match these case-insensitively
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # a browser drops (or cuts) a line with one: we drop it whole


def is_platform_cookie(name: str) -> bool:
    """Whether ``name`` is (or would be taken by a browser or a server for) one of the platform's cookies: ``idlegrid…``
    in any case, behind any ``__Host-``/``__Secure-`` prefix, with blanks around it."""
    bare = name.strip(" \t").lower()
    for prefix in sorted(_NAME_PREFIXES, key=len, reverse=True):
        if bare.startswith(prefix):
            bare = bare[len(prefix) :]
            break
    return bare.startswith(PLATFORM_PREFIX)


def cookie_pairs(headers: Iterable[str]) -> list[tuple[str, str]]:
    """The ``(name, value)`` pairs of a request's ``Cookie`` headers, in order, names stripped, values as sent (a pair
    without ``=`` is a nameless cookie: ``("", text)``)."""
    pairs: list[tuple[str, str]] = []
    for header in headers:
        for part in header.split(";"):
            if not part.strip():
                continue
            name, eq, value = part.partition("=")
            pairs.append((name.strip(" \t"), value.strip(" \t")) if eq else ("", part.strip(" \t")))
    return pairs


def cookie_header_without_platform(headers: Iterable[str]) -> str:
    """A request's ``Cookie`` headers as one, without the platform's cookies (and without nameless ones, which a
    server may read as any name): what a link's container is given."""
    kept = [f"{name}={value}" for name, value in cookie_pairs(headers) if name and not is_platform_cookie(name)]
    return "; ".join(kept)


@dataclass(frozen=True, slots=True)
class SetCookie:
    """What decides where a ``Set-Cookie`` line's cookie goes: its name, its ``Path`` (None: the default path) and
    whether it named a ``Domain``."""

    name: str
    path: str | None
    has_domain: bool


def parse_set_cookie(line: str) -> SetCookie | None:
    """One ``Set-Cookie`` header value as a browser reads it; None for one a browser would drop or might read
    otherwise (a control character, no ``=``, an empty name)."""
    if _CONTROL.search(line):
        return None
    pair, _, attributes = line.partition(";")
    name, eq, _ = pair.partition("=")
    name = name.strip(" \t")
    if not eq or not name:
        return None
    path: str | None = None
    has_domain = False
    for attribute in attributes.split(";"):
        key, _, value = attribute.partition("=")
        key, value = key.strip(" \t").lower(), value.strip(" \t")
        if key == "domain":
            has_domain = True  # even an empty one: browsers differ on it, so it is refused, never weighed
        elif key == "path":
            path = value if value.startswith("/") else None  # the last one counts, an invalid one too (the default)
    return SetCookie(name, path, has_domain)


def default_path(request_path: str) -> str:
    """RFC 6265 5.1.4: the directory of the request's path (as the browser sent it), where a cookie without a valid
    ``Path`` is scoped."""
    if not request_path.startswith("/") or request_path.count("/") <= 1:
        return "/"
    return request_path[: request_path.rfind("/")]


def within(path: str, scope: str) -> bool:
    """Whether a cookie scoped to ``path`` is sent only to paths under ``scope`` (which ends with ``/``): ``path`` is
    ``scope`` itself, with or without its slash, or longer. ``/w/a-1`` stays in ``/w/a-1/``: by RFC 6265's path-match it
    is sent to ``/w/a-1`` and ``/w/a-1/...``, never to ``/w/a-10``."""
    return path == scope.rstrip("/") or path.startswith(scope)


def judge_set_cookie(line: str, *, scope: str, request_path: str) -> str:
    """Why the ``Set-Cookie`` header ``line``, answered by a link's container, must not reach the browser; "" when it
    may. ``scope``: the link's own path (``/w/<workload>-<port>/``, or ``/`` on a host of its own); ``request_path``:
    the path the browser asked for, raw (its query left off), from which the default path comes."""
    cookie = parse_set_cookie(line)
    if cookie is None:
        return "it cannot be read as one cookie"
    if is_platform_cookie(cookie.name):
        return f"{cookie.name!r} is the platform's cookie name"
    if cookie.has_domain:
        return "it names a Domain (it would reach other hosts)"
    path = cookie.path if cookie.path is not None else default_path(request_path)
    if not within(path, scope):
        return f"its path {path!r} leaves the link's {scope!r}"
    return ""

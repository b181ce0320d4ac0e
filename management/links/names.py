"""Where a link lives and what lets a visitor in: names, URLs and link tokens (pure: no I/O, clock passed in).

A link is one ``http`` port of one workload (``LinkAddress``), named ``<workload>-<port>`` (``wl-0123abcd-8888``):

- on a wildcard grid domain, the host ``<name>.<domain>`` (each link an origin of its own);
- everywhere, the path prefix ``/w/<name>/`` on the Master's public address.

A link token is a bearer secret for one link: ``igl_<body>.<mac>``, the body the account it acts for, the link and
an expiry, the mac HMAC-SHA256 under a key only the Master holds. It is checked against the link it is presented
at, so a token for one link never opens another.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

import msgspec

from common.errors import IdlegridError

PATH_PREFIX = "/w/"
ENDPOINT_PREFIX = "/e/"  # a load-balanced endpoint's URL: /e/<endpoint id>/ (docs/endpoints.md, "Load-balanced mode")
TOKEN_PREFIX = "igl_"
TOKEN_COOKIE = "idlegrid_link"  # the browser's link token, scoped to the link's path (or its host)
TOKEN_QUERY = "idlegrid_token"  # a token handed over in a URL once: turned into the cookie and taken off the URL
_NAME = re.compile(r"^(wl-[0-9a-f]{1,32})-(\d{1,5})\Z")


class BadLinkToken(IdlegridError):
    """A link token that does not decode, was not made here, expired or names another link."""

    code = "bad_link_token"


@dataclass(frozen=True, order=True)
class LinkAddress:
    workload: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.workload}-{self.port}"

    @property
    def prefix(self) -> str:
        """The path the link is served under on the Master's address, with its trailing slash."""
        return f"{PATH_PREFIX}{self.name}/"


def parse_name(name: str) -> LinkAddress | None:
    """``wl-<hex>-<port>`` -> the link, None for anything else (a port outside 1-65535 included)."""
    match = _NAME.match(name)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        return None
    return LinkAddress(match.group(1), int(match.group(2)))


def from_host(host: str, domain: str) -> LinkAddress | None:
    """The link a request's Host names on the wildcard ``domain`` (port and case ignored); None when it names none."""
    if not domain:
        return None
    hostname = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    label, dot, rest = hostname.lower().partition(".")
    if not dot or rest != domain.lower().strip("."):
        return None
    return parse_name(label)


def endpoint_url(endpoint_id: str, *, public_url: str) -> str:
    """A load-balanced endpoint's one URL, on the links listener: ``<public_url>/e/<endpoint id>/``."""
    return f"{public_url.rstrip('/')}{ENDPOINT_PREFIX}{endpoint_id}/"


def from_path(path: str) -> tuple[LinkAddress, str] | None:
    """``/w/<name>/rest`` -> (the link, ``/rest``); ``/w/<name>`` -> (the link, ``""``: redirect to the slash)."""
    if not path.startswith(PATH_PREFIX):
        return None
    name, slash, rest = path[len(PATH_PREFIX) :].partition("/")
    address = parse_name(name)
    if address is None:
        return None
    return address, (slash + rest) if slash else ""


def link_url(address: LinkAddress, *, public_url: str, domain: str, scheme: str) -> str:
    """The URL people open: on the wildcard domain when there is one, else a path on the Master's address."""
    if domain:
        return f"{scheme}://{address.name}.{domain.strip('.')}/"
    return public_url.rstrip("/") + address.prefix


class TokenBody(msgspec.Struct, array_like=True):
    account: str
    workload: str
    port: int
    expires_at: int  # unix seconds


def mint_token(key: bytes, account: str, address: LinkAddress, expires_at: float) -> str:
    body = msgspec.json.encode(TokenBody(account, address.workload, address.port, int(expires_at)))
    return f"{TOKEN_PREFIX}{_b64(body)}.{_b64(_mac(key, body))}"


def is_link_token(text: str) -> bool:
    return text.startswith(TOKEN_PREFIX)


def check_token(key: bytes, token: str, address: LinkAddress, now: float) -> str:
    """The account ``token`` acts for at ``address``; BadLinkToken, saying why, otherwise."""
    encoded, dot, mac = token.removeprefix(TOKEN_PREFIX).partition(".")
    try:
        body = _unb64(encoded)
        given = _unb64(mac)
    except ValueError:
        raise BadLinkToken("the link token is not one this grid issues") from None
    if not dot or not hmac.compare_digest(given, _mac(key, body)):
        raise BadLinkToken("the link token is not one this grid issues")
    decoded = msgspec.json.decode(body, type=TokenBody)
    if (decoded.workload, decoded.port) != (address.workload, address.port):
        raise BadLinkToken(f"the link token is for another link, not {address.name}")
    if decoded.expires_at <= now:
        raise BadLinkToken("the link token expired; open the link again from the console or mint another")
    return decoded.account


def _mac(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, b"idlegrid-link-token\0" + body, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None

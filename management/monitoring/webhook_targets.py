"""Where a webhook may be delivered: public addresses only, so that a webhook cannot make the Master post to itself,
to its host's loopback services, to the cloud's metadata endpoint or into a private network (server-side request
forgery). An operator setting (``webhook_allow_private``) lets the operator's own webhooks reach private targets.

Checked twice, because a name can change what it resolves to between the checks (DNS rebinding):

- when a webhook is created (``url_refusal``, no DNS): an http(s) URL with a host and no credentials
  (``user:password@``, which HTTP clients would send as Basic auth); a literal address in any of the forms resolvers
  accept (``127.1``, ``2130706433``, ``0x7f.1``, ``[::1]``, ``[::ffff:127.0.0.1]``) and the names that always mean
  loopback (``localhost``, ``*.localhost``) are judged as what they stand for;
- on every connection of a delivery (``PublicResolver``): the delivery's client resolves through it, so the
  addresses it connects to are the ones judged, none cached between deliveries. A name with any address that is not
  public is refused whole, before any connection is made.

Pure functions, except ``PublicResolver`` (a thin layer over the resolver it wraps).
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")  # what inet_aton's legacy forms are made of (decimal, octal, hex)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # IPv4 addresses reached through a NAT64 gateway


class TargetRefused(Exception):
    """A delivery's target resolved to an address a webhook may not reach (the message says which and why)."""


def address_refusal(address: IPAddress) -> str | None:
    """Why a webhook may not be delivered to ``address``; None when it is a public address."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return address_refusal(embedded)
    if address.is_unspecified:
        return "an unspecified address (0.0.0.0 or ::, which reaches this host)"
    if address.is_loopback:
        return "a loopback address (this host)"
    if address.is_link_local:
        return "a link-local address (such as the cloud metadata endpoint 169.254.169.254)"
    if address.is_multicast:
        return "a multicast address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a public address (a reserved or shared range)"
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` stands for when it is one written as a number (in any form a resolver accepts, legacy
    IPv4 forms included); None when it is a name."""
    bare = host.strip("[]").split("%", 1)[0]
    if not bare.endswith("]") and ":" not in bare:
        bare = bare.rstrip(".")  # "127.0.0.1." resolves as 127.0.0.1
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if not _NUMERIC_HOST.fullmatch(bare):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(bare))  # "127.1", "2130706433", "0x7f.1", "0177.0.0.1"
    except OSError:
        return None


def host_refusal(host: str) -> str | None:
    """Why ``host`` may not be reached, judged without DNS; None when only resolving it can tell."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return f"{host} names this host (localhost always resolves to a loopback address)"
    address = literal_address(host)
    if address is None:
        return None
    why = address_refusal(address)
    return None if why is None else f"{host} is {address}: {why}"


def url_refusal(url: str, *, allow_private: bool) -> str | None:
    """Why ``url`` may not be a webhook; None when it may (its name is judged again at every connection).

    The host is judged as the standard library reads it and as yarl does (the delivery client's parser, which
    normalizes internationalized names: ``①②⑦.0.0.1`` is 127.0.0.1 to it, and a literal address skips the resolver)."""
    if any(c.isspace() or not c.isprintable() for c in url):  # "$" in a pattern lets a last "\n" through
        return f"url {url!r} has whitespace or control characters in it"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port out of range raises here)
        parsed = URL(url)
        hosts = {parts.hostname, parsed.host, parsed.raw_host}
    except (ValueError, UnicodeError) as exc:
        return f"url {url!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname or not parsed.raw_host:
        return f"url {url!r} must be an http:// or https:// URL with a host"
    if "@" in parts.netloc or parsed.raw_user is not None or parsed.raw_password is not None:
        return "url carries credentials (user:password@); put a secret in the path, and check the signature header"
    if allow_private:
        return None
    for host in sorted(h for h in hosts if h):
        why = host_refusal(host)
        if why is not None:
            return f"url {url!r} is not a public target: {why}; webhooks are delivered to public addresses only"
    return None


class PublicResolver(AbstractResolver):
    """Resolves through ``inner`` and refuses (TargetRefused) a name with any address that is not public."""

    def __init__(self, inner: AbstractResolver) -> None:
        self._inner = inner

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        for result in results:
            address = ipaddress.ip_address(result["host"].split("%", 1)[0])
            why = address_refusal(address)
            if why is not None:
                raise TargetRefused(f"{host} resolves to {address}: {why}; webhooks are delivered to public addresses only")
        return results

    async def close(self) -> None:
        await self._inner.close()

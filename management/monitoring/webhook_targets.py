"""Where a webhook may be delivered: the grid's one egress rule (common/egress.py), so that a webhook cannot make the
Master post to itself, to its host's loopback services, to the cloud's metadata endpoint or into a private network
(server-side request forgery). The operator's own webhooks reach private targets with ``webhook_allow_private``; any
webhook reaches a host the operator allows by name (the Master's ``egress_allow``).

Checked twice, because a name can change what it resolves to between the checks (DNS rebinding):

- when a webhook is created (``url_refusal``, no DNS): an http(s) URL with a host and no credentials
  (``user:password@``, which HTTP clients would send as Basic auth), whose host the rule does not refuse on sight
  (``common.egress.host_refusal``: literal addresses in every form, ``localhost``);
- on every connection of a delivery (``PublicResolver``): the delivery's client resolves through it, so the
  addresses it connects to are the ones judged, none cached between deliveries. A name with any address that is not
  public is refused whole, before any connection is made.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from yarl import URL

from common.egress import DEFAULT_PORTS, EgressRule, address_refusal, host_refusal
from common.errors import EgressRefused

__all__ = ["OPERATOR_RULE", "PublicResolver", "TargetRefused", "address_refusal", "url_refusal"]

TargetRefused = EgressRefused  # a delivery's target resolved to an address a webhook may not reach
OPERATOR_RULE = EgressRule(who="the operator", setting="egress_allow in the Master's config")  # public only


def url_refusal(url: str, *, allow_private: bool, rule: EgressRule = OPERATOR_RULE) -> str | None:
    """Why ``url`` may not be a webhook; None when it may (its name is judged again at every connection).

    The host is judged as the standard library reads it and as yarl does (the delivery client's parser, which
    normalizes internationalized names: ``①②⑦.0.0.1`` is 127.0.0.1 to it, and a literal address skips the resolver)."""
    if any(c.isspace() or not c.isprintable() for c in url):  # "$" in a pattern lets a last "\n" through
        return f"url {url!r} has whitespace or control characters in it"
    try:
        parts = urlsplit(url)
        port = parts.port  # a port out of range raises here
        parsed = URL(url)
        hosts = {parts.hostname, parsed.host, parsed.raw_host}
    except (ValueError, UnicodeError) as exc:
        return f"url {url!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname or not parsed.raw_host:
        return f"url {url!r} must be an http:// or https:// URL with a host"
    if "@" in parts.netloc or parsed.raw_user is not None or parsed.raw_password is not None:
        return "url carries credentials (user:password@); put a secret in the path, and check the signature header"
    if allow_private or rule.allows(parts.hostname, port or DEFAULT_PORTS[parts.scheme]):
        return None
    for host in sorted(h for h in hosts if h):
        why = host_refusal(host)
        if why is not None:
            return f"url {url!r} is not a public target: {why}; webhooks are delivered to public addresses only"
    return None


class PublicResolver(AbstractResolver):
    """Resolves through ``inner`` and refuses (TargetRefused) a name with any address ``rule`` refuses."""

    def __init__(self, inner: AbstractResolver, rule: EgressRule = OPERATOR_RULE) -> None:
        self._inner = inner
        self._rule = rule

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        results = await self._inner.resolve(host, port, family)
        addresses = [ipaddress.ip_address(result["host"].split("%", 1)[0]) for result in results]
        self._rule.judge(f"webhook target {host}", host, port, addresses)
        return results

    async def close(self) -> None:
        await self._inner.close()

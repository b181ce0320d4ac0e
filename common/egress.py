"""The one egress rule: where the grid may connect on a renter's behalf (storage endpoints, image registries,
webhooks, anything later). docs/security.md, "Egress".

A renter names a host; a host, a relay or the Master then connects to it from inside the provider's or operator's
network, where a name can lead to the host's loopback services, its LAN, or the cloud's metadata endpoint (server-side
request forgery). The rule:

- every address a name resolves to must be public: loopback, private, link-local, CGNAT (100.64.0.0/10), multicast,
  reserved and unspecified addresses are refused, and so are addresses that carry one of those (IPv4-mapped, 6to4,
  NAT64); a name with any such address is refused whole;
- ``localhost`` (and ``*.localhost``) and every literal form of an address a resolver accepts (``127.1``,
  ``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``[::ffff:127.0.0.1]``, a trailing dot) are judged as what they stand
  for, without DNS;
- it is checked when the renter names the target (at submit, ``refusal_before_dns`` and ``addresses``) and again at
  every connection, on the addresses the connection then uses (``addresses``, called by the connecting code, which
  connects to exactly the addresses returned, never resolving the name a second time: a DNS answer that changes
  between the two checks, DNS rebinding, changes nothing);
- redirects are never followed (each caller refuses them: it cannot know where a redirect leads before it resolves);
- a private target is reached only where whoever runs the connecting process allows it by name: the provider in the
  agent's config, the operator in the Master's (``egress_allow = ["minio.lan:9000", "registry.lan"]``). An entry is
  ``HOST`` (any port) or ``HOST:PORT`` (that port only; ``[v6]:PORT`` for an IPv6 literal), compared with the host as
  the renter wrote it (case and a trailing dot aside): an allowed name is connected to whatever it resolves to.

Pure, except ``system_resolver`` and the ``addresses`` methods, which resolve through the resolver the rule holds.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from common.containers import DOCKER_HUB_ALIASES, registry_of
from common.errors import ConfigError, EgressRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# Resolves (host, port) to the addresses a connection would use, as text (getaddrinfo's); raises OSError when the
# name does not resolve.
Resolver = Callable[[str, int], Sequence[str]]

_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")  # what inet_aton's legacy forms are made of (decimal, octal, hex)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # IPv4 addresses reached through a NAT64 gateway
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")  # shared address space (RFC 6598): a carrier's or a cloud's inside
_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?\Z")
DEFAULT_PORTS = {"http": 80, "https": 443}


def system_resolver(host: str, port: int) -> list[str]:
    """The addresses the system's resolver gives ``host`` for a TCP connection to ``port``."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def address_refusal(address: IPAddress) -> str | None:
    """Why the grid may not connect to ``address`` for a renter; None when it is a public address."""
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
    if isinstance(address, ipaddress.IPv4Address) and address in _CGNAT:
        return "a shared (CGNAT, 100.64.0.0/10) address, inside a carrier's or a cloud's network"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a public address (a reserved or shared range)"
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` stands for when it is one written as a number (in any form a resolver accepts, legacy
    IPv4 forms included); None when it is a name."""
    bare = host.strip("[]").split("%", 1)[0]
    if ":" not in bare:
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


def url_target(url: str) -> tuple[str, int]:
    """The host and port an http(s) URL connects to; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not an http:// or https:// URL with a host")
    return parts.hostname, parts.port or DEFAULT_PORTS[parts.scheme]


def _normal(host: str) -> str:
    return host.strip("[]").rstrip(".").lower()


def parse_allowed(entry: str) -> tuple[str, int | None]:
    """An ``egress_allow`` entry as (host, port or None for any); ConfigError naming the entry when it is not
    ``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT``."""
    text = entry.strip()
    host, port = text, None
    if text.startswith("["):
        inside, bracket, rest = text[1:].partition("]")
        host = inside if bracket else ""
        if rest:
            port = rest.removeprefix(":") if rest.startswith(":") else "bad"
    elif text.count(":") == 1:
        host, port = text.split(":")
    try:
        number = None if port is None else int(port)
    except ValueError:
        number = 0
    valid_host = bool(host) and (_NAME.match(host.rstrip(".")) is not None or literal_address(host) is not None)
    if not valid_host or (number is not None and not 0 < number < 65536):
        raise ConfigError(
            f'egress_allow: {entry!r} is not HOST or HOST:PORT (e.g. "minio.lan:9000", "registry.lan", "[fd00::5]:443")'
        )
    return _normal(host), number


@dataclass(frozen=True)
class EgressRule:
    """Public addresses only, except the hosts ``allow`` names (``HOST`` or ``HOST:PORT`` entries, parsed by
    ``allowing``). ``who`` says whose configuration allows more, for the refusal's message (``the provider`` for the
    agent, ``the operator`` for the Master); ``resolver``: how names are resolved (the system's by default)."""

    allow: frozenset[tuple[str, int | None]] = frozenset()
    who: str = "the provider"
    setting: str = "egress_allow in the agent's config"
    resolver: Resolver = system_resolver

    @classmethod
    def allowing(
        cls,
        entries: Iterable[str],
        *,
        who: str = "the provider",
        setting: str = "egress_allow in the agent's config",
        resolver: Resolver = system_resolver,
    ) -> EgressRule:
        """A rule allowing ``entries`` (config strings); ConfigError for one that is not HOST[:PORT]."""
        return cls(frozenset(parse_allowed(e) for e in entries), who, setting, resolver)

    def allows(self, host: str, port: int) -> bool:
        """Whether ``host:port`` is one the configuration allows by name (no address check then)."""
        name = _normal(host)
        return (name, None) in self.allow or (name, port) in self.allow

    def refused(self, what: str, host: str, port: int, why: str) -> EgressRefused:
        """The refusal a renter reads: what was refused, why, and what to change."""
        return EgressRefused(
            f"{what}: {why}. On a renter's behalf the grid connects only to public addresses: name a target on a public "
            f"address, or ask {self.who} to allow {host}:{port} by name ({self.setting})"
        )

    def refusal_before_dns(self, what: str, host: str, port: int) -> EgressRefused | None:
        """The refusal a target earns without DNS (localhost, a literal address that is not public); None when it is
        allowed by name or only resolving it can tell."""
        if self.allows(host, port):
            return None
        why = host_refusal(host)
        return None if why is None else self.refused(what, host, port, why)

    def addresses(self, what: str, host: str, port: int) -> list[IPAddress]:
        """Resolve ``host`` and return the addresses to connect to, every one judged public (unless the name is
        allowed); EgressRefused before any connection otherwise. OSError when the name does not resolve. A caller
        connects to these addresses only, never to the name."""
        refusal = self.refusal_before_dns(what, host, port)
        if refusal is not None:
            raise refusal
        literal = literal_address(host)
        if literal is not None:
            found = [literal]
        else:
            found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in self.resolver(host, port)]
        if not found:
            raise OSError(f"{host} resolves to no address")
        self.judge(what, host, port, found)
        return found

    def judge(self, what: str, host: str, port: int, addresses: Iterable[IPAddress]) -> None:
        """EgressRefused when any of the addresses ``host`` resolved to is not public (and the name is not allowed)."""
        if self.allows(host, port):
            return
        for address in addresses:
            why = address_refusal(address)
            if why is not None:
                raise self.refused(what, host, port, f"{host} resolves to {address}: {why}")

    async def addresses_async(self, what: str, host: str, port: int) -> list[IPAddress]:
        """``addresses`` off the event loop (resolving blocks)."""
        return await asyncio.to_thread(self.addresses, what, host, port)


def registry_target(reference: str) -> tuple[str, int] | None:
    """The host and port an image reference's registry is reached at (443 unless it names a port); None for Docker
    Hub, whose names are fixed public services, not a target the renter chose."""
    registry = registry_of(reference)
    if registry in DOCKER_HUB_ALIASES:
        return None
    host, port = registry, DEFAULT_PORTS["https"]
    if registry.startswith("["):
        inside, _, rest = registry[1:].partition("]")
        host, port = inside, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else port
    elif registry.count(":") == 1:
        name, _, number = registry.partition(":")
        host, port = name, int(number) if number.isdigit() else port
    return host, port


def registry_refusal_before_dns(rule: EgressRule, reference: str) -> EgressRefused | None:
    """What ``rule`` says of ``reference``'s registry without DNS (submit's first look)."""
    target = registry_target(reference)
    if target is None:
        return None
    host, port = target
    return rule.refusal_before_dns(f"image {reference!r}: registry {registry_of(reference)}", host, port)


async def check_registry(rule: EgressRule, reference: str) -> None:
    """EgressRefused unless every address ``reference``'s registry resolves to is public (or the registry is allowed
    by name). A registry whose name does not resolve here is let through: the engine's own pull then fails, saying so.

    The engine (Podman, Docker) resolves the name again and connects from its own process, which the agent cannot
    make connect to the addresses judged here: between the two a DNS answer can change (rebinding). This check stops
    a renter naming a private registry, not a DNS server answering differently twice; a provider who needs that too
    runs the engine where it cannot reach private addresses (its own network namespace or firewall)."""
    target = registry_target(reference)
    if target is None:
        return
    host, port = target
    try:
        await rule.addresses_async(f"image {reference!r}: registry {registry_of(reference)}", host, port)
    except OSError:
        return

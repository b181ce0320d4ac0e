"""Tests never ask the system's name server. The egress rule (common/egress.py) resolves what a renter names at submit
and before every connection, and a test that submits ``ghcr.io/...`` would otherwise send a DNS query to whatever
server the machine is configured with: traffic to an address that is not this machine's. ``guard()`` replaces
``socket.getaddrinfo`` in the test process with one that answers this host's own names (``localhost``, its host name,
literal addresses) as before and refuses every other name at once, as a name that does not resolve. Tests that need
a name to resolve give the code a resolver of their own (tests/support/egress.py) or run dnsmasq on 127.0.0.1."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

_LOCAL_NAMES = {"localhost", "localhost.", "ip6-localhost", "ip6-loopback", socket.gethostname()}


def _is_local(host: object) -> bool:
    if host is None:
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name.lower() in _LOCAL_NAMES or name.lower().endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def guard() -> None:
    """From now on, this process resolves only this host's own names (idempotent)."""
    if getattr(socket.getaddrinfo, "_idlegrid_no_dns", False):
        return
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _is_local(host):
            raise socket.gaierror(socket.EAI_NONAME, f"{host}: tests never ask the system's DNS (tests/support/no_dns.py)")
        return real(host, *args, **kwargs)

    getaddrinfo._idlegrid_no_dns = True  # type: ignore[attr-defined]
    socket.getaddrinfo = getaddrinfo

"""Hosts behind NATs, made of network namespaces, for the overlay's tests and bench (docs/overlay.md).

```
 lighthouse ns (10.x.0.10) ----+
                               |  bridge "the internet", in its own namespace (10.x.0.0/24)
 host A ns (10.x.0.2) ---------+--------- host B ns (10.x.0.3)
   MASQUERADE out of its uplink              MASQUERADE ...
   bridge for its containers (10.x.11.1/24)   (10.x.12.1/24)
     container ns 10.x.11.2, .3 ...             container ns 10.x.12.2, ...
```

Every name carries a per-fabric tag (namespaces ``igt<tag>-…``, interfaces inside namespaces only), every iptables
rule lives inside a namespace the fabric made, and ``close`` deletes the namespaces (which takes their interfaces,
routes and rules with them): the machine's own namespace, routes and firewall are never touched. Needs root and
``ip`` (iproute2) and ``iptables``; ``available`` says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Fabric", "available"]


def available() -> str:
    """ "" when namespaces can be made here, else why not (the reason a test skips with)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: the overlay needs a TUN device"
    return ""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True, timeout=30)


@dataclass
class Fabric:
    """The namespaces of one test. ``second_octet`` keeps two fabrics' addresses apart (they are in separate
    namespaces anyway; it only makes logs readable)."""

    tag: str
    second_octet: int = 77
    namespaces: list[str] = field(default_factory=list)
    _hosts: dict[str, int] = field(default_factory=dict)
    _containers: dict[str, int] = field(default_factory=dict)

    @property
    def internet(self) -> str:
        return f"igt{self.tag}-net"

    def public(self, last: int) -> str:
        return f"10.{self.second_octet}.0.{last}"

    def _ns(self, name: str) -> str:
        ns = f"igt{self.tag}-{name}"
        _run("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        self.exec(ns, "ip", "link", "set", "lo", "up")
        return ns

    def exec(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run("ip", "netns", "exec", ns, *args, check=check)

    def command(self, ns: str, args: Sequence[str]) -> list[str]:
        """``args`` as a command line run inside ``ns`` (for Popen)."""
        return ["ip", "netns", "exec", ns, *args]

    def start(self) -> Fabric:
        net = self._ns("net")
        self.exec(net, "ip", "link", "add", "name", "br0", "type", "bridge")
        self.exec(net, "ip", "link", "set", "br0", "up")
        return self

    def _uplink(self, ns: str, last: int) -> None:
        """A veth from ``ns`` (its ``up0``) to the internet's bridge, with the public address 10.x.0.<last>."""
        _run("ip", "link", "add", "name", "up0", "netns", ns, "type", "veth", "peer", "name", f"p{last}", "netns", self.internet)
        self.exec(self.internet, "ip", "link", "set", f"p{last}", "master", "br0", "up")
        self.exec(ns, "ip", "addr", "add", f"{self.public(last)}/24", "dev", "up0")
        self.exec(ns, "ip", "link", "set", "up0", "up")

    def add_public(self, name: str, last: int) -> str:
        """A namespace on the internet itself (a lighthouse, a relay): no NAT in front of it."""
        ns = self._ns(name)
        self._uplink(ns, last)
        return ns

    def add_host(self, name: str, last: int) -> str:
        """A provider's host: public address 10.x.0.<last>, its containers on 10.x.<10+n>.0/24 behind its NAT."""
        ns = self._ns(name)
        self._uplink(ns, last)
        n = len(self._hosts) + 1
        self._hosts[ns] = n
        self.exec(ns, "ip", "link", "add", "name", "cbr", "type", "bridge")
        self.exec(ns, "ip", "addr", "add", f"10.{self.second_octet}.{10 + n}.1/24", "dev", "cbr")
        self.exec(ns, "ip", "link", "set", "cbr", "up")
        self.exec(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self.exec(ns, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "up0", "-j", "MASQUERADE")
        return ns

    def add_container(self, host: str, name: str) -> str:
        """A container's namespace on ``host``: its own address on the host's bridge, out through the host's NAT."""
        ns = self._ns(name)
        n = self._hosts[host]
        self._containers[host] = index = self._containers.get(host, 1) + 1
        peer = f"c{index}"
        _run("ip", "link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", peer, "netns", host)
        self.exec(host, "ip", "link", "set", peer, "master", "cbr", "up")
        self.exec(ns, "ip", "addr", "add", f"10.{self.second_octet}.{10 + n}.{index}/24", "dev", "eth0")
        self.exec(ns, "ip", "link", "set", "eth0", "up")
        self.exec(ns, "ip", "route", "add", "default", "via", f"10.{self.second_octet}.{10 + n}.1")
        return ns

    def block_udp_between(self, host: str, other_public: str) -> None:
        """No UDP from ``host``'s containers to ``other_public`` (hole punching fails; relays still work)."""
        self.exec(host, "iptables", "-A", "FORWARD", "-p", "udp", "-d", other_public, "-j", "DROP")
        self.exec(host, "iptables", "-A", "FORWARD", "-p", "udp", "-s", other_public, "-j", "DROP")

    def close(self) -> None:
        """Delete every namespace made (their interfaces, routes and iptables rules go with them)."""
        for ns in reversed(self.namespaces):
            for pid in _run("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            _run("ip", "netns", "delete", ns, check=False)
        self.namespaces.clear()

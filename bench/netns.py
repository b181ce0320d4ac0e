"""Hosts behind NATs, made of network namespaces, for the overlay's bench and tests (docs/overlay.md).

```
 lighthouse ns (10.x.0.10) ----+
                               |  bridge "the internet", in its own namespace (10.x.0.0/24)
 host A ns (10.x.0.2) ---------+--------- host B ns (10.x.0.3)
   MASQUERADE out of its uplink              MASQUERADE ...
   bridge for its containers (10.x.11.1/24)   (10.x.12.1/24)
     container ns 10.x.11.2, .3 ...             container ns 10.x.12.2, ...
```

Each namespace is held by a process of its own (``unshare --net``) and entered by its path, ``/proc/PID/ns/net``,
the way the agent enters a container's: nothing is named in ``/run/netns``, so another program's clean-up of named
namespaces cannot pull one from under a test. Interfaces exist inside the fabric's namespaces only, every iptables
rule lives inside one, and ``close`` ends the holders (the kernel then deletes each namespace with its interfaces,
routes and rules): the machine's own namespace, routes and firewall are never touched. Needs root and
``ip`` (iproute2) and ``iptables``; ``available`` says why not when they are missing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Fabric", "available", "pids_in", "run_in_namespace"]

T = TypeVar("T")

HOLD_S = 3600  # a holder outlives any test; close() ends it sooner


def available() -> str:
    """ "" when namespaces can be made here, else why not (the reason a test skips with)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: the overlay needs a TUN device"
    return ""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


@dataclass
class Fabric:
    """The namespaces of one test. ``second_octet`` keeps two fabrics' addresses apart (they are in separate
    namespaces anyway; it only makes logs readable)."""

    tag: str
    second_octet: int = 77
    namespaces: list[str] = field(default_factory=list)  # /proc/PID/ns/net of each holder
    _holders: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    internet: str = ""
    _hosts: dict[str, int] = field(default_factory=dict)
    _containers: dict[str, int] = field(default_factory=dict)

    def public(self, last: int) -> str:
        return f"10.{self.second_octet}.0.{last}"

    def _ns(self, name: str) -> str:
        """A new namespace (``name`` is for the reader: the holder's command line carries it)."""
        holder = subprocess.Popen(["unshare", "--net", "sleep", f"{HOLD_S}"], stdin=subprocess.DEVNULL)
        ns = f"/proc/{holder.pid}/ns/net"
        deadline = time.monotonic() + 10
        while os.readlink(ns) == os.readlink("/proc/self/ns/net"):  # until unshare has made it
            if time.monotonic() > deadline or holder.poll() is not None:
                holder.kill()
                raise RuntimeError(f"no network namespace for {name}")
            time.sleep(0.01)
        self._holders[ns] = holder
        self.namespaces.append(ns)
        self.exec(ns, "ip", "link", "set", "lo", "up")
        return ns

    @staticmethod
    def pid(ns: str) -> str:
        return ns.split("/")[2]

    def exec(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(*self.command(ns, args), check=check)

    def command(self, ns: str, args: Sequence[str]) -> list[str]:
        """``args`` as a command line run inside ``ns`` (for Popen)."""
        return ["nsenter", f"--net={ns}", *args]

    def start(self) -> Fabric:
        net = self.internet = self._ns("net")
        self.exec(net, "ip", "link", "add", "name", "br0", "type", "bridge")
        self.exec(net, "ip", "link", "set", "br0", "up")
        return self

    def _uplink(self, ns: str, last: int) -> None:
        """A veth from ``ns`` (its ``up0``) to the internet's bridge, with the public address 10.x.0.<last>."""
        _run(
            "ip",
            "link",
            "add",
            "name",
            "up0",
            "netns",
            self.pid(ns),
            "type",
            "veth",
            "peer",
            "name",
            f"p{last}",
            "netns",
            self.pid(self.internet),
        )
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
        _run(
            "ip",
            "link",
            "add",
            "name",
            "eth0",
            "netns",
            self.pid(ns),
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            self.pid(host),
        )
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
        """End every process left in the fabric's namespaces, then their holders: the namespaces go with them."""
        for ns in reversed(self.namespaces):
            holder = self._holders.pop(ns)
            for pid in pids_in(ns):
                if pid != holder.pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            holder.kill()
            holder.wait()
        self.namespaces.clear()


def pids_in(ns: str) -> list[int]:
    """Processes whose network namespace is ``ns`` (what the test started there)."""
    try:
        target = os.readlink(ns)
    except OSError:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/net") == target:
                    pids.append(int(entry))
    return pids


CLONE_NEWNET = 0x40000000  # setns(2)'s flag for a network namespace


def run_in_namespace(ns: str, work: Callable[[], T]) -> T:
    """``work()`` in a thread of its own whose network namespace is ``ns``, and its result (or its exception).

    A network namespace belongs to a thread, not to the process: the thread's sockets, its child threads (an event
    loop's executor) and the processes it starts are in ``ns``, while the rest of this process stays where it was.
    The thread ends with ``work``, so no pooled thread is ever left in ``ns``. (``os.setns`` arrives in Python 3.12.)"""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def enter_and_work() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(ns, os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    code = ctypes.get_errno()
                    raise OSError(code, f"setns {ns}: {os.strerror(code)}")
            finally:
                os.close(fd)
            outcome.append(work())
        except BaseException as exc:  # handed to the caller's thread as it was
            failure.append(exc)

    thread = threading.Thread(target=enter_and_work, name=f"in {ns}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]

"""A gang overlay's lighthouse and relay for a local grid of sandboxed process-runtime hosts (docs/overlay.md).

``idlegrid demo`` runs one, and so do the end-to-end tests of gangs (tests/support/lighthouse.py re-exports this).

A sandboxed container's network namespace reaches out through slirp4netns, which opens its sockets in the machine's
own namespace but refuses the machine's loopback (``--disable-host-loopback``): a lighthouse on 127.0.0.1 is out of
its reach. So the lighthouse runs in a network namespace of its own, joined to the machine's namespace by a veth pair
on a /30 of 198.18.0.0/15 (RFC 2544's benchmarking range, never routed anywhere): slirp4netns's sockets reach its far
end, and nothing else is reachable through it. The namespace is held by a process of its own (entered by
``/proc/PID/ns/net``, never named in ``/run/netns``); when the holder and nebula end, the kernel deletes the namespace,
and with it both ends of the veth, its route and the lighthouse's iptables rule: the machine's namespace keeps nothing.

Its files come from the operator's own function (``write_lighthouse``, what ``idlegrid ca issue-lighthouse`` runs)
against the Master's state directory, and Debian's ``nebula`` runs it, as on a relay's host. Both processes run from
the lighthouse's directory, so the local-grid launcher (``LocalGrid.start_lighthouse``) can end those an earlier
launcher left there, one SIGKILLed before it could close them (``kill_processes_under`` that directory).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from master.port import OverlayAuthority, OverlaySettings, write_lighthouse

__all__ = [
    "LIGHTHOUSE_ADDRESS",
    "LIGHTHOUSE_PORT",
    "Lighthouse",
    "lighthouse_unavailable",
    "overlay_toml",
    "veth_pair",
]

LIGHTHOUSE_ADDRESS = "100.64.0.1"  # in the overlay range's first block, the lighthouses'
LIGHTHOUSE_PORT = 4242
VETH_RANGE = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544: never routed, so the veth reaches nothing else
SLOTS = VETH_RANGE.num_addresses // 4  # one /30 per lighthouse on this machine
SLOT_TRIES = 32  # another lighthouse's veth on the slot first tried: the next ones
VETH_PREFIX = "iglh"  # the machine's end of the veth: iglh<slot> (15 characters at most)
TOOLS = ("ip", "iptables", "unshare", "nsenter", "nebula", "slirp4netns")
UP_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


def lighthouse_unavailable() -> str:
    """Empty when a lighthouse namespace can be made and gangs' overlays run here, else why not, naming the fix."""
    if os.geteuid() != 0:
        return "network namespaces, TUN devices and sandboxed containers need root (run it as root)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install nebula iproute2 iptables util-linux slirp4netns)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: the overlay needs a TUN device"
    return ""


def veth_pair(slot: int) -> tuple[str, str]:
    """(the machine's end, the lighthouse's end) of slot ``slot``'s /30 of VETH_RANGE."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} is outside 0..{SLOTS - 1}")
    base = VETH_RANGE.network_address + slot * 4
    return str(base + 1), str(base + 2)


def overlay_toml(address: str, endpoint: str) -> str:
    """The Master's ``[overlay]`` listing one lighthouse (``--config``'s TOML): its overlay address and UDP endpoint."""
    return f"[[overlay.lighthouses]]\naddress = {json.dumps(address)}\nendpoints = [{json.dumps(endpoint)}]\n"


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")


@dataclass
class Lighthouse:
    """The lighthouse's namespace, its link to the machine's namespace and its nebula. ``workdir`` holds its files
    (key 0600, certificate, CA, ``nebula.json``) and is its processes' working directory."""

    workdir: Path
    slot: int = field(default_factory=lambda: os.getpid() % SLOTS)  # first tried: keeps processes' /30s apart
    holder: subprocess.Popen[bytes] | None = None
    nebula: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """Its UDP endpoint, as the Master lists it (``[[overlay.lighthouses]] endpoints``)."""
        return f"{veth_pair(self.slot)[1]}:{LIGHTHOUSE_PORT}"

    @property
    def netns(self) -> str:
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    def alive(self) -> bool:
        return self.nebula is not None and self.nebula.poll() is None

    def start(self) -> Lighthouse:
        """The namespace and its veth, on the first free slot from ``slot``."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)  # its key is there
        self.holder = self._popen(["unshare", "--net", "sleep", "infinity"])
        self._wait_namespace()
        for _ in range(SLOT_TRIES):
            if not os.path.exists(f"/sys/class/net/{VETH_PREFIX}{self.slot}") and self._link():
                break
            self.slot = (self.slot + 1) % SLOTS
        else:
            raise RuntimeError(f"no free veth slot for the lighthouse after {SLOT_TRIES} tries")
        near, far = veth_pair(self.slot)
        outer = f"{VETH_PREFIX}{self.slot}"
        _run("ip", "addr", "add", f"{near}/30", "dev", outer)
        _run("ip", "link", "set", outer, "up")
        inside = ("nsenter", f"--net={self.netns}")
        _run(*inside, "ip", "addr", "add", f"{far}/30", "dev", "up0")
        _run(*inside, "ip", "link", "set", "up0", "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        return self

    def _wait_namespace(self) -> None:
        assert self.holder is not None
        deadline = time.monotonic() + UP_TIMEOUT_S
        while os.readlink(self.netns) == os.readlink("/proc/self/ns/net"):  # until unshare has made it
            if time.monotonic() > deadline or self.holder.poll() is not None:
                raise RuntimeError("no network namespace for the lighthouse")
            time.sleep(0.01)

    def _link(self) -> bool:
        """The veth pair on this slot; False when another process took the name first."""
        assert self.holder is not None
        outer = f"{VETH_PREFIX}{self.slot}"
        args = ["ip", "link", "add", "name", outer, "type", "veth", "peer", "name", "up0", "netns", str(self.holder.pid)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0:
            return True
        if "exists" in done.stderr:
            return False
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")

    def run(self, master_dir: Path, log: Path) -> None:
        """Issue the lighthouse from the Master's overlay CA (the operator's ``issue-lighthouse``) into ``workdir``,
        bound each replica's relayed bandwidth in the namespace, and run nebula there, its output appended to ``log``.
        The Master must have started once: its state directory holds the overlay CA."""
        authority = OverlayAuthority.open(master_dir, OverlaySettings())
        rules = write_lighthouse(authority, address=LIGHTHOUSE_ADDRESS, port=LIGHTHOUSE_PORT, out=self.workdir)
        for rule in rules:
            _run("nsenter", f"--net={self.netns}", "iptables", *rule)
        with open(log, "ab") as kept:
            self.nebula = self._popen(
                ["nsenter", f"--net={self.netns}", "nebula", "-config", str(self.workdir / "nebula.json")], out=kept
            )

    def _popen(self, args: list[str], out: int | IO[bytes] = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
        # A session of its own: the terminal's Ctrl-C reaches the launcher alone, which closes this after the daemons.
        return subprocess.Popen(
            args, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def close(self) -> None:
        """End nebula and the holder: the namespace goes with them, its veth, route and iptables rule too."""
        for proc in (self.nebula, self.holder):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=STOP_TIMEOUT_S)

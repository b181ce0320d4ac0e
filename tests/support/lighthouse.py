"""A gang overlay's lighthouse and relay for a local grid of sandboxed process-runtime hosts (docs/overlay.md).

A sandboxed container's network namespace reaches out through slirp4netns, which opens its sockets in the machine's
own namespace but refuses the machine's loopback (``--disable-host-loopback``): a lighthouse on 127.0.0.1 is out of
its reach. So the lighthouse runs in a network namespace of the test's own, joined to the machine's namespace by a
veth pair on a /30 of 198.18.0.0/15 (RFC 2544's benchmarking range, never routed anywhere): slirp4netns's sockets reach
its far end, and nothing else is reachable through it. The namespace is held by a process of its own (entered by
``/proc/PID/ns/net``, never named in ``/run/netns``); when the holder ends the kernel deletes the namespace, and with it
both ends of the veth, its route and the lighthouse's iptables rule: the machine's namespace keeps nothing.

The lighthouse's files come from the operator's own command, ``idlegrid ca issue-lighthouse`` run against the Master's
state directory, and Debian's ``nebula`` runs it, as on a relay's host.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.grid import REPO

__all__ = ["LIGHTHOUSE_ADDRESS", "LIGHTHOUSE_PORT", "LighthouseNet", "lighthouse_net", "lighthouse_unavailable"]

LIGHTHOUSE_ADDRESS = "100.64.0.1"  # in the overlay range's first block, the lighthouses'
LIGHTHOUSE_PORT = 4242
HOLD_S = 3600  # a holder outlives any test; close() ends it sooner
UP_TIMEOUT_S = 10.0


def lighthouse_unavailable() -> str:
    """ "" when a lighthouse namespace can be made and gangs' overlays run here, else why not (a skip's reason)."""
    if os.geteuid() != 0:
        return "network namespaces, TUN devices and sandboxed containers need root"
    for tool in ("ip", "iptables", "unshare", "nsenter", "nebula", "slirp4netns"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup-env installs it)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: the overlay needs a TUN device"
    return ""


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")


@dataclass
class LighthouseNet:
    """The lighthouse's namespace and its link to the machine's namespace; ``endpoint`` is what the Master lists."""

    slot: int = field(default_factory=lambda: os.getpid() % 16000)  # keeps two test processes' /30s apart
    holder: subprocess.Popen[bytes] | None = None
    nebula: subprocess.Popen[bytes] | None = None

    @property
    def _subnet(self) -> tuple[str, str]:
        """(the machine's end, the lighthouse's end) of the /30."""
        base = 198 * 2**24 + 18 * 2**16 + self.slot * 4
        dotted = [".".join(str((n >> s) & 255) for s in (24, 16, 8, 0)) for n in (base + 1, base + 2)]
        return dotted[0], dotted[1]

    @property
    def endpoint(self) -> str:
        return f"{self._subnet[1]}:{LIGHTHOUSE_PORT}"

    @property
    def netns(self) -> str:
        assert self.holder is not None
        return f"/proc/{self.holder.pid}/ns/net"

    def start(self) -> LighthouseNet:
        self.holder = subprocess.Popen(["unshare", "--net", "sleep", str(HOLD_S)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + UP_TIMEOUT_S
        while os.readlink(self.netns) == os.readlink("/proc/self/ns/net"):  # until unshare has made it
            if time.monotonic() > deadline or self.holder.poll() is not None:
                raise RuntimeError("no network namespace for the lighthouse")
            time.sleep(0.01)
        near, far = self._subnet
        outer = f"iglh{self.slot}"
        _run("ip", "link", "add", "name", outer, "type", "veth", "peer", "name", "up0", "netns", str(self.holder.pid))
        _run("ip", "addr", "add", f"{near}/30", "dev", outer)
        _run("ip", "link", "set", outer, "up")
        inside = ("nsenter", f"--net={self.netns}")
        _run(*inside, "ip", "addr", "add", f"{far}/30", "dev", "up0")
        _run(*inside, "ip", "link", "set", "up0", "up")
        _run(*inside, "ip", "link", "set", "lo", "up")
        return self

    def run_lighthouse(self, master_dir: Path, out: Path, log: Path) -> None:
        """Issue the lighthouse from the Master's overlay CA (the operator's command) and run it in the namespace."""
        issued = subprocess.run(
            [sys.executable, "-m", "management.cli", "ca", "issue-lighthouse", "--state-dir", str(master_dir),
             "--address", LIGHTHOUSE_ADDRESS, "--port", str(LIGHTHOUSE_PORT), "--out", str(out)],
            capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        )  # fmt: skip
        if issued.returncode != 0:
            raise RuntimeError(f"idlegrid ca issue-lighthouse: {issued.stderr.strip()}")
        for line in issued.stdout.splitlines():  # the relay's bound per replica, applied where the lighthouse runs
            if "iptables " in line:
                _run("nsenter", f"--net={self.netns}", "iptables", *line.split("iptables ", 1)[1].split())
        with open(log, "ab") as kept:
            self.nebula = subprocess.Popen(
                ["nsenter", f"--net={self.netns}", "nebula", "-config", str(out / "nebula.json")],
                stdin=subprocess.DEVNULL,
                stdout=kept,
                stderr=subprocess.STDOUT,
            )

    def close(self) -> None:
        for proc in (self.nebula, self.holder):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)


@contextlib.contextmanager
def lighthouse_net() -> Iterator[LighthouseNet]:
    net = LighthouseNet()
    try:
        yield net.start()
    finally:
        net.close()

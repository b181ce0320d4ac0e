"""A gang replica's overlay in the process runtime's own network namespace: the agent's GangOverlays with the real
ProcessRuntime (a sandboxed process with slirp4netns) and Debian's nebula. The lighthouse named is the namespace's own
127.0.0.1, so nothing leaves the container's namespace; the meeting of replicas across NATs is
tests/agent/test_overlay_netns.py's."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from agent.overlay import GangOverlays, OverlayKey
from agent.runtime.base import ExecSession
from agent.runtime.process import ProcessRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from master.overlay import LighthouseSetting, OverlayAuthority, OverlaySettings
from tests.support.overlay_specs import replica_overlay

_why = (
    "needs root (a network namespace of its own per container)"
    if os.geteuid() != 0
    else ""
    if shutil.which("nebula") and shutil.which("slirp4netns")
    else "nebula or slirp4netns is not installed"
)
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "runs")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


def _interfaces(netns: str) -> str:
    return subprocess.run(["nsenter", f"--net={netns}", "ip", "-br", "addr"], capture_output=True, text=True, check=True).stdout


async def _log_until(runtime: ProcessRuntime, name: str, last: str, timeout_s: float = 10.0) -> str:
    """The container's log once ``last`` is in it (or at the deadline)."""
    log = runtime.root / f"{name}.log"
    deadline = time.monotonic() + timeout_s
    while last not in log.read_text() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return log.read_text()


async def test_a_process_replicas_overlay_runs_in_its_own_namespace_and_its_hostfile_at_a_fixed_path(tmp_path: Path) -> None:
    """The agent's state lies under a home directory of root's (0700), as in a demo run from a clone in /root: no uid
    but root's passes there, yet the replica reads its hostfile, from its first instruction, at /idlegrid/overlay."""
    home = tmp_path / "root-home"
    home.mkdir(mode=0o700)
    runtime = ProcessRuntime(home / "state")
    overlays, overlay = replica_overlay(home, 1)
    read = 'echo "$IDLEGRID_HOSTFILE"; cat "$IDLEGRID_HOSTFILE"; { echo x >"$IDLEGRID_HOSTFILE"; } 2>/dev/null || echo unwritable'
    command = ["sh", "-c", f"{read}; exec sleep 60"]
    spec = overlays.prepare(ContainerSpec(name="wl-ab-r1-a1", image="none", command=command, overlay=overlay), runtime)
    assert spec.env["MASTER_ADDR"] == "100.64.1.1" and spec.env["NODE_RANK"] == "1"
    await runtime.create(spec, labels={LABEL_COMMAND_ID: "c1", LABEL_AGENT_ID: "agt-1"})
    try:
        said = await _log_until(runtime, spec.name, "unwritable")
        hostfile = "100.64.1.1 slots=1\n100.64.1.2 slots=1\n"
        assert said == f"/idlegrid/overlay/hostfile\n{hostfile}unwritable\n", said  # read-only, before any overlay ran
        netns = await runtime.network_namespace(spec.name)
        assert netns is not None and os.readlink(netns) != os.readlink("/proc/self/ns/net")
        await overlays.attach(spec, runtime)
        deadline = time.monotonic() + 10
        while "100.64.1.2/10" not in _interfaces(netns) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert "ig0" in _interfaces(netns) and "100.64.1.2/10" in _interfaces(netns)  # in the container's namespace
        assert "100.64.1.2" not in subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
        again = await runtime.exec(spec.name, ["cat", "/idlegrid/overlay/hostfile"], tty=False)  # an exec sees it too
        assert (await _exec_output(again)) == hostfile
    finally:
        await overlays.close()
        await runtime.delete(spec.name, timeout_s=0)
    assert overlays.clients == {}
    assert not (runtime.root / f"{spec.name}.overlay").exists()  # its files went with the container


async def test_another_renter_on_the_host_reads_neither_a_gangs_hostfile_nor_its_overlay_files(tmp_path: Path) -> None:
    """The agent's state under a directory every uid may pass (0755: /var/lib, not /tmp, which a sandbox sees fresh), so
    that only the modes of the
    agent's own directories stand between another renter's sandboxed container and the gang replica's files: its
    hostfile (where the runtime binds it from, and the overlay directory's copy), its certificate, the CA, Nebula's
    configuration and log. (Through /proc it has no way either: its own shows none of the host's processes,
    tests/agent/test_process_isolation.py.)"""
    shared = Path(tempfile.mkdtemp(prefix="idlegrid-test-", dir="/var/lib"))
    try:
        os.chmod(shared, 0o755)
        runtime = ProcessRuntime(shared / "state")
        overlays = GangOverlays.available(shared / "state")
        assert overlays is not None  # root, nebula and /dev/net/tun: checked by the module's skip
        settings = OverlaySettings(lighthouses=[LighthouseSetting(address="100.64.0.1", endpoints=["127.0.0.1:4242"])])
        overlay = OverlayAuthority.create(settings).replica_spec(
            workload_id="wl-ab", network="100.64.1.0/25", replica=0, replicas=2, gpus=1,
            public_key_pem=overlays.key.public_pem, now=time.time(),
        )  # fmt: skip
        gang = overlays.prepare(
            ContainerSpec(name="wl-ab-r0-a1", image="none", command=["sleep", "60"], overlay=overlay), runtime
        )
        await runtime.create(gang, labels={LABEL_COMMAND_ID: "c1", LABEL_AGENT_ID: "agt-1"})
        other: ContainerSpec | None = None
        try:
            await overlays.attach(gang, runtime)
            workdir = shared / "state-overlay" / gang.name
            secrets = [
                runtime.root / f"{gang.name}.overlay" / "hostfile",
                *(workdir / f for f in ("idlegrid-hostfile", "host.crt", "ca.crt", "nebula.json", "nebula.log")),
            ]
            deadline = time.monotonic() + 10
            while not all(path.is_file() for path in secrets) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # nebula.log: from nebula's first line
            assert [path for path in secrets if not path.is_file()] == []  # there, for root
            probe = 'for f; do cat "$f" >/dev/null 2>&1 && echo "read $f" || echo "refused: $(cat "$f" 2>&1)"; done; ls "$0"'
            command = ["sh", "-c", f"{probe}; echo end", str(shared / "state-overlay"), *map(str, secrets)]
            other = ContainerSpec(name="other-renter", image="none", command=command)
            await runtime.create(other, labels={LABEL_COMMAND_ID: "c2", LABEL_AGENT_ID: "agt-1"})
            said = await _log_until(runtime, other.name, "end")
            refused = [line for line in said.splitlines() if line.startswith("refused: ")]
            assert len(refused) == len(secrets) and "read " not in said, said
            assert all(line.endswith("Permission denied") for line in refused), said
            assert f"cannot open directory '{shared / 'state-overlay'}': Permission denied" in said, said  # nor lists it
        finally:
            await overlays.close()
            await runtime.delete(gang.name, timeout_s=0)
            if other is not None:
                await runtime.delete(other.name, timeout_s=0)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


async def _exec_output(session: ExecSession) -> str:
    """What an exec wrote, once it has ended."""
    out = b""
    while (chunk := await asyncio.wait_for(session.read(), 10)) is not None:
        out += chunk[1]
    await session.wait()
    return out.decode()


async def test_a_restarted_agent_starts_again_the_overlays_of_replicas_still_running_and_removes_the_rest(
    tmp_path: Path,
) -> None:
    runtime = ProcessRuntime(tmp_path / "state")
    key = OverlayKey.load_or_create(tmp_path / "state")
    first = GangOverlays(key, tmp_path / "state-overlay")
    settings = OverlaySettings(lighthouses=[LighthouseSetting(address="100.64.0.1", endpoints=["127.0.0.1:4242"])])
    authority = OverlayAuthority.create(settings)
    specs = []
    for replica in (0, 1):
        overlay = authority.replica_spec(
            workload_id="wl-ab", network="100.64.1.0/25", replica=replica, replicas=2, gpus=1,
            public_key_pem=key.public_pem, now=time.time(),
        )  # fmt: skip
        spec = first.prepare(ContainerSpec(name=f"wl-ab-r{replica}-a1", image="none", command=["sleep", "60"], overlay=overlay))
        await runtime.create(spec, labels={LABEL_COMMAND_ID: f"c{replica}", LABEL_AGENT_ID: "agt-1"})
        await first.attach(spec, runtime)
        specs.append(spec)
    second = GangOverlays(key, tmp_path / "state-overlay")
    try:
        old_pid = first.clients["wl-ab-r0-a1"].pid
        # The agent dies without stopping anything (SIGKILL); replica 1's container ends meanwhile.
        await runtime.delete("wl-ab-r1-a1", timeout_s=0)
        await second.resume(runtime)
        assert sorted(second.clients) == ["wl-ab-r0-a1"]
        assert not (tmp_path / "state-overlay" / "wl-ab-r1-a1").exists()
        netns = await runtime.network_namespace("wl-ab-r0-a1")
        assert netns is not None
        deadline = time.monotonic() + 10
        while "100.64.1.1/10" not in _interfaces(netns) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert "100.64.1.1/10" in _interfaces(netns)
        assert second.clients["wl-ab-r0-a1"].pid != old_pid and not _alive(old_pid)  # the old nebula was ended
        await second.detach("wl-ab-r0-a1")
        assert not (tmp_path / "state-overlay" / "wl-ab-r0-a1").exists()
    finally:
        for overlays in (first, second):
            await overlays.close()
        for spec in specs:
            await runtime.delete(spec.name, timeout_s=0)


def _route(netns: str, address: str) -> str:
    done = subprocess.run(["nsenter", f"--net={netns}", "ip", "route", "get", address], capture_output=True, text=True)
    return (done.stdout + done.stderr).strip()


async def test_a_replicas_peers_are_unreachable_but_through_its_overlay_from_its_first_instruction(tmp_path: Path) -> None:
    """Without the fence, MASTER_ADDR (100.64.x.y) follows the namespace's default route (slirp4netns, then the host's
    own) out to whoever answers for it on the provider's network, before Nebula is up and after it ends: the e2e gang
    test's rank 1 "met" a stranger that way. The command looks at its route to rank 0 before anything else runs."""
    runtime = ProcessRuntime(tmp_path / "state")
    overlays, overlay = replica_overlay(tmp_path, 1)
    ip = shutil.which("ip")
    assert ip is not None
    command = ["sh", "-c", f"{ip} route get 100.64.1.1 2>&1; {ip} route get 100.64.9.9 2>&1; exec sleep 60"]
    spec = overlays.prepare(ContainerSpec(name="wl-ab-r1-a1", image="none", command=command, overlay=overlay))
    await runtime.create(spec, labels={LABEL_COMMAND_ID: "c1", LABEL_AGENT_ID: "agt-1"})
    try:
        netns = await runtime.network_namespace(spec.name)
        assert netns is not None
        log = runtime.root / f"{spec.name}.log"
        deadline = time.monotonic() + 10
        while log.read_text().count("\n") < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        said = log.read_text()
        # Before the overlay runs: rank 0, and the rest of the grid's range, are unreachable, not "via 10.0.2.2".
        assert said.count("No route to host") == 2 and "via" not in said, said
        assert "via" in _route(netns, "198.51.100.1")  # what is not the overlay's still goes out
        await overlays.attach(spec, runtime)
        deadline = time.monotonic() + 10
        while "dev ig0" not in _route(netns, "100.64.1.1") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert "dev ig0" in _route(netns, "100.64.1.1")  # up: the overlay carries the range
        await overlays.close()  # Nebula ends (as when the agent dies): the fence holds again
        deadline = time.monotonic() + 10
        while "dev ig0" in _route(netns, "100.64.1.1") and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert "No route to host" in _route(netns, "100.64.1.1")
    finally:
        await overlays.close()
        await runtime.delete(spec.name, timeout_s=0)

"""Gangs across NATs, with real parts: network namespaces as hosts behind their own NAT (iptables MASQUERADE) on a
shared "internet" bridge, Debian's nebula as every replica's overlay client and as the lighthouse and relay, and
certificates from the Master's overlay authority (master/overlay.py) for each host's own key.

Skipped, with the reason, where namespaces cannot be made (not root, no iproute2/iptables, no TUN) or nebula is not
installed (scripts/setup-env installs it). Every namespace, interface and iptables rule is the test's own and goes
with its namespace at the end, even on failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path

import pytest

from agent.overlay import GangOverlays, OverlayClient, OverlayKey
from bench.netns import Fabric, available
from common.containers import ContainerSpec
from common.nebula import decode_cert_pem, fingerprint
from master.overlay import LighthouseSetting, OverlayAuthority, OverlaySettings, allocate_network, write_lighthouse

_why = available() or ("" if shutil.which("nebula") else "Debian's nebula is not installed (scripts/setup-env)")
pytestmark = pytest.mark.skipif(bool(_why), reason=_why or "runs")

REPLICA = str(Path(__file__).with_name("overlay_replica.py"))
LIGHTHOUSE = "100.64.0.1"
LIGHTHOUSE_PORT = 4242
_tags = count()


class Namespaces:
    """The part of a container runtime the overlay asks for: each container's network namespace. The namespaces are
    real (the fabric's); no engine is needed to make them."""

    def __init__(self) -> None:
        self.of: dict[str, str] = {}

    async def network_namespace(self, name: str) -> str | None:
        return self.of.get(name)


@dataclass
class Gang:
    """The fabric, the lighthouse, and each replica's overlay client by (workload, rank)."""

    fabric: Fabric
    authority: OverlayAuthority
    tmp: Path
    hosts: dict[str, str] = field(default_factory=dict)  # name -> namespace
    overlays: dict[str, GangOverlays] = field(default_factory=dict)  # host -> its agent's overlays
    runtime: Namespaces = field(default_factory=Namespaces)
    replicas: dict[tuple[str, int], tuple[str, OverlayClient]] = field(default_factory=dict)
    env: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)  # what each replica's container gets
    networks: dict[str, str] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    async def add_workload(self, workload: str, hosts: list[str], *, blocklist: tuple[str, ...] = (), attempt: int = 0) -> None:
        network = allocate_network(self.networks.values(), self.authority.settings)
        self.networks[workload] = network
        for rank, host in enumerate(hosts):
            await self.add_replica(workload, network, rank, len(hosts), host, blocklist=blocklist, attempt=attempt)
        for _, client in (self.replicas[(workload, r)] for r in range(len(hosts))):
            await client.wait_up(10)

    async def add_replica(
        self, workload: str, network: str, rank: int, replicas: int, host: str, *, blocklist: tuple[str, ...], attempt: int
    ) -> OverlayClient:
        """One replica of ``workload`` on ``host``, as its agent starts it; its overlay client (not yet up)."""
        ns = self.fabric.add_container(self.hosts[host], f"{workload[-2:]}{rank}{attempt or ''}")
        overlays = self.overlays[host]
        overlay = self.authority.replica_spec(
            workload_id=workload,
            network=network,
            replica=rank,
            replicas=replicas,
            gpus=1,
            public_key_pem=overlays.key.public_pem,
            now=time.time(),
            blocklist=blocklist,
            attempt=attempt,
        )
        # What the agent's executor does with the create: the variables before, the overlay once it runs.
        name = f"{workload}-r{rank}-a{attempt or 1}"
        spec = overlays.prepare(ContainerSpec(name=name, image="busybox", overlay=overlay))
        self.runtime.of[name] = ns
        await overlays.attach(spec, self.runtime)
        self.replicas[(workload, rank)] = (ns, overlays.clients[name])
        self.env[(workload, rank)] = spec.env
        return overlays.clients[name]

    def run(self, workload: str, rank: int, *args: str) -> subprocess.Popen[bytes]:
        ns, _ = self.replicas[(workload, rank)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **self.env[(workload, rank)]}
        proc = subprocess.Popen(self.fabric.command(ns, [sys.executable, *args]), env=env, stdout=subprocess.PIPE)
        self.processes.append(proc)
        return proc

    def listen(self, workload: str, rank: int, port: int) -> None:
        """A TCP listener on every address of a replica's namespace, for two minutes (ended with the gang)."""
        ns, _ = self.replicas[(workload, rank)]
        code = f"import socket,time;s=socket.create_server(('0.0.0.0',{port}));time.sleep(120)"
        self.processes.append(subprocess.Popen(self.fabric.command(ns, [sys.executable, "-c", code])))

    def connects(self, workload: str, rank: int, address: str, port: int, timeout_s: float = 3.0) -> str:
        """From a replica's namespace: "ok" when a TCP connection to address:port opens, else the error's name."""
        ns, _ = self.replicas[(workload, rank)]
        probe = (
            "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"
            "\n print('ok')\nexcept OSError as e:\n print(type(e).__name__)"
        )
        done = self.fabric.exec(ns, sys.executable, "-c", probe, address, str(port), str(timeout_s))
        return done.stdout.strip()


@pytest.fixture
async def gang(tmp_path: Path) -> AsyncIterator[Gang]:
    fabric = Fabric(tag=f"{os.getpid() % 100000}{next(_tags)}")
    gang_ = None
    try:
        fabric.start()
        lh_ns = fabric.add_public("lh", 10)
        settings = OverlaySettings(
            lighthouses=[LighthouseSetting(address=LIGHTHOUSE, endpoints=[f"{fabric.public(10)}:{LIGHTHOUSE_PORT}"])]
        )
        authority = OverlayAuthority.create(settings)
        gang_ = Gang(fabric, authority, tmp_path)
        for name, last in (("ha", 2), ("hb", 3)):
            gang_.hosts[name] = fabric.add_host(name, last)
            state = tmp_path / f"state-{name}"
            gang_.overlays[name] = GangOverlays(OverlayKey.load_or_create(state), Path(f"{state}-overlay"))
        # The lighthouse and relay: what runs beside an Access relay, with a certificate from the same authority.
        lh_dir = tmp_path / "lighthouse"
        for rule in write_lighthouse(authority, address=LIGHTHOUSE, port=LIGHTHOUSE_PORT, out=lh_dir):
            fabric.exec(lh_ns, "iptables", *rule)  # the relay's bound per replica, as on a relay's host
        log = open(lh_dir / "nebula.log", "wb")
        gang_.processes.append(
            subprocess.Popen(
                fabric.command(lh_ns, ["nebula", "-config", str(lh_dir / "nebula.json")]), stdout=log, stderr=subprocess.STDOUT
            )
        )
        yield gang_
    finally:
        if gang_ is not None:
            for overlays in gang_.overlays.values():
                await overlays.close()
            for proc in gang_.processes:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        fabric.close()


def _finish(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> dict:
    out, _ = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, out
    return json.loads(out)


async def _until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return bool(predicate())


async def test_a_gang_on_two_nated_hosts_meets_at_master_addr_and_all_reduces(gang: Gang) -> None:
    await gang.add_workload("wl-aa", ["ha", "hb"])
    r0, r1 = gang.run("wl-aa", 0, REPLICA, "1.5"), gang.run("wl-aa", 1, REPLICA, "2.25")
    zero, one = await asyncio.to_thread(_finish, r0), await asyncio.to_thread(_finish, r1)
    assert zero["sum"] == one["sum"] == 3.75  # the all-reduce's right sum on every rank
    assert zero["heard"] == ["hello from 1"] and one["heard"] == ["hello from 0"]  # data both ways
    peers = gang.replicas[("wl-aa", 0)][1].spec.peers
    for rank, result in enumerate((zero, one)):
        env = result["env"]
        assert env["MASTER_ADDR"] == peers[0] and env["MASTER_PORT"] == "29500"
        assert (env["NNODES"], env["NODE_RANK"], env["RANK"], env["WORLD_SIZE"]) == ("2", str(rank), str(rank), "2")
        assert env["LOCAL_WORLD_SIZE"] == "1" and env["IDLEGRID_OVERLAY_ADDR"] == peers[rank]
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ig0"
        assert result["hostfile"] == f"{peers[0]} slots=1\n{peers[1]} slots=1\n"
    # The agent knows how each replica reaches its peer (direct or relay: Linux's NATs on both sides usually relay).
    client = gang.replicas[("wl-aa", 0)][1]
    assert await _until(lambda: peers[1] in client.paths)


async def test_another_workloads_replica_cannot_reach_the_gang_nor_the_host_loopback(gang: Gang) -> None:
    await gang.add_workload("wl-aa", ["ha", "hb"])
    await gang.add_workload("wl-bb", ["ha", "hb"])
    target = gang.replicas[("wl-aa", 0)][1].spec.peers[0]
    gang.listen("wl-aa", 0, 7777)
    # Its own gang reaches it (the listener is up) ...
    assert await _until(lambda: gang.connects("wl-aa", 1, target, 7777) == "ok", 20)
    # ... a replica of another workload, on the other host and on the same host, does not: Nebula's firewall drops it.
    assert gang.connects("wl-bb", 1, target, 7777) != "ok"
    assert gang.connects("wl-bb", 0, target, 7777) != "ok"
    # The host's loopback services are not the replica's: its 127.0.0.1 is its own namespace's.
    host = gang.hosts["ha"]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = probe.getsockname()[1]
    loopback = subprocess.Popen(
        gang.fabric.command(
            host, [sys.executable, "-c", f"import socket,time;s=socket.create_server(('127.0.0.1',{free_port}));time.sleep(120)"]
        )
    )
    gang.processes.append(loopback)
    assert await _until(lambda: "127.0.0.1:" + str(free_port) in gang.fabric.exec(host, "ss", "-ltn").stdout, 10)
    assert gang.connects("wl-aa", 0, "127.0.0.1", free_port) == "ConnectionRefusedError"


async def test_with_hole_punching_blocked_the_gang_goes_through_the_relay_and_says_so(gang: Gang) -> None:
    fabric = gang.fabric
    fabric.block_udp_between(gang.hosts["ha"], fabric.public(3))
    fabric.block_udp_between(gang.hosts["hb"], fabric.public(2))
    await gang.add_workload("wl-aa", ["ha", "hb"])
    r0, r1 = gang.run("wl-aa", 0, REPLICA, "1"), gang.run("wl-aa", 1, REPLICA, "2")
    zero, one = await asyncio.to_thread(_finish, r0), await asyncio.to_thread(_finish, r1)
    assert zero["sum"] == one["sum"] == 3.0
    peers = gang.replicas[("wl-aa", 0)][1].spec.peers
    first, second = gang.replicas[("wl-aa", 0)][1], gang.replicas[("wl-aa", 1)][1]
    assert await _until(lambda: first.paths.get(peers[1]) == "relay" and second.paths.get(peers[0]) == "relay")


async def test_a_replica_left_behind_with_its_earlier_certificate_is_refused_by_the_gang_that_replaced_it(
    gang: Gang,
) -> None:
    """A host lost to the Master but still running (cut off from its relay, or its agent back before the stray is
    deleted) keeps its replica's certificate, valid, naming the address its successor now holds. The successors'
    Nebulas refuse it at its handshake: the Master puts the earlier attempts' certificates in their blocklist (without
    it, rank 0's Nebula logs no refusal and takes the handshake of whichever holder of the address comes first)."""
    network = allocate_network(gang.networks.values(), gang.authority.settings)
    stale = await gang.add_replica("wl-aa", network, 1, 2, "ha", blocklist=(), attempt=1)
    await stale.wait_up(10)
    stale_ns = gang.replicas[("wl-aa", 1)][0]
    old = fingerprint(decode_cert_pem(stale.spec.certificate)).hex()
    await gang.add_workload("wl-aa", ["ha", "hb"], blocklist=(old,), attempt=2)  # the same block, placed again
    target = gang.replicas[("wl-aa", 0)][1].spec.peers[0]
    gang.listen("wl-aa", 0, 7777)
    assert await _until(lambda: gang.connects("wl-aa", 1, target, 7777) == "ok", 20)  # its successor reaches rank 0
    probe = (
        "import socket,sys\ntry:\n socket.create_connection((sys.argv[1], 7777), timeout=3)\n print('ok')"
        "\nexcept OSError as e:\n print(type(e).__name__)"
    )
    assert gang.fabric.exec(stale_ns, sys.executable, "-c", probe, target).stdout.strip() != "ok"
    log = gang.overlays["ha"].root / "wl-aa-r0-a2" / "nebula.log"  # (the agent's reader writes it as lines come)
    # Rank 0 says why: the earlier certificate (wl-aa-r1-a1) is refused at its handshake.
    assert await _until(lambda: "certificate has been blocked" in log.read_text(), 10), log.read_text()[-3000:]
    assert all(
        json.loads(line)["cert"]["details"]["name"] == "wl-aa-r1-a1"
        for line in log.read_text().splitlines()
        if "certificate has been blocked" in line
    )

"""Gang overlay: throughput and round trip between two replicas, direct and through a relay, and a control path's
round trip through the relay's host while the overlay carries bulk traffic (docs/overlay.md, bench/README.md).

Hosts are network namespaces (bench/netns.py): the lighthouse and relay on the "internet", replica 0 behind a NAT,
replica 1 either on a public address (Nebula punches through: direct) or behind a NAT with UDP between the two hosts
dropped (Nebula goes through the relay). Certificates come from the Master's overlay authority, nebula is run by the
agent's overlay client. The control path is a TCP echo served on the relay's host, measured from replica 0's host:
a stand-in for the Access relay's control frames, sharing the relay host's network stack and CPU with the overlay.

    sudo python -m bench.overlay [--mib 64] [--pings 2000] [--json out.json]

Needs root, iproute2, iptables and Debian's nebula.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.overlay import OverlayClient, OverlayKey
from bench.netns import Fabric, available
from common.overlay import relay_limit_rules
from master.overlay import LighthouseSetting, OverlayAuthority, OverlaySettings, allocate_network, write_lighthouse

LIGHTHOUSE = "100.64.0.1"
PORT = 4242
DATA_PORT = 5201
ECHO_PORT = 7001

# Run inside a namespace. Server: read everything / echo lines. Client: send MiB, or ping-pong, printing JSON.
_SINK = (
    "import socket,sys\ns=socket.create_server(('0.0.0.0',int(sys.argv[1])))\n"
    "while True:\n c,_=s.accept()\n while True:\n  b=c.recv(1<<20)\n  if not b: break\n"
    "  if b.endswith(b'!'): c.sendall(b'k')\n c.close()"
)
_ECHO = (
    "import socket,sys,threading\ns=socket.create_server(('0.0.0.0',int(sys.argv[1])))\n"
    "def serve(c):\n c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)\n while True:\n  b=c.recv(64)\n"
    "  if not b: return\n  c.sendall(b)\n"
    "while True:\n c,_=s.accept(); threading.Thread(target=serve,args=(c,),daemon=True).start()"
)
_BULK = (
    "import socket,sys,time,json\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=60)\n"
    "n=int(sys.argv[3]);chunk=b'x'*(1<<16);t=time.perf_counter()\nfor _ in range(n*16): c.sendall(chunk)\n"
    "c.sendall(b'!');c.recv(1);print(json.dumps({'s':time.perf_counter()-t}))"
)
_PINGS = (
    "import socket,sys,time,json\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=60)\n"
    "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1);n=int(sys.argv[3]);gap=float(sys.argv[4]);out=[]\n"
    "for _ in range(n):\n t=time.perf_counter();c.sendall(b'p'*32);got=b''\n while len(got)<32: got+=c.recv(64)\n"
    " out.append((time.perf_counter()-t)*1000)\n if gap: time.sleep(gap)\nprint(json.dumps(out))"
)


@dataclass
class PathFigures:
    path: str  # what the agent's client says: "direct" or "relay"
    mib_per_s: float
    rtt_p50_ms: float
    rtt_p99_ms: float


@dataclass
class OverlayBench:
    direct: PathFigures
    relay: PathFigures
    wireguard: PathFigures | None  # wireguard-go between the same two hosts as "direct", for the choice
    control_idle_p99_ms: float
    control_loaded_p99_ms: float
    control_ratio: float


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class _Setup:
    def __init__(self, fabric: Fabric, tmp: Path) -> None:
        self.fabric, self.tmp = fabric, tmp
        self.procs: list[subprocess.Popen[bytes]] = []
        self.clients: list[OverlayClient] = []
        self.networks: list[str] = []

    def spawn(self, ns: str, code: str, *args: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.fabric.command(ns, [sys.executable, "-c", code, *args]), stdout=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    async def run(self, ns: str, code: str, *args: str) -> object:
        """Run ``code`` in ``ns`` to its end, off the event loop (the overlay clients read nebula's log meanwhile)."""
        return await asyncio.to_thread(self._run, ns, code, *args)

    def _run(self, ns: str, code: str, *args: str) -> object:
        done = subprocess.run(self.fabric.command(ns, [sys.executable, "-c", code, *args]), capture_output=True, timeout=300)
        if done.returncode:
            raise RuntimeError(done.stderr.decode()[-500:])
        return json.loads(done.stdout)

    async def gang(self, authority: OverlayAuthority, name: str, namespaces: list[str]) -> list[OverlayClient]:
        network = allocate_network(self.networks, authority.settings)
        self.networks.append(network)
        clients = []
        for rank, ns in enumerate(namespaces):
            key = OverlayKey.load_or_create(self.tmp / f"{name}-key{rank}")
            spec = authority.replica_spec(
                workload_id=name, network=network, replica=rank, replicas=len(namespaces), gpus=1,
                public_key_pem=key.public_pem, now=time.time(),
            )  # fmt: skip
            client = OverlayClient(spec, workdir=self.tmp / f"{name}-r{rank}", key=key, enter=["nsenter", f"--net={ns}"])
            await client.start()
            clients.append(client)
        self.clients += clients
        for client in clients:
            await client.wait_up(15)
        return clients


async def _measure(
    setup: _Setup, clients: list[OverlayClient], server_ns: str, client_ns: str, mib: int, pings: int
) -> PathFigures:
    peer = clients[0].spec.peers[0]
    figures = await _measure_path(setup, peer, server_ns, client_ns, mib, pings)
    figures.path = clients[1].paths.get(peer, "unknown")
    return figures


async def _measure_path(setup: _Setup, peer: str, server_ns: str, client_ns: str, mib: int, pings: int) -> PathFigures:
    """Round trips then bulk from ``client_ns`` to ``peer`` (served in ``server_ns``), over whatever tunnel joins them."""
    setup.spawn(server_ns, _SINK, str(DATA_PORT))
    setup.spawn(server_ns, _ECHO, str(DATA_PORT + 1))
    deadline = time.monotonic() + 20
    while True:  # the first packet makes the tunnel; until then a connection may be refused
        try:
            rtts = await setup.run(client_ns, _PINGS, peer, str(DATA_PORT + 1), "20", "0")
            break
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    rtts = await setup.run(client_ns, _PINGS, peer, str(DATA_PORT + 1), str(pings), "0")
    bulk = await setup.run(client_ns, _BULK, peer, str(DATA_PORT), str(mib))
    assert isinstance(rtts, list) and isinstance(bulk, dict)
    return PathFigures(path="", mib_per_s=mib / bulk["s"], rtt_p50_ms=statistics.median(rtts), rtt_p99_ms=_p(rtts, 0.99))


async def _wireguard_pair(setup: _Setup, ends: list[tuple[str, str]], port: int = 51820) -> list[str]:
    """wireguard-go between two namespaces, for comparison: ``ends`` is (namespace, its public address or "" when it
    is behind a NAT and dials out). Keys are made with ``wg``; returns the two tunnel addresses."""
    fabric = setup.fabric
    keys = []
    for index, _ in enumerate(ends):
        private = subprocess.run(["wg", "genkey"], capture_output=True, text=True, check=True).stdout.strip()
        public = subprocess.run(["wg", "pubkey"], input=private, capture_output=True, text=True, check=True).stdout.strip()
        (setup.tmp / f"wg{index}.key").write_text(private + "\n")
        keys.append(public)
    addresses = [f"10.99.0.{index + 1}" for index in range(len(ends))]
    for index, (ns, _) in enumerate(ends):
        device = f"igwg{index}"  # names differ: wireguard-go's control socket is a file all namespaces share
        Path(f"/var/run/wireguard/{device}.sock").unlink(missing_ok=True)  # a killed earlier run's
        setup.procs.append(subprocess.Popen(fabric.command(ns, ["wireguard-go", "-f", device]), stdout=subprocess.DEVNULL))
        other = 1 - index
        deadline = time.monotonic() + 10
        while not Path(f"/var/run/wireguard/{device}.sock").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("wireguard-go did not start")
            await asyncio.sleep(0.05)
        peer = ["peer", keys[other], "allowed-ips", f"{addresses[other]}/32", "persistent-keepalive", "1"]
        if ends[other][1]:
            peer += ["endpoint", f"{ends[other][1]}:{port}"]
        fabric.exec(ns, "wg", "set", device, "private-key", str(setup.tmp / f"wg{index}.key"), "listen-port", str(port), *peer)
        fabric.exec(ns, "ip", "addr", "add", f"{addresses[index]}/24", "dev", device)
        fabric.exec(ns, "ip", "link", "set", device, "mtu", "1300", "up")
    return addresses


async def run_overlay_bench(mib: int = 64, pings: int = 2000, relay_limit_mib: float = 0.0) -> OverlayBench:
    why = available() or ("" if shutil.which("nebula") else "nebula is not installed")
    if why:
        raise SystemExit(f"bench overlay: {why}")
    fabric = Fabric(tag="bench")
    setup: _Setup | None = None
    with tempfile.TemporaryDirectory(prefix="idlegrid-overlay-bench-") as tmp:
        try:
            fabric.start()
            setup = _Setup(fabric, Path(tmp))
            lh = fabric.add_public("lh", 10)
            settings = OverlaySettings(
                lighthouses=[LighthouseSetting(address=LIGHTHOUSE, endpoints=[f"{fabric.public(10)}:{PORT}"])]
            )
            authority = OverlayAuthority.create(settings)
            lh_dir = Path(tmp) / "lighthouse"
            write_lighthouse(authority, address=LIGHTHOUSE, port=PORT, out=lh_dir)  # unbounded unless asked (below)
            setup.procs.append(
                subprocess.Popen(
                    fabric.command(lh, ["nebula", "-config", str(lh_dir / "nebula.json")]), stdout=subprocess.DEVNULL
                )
            )
            if relay_limit_mib:
                rules = relay_limit_rules(PORT, int(relay_limit_mib * 1024 * 1024))  # the relay host's bound
                for rule in rules:
                    fabric.exec(lh, "iptables", *rule)
            ha, hb = fabric.add_host("ha", 2), fabric.add_host("hb", 3)
            # Direct: a NATed replica and one on a public address (its peer's NAT keeps the mapping: punching works).
            public_ns = fabric.add_public("pub", 4)
            a0 = fabric.add_container(ha, "a0")
            direct_clients = await setup.gang(authority, "wl-d1", [public_ns, a0])
            direct = await _measure(setup, direct_clients, public_ns, a0, mib, pings)
            wireguard = None
            if shutil.which("wireguard-go") and shutil.which("wg"):
                wg_public, wg_nated = fabric.add_public("wgp", 5), fabric.add_container(ha, "wg0")
                wg_addresses = await _wireguard_pair(setup, [(wg_public, fabric.public(5)), (wg_nated, "")])
                wireguard = await _measure_path(setup, wg_addresses[0], wg_public, wg_nated, mib, pings)
                wireguard.path = "direct"
            # Relay: two NATed replicas with UDP between their hosts dropped.
            fabric.block_udp_between(ha, fabric.public(3))
            fabric.block_udp_between(hb, fabric.public(2))
            r0, r1 = fabric.add_container(hb, "b0"), fabric.add_container(ha, "a1")
            relay_clients = await setup.gang(authority, "wl-r1", [r0, r1])
            relay = await _measure(setup, relay_clients, r0, r1, mib, pings)
            # The control path through the relay's host: idle, then while the relay carries bulk traffic.
            setup.spawn(lh, _ECHO, str(ECHO_PORT))
            await asyncio.sleep(0.3)
            idle = await setup.run(a0, _PINGS, fabric.public(10), str(ECHO_PORT), "500", "0.01")
            peer = relay_clients[0].spec.peers[0]
            bulk = setup.spawn(r1, _BULK, peer, str(DATA_PORT), str(mib * 4))
            await asyncio.sleep(0.5)
            loaded = await setup.run(a0, _PINGS, fabric.public(10), str(ECHO_PORT), "500", "0.01")
            still_bulk = bulk.poll() is None
            bulk.wait(timeout=300)
            assert isinstance(idle, list) and isinstance(loaded, list)
            if not still_bulk:
                print("warning: the bulk transfer ended before the loaded pings did", file=sys.stderr)
            idle_p99, loaded_p99 = _p(idle, 0.99), _p(loaded, 0.99)
            return OverlayBench(direct, relay, wireguard, idle_p99, loaded_p99, loaded_p99 / idle_p99)
        finally:
            if setup is not None:
                for client in setup.clients:
                    await client.stop()
                for proc in setup.procs:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()
            fabric.close()


def overlay_table(result: OverlayBench) -> str:
    rows = ["| path | agent says | throughput MiB/s | RTT p50 ms | RTT p99 ms |", "|---|---|---|---|---|"]
    paths = [("direct", result.direct), ("through the relay", result.relay)]
    if result.wireguard is not None:
        paths.append(("wireguard-go, direct (comparison)", result.wireguard))
    for name, fig in paths:
        rows.append(f"| {name} | {fig.path} | {fig.mib_per_s:.1f} | {fig.rtt_p50_ms:.3f} | {fig.rtt_p99_ms:.3f} |")
    rows.append("")
    rows.append(
        f"control path via the relay's host, p99: idle {result.control_idle_p99_ms:.3f} ms, "
        f"with the relay carrying bulk {result.control_loaded_p99_ms:.3f} ms (x{result.control_ratio:.2f})"
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overlay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="MiB sent per throughput run (default 64)")
    parser.add_argument("--pings", type=int, default=2000, help="round trips per path (default 2000)")
    parser.add_argument("--json", type=Path, help="write the figures there too")
    parser.add_argument("--relay-limit-mib", type=float, default=0.0, help="bound each replica's relayed MiB/s (0: none)")
    args = parser.parse_args(argv)
    result = asyncio.run(run_overlay_bench(args.mib, args.pings, args.relay_limit_mib))
    print(overlay_table(result))
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))


if __name__ == "__main__":
    main()

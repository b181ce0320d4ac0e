"""Gang overlay: throughput and round trip between two replicas, direct and through a relay, and the grid's command
round trip through the Access relay on the overlay relay's host, idle and while the overlay carries bulk traffic
through that host (docs/overlay.md, bench/README.md; issue 26, acceptance 4).

Hosts are network namespaces (bench/netns.py): the lighthouse and relay on the "internet", replica 0 behind a NAT,
replica 1 either on a public address (Nebula punches through: direct) or behind a NAT with UDP between the two hosts
dropped (Nebula goes through the relay). Certificates come from the Master's overlay authority, nebula is run by the
agent's overlay client.

The command path: a local grid as ``bench tunnel`` runs it (bench/tunnel.py: a Master, one Access relay, sandboxed
process-runtime agents, commands to the agents and heartbeats timed), all started inside the lighthouse's namespace,
so the Access relay shares the overlay relay's host (its network stack and CPUs). Commands are timed for ``idle_s``,
then for ``bulk_s`` while the relayed replica pair pushes TCP bulk through the overlay relay; the figure is the ratio
of the two phases' command p99 (target: within 2x). A last phase, the control, times them while the direct pair
streams instead: bulk on the same machine that never crosses the relay's host.

    sudo python -m bench.overlay [--mib 64] [--pings 2000] [--idle-s 15] [--bulk-s 15] [--json out.json]

Needs root, iproute2, iptables and Debian's nebula.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.overlay import OverlayClient, OverlayKey
from bench.netns import Fabric, available, pids_in, run_in_namespace
from bench.procs import read_usage
from bench.tunnel import (
    CommandLoad,
    TunnelBenchOptions,
    _mean,
    _measure,
    _ratio,
    bench_grid,
    loop_stalls,
    moves,
    phase_rows,
    stall_lines,
    start_sandboxed_hosts,
)
from common.overlay import RELAY_BYTES_PER_S, relay_limit_rules
from management.client.api import AsyncApiClient
from management.devgrid.localgrid import LocalGrid
from master.overlay import LighthouseSetting, OverlayAuthority, OverlaySettings, allocate_network, write_lighthouse

LIGHTHOUSE = "100.64.0.1"
PORT = 4242
DATA_PORT = 5201

# Run inside a namespace. Server: read everything / echo lines. Client: send MiB, send for seconds, or ping-pong,
# printing JSON.
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
_STREAM = (
    "import socket,sys,time,json\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=60)\n"
    "chunk=b'x'*(1<<16);n=0;t=time.perf_counter();end=t+float(sys.argv[3])\n"
    "while time.perf_counter()<end:\n c.sendall(chunk);n+=len(chunk)\n"
    "c.sendall(b'!');c.recv(1);print(json.dumps({'bytes':n,'s':time.perf_counter()-t}))"
)
_PINGS = (
    "import socket,sys,time,json\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=60)\n"
    "c.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1);n=int(sys.argv[3]);gap=float(sys.argv[4]);out=[]\n"
    "for _ in range(n):\n t=time.perf_counter();c.sendall(b'p'*32);got=b''\n while len(got)<32: got+=c.recv(64)\n"
    " out.append((time.perf_counter()-t)*1000)\n if gap: time.sleep(gap)\nprint(json.dumps(out))"
)


@dataclass(frozen=True)
class OverlayBenchOptions:
    mib: int = 64  # sent per throughput run
    pings: int = 2000  # round trips per path
    # The relay host's bound per replica, MiB/s (0: none): by default the one the operator installs beside a lighthouse.
    relay_limit_mib: float = RELAY_BYTES_PER_S / 2**20
    wireguard: bool = True  # measure wireguard-go too, when it is installed
    hosts: int = 4  # agents of the command load
    heartbeat_s: float = 0.25
    cmd_rate: float = 20.0  # commands a second, spread over the hosts
    idle_s: float = 15.0  # commands with the overlay quiet
    bulk_s: float = 15.0  # commands while the relayed pair pushes bulk through the relay
    # The nice level of the replicas' side of the bulk (their nebulas, the sender, the sink) in the command phases:
    # they would run on other machines, and here take the relay host's two cores (0: as everything else).
    replica_nice: int = 0
    # Stand the replicas' side on machines of its own: its processes (nebulas, sender, sink) on the last CPU, the relay
    # host's (the grid's daemons and what they start, the lighthouse's nebula) on the others. Needs 2 CPUs or more.
    split_cores: bool = False


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
    # The grid's commands through the Access relay on the overlay relay's host: options, the "idle", "bulk" (relayed
    # stream) and "direct" (control) phases (bench/tunnel.py's Phase.summary), each stream's "transfers" and "paths",
    # "ratios" (bulk_cmd: the figure), "cpu_cores", "errors".
    commands: dict[str, Any] = field(default_factory=dict)
    relay_limit_mib: float = 0.0  # the bound the relayed figures were taken under (0: none)


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
        return await asyncio.to_thread(self.run_sync, ns, code, *args)

    def run_sync(self, ns: str, code: str, *args: str, nice: int = 0, cpus: frozenset[int] = frozenset()) -> object:
        command = self.fabric.command(ns, [sys.executable, "-c", code, *args])
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if cpus else []
        done = subprocess.run([*pin, "nice", "-n", str(nice), *command], capture_output=True, timeout=300)
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


async def _measure_overlay(
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
        wg = fabric.command(ns, ["wireguard-go", "-f", device])  # quiet: its banner about kernel WireGuard is for users
        setup.procs.append(subprocess.Popen(wg, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
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


def core_split() -> tuple[frozenset[int], frozenset[int]]:
    """The CPUs of the relay host's side and of the replicas' side when ``split_cores``: the last CPU for the replicas."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--split-cores needs 2 CPUs or more")
    return frozenset(cpus[:-1]), frozenset(cpus[-1:])


def _pin_tree(pid: int, cpus: frozenset[int]) -> int:
    """Every thread of ``pid`` and of its descendants on ``cpus`` (those started later inherit it); how many processes."""
    pinned = 0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), cpus)
                for child in (task / "children").read_text().split():
                    pinned += _pin_tree(int(child), cpus)
        pinned += 1
    return pinned


def _renice(pid: int, nice: int) -> None:
    """Every thread of ``pid`` at ``nice`` (on Linux a nice level is a thread's: nebula's Go threads each have one)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


# The command phases after "idle": each while one pair streams over the overlay, by what its stream crosses.
STREAM_PHASES = ("bulk", "direct")  # through the relay's host (the figure); a direct pair, away from it (the control)


def _command_phases(
    setup: _Setup, options: OverlayBenchOptions, streams: dict[str, tuple[str, str]], pids: dict[str, list[int]], work_dir: str
) -> dict[str, Any]:
    """The grid's command round trip, idle and then while each of ``streams`` (phase -> sender's namespace, peer's
    overlay address) streams over the overlay: run in the lighthouse's namespace (``run_in_namespace``), so the grid's
    Master, Access relay and agents live there. ``pids``: the overlay's processes whose CPU is reported, by name."""
    with tempfile.TemporaryDirectory(prefix="idlegrid-overlay-bench-grid-", dir=work_dir or None) as root:
        with bench_grid(Path(root), options.heartbeat_s) as grid:
            commands = asyncio.run(_commands(grid, setup, options, streams, pids))
            commands["stalls"] = loop_stalls(grid)
            return commands


def _cpu_s(pids: dict[str, list[int]]) -> dict[str, float]:
    return {name: sum(read_usage(pid).cpu_s for pid in group) for name, group in pids.items()}


async def _commands(
    grid: LocalGrid,
    setup: _Setup,
    options: OverlayBenchOptions,
    streams: dict[str, tuple[str, str]],
    overlay_pids: dict[str, list[int]],
) -> dict[str, Any]:
    agent_ids = await start_sandboxed_hosts(grid, options.hosts)
    pids = {**{d.role: [d.pid] for d in grid.daemons if d.role in ("master", "relay")}, **overlay_pids}
    replica_cpus: frozenset[int] = frozenset()
    if options.split_cores:  # the relay host's side: the grid's daemons (and what they start), the lighthouse's nebula
        host_cpus, replica_cpus = core_split()
        for pid in [d.pid for d in grid.daemons] + overlay_pids.get("lighthouse nebula", []):
            _pin_tree(pid, host_cpus)
    phases = TunnelBenchOptions(
        hosts=options.hosts, heartbeat_s=options.heartbeat_s, cmd_rate=options.cmd_rate, idle_s=options.idle_s
    )
    transfers: dict[str, list[dict[str, Any]]] = {name: [] for name in streams}

    async def stream(name: str) -> None:
        sender, peer = streams[name]
        command = (sender, _STREAM, peer, str(DATA_PORT), str(options.bulk_s))
        sent = await asyncio.to_thread(setup.run_sync, *command, nice=options.replica_nice, cpus=replica_cpus)
        assert isinstance(sent, dict)
        transfers[name].append(
            {"bytes": sent["bytes"], "seconds": round(sent["s"], 2), "mib_per_s": round(sent["bytes"] / sent["s"] / 2**20, 1)}
        )

    measured = {}
    async with AsyncApiClient(grid.api_url, grid.client.api_key) as api:
        load = CommandLoad(api, agent_ids)
        cpu = [_cpu_s(pids)]
        measured["idle"] = await _measure(grid, load, phases, None)
        cpu.append(_cpu_s(pids))
        for name in streams:
            measured[name] = await _measure(grid, load, phases, stream(name))
            cpu.append(_cpu_s(pids))
    summaries = {name: phase.summary() for name, phase in measured.items()}
    # CPU share of one core in each phase: the shared machine's load does not inflate it, unlike the latencies.
    cores = {
        name: {phase: round((cpu[n + 1][name] - cpu[n][name]) / measured[phase].seconds, 2) for n, phase in enumerate(measured)}
        for name in pids
    }
    idle = summaries["idle"]
    return {
        "options": {
            "hosts": options.hosts,
            "heartbeat_s": options.heartbeat_s,
            "cmd_rate": options.cmd_rate,
            "replica_nice": options.replica_nice,
            "split_cores": options.split_cores,
        },
        **summaries,
        "transfers": transfers,
        "ratios": {
            f"{name}_{what}": _ratio(summaries[name][f"{what}_p99_ms"], idle[f"{what}_p99_ms"])
            for name in streams
            for what in ("cmd", "hb")
        },
        "cmd_mean_ms": {name: _mean(phase.commands_ms) for name, phase in measured.items()},
        "cpu_cores": cores,
        "errors": load.errors[:20],
    }


async def run_overlay_bench(options: OverlayBenchOptions, work_dir: str = "") -> OverlayBench:
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
            lighthouse = subprocess.Popen(
                fabric.command(lh, ["nebula", "-config", str(lh_dir / "nebula.json")]), stdout=subprocess.DEVNULL
            )  # nsenter execs nebula: the pid is nebula's
            setup.procs.append(lighthouse)
            if options.relay_limit_mib:
                rules = relay_limit_rules(PORT, int(options.relay_limit_mib * 1024 * 1024))  # the relay host's bound
                for rule in rules:
                    fabric.exec(lh, "iptables", *rule)
            ha, hb = fabric.add_host("ha", 2), fabric.add_host("hb", 3)
            # Direct: a NATed replica and one on a public address (its peer's NAT keeps the mapping: punching works).
            public_ns = fabric.add_public("pub", 4)
            a0 = fabric.add_container(ha, "a0")
            direct_clients = await setup.gang(authority, "wl-d1", [public_ns, a0])
            direct = await _measure_overlay(setup, direct_clients, public_ns, a0, options.mib, options.pings)
            wireguard = None
            if options.wireguard and shutil.which("wireguard-go") and shutil.which("wg"):
                wg_public, wg_nated = fabric.add_public("wgp", 5), fabric.add_container(ha, "wg0")
                wg_addresses = await _wireguard_pair(setup, [(wg_public, fabric.public(5)), (wg_nated, "")])
                wireguard = await _measure_path(setup, wg_addresses[0], wg_public, wg_nated, options.mib, options.pings)
                wireguard.path = "direct"
            # Relay: two NATed replicas with UDP between their hosts dropped.
            fabric.block_udp_between(ha, fabric.public(3))
            fabric.block_udp_between(hb, fabric.public(2))
            r0, r1 = fabric.add_container(hb, "b0"), fabric.add_container(ha, "a1")
            relay_clients = await setup.gang(authority, "wl-r1", [r0, r1])
            relay = await _measure_overlay(setup, relay_clients, r0, r1, options.mib, options.pings)
            # The grid's commands through the Access relay on the lighthouse's host, idle, while r1 streams to r0 through
            # the overlay relay there, and while a0 streams to its direct peer (a control: that stream never crosses the
            # relay's host, only the machine's cores). The overlay clients' log readers keep running on this loop.
            peer, direct_peer = relay_clients[1].spec.peers[0], direct_clients[1].spec.peers[0]
            streams = dict(zip(STREAM_PHASES, [(r1, peer), (a0, direct_peer)], strict=True))
            replica_side = [pid for ns in (r0, r1, public_ns, a0) for pid in pids_in(ns)]  # nebulas, sinks, echoes
            if options.replica_nice:
                for pid in replica_side:
                    _renice(pid, options.replica_nice)
            if options.split_cores:
                replica_cpus = core_split()[1]
                for pid in replica_side:
                    _pin_tree(pid, replica_cpus)
            # The replicas' nebulas would run on other machines; here they take the same two cores (reported apart).
            pids = {
                "lighthouse nebula": [lighthouse.pid],
                "relayed pair's nebulas": [c.pid for c in relay_clients],
                "direct pair's nebulas": [c.pid for c in direct_clients],
            }
            commands = await asyncio.to_thread(
                run_in_namespace, lh, lambda: _command_phases(setup, options, streams, pids, work_dir)
            )
            commands["paths"] = {
                "bulk": relay_clients[1].paths.get(peer, "unknown"),
                "direct": direct_clients[1].paths.get(direct_peer, "unknown"),
            }
            return OverlayBench(direct, relay, wireguard, commands, options.relay_limit_mib)
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
    c = result.commands
    rows += [
        "",
        f"commands through the Access relay on the overlay relay's host: {c['options']['hosts']} hosts, heartbeats every "
        f"{c['options']['heartbeat_s']} s, {c['options']['cmd_rate']:g} commands/s; relayed overlay bound: "
        + (f"{result.relay_limit_mib:g} MiB/s per replica" if result.relay_limit_mib else "none")
        + (f"; replicas' side at nice {c['options']['replica_nice']}" if c["options"].get("replica_nice") else "")
        + ("; replicas' side on a CPU of its own" if c["options"].get("split_cores") else ""),
        f"overlay bulk through the relay ({c['paths']['bulk']}): " + moves(c["transfers"]["bulk"]),
        f"control, overlay bulk between a direct pair ({c['paths']['direct']}): " + moves(c["transfers"]["direct"]),
        *phase_rows(c, ("idle", *STREAM_PHASES)),
        "CPU (cores) idle -> bulk -> direct: "
        + ", ".join(f"{name} {' -> '.join(str(u[p]) for p in ('idle', *STREAM_PHASES))}" for name, u in c["cpu_cores"].items()),
        f"bulk/idle p99: commands {c['ratios']['bulk_cmd']}x, heartbeats {c['ratios']['bulk_hb']}x (target <= 2x); "
        f"direct/idle: commands {c['ratios']['direct_cmd']}x, heartbeats {c['ratios']['direct_hb']}x",
    ]
    rows += stall_lines(c)
    if c["errors"]:
        rows.append(f"errors: {c['errors']}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.overlay", description=__doc__.split("\n\n")[0])
    d = OverlayBenchOptions()
    parser.add_argument("--mib", type=int, default=d.mib, help=f"MiB sent per throughput run (default {d.mib})")
    parser.add_argument("--pings", type=int, default=d.pings, help=f"round trips per path (default {d.pings})")
    parser.add_argument("--json", type=Path, help="write the figures there too")
    parser.add_argument(
        "--relay-limit-mib",
        type=float,
        default=d.relay_limit_mib,
        help=f"bound each replica's relayed MiB/s on the relay's host (default {d.relay_limit_mib:g}, the grid's; 0: none)",
    )
    parser.add_argument("--no-wireguard", action="store_true", help="skip the wireguard-go comparison")
    parser.add_argument("--hosts", type=int, default=d.hosts, help=f"agents taking commands (default {d.hosts})")
    parser.add_argument("--heartbeat-s", type=float, default=d.heartbeat_s, help=f"(default {d.heartbeat_s})")
    parser.add_argument("--cmd-rate", type=float, default=d.cmd_rate, help=f"commands a second (default {d.cmd_rate:g})")
    parser.add_argument("--idle-s", type=float, default=d.idle_s, help=f"the idle phase (default {d.idle_s:g} s)")
    parser.add_argument("--bulk-s", type=float, default=d.bulk_s, help=f"the overlay bulk phase (default {d.bulk_s:g} s)")
    parser.add_argument(
        "--replica-nice",
        type=int,
        default=d.replica_nice,
        help="nice level of the replicas' nebulas, sender and sink while commands are timed: they stand for other "
        f"machines (default {d.replica_nice}: none)",
    )
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="the replicas' side (nebulas, sender, sink) on the last CPU and the relay host's (the grid, the lighthouse) "
        "on the others, as if the replicas ran on machines of their own",
    )
    parser.add_argument("--work-dir", default="", help="the folder the grid's temporary state goes under (default: the system's)")
    args = parser.parse_args(argv)
    options = OverlayBenchOptions(
        mib=args.mib, pings=args.pings, relay_limit_mib=args.relay_limit_mib, wireguard=not args.no_wireguard,
        hosts=args.hosts, heartbeat_s=args.heartbeat_s, cmd_rate=args.cmd_rate, idle_s=args.idle_s, bulk_s=args.bulk_s,
        replica_nice=args.replica_nice, split_cores=args.split_cores,
    )  # fmt: skip
    result = asyncio.run(run_overlay_bench(options, args.work_dir))
    print(overlay_table(result))
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))


if __name__ == "__main__":
    main()

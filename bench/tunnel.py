"""``python -m bench tunnel``: does bulk data through a relay delay the control frames that cross the same relay?

A real local grid (management/devgrid/localgrid.py): a Master, one relay, ``hosts`` agents linked through it (simulated GPUs,
the process runtime). One host runs a renter's workload; a tunnel to it moves ``megabytes`` of its output (``head -c
N /dev/zero`` through an ``exec`` tunnel, read by this process as a renter's CLI would). Meanwhile, as in an idle
phase of the same length before it, commands go to the other hosts (a create and a delete of a sleeping container,
timed from the API call to the final state) and every agent heartbeats every ``heartbeat_s``: the Master's
``idlegrid_heartbeat_transit_seconds`` histogram (agent send -> Master take) is read before and after each phase.

The figures to compare are within one run: each phase's p99 against the idle phase's (the issue: within 2x).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from common.tunnel import Op
from management.cli.access import grant_of
from management.client.api import ApiClient, AsyncApiClient
from management.client.tunnel import Tunnel, TunnelGrant
from management.devgrid.localgrid import LocalGrid, wait_until

RENTER = "bench-renter"
PROVIDER = "bench-provider"
FINAL = frozenset({"succeeded", "failed", "timed_out", "cancelled"})


@dataclass(frozen=True)
class TunnelBenchOptions:
    hosts: int = 8
    megabytes: int = 100
    heartbeat_s: float = 0.25
    cmd_rate: float = 20.0  # commands a second, spread over the other hosts
    rounds: int = 3  # transfers of ``megabytes``, one after another, in the tunnel phase
    idle_s: float = 10.0  # the idle phase; the tunnel phase lasts as long as the transfer
    relay_bytes_per_s: int = 0  # 0: the relay's default bandwidth per tunnel


@dataclass
class Phase:
    commands_ms: list[float]
    heartbeat_buckets: dict[float, float]  # upper bound -> count in the phase
    seconds: float

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 2),
            "commands": len(self.commands_ms),
            "cmd_p50_ms": _pct(self.commands_ms, 0.5),
            "cmd_p99_ms": _pct(self.commands_ms, 0.99),
            "heartbeats": int(sum(self.heartbeat_buckets.values())),
            "hb_p50_ms": _bucket_pct(self.heartbeat_buckets, 0.5),
            "hb_p99_ms": _bucket_pct(self.heartbeat_buckets, 0.99),
        }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def _bucket_pct(buckets: dict[float, float], q: float) -> float | None:
    """The upper bound (ms) of the bucket holding the q-quantile: a histogram's resolution, not finer."""
    total = sum(buckets.values())
    if total <= 0:
        return None
    seen = 0.0
    for bound in sorted(buckets):
        seen += buckets[bound]
        if seen >= q * total:
            return round(bound * 1000, 2) if bound != float("inf") else None
    return None


def heartbeat_histogram(metrics: str) -> dict[float, float]:
    """Cumulative bucket counts of the Master's heartbeat transit histogram, by upper bound."""
    found: dict[float, float] = {}
    for line in metrics.splitlines():
        if line.startswith("idlegrid_heartbeat_transit_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            found[float(bound)] = float(line.rsplit(" ", 1)[1])
    return found


def _phase_buckets(before: dict[float, float], after: dict[float, float]) -> dict[float, float]:
    """Per-bucket (not cumulative) counts of what arrived between two readings."""
    deltas, previous = {}, 0.0
    for bound in sorted(after):
        cumulative = after[bound] - before.get(bound, 0.0)
        deltas[bound] = cumulative - previous
        previous = cumulative
    return deltas


class CommandLoad:
    def __init__(self, client: AsyncApiClient, hosts: list[str]) -> None:
        self._client = client
        self._hosts = hosts
        self._n = 0
        self.errors: list[str] = []

    async def run(self, rate: float, stop: asyncio.Event) -> list[float]:
        timings: list[float] = []
        tasks: list[asyncio.Task[None]] = []
        while not stop.is_set():
            tasks.append(asyncio.create_task(self._pair(timings)))
            try:
                await asyncio.wait_for(stop.wait(), 1 / rate)
            except TimeoutError:
                pass
        await asyncio.gather(*tasks)
        return timings

    async def _pair(self, timings: list[float]) -> None:
        """One command's round trip, API -> Master -> relay -> agent -> back: a delete of a container that is not there,
        which the agent answers without starting anything (so the figure is the path's, not a runtime's)."""
        self._n += 1
        host, name = self._hosts[self._n % len(self._hosts)], f"probe-{self._n}"
        started = time.perf_counter()
        try:
            command_id = (await self._client.issue_command(host, "delete_container", {"name": name}))["id"]
            pause = 0.002
            while (state := (await self._client.command(command_id))["state"]) not in FINAL:
                await asyncio.sleep(pause)
                pause = min(pause * 1.5, 0.02)
        except Exception as exc:  # a benchmark reports what failed and goes on
            self.errors.append(f"delete_container: {exc}")
            return
        if state != "succeeded":
            self.errors.append(f"delete_container {command_id}: {state}")
            return
        timings.append((time.perf_counter() - started) * 1000)


async def _measure(grid: LocalGrid, load: CommandLoad, options: TunnelBenchOptions, work: Any) -> Phase:
    """One phase: commands and heartbeats while ``work`` (a coroutine, or None: ``idle_s`` of nothing) runs."""
    before = heartbeat_histogram(await asyncio.to_thread(_master_metrics, grid))
    stop = asyncio.Event()
    started = time.perf_counter()
    loading = asyncio.create_task(load.run(options.cmd_rate, stop))
    if work is None:
        await asyncio.sleep(options.idle_s)
    else:
        await work
    stop.set()
    timings = await loading
    seconds = time.perf_counter() - started
    after = heartbeat_histogram(await asyncio.to_thread(_master_metrics, grid))
    return Phase(timings, _phase_buckets(before, after), seconds)


def _master_metrics(grid: LocalGrid) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{grid.api_url}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


async def _transfer(grant: TunnelGrant, expected: int) -> dict[str, Any]:
    received, started = 0, time.perf_counter()
    async with await Tunnel.open(grant) as tunnel:
        while (frame := await tunnel.receive()) is not None:
            if frame.op is Op.DATA:
                received += len(frame.payload)
            elif frame.op in (Op.EXIT, Op.ERROR):
                break
    seconds = time.perf_counter() - started
    if received != expected:
        raise RuntimeError(f"the tunnel moved {received} bytes, not {expected}")
    return {"bytes": received, "seconds": round(seconds, 2), "mib_per_s": round(received / seconds / 2**20, 1)}


async def start_sandboxed_hosts(grid: LocalGrid, count: int, egress_allow: Sequence[str] = ()) -> list[str]:
    """``count`` hosts behind relay-1, each one simulated A10 on the sandboxed process runtime; their agent ids, once
    every one is ready (the tunnel, link, ssh and storage benches' grid). ``egress_allow``: the bench's own servers on
    127.0.0.1 their providers let renters reach (common/egress.py)."""
    names = [f"host-{n}" for n in range(count)]
    for name in names:
        enrolled = await asyncio.to_thread(grid.enroll, name, grid.relays["relay-1"])
        if enrolled.returncode != 0:
            raise RuntimeError(f"enrolling {name}: {enrolled.stderr}")
        env = {"IDLEGRID_AGENT_PROCESS_USER": "dynamic"}
        if egress_allow:
            env["IDLEGRID_AGENT_EGRESS_ALLOW"] = ",".join(egress_allow)
        grid.start_agent(name, "--runtime", "process", simulate="a10:1", env=env)
    agent_ids = [grid.agent_id(name) for name in names]
    await asyncio.to_thread(grid.wait_agents_ready, agent_ids)
    return agent_ids


async def _run(grid: LocalGrid, options: TunnelBenchOptions) -> dict[str, Any]:
    agent_ids = await start_sandboxed_hosts(grid, options.hosts)
    operator = grid.client
    operator.create_account(RENTER, "renter")
    key = operator.create_api_key(RENTER, "bench")["key"]
    renter = ApiClient(grid.api_url, key)
    data_host = agent_ids[0]
    submitted = renter.submit_workload(
        {
            "name": "data-source",
            "image": "none",
            "command": ["sleep", "3600"],
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
        }
    )
    await asyncio.to_thread(
        wait_until, lambda: renter.workload(submitted["id"])["state"] == "running", 30, "the data source to run"
    )
    placed = renter.workload(submitted["id"])["assignments"][0]["agent_id"]
    others = [a for a in agent_ids if a != placed]
    expected = options.megabytes * 1_000_000
    async with AsyncApiClient(grid.api_url, grid.client.api_key) as api:
        load = CommandLoad(api, others)
        idle = await _measure(grid, load, options, None)
        transfers: list[dict[str, Any]] = []

        async def move() -> None:
            for _ in range(options.rounds):
                grant = grant_of(
                    renter.open_tunnel(submitted["id"], {"kind": "exec", "command": ["head", "-c", str(expected), "/dev/zero"]})
                )
                transfers.append(await _transfer(grant, expected))

        busy = await _measure(grid, load, options, move())
    idle_s, busy_s = idle.summary(), busy.summary()
    return {
        "options": asdict(options),
        "data_host": data_host,
        "idle": idle_s,
        "tunnel": busy_s,
        "transfers": transfers,
        "ratios": {
            "cmd_p99": _ratio(busy_s["cmd_p99_ms"], idle_s["cmd_p99_ms"]),
            "hb_p99": _ratio(busy_s["hb_p99_ms"], idle_s["hb_p99_ms"]),
        },
        "errors": load.errors[:20],
        "cmd_mean_ms": {"idle": _mean(idle.commands_ms), "tunnel": _mean(busy.commands_ms)},
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 2) if values else None


@contextlib.contextmanager
def bench_grid(root: Path, heartbeat_s: float, relay_bytes_per_s: int = 0) -> Iterator[LocalGrid]:
    """A Master that offers sandboxed hosts and one relay (``relay-1``) under ``root``, stopped on the way out (the
    tunnel, ssh and overlay benches' grid; ``start_sandboxed_hosts`` adds the hosts)."""
    grid = LocalGrid(root, heartbeat_s=heartbeat_s)
    try:
        config = root / "master.toml"
        # The bench's own polling and command load must meet neither the key's nor the account's API limit (40/s
        # per account by default: its 429s would be timed as latency).
        config.write_text(
            "offer_sandboxed_hosts = true\nscheduler_period_s = 0.5\napi_key_rate_per_s = 2000.0\napi_key_burst = 4000\n"
            "api_account_rate_per_s = 2000.0\napi_account_burst = 4000\n"  # and the account's, all its keys together
        )
        grid.start_master("--config", str(config))
        extra = ["--tunnel-bytes-per-s", str(relay_bytes_per_s)] if relay_bytes_per_s else []
        grid.start_relay("relay-1", extra=extra)
        yield grid
    finally:
        grid.stop()


def run_tunnel_bench(options: TunnelBenchOptions, work_dir: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="idlegrid-tunnel-bench-", dir=work_dir or None) as root:
        with bench_grid(Path(root), options.heartbeat_s, options.relay_bytes_per_s) as grid:
            result = asyncio.run(_run(grid, options))
            result["stalls"] = loop_stalls(grid)
            return result


def moves(transfers: list[dict[str, Any]]) -> str:
    """Each transfer's size, time and rate, on one line (the transfer benches' tables)."""
    return ", ".join(f"{t['bytes'] / 1e6:.0f} MB in {t['seconds']} s ({t['mib_per_s']} MiB/s)" for t in transfers)


def phase_rows(r: dict[str, Any], phases: tuple[str, ...]) -> list[str]:
    """The table of each phase's command and heartbeat percentiles, with its heading (tunnel, link, ssh benches)."""
    rows = [f"{'phase':<8} {'s':>6} {'cmds':>5} {'cmd p50':>8} {'cmd p99':>8} {'beats':>6} {'hb p50':>7} {'hb p99':>7}"]
    for name in phases:
        p = r[name]
        rows.append(
            f"{name:<8} {p['seconds']:>6} {p['commands']:>5} {p['cmd_p50_ms']!s:>8} {p['cmd_p99_ms']!s:>8} "
            f"{p['heartbeats']:>6} {p['hb_p50_ms']!s:>7} {p['hb_p99_ms']!s:>7}"
        )
    return rows


def tunnel_table(r: dict[str, Any]) -> str:
    lines = [
        f"tunnel bench: {r['options']['hosts']} hosts through one relay, heartbeats every {r['options']['heartbeat_s']} s, "
        f"{r['options']['cmd_rate']:g} commands/s",
        "transfers: " + moves(r["transfers"]),
    ]
    lines += phase_rows(r, ("idle", "tunnel"))
    lines.append(f"tunnel/idle p99: commands {r['ratios']['cmd_p99']}x, heartbeats {r['ratios']['hb_p99']}x (target <= 2x)")
    lines += stall_lines(r)
    if r["errors"]:
        lines.append(f"errors: {r['errors']}")
    return "\n".join(lines)


LOOP_HELD = "event loop was held"  # common/loopwatch.py's warning


def loop_stalls(grid: LocalGrid) -> list[str]:
    """Every daemon's warnings that its event loop was held 100 ms or more (common/loopwatch.py), with the daemon's
    name and the time: a spike in a phase's p99 then says which process stalled, and whether the collector did it."""
    found = []
    for log in sorted(grid.logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if LOOP_HELD in line:
                found.append(f"{log.stem}: {line.strip()[:240]}")
    return found


def stall_lines(r: dict[str, Any]) -> list[str]:
    stalls = r.get("stalls") or []
    return [f"event loops held >= 100 ms: {len(stalls)}", *(f"  {line}" for line in stalls)] if stalls else []

"""``python -m bench link``: an HTTPS link's throughput through a relay, and whether it delays the control frames
that cross the same relay (docs/links.md).

The tunnel bench's grid and load (bench/tunnel.py): a Master, one relay, ``hosts`` agents through it, commands to the
other hosts and heartbeats timed in an idle phase, then while a browser-like client downloads ``megabytes`` from a
renter's web server (``python3 -m http.server`` serving a file, sandboxed on the process runtime) through its link:
client -> the Master's links listener ``/w/<workload>-<port>/`` -> the link's tunnel -> the relay -> the agent -> the container.
The figures to compare are within one run: the link phase's p99 against the idle phase's (the target: within 2x).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import read_usage
from bench.tunnel import RENTER, CommandLoad, _measure, _ratio, loop_stalls, moves, phase_rows, stall_lines, start_sandboxed_hosts
from management.client.api import ApiClient, AsyncApiClient
from management.devgrid.localgrid import LocalGrid, wait_until

SERVER_PORT = 8000
CHUNK = 256 * 1024


@dataclass(frozen=True)
class LinkBenchOptions:
    hosts: int = 8
    megabytes: int = 100
    heartbeat_s: float = 0.25
    cmd_rate: float = 20.0
    rounds: int = 3
    idle_s: float = 10.0
    # Commands in flight at most: a command not sent because so many wait is counted as skipped. Unbounded, a slow
    # phase feeds itself (every waiting command polls its state every 20 ms: 700 waiting are 35,000 calls a second
    # from the bench), and the figure becomes the bench's own storm.
    max_in_flight: int = 40
    link_bytes_per_s: int = -1  # the Master's [links] bytes_per_s; -1: its default


class BoundedCommandLoad(CommandLoad):
    """bench/tunnel.py's command load with at most ``max_in_flight`` commands waiting at once."""

    def __init__(self, client: AsyncApiClient, hosts: list[str], max_in_flight: int) -> None:
        super().__init__(client, hosts)
        self._max = max_in_flight
        self.skipped = 0

    async def run(self, rate: float, stop: asyncio.Event) -> list[float]:
        timings: list[float] = []
        tasks: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            tasks = {t for t in tasks if not t.done()}
            if len(tasks) < self._max:
                tasks.add(asyncio.create_task(self._pair(timings)))
            else:
                self.skipped += 1
            try:
                await asyncio.wait_for(stop.wait(), 1 / rate)
            except TimeoutError:
                pass
        await asyncio.gather(*tasks)
        return timings


async def _download(url: str, key: str, expected: int) -> dict[str, Any]:
    received, started = 0, time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.get(url) as answer:
            if answer.status != 200:
                raise RuntimeError(f"the link answered {answer.status}: {(await answer.read())[:200]!r}")
            async for chunk in answer.content.iter_chunked(CHUNK):
                received += len(chunk)
    seconds = time.perf_counter() - started
    if received != expected:
        raise RuntimeError(f"the link moved {received} bytes, not {expected}")
    return {"bytes": received, "seconds": round(seconds, 2), "mib_per_s": round(received / seconds / 2**20, 1)}


async def _run(grid: LocalGrid, options: LinkBenchOptions, www: Path) -> dict[str, Any]:
    agent_ids = await start_sandboxed_hosts(grid, options.hosts)
    grid.client.create_account(RENTER, "renter")
    key = grid.client.create_api_key(RENTER, "bench")["key"]
    renter = ApiClient(grid.api_url, key)
    submitted = renter.submit_workload(
        {
            "name": "web-source",
            "image": "none",
            "command": ["python3", "-m", "http.server", str(SERVER_PORT), "--bind", "127.0.0.1", "--directory", str(www)],
            "ports": [SERVER_PORT],
            "links": [{"port": SERVER_PORT}],
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
        }
    )
    wid = submitted["id"]
    await asyncio.to_thread(wait_until, lambda: renter.workload(wid)["state"] == "running", 30, "the web source to run")
    url = renter.workload_links(wid)["items"][0]["url"] + "blob"
    expected = options.megabytes * 1_000_000
    await asyncio.to_thread(wait_until, lambda: _answers(url, key), 30, "the link to answer")
    placed = renter.workload(wid)["assignments"][0]["agent_id"]
    others = [a for a in agent_ids if a != placed]
    pids = {d.role: d.pid for d in grid.daemons if d.role in ("master", "relay")}
    cpu: dict[str, dict[str, float]] = {}
    async with AsyncApiClient(grid.api_url, grid.client.api_key) as api:
        load = BoundedCommandLoad(api, others, options.max_in_flight)
        skipped_before = 0
        before = {role: read_usage(pid).cpu_s for role, pid in pids.items()}
        idle = await _measure(grid, load, options, None)  # type: ignore[arg-type]
        skipped_before = load.skipped
        middle = {role: read_usage(pid).cpu_s for role, pid in pids.items()}
        transfers: list[dict[str, Any]] = []

        async def move() -> None:
            for _ in range(options.rounds):
                transfers.append(await _download(url, key, expected))

        busy = await _measure(grid, load, options, move())  # type: ignore[arg-type]
        after = {role: read_usage(pid).cpu_s for role, pid in pids.items()}
    for role in pids:  # CPU share of one core in each phase: the Master carries every link byte, the relay too
        cpu[role] = {
            "idle": round((middle[role] - before[role]) / idle.seconds, 2),
            "link": round((after[role] - middle[role]) / busy.seconds, 2),
        }
    idle_s, busy_s = idle.summary(), busy.summary()
    return {
        "options": asdict(options),
        "idle": idle_s,
        "link": busy_s,
        "transfers": transfers,
        "ratios": {
            "cmd_p99": _ratio(busy_s["cmd_p99_ms"], idle_s["cmd_p99_ms"]),
            "hb_p99": _ratio(busy_s["hb_p99_ms"], idle_s["hb_p99_ms"]),
        },
        "cpu_cores": cpu,
        "skipped": {"idle": skipped_before, "link": load.skipped - skipped_before},
        "errors": load.errors[:20],
    }


def _answers(url: str, key: str) -> bool:
    import urllib.request

    request = urllib.request.Request(url, method="HEAD", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def run_link_bench(options: LinkBenchOptions, work_dir: str = "") -> dict[str, Any]:
    # The sandboxed server must read the file: not under /tmp (each sandbox gets its own), nor a root-only tree.
    www = Path(tempfile.mkdtemp(prefix="idlegrid-link-bench-", dir="/run" if os.access("/run", os.W_OK) else None))
    try:
        os.chmod(www, 0o755)
        with open(www / "blob", "wb") as blob:
            blob.truncate(options.megabytes * 1_000_000)
        os.chmod(www / "blob", 0o644)
        with tempfile.TemporaryDirectory(prefix="idlegrid-link-bench-grid-", dir=work_dir or None) as root:
            grid = LocalGrid(Path(root), heartbeat_s=options.heartbeat_s)
            try:
                config = Path(root) / "master.toml"
                # The bench's own polling must meet neither the key's nor the account's API limit (429s would be timed).
                config.write_text(
                    "offer_sandboxed_hosts = true\nscheduler_period_s = 0.5\napi_key_rate_per_s = 2000.0\n"
                    "api_key_burst = 4000\napi_account_rate_per_s = 4000.0\napi_account_burst = 8000\n"
                    + (f"[links]\nbytes_per_s = {options.link_bytes_per_s}\n" if options.link_bytes_per_s >= 0 else "")
                )
                grid.start_master("--config", str(config))
                grid.start_relay("relay-1")
                result = asyncio.run(_run(grid, options, www))
                result["stalls"] = loop_stalls(grid)
                return result
            finally:
                grid.stop()
    finally:
        shutil.rmtree(www, ignore_errors=True)


def link_table(r: dict[str, Any]) -> str:
    lines = [
        f"link bench: {r['options']['hosts']} hosts through one relay, heartbeats every {r['options']['heartbeat_s']} s, "
        f"{r['options']['cmd_rate']:g} commands/s",
        "downloads through the link: " + moves(r["transfers"]),
    ]
    lines += phase_rows(r, ("idle", "link"))
    lines.append(
        "CPU (cores) idle -> link: " + ", ".join(f"{role} {c['idle']} -> {c['link']}" for role, c in r["cpu_cores"].items())
    )
    lines.append(f"link/idle p99: commands {r['ratios']['cmd_p99']}x, heartbeats {r['ratios']['hb_p99']}x (target <= 2x)")
    lines += stall_lines(r)
    skipped = r["skipped"]
    if skipped["idle"] or skipped["link"]:
        lines.append(
            f"commands not sent ({r['options']['max_in_flight']} waiting): idle {skipped['idle']}, link {skipped['link']}"
        )
    if r["errors"]:
        lines.append(f"errors: {r['errors']}")
    return "\n".join(lines)

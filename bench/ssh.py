"""``python -m bench ssh``: how fast ``scp`` moves a file to and from a workload through a relay (the SSH end is the
agent, docs/ssh.md), and whether control frames through the same relay keep their latency meanwhile.

The same grid and load as ``bench tunnel`` (bench/tunnel.py): a Master, one relay, ``hosts`` agents behind it
(simulated GPUs, the process runtime), commands to the other hosts and heartbeats timed while idle, then while an exec
tunnel streams ``megabytes`` ``rounds`` times (the relay path without SSH, for comparison within the run), then while
OpenSSH's ``scp`` (Debian ``openssh-client``) copies ``megabytes`` up to the workload and back down, ``rounds`` times,
through ``idlegrid workload proxy`` as its ProxyCommand. The figures to compare are within one run: the scp phase's command
p99 against the idle phase's (target: within 2x).
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.tunnel import (
    FINAL,
    RENTER,
    CommandLoad,
    _mean,
    _measure,
    _ratio,
    _transfer,
    bench_grid,
    loop_stalls,
    moves,
    phase_rows,
    stall_lines,
    start_sandboxed_hosts,
)
from management.cli.access import grant_of
from management.client.api import ApiClient, AsyncApiClient
from management.devgrid.localgrid import LocalGrid, wait_until

__all__ = ["FINAL", "SshBenchOptions", "run_ssh_bench", "ssh_table"]


@dataclass(frozen=True)
class SshBenchOptions:
    hosts: int = 8
    megabytes: int = 100
    heartbeat_s: float = 0.25
    cmd_rate: float = 20.0  # commands a second, spread over the other hosts
    rounds: int = 2  # an upload and a download each
    idle_s: float = 10.0
    relay_bytes_per_s: int = 0  # 0: the relay's default bandwidth per tunnel


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used: a figure the shared machine's load does not inflate."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _cpu_now(pids: dict[str, int]) -> dict[str, float]:
    """Each daemon's CPU seconds, and the renter's side: this process and the scp, ssh and proxy it ran."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    taken = {name: _cpu_s(pid) for name, pid in pids.items()}
    taken["renter"] = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return taken


def _cpu_per_100mb(before: dict[str, float], after: dict[str, float], moved: int) -> dict[str, float]:
    return {name: round((after[name] - before[name]) * 100e6 / moved, 2) for name in after}


def _ssh_setup(grid: LocalGrid, renter: ApiClient, workload_id: str, folder: Path) -> tuple[Path, dict[str, str]]:
    """A key registered for the renter, the workload's published host key, an ssh config through the proxy."""
    key = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    renter.add_ssh_key((folder / "id_ed25519.pub").read_text())
    [replica] = renter.workload_ssh(workload_id)["replicas"]
    (folder / "known_hosts").write_text(replica["known_hosts"] + "\n")
    config = folder / "config"
    config.write_text(
        f"Host {workload_id}\n"
        f"    ProxyCommand {sys.executable} -m management.cli workload proxy %h\n"
        f"    UserKnownHostsFile {folder / 'known_hosts'}\n"
        "    StrictHostKeyChecking yes\n"
        f"    IdentityFile {key}\n"
        "    IdentitiesOnly yes\n"
        "    BatchMode yes\n"
    )
    env = {**os.environ, "IDLEGRID_API": grid.api_url, "IDLEGRID_API_KEY": renter.api_key or ""}
    return config, env


async def _scp(config: Path, env: dict[str, str], source: str, target: str, size: int) -> dict[str, Any]:
    started = time.perf_counter()
    scp = await asyncio.create_subprocess_exec(
        "scp", "-F", str(config), source, target, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )
    _, err = await scp.communicate()
    seconds = time.perf_counter() - started
    if scp.returncode != 0:
        raise RuntimeError(f"scp {source} {target} failed ({scp.returncode}): {err.decode(errors='replace')[-500:]}")
    return {"bytes": size, "seconds": round(seconds, 2), "mib_per_s": round(size / seconds / 2**20, 1)}


async def _run(grid: LocalGrid, options: SshBenchOptions, folder: Path) -> dict[str, Any]:
    agent_ids = await start_sandboxed_hosts(grid, options.hosts)
    grid.client.create_account(RENTER, "renter")
    renter = ApiClient(grid.api_url, grid.client.create_api_key(RENTER, "bench")["key"])
    submitted = renter.submit_workload(
        {
            "name": "scp-target",
            "image": "none",
            "command": ["sleep", "3600"],
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
        }
    )
    workload_id = submitted["id"]
    await asyncio.to_thread(wait_until, lambda: renter.workload(workload_id)["state"] == "running", 30, "the workload to run")
    placed = renter.workload(workload_id)["assignments"][0]["agent_id"]
    config, env = _ssh_setup(grid, renter, workload_id, folder)
    size = options.megabytes * 1_000_000
    payload = folder / "payload"
    with payload.open("wb") as out:  # what scp carries is encrypted whatever it holds: zeros cost nothing to make
        out.truncate(size)
    daemons = {d.name: d.pid for d in grid.daemons}
    pids = {"agent": daemons[f"host-{agent_ids.index(placed)}"], "relay": daemons["relay-1"], "master": daemons["master"]}
    async with AsyncApiClient(grid.api_url, grid.client.api_key) as api:
        load = CommandLoad(api, [a for a in agent_ids if a != placed])
        idle = await _measure(grid, load, options, None)  # type: ignore[arg-type]
        cpu = [_cpu_now(pids)]
        execs: list[dict[str, Any]] = []

        async def stream() -> None:
            """The same bytes through an exec tunnel (no SSH): what the relay path costs without SSH, in this run."""
            for _ in range(options.rounds):
                command = ["head", "-c", str(size), "/dev/zero"]
                grant = grant_of(renter.open_tunnel(workload_id, {"kind": "exec", "command": command}))
                execs.append(await _transfer(grant, size))

        exec_phase = await _measure(grid, load, options, stream())  # type: ignore[arg-type]
        cpu.append(_cpu_now(pids))
        uploads: list[dict[str, Any]] = []
        downloads: list[dict[str, Any]] = []

        async def move() -> None:
            for n in range(options.rounds):
                uploads.append(await _scp(config, env, str(payload), f"{workload_id}:payload", size))
                downloads.append(await _scp(config, env, f"{workload_id}:payload", str(folder / f"back-{n}"), size))
                if (folder / f"back-{n}").stat().st_size != size:
                    raise RuntimeError(f"scp brought back {(folder / f'back-{n}').stat().st_size} bytes, not {size}")
                (folder / f"back-{n}").unlink()

        busy = await _measure(grid, load, options, move())  # type: ignore[arg-type]
        cpu.append(_cpu_now(pids))
    idle_s, exec_s, busy_s = idle.summary(), exec_phase.summary(), busy.summary()
    return {
        "options": asdict(options),
        "idle": idle_s,
        "exec": exec_s,
        "scp": busy_s,
        # CPU seconds per 100 MB moved, by process (the command load's share included: compare the two phases)
        "cpu_per_100mb": {
            "exec": _cpu_per_100mb(cpu[0], cpu[1], size * options.rounds),
            "scp": _cpu_per_100mb(cpu[1], cpu[2], 2 * size * options.rounds),
        },
        "execs": execs,
        "uploads": uploads,
        "downloads": downloads,
        "ratios": {
            "cmd_p99": _ratio(busy_s["cmd_p99_ms"], idle_s["cmd_p99_ms"]),
            "hb_p99": _ratio(busy_s["hb_p99_ms"], idle_s["hb_p99_ms"]),
            "exec_cmd_p99": _ratio(exec_s["cmd_p99_ms"], idle_s["cmd_p99_ms"]),
        },
        "errors": load.errors[:20],
        "cmd_mean_ms": {"idle": _mean(idle.commands_ms), "scp": _mean(busy.commands_ms)},
    }


def run_ssh_bench(options: SshBenchOptions, work_dir: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="idlegrid-ssh-bench-", dir=work_dir or None) as root:
        with bench_grid(Path(root), options.heartbeat_s, options.relay_bytes_per_s) as grid:
            folder = Path(root) / "renter"
            folder.mkdir()
            result = asyncio.run(_run(grid, options, folder))
            result["stalls"] = loop_stalls(grid)
            return result


def ssh_table(r: dict[str, Any]) -> str:
    lines = [
        f"ssh bench: {r['options']['hosts']} hosts through one relay, heartbeats every {r['options']['heartbeat_s']} s, "
        f"{r['options']['cmd_rate']:g} commands/s",
        f"exec tunnel down (no SSH): {moves(r['execs'])}",
        f"scp up: {moves(r['uploads'])}",
        f"scp down: {moves(r['downloads'])}",
    ]
    lines += phase_rows(r, ("idle", "exec", "scp"))
    lines.append(f"scp/idle p99: commands {r['ratios']['cmd_p99']}x, heartbeats {r['ratios']['hb_p99']}x (target <= 2x)")
    lines.append(f"exec/idle p99: commands {r['ratios']['exec_cmd_p99']}x (the same relay path without SSH)")
    lines += stall_lines(r)
    for phase, cpu in r["cpu_per_100mb"].items():
        lines.append(f"CPU s per 100 MB, {phase}: " + ", ".join(f"{name} {value}" for name, value in cpu.items()))
    if r["errors"]:
        lines.append(f"errors: {r['errors']}")
    return "\n".join(lines)

"""``python -m bench takeover``: how long a standby Master takes to serve after the leader is SIGKILLed (docs/ha.md).

Each run starts afresh: two Masters with ``ha`` on, one database (nx-27017, or a real mongod named by MONGODB_URI),
one relay linked to the standby's address list, and N real agents in one fleet process (tests/support/failover.py),
all ready through the leader. Commands are issued to the agents, the leader is SIGKILLed with them in flight, more
are issued to the standby once it serves, and the run times, from the SIGKILL:

- ``serves_s``: the standby answers the API as the leader (its lease taken over);
- ``relinked_s``: the relay's link to it is up;
- ``agents_ready_s``: every agent is ready in the new leader's view (none of them reconnects: the relay holds them);
- ``commands_done_s``: every command of the run has finished, and each ran exactly once (the agents' journal).

Target: the standby serves within 15 s (the lease's ttl of 10 s, a standby's poll of 3 s, and the relay's re-link).
tests/e2e/test_failover.py checks what a takeover does; it asserted this speed until 2026-12-07.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.provision import provision_agents
from master.config import MasterConfig
from tests.support.failover import MASTER_B, FleetProcess, MasterPair, all_on
from tests.support.grid import FINISHED, Grid, wait_for, write_toml
from tests.support.mongo import Nx27017, database_url, real_mongodb_uri

TARGET_S = 15.0
LIVENESS_S = 90.0  # a step not done by then is not coming: the run fails, saying which step


@dataclass(frozen=True)
class TakeoverBenchOptions:
    runs: int = 5
    agents: int = 50
    commands: int = 20  # half issued before the SIGKILL (in flight), half to the standby once it serves


def _one_run(work: Path, server_uri: str, n: int, options: TakeoverBenchOptions) -> dict[str, float | int]:
    grid = Grid(work)
    try:
        store_url = database_url(server_uri, f"idlegrid_takeover_{n}_{int(time.time())}")
        config = write_toml(work / "master.toml", {"ha": True, "store_url": store_url})
        agents_dir = work / "fleet"
        provisioned = asyncio.run(
            provision_agents(MasterConfig(state_dir=str(grid.master_dir), store_url=store_url), agents_dir, options.agents)
        )
        agent_ids = provisioned.agent_ids
        pair = MasterPair(grid, config)
        pair.start("master")
        wait_for(lambda: pair.role("master") == "leader", LIVENESS_S, "the first Master to lead")
        pair.start(MASTER_B)
        wait_for(lambda: pair.role(MASTER_B) == "standby", LIVENESS_S, "master-b to stand by")
        relay_config = write_toml(work / "relay.toml", {"backoff_initial_s": 0.2, "backoff_max_s": 1.0})
        extra = ["--config", str(relay_config), "--master-url", pair.link_url(MASTER_B)]
        relay = grid.start_relay("relay-1", "eu-west", extra=extra)
        fleet = FleetProcess(grid, agents_dir, [relay.agent_url], options.agents)
        fleet.request("start")
        wait_for(lambda: all_on(grid.client, agent_ids, "relay-1"), LIVENESS_S, "every agent ready through relay-1")

        targets = [agent_ids[(3 * k) % len(agent_ids)] for k in range(options.commands)]
        before = options.commands // 2
        spec = {"image": "none"}
        issued = [grid.command(targets[k], "create_container", {**spec, "name": f"takeover-{k}"}) for k in range(before)]
        pair.daemons["master"].kill()  # SIGKILL
        killed_at = time.monotonic()
        wait_for(lambda: pair.serves(MASTER_B), LIVENESS_S, "master-b to serve", interval=0.05)
        serves_s = time.monotonic() - killed_at
        wait_for(lambda: grid.relay_health(relay)["master_link"] == "up", LIVENESS_S, "the relay to re-link", interval=0.05)
        relinked_s = time.monotonic() - killed_at
        b = pair.client(MASTER_B)
        issued += [
            str(b.issue_command(targets[k], "create_container", {**spec, "name": f"takeover-{k}"})["id"])
            for k in range(before, options.commands)
        ]
        try:
            wait_for(lambda: all_on(b, agent_ids, "relay-1"), LIVENESS_S, "every agent ready at master-b", interval=0.1)
        except AssertionError as exc:  # what the new leader saw of each, and its log's end: why they are not ready
            seen = {a["id"]: (a["state"], a.get("relay")) for a in b.list("/api/v1/agents")}
            raise AssertionError(f"{exc}\nmaster-b sees {seen}\n{pair.daemons[MASTER_B].tail()}") from None
        agents_ready_s = time.monotonic() - killed_at
        states = [
            wait_for(lambda c=c: (r := b.command(c))["state"] in FINISHED and r["state"], LIVENESS_S, f"command {c}")
            for c in issued
        ]
        commands_done_s = time.monotonic() - killed_at
        ran = wait_for(
            lambda: (s := fleet.request("stats"))["commands_executed"] >= options.commands and s,
            LIVENESS_S,
            "the agents to report their executions",
        )
        return {
            "serves_s": round(serves_s, 2),
            "relinked_s": round(relinked_s, 2),
            "agents_ready_s": round(agents_ready_s, 2),
            "commands_done_s": round(commands_done_s, 2),
            "commands_succeeded": sum(1 for s in states if s == "succeeded"),
            "commands_executed": int(ran["commands_executed"]),
            "duplicate_executions": int(ran["duplicate_executions"]),
        }
    finally:
        grid.stop()


def run_takeover_bench(options: TakeoverBenchOptions) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-takeover-") as tmp:
        root = Path(tmp)
        real = real_mongodb_uri()
        server = None if real is not None else Nx27017(root / "nx27017").start()
        try:
            uri = real if real is not None else server.uri  # type: ignore[union-attr]
            runs = []
            for n in range(options.runs):
                work = root / f"run-{n}"
                work.mkdir()
                runs.append(_one_run(work, uri, n, options))
        finally:
            if server is not None:
                server.stop()
    serves = [float(r["serves_s"]) for r in runs]
    once = all(
        r["commands_succeeded"] == options.commands
        and r["commands_executed"] == options.commands
        and r["duplicate_executions"] == 0
        for r in runs
    )
    summary = {
        f"{key}_{name}": round(fn([float(r[key]) for r in runs]), 2)
        for key in ("serves_s", "relinked_s", "agents_ready_s", "commands_done_s")
        for name, fn in (("p50", statistics.median), ("max", max))
    }
    return {
        "runs": options.runs,
        "agents": options.agents,
        "commands": options.commands,
        "store": "mongodb" if real is not None else "nx-27017",
        "each": runs,
        **summary,
        "every_command_once": once,
        "target_s": TARGET_S,
        "met": max(serves) <= TARGET_S and once,
    }


def takeover_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['runs']} takeovers, {r['agents']} agents, {r['commands']} commands each ({r['store']}); seconds after the "
        "leader's SIGKILL",
        f"{'run':<5} {'serves':>8} {'relay up':>9} {'agents':>8} {'commands':>9}  once",
    ]
    for n, run in enumerate(r["each"]):
        once = run["commands_executed"] == r["commands"] and run["duplicate_executions"] == 0
        lines.append(
            f"{n + 1:<5} {run['serves_s']:>8.2f} {run['relinked_s']:>9.2f} {run['agents_ready_s']:>8.2f} "
            f"{run['commands_done_s']:>9.2f}  {'yes' if once else 'NO'}"
        )
    lines.append(
        f"{'p50':<5} {r['serves_s_p50']:>8.2f} {r['relinked_s_p50']:>9.2f} {r['agents_ready_s_p50']:>8.2f} "
        f"{r['commands_done_s_p50']:>9.2f}"
    )
    lines.append(
        f"{'max':<5} {r['serves_s_max']:>8.2f} {r['relinked_s_max']:>9.2f} {r['agents_ready_s_max']:>8.2f} "
        f"{r['commands_done_s_max']:>9.2f}"
    )
    verdict = "met" if r["met"] else "MISSED"
    lines.append(f"target: the standby serves within {r['target_s']:g} s, every command once: {verdict}")
    return "\n".join(lines)

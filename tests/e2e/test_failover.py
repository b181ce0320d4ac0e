"""Issue 3, acceptance 2: a relay carrying 50 agents is SIGKILLed; all 50 are connected through another relay
within 10 s, and 20 commands issued during the failover each run exactly once.

50 agent processes would cost about a CPU-second each to start on these 2 cores, so the agents run in one fleet
process (``python -m bench.fleet_agents --control``): each is a real ``agent.daemon.Agent`` with its own certificate, its
own mutual-TLS WebSocket and the same relay connector, with simulated GPUs and a simulated container runtime. They
are enrolled beforehand through the Master's own enrollment code (bench/provision.py), which takes a second
instead of 50 enrollment round trips.

The fleet names its relays statically (``access_urls``; DNS discovery and failover across regions are covered by
test_geo.py). Both relays are listed, but relay-2 starts only once all 50 agents are on relay-1, so relay-1
carries them all when it dies.

"Exactly once" is checked on the agents' side: the fleet's simulated runtimes journal every create they carry
out, by command id, and the fleet reports how many distinct ids were carried out and how many more than once.
"""

from __future__ import annotations

import asyncio
import json
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.provision import provision_agents
from master.config import MasterConfig
from tests.support.grid import REPO, Daemon, Grid, wait_for

AGENTS = 50
COMMANDS = 20
COMMANDS_BEFORE_KILL = 5  # already on their way through relay-1 when it dies; the rest are issued after
FAILOVER_LIMIT_S = 10.0
FLEET_ANSWER_TIMEOUT_S = 30.0


class FleetProcess:
    """``python -m bench.fleet_agents --control``: JSON-line requests on its stdin, answers on its stdout."""

    def __init__(self, grid: Grid, agents_dir: Path, access_urls: list[str]) -> None:
        log = grid.logs / "fleet.log"
        args = [
            sys.executable,
            "-m",
            "bench.fleet_agents",
            "--control",
            "--agents-dir",
            str(agents_dir),
            "--simulate",
            "a10:1",
            "--log-level",
            "info",
        ]
        for url in access_urls:
            args += ["--access", url]
        with open(log, "ab") as err:
            self.process = subprocess.Popen(
                args, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, bufsize=0, start_new_session=True
            )
        self.daemon = Daemon("fleet", self.process, log)
        grid.daemons.append(self.daemon)  # grid.stop() kills it whatever happens
        loaded = self._answer("loaded")
        assert loaded["agents"] == AGENTS, loaded

    def request(self, op: str) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps({"op": op, "id": op}) + "\n").encode())
        return self._answer(op)

    def _answer(self, op: str) -> dict[str, Any]:
        stdout = self.process.stdout
        assert stdout is not None
        deadline = time.monotonic() + FLEET_ANSWER_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([stdout], [], [], left)
            line = stdout.readline() if readable else b""  # unbuffered: select sees every byte not yet read
            if not line:
                break
            answer = json.loads(line)
            if answer.get("op") == op:
                assert answer["ok"], answer
                return answer
        raise AssertionError(f"the fleet did not answer {op!r} within {FLEET_ANSWER_TIMEOUT_S} s\n{self.daemon.tail()}")


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    g = Grid(tmp_path)
    try:
        yield g
    finally:
        g.stop()


def relays_of(grid: Grid, agent_ids: list[str]) -> dict[str, str]:
    """agent id -> the relay the Master saw its last hello through, for agents the Master has ready."""
    wanted = set(agent_ids)
    return {
        a["id"]: a["relay"] for a in grid.get("/api/v1/agents")["items"] if a["id"] in wanted and a["state"] in ("ready", "busy")
    }


def all_on(grid: Grid, agent_ids: list[str], relay_id: str) -> bool:
    placed = relays_of(grid, agent_ids)
    return len(placed) == len(agent_ids) and set(placed.values()) == {relay_id}


def create(grid: Grid, agent_id: str, n: int) -> str:
    return grid.command(agent_id, "create_container", {"name": f"failover-{n}", "image": "none"})


def test_sigkill_of_a_relay_with_50_agents_moves_them_all_within_10_s_and_commands_run_once(grid, tmp_path):
    agents_dir = tmp_path / "fleet"
    provisioned = asyncio.run(provision_agents(MasterConfig(state_dir=str(grid.master_dir)), agents_dir, AGENTS))
    agent_ids = provisioned.agent_ids
    grid.start_master()
    relay_1 = grid.start_relay("relay-1", "eu-west")
    relay_2 = grid.plan_relay("relay-2", "eu-west")  # started once relay-1 carries everyone

    fleet = FleetProcess(grid, agents_dir, [relay_1.agent_url, relay_2.agent_url])
    fleet.request("start")
    wait_for(lambda: all_on(grid, agent_ids, "relay-1"), 30, f"all {AGENTS} agents on relay-1\n{fleet.daemon.tail()}")
    grid.start_relay("relay-2", "eu-west")

    targets = [agent_ids[(3 * n) % AGENTS] for n in range(COMMANDS)]  # 20 different agents
    command_ids = [create(grid, targets[n], n) for n in range(COMMANDS_BEFORE_KILL)]
    assert relay_1.daemon is not None
    relay_1.daemon.kill()  # SIGKILL
    killed_at = time.monotonic()
    command_ids += [create(grid, targets[n], n) for n in range(COMMANDS_BEFORE_KILL, COMMANDS)]

    wait_for(lambda: all_on(grid, agent_ids, "relay-2"), FAILOVER_LIMIT_S, f"all {AGENTS} agents on relay-2", interval=0.05)
    failover_s = time.monotonic() - killed_at
    print(f"\nfailover: {AGENTS} agents connected through relay-2 {failover_s:.2f} s after the SIGKILL of relay-1")
    assert failover_s <= FAILOVER_LIMIT_S

    results = [grid.wait_command(command_id, timeout=30) for command_id in command_ids]
    assert [r["state"] for r in results] == ["succeeded"] * COMMANDS, results
    ran = wait_for(
        lambda: (s := fleet.request("stats"))["commands_executed"] >= COMMANDS and s, 10, "the agents to report their executions"
    )
    assert (ran["commands_executed"], ran["duplicate_executions"], ran["failed_executions"]) == (COMMANDS, 0, 0), ran

    moves = grid.get("/api/v1/events?kind=agent.relay_changed")["items"]
    assert sorted(e["subject"] for e in moves) == sorted(agent_ids)
    assert {(e["data"]["old_relay"], e["data"]["new_relay"]) for e in moves} == {("relay-1", "relay-2")}

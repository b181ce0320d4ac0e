"""What the failover tests and ``python -m bench takeover`` share: a fleet of real agents in one process, two Masters
taking over from each other on one database, and reading which relay each agent is on.

``FleetProcess`` is ``python -m bench.fleet_agents --control``: each agent a real ``agent.daemon.Agent`` with its own
certificate, its own mutual-TLS WebSocket and the same relay connector, with simulated GPUs and a simulated container
runtime; it journals every create it carries out, by command id, so "exactly once" is checked on the agents' side."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common.errors import IdlegridError
from management.client.api import ApiClient, ApiRequest
from tests.support.grid import REPO, Daemon, Grid, RelayInfo, free_port, wait_for

FLEET_ANSWER_TIMEOUT_S = 30.0
MASTER_B = "master-b"
STEPPED_DOWN_EXIT = 75


class FleetProcess:
    """``python -m bench.fleet_agents --control``: JSON-line requests on its stdin, answers on its stdout."""

    def __init__(self, grid: Grid, agents_dir: Path, access_urls: list[str], agents: int) -> None:
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
        assert loaded["agents"] == agents, loaded

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


def relays_of(client: ApiClient, agent_ids: list[str]) -> dict[str, str]:
    """agent id -> the relay the Master (``client``'s) saw its last hello through, for agents it has ready."""
    wanted = set(agent_ids)
    return {a["id"]: a["relay"] for a in client.list("/api/v1/agents") if a["id"] in wanted and a["state"] in ("ready", "busy")}


def all_on(client: ApiClient, agent_ids: list[str], relay_id: str) -> bool:
    placed = relays_of(client, agent_ids)
    return len(placed) == len(agent_ids) and set(placed.values()) == {relay_id}


class MasterPair:
    """Two Master processes with ``ha`` on, one state directory (one CA, one set of signing keys), one database."""

    def __init__(self, grid: Grid, config: Path) -> None:
        self.grid = grid
        self.config = config
        self.api_b, self.link_b, self.links_b = free_port(), free_port(), free_port()
        self.daemons: dict[str, Daemon] = {}

    def api_url(self, name: str) -> str:
        return self.grid.api_url if name == "master" else f"http://127.0.0.1:{self.api_b}"

    def link_url(self, name: str) -> str:
        port = self.grid.link_port if name == "master" else self.link_b
        return f"wss://127.0.0.1:{port}/link"

    def start(self, name: str) -> Daemon:
        if name == "master":
            self.daemons[name] = self.grid.start_master("--config", str(self.config))
            return self.daemons[name]
        args = ["master", "--state-dir", str(self.grid.master_dir), "--api-port", str(self.api_b)]
        args += ["--link-port", str(self.link_b), "--links-port", str(self.links_b), "--heartbeat-s", "1.0"]
        args += ["--config", str(self.config)]
        self.daemons[name] = daemon = self.grid.spawn(name, "master", args)
        wait_for(lambda: self.health(name), 15, f"{name}'s API\n{daemon.tail()}")
        return daemon

    def health(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(ApiClient(self.api_url(name), None, timeout_s=2).health())
        except (IdlegridError, OSError):
            return None

    def role(self, name: str) -> str:
        health = self.health(name)
        return str(health["role"]) if health else "down"

    def client(self, name: str) -> ApiClient:
        return ApiClient.with_key_file(self.api_url(name), self.grid.operator_key_file)

    def serves(self, name: str) -> bool:
        try:
            return self.role(name) == "leader" and self.client(name).exchange(ApiRequest("GET", "/api/v1/agents"))[0] == 200
        except (IdlegridError, OSError):
            return False


def relay_counter(grid: Grid, relay: RelayInfo, name: str) -> float:
    """The sum of a relay metric's samples (0 when it has none yet)."""
    total = 0.0
    for line in grid.relay_metrics(relay).splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total

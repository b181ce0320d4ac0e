"""A grid of real processes for end-to-end tests: a Master, Access relays and agents, each its own process."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.pki import Role
from management.demo import kill_processes_under
from master.authority import Authority

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the thing polled may not be up yet
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last error: {last_error!r})")


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=10)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:]) if self.log.exists() else ""


@dataclass
class RelayInfo:
    relay_id: str
    region: str
    agent_port: int
    http_port: int
    daemon: Daemon | None = None

    @property
    def agent_url(self) -> str:
        return f"wss://127.0.0.1:{self.agent_port}"

    @property
    def http_url(self) -> str:
        return f"https://127.0.0.1:{self.http_port}"


@dataclass
class Grid:
    root: Path
    heartbeat_s: float = 1.0
    daemons: list[Daemon] = field(default_factory=list)
    relays: dict[str, RelayInfo] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.master_dir = self.root / "master"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.authority = Authority.open(self.master_dir)
        self.api_port = free_port()
        self.link_port = free_port()
        self.master: Daemon | None = None

    # --- processes -----------------------------------------------------------------------------

    def spawn(self, name: str, *args: str) -> Daemon:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "management.cli", *args], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        daemon = Daemon(name, process, log)
        self.daemons.append(daemon)
        return daemon

    def start_master(self, *extra: str) -> Daemon:
        self.master = self.spawn(
            "master", "master", "--state-dir", str(self.master_dir), "--api-port", str(self.api_port),
            "--link-port", str(self.link_port), "--heartbeat-s", str(self.heartbeat_s), *extra,
        )
        wait_for(lambda: self.get("/healthz", auth=False), 30, f"the Master to serve\n{self.master.tail()}")
        return self.master

    def start_relay(self, relay_id: str = "relay-1", region: str = "local") -> RelayInfo:
        relay = self.relays.get(relay_id) or RelayInfo(relay_id, region, free_port(), free_port())
        self.relays[relay_id] = relay
        cert, key, ca = self.authority.write_server_identity(self.root / "relays" / relay_id, Role.ACCESS, relay_id)
        relay.daemon = self.spawn(
            relay_id, "access", "--relay-id", relay_id, "--region", region, "--master-url",
            f"wss://127.0.0.1:{self.link_port}/link", "--agent-port", str(relay.agent_port), "--http-port",
            str(relay.http_port), "--cert", str(cert), "--key", str(key), "--ca", str(ca),
        )
        wait_for(lambda: self.relay_health(relay)["master_link"] == "up", 30, f"{relay_id} to link up\n{relay.daemon.tail()}")
        return relay

    def relay_health(self, relay: RelayInfo) -> dict:
        context = ssl.create_default_context(cafile=str(self.authority.ca_file))
        with urllib.request.urlopen(f"{relay.http_url}/healthz", timeout=2, context=context) as response:
            return json.loads(response.read())

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def enroll(self, name: str, relay: RelayInfo, token: str | None = None) -> subprocess.CompletedProcess:
        token = token or self.join_token()
        return subprocess.run(
            [sys.executable, "-m", "management.cli", "agent", "--state-dir", str(self.agent_dir(name)), "enroll",
             "--token", token, "--access", relay.http_url, "--ca-file", str(self.authority.ca_file),
             "--connect", relay.agent_url],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )

    def agent_id(self, name: str) -> str:
        return json.loads((self.agent_dir(name) / "identity.json").read_text())["agent_id"]

    def start_agent(self, name: str, *extra: str, simulate: str = "h100:2") -> Daemon:
        return self.spawn(name, "agent", "--state-dir", str(self.agent_dir(name)), "--simulate", simulate,
                          "--no-bandwidth", *extra)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            try:
                daemon.kill(signal.SIGTERM)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                daemon.kill(signal.SIGKILL)
            except Exception:
                pass
        kill_processes_under(self.root)

    # --- the management API --------------------------------------------------------------------

    @property
    def operator_key(self) -> str:
        return (self.master_dir / "operator.token").read_text().strip()

    def call(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> tuple[int, Any]:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.operator_key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def get(self, path: str, *, auth: bool = True) -> Any:
        status, body = self.call("GET", path, auth=auth)
        assert status == 200, (status, body)
        return body

    def join_token(self, provider: str = "prov-1", ttl_s: float = 600) -> str:
        status, body = self.call("POST", "/api/v1/tokens", {"provider": provider, "ttl_s": ttl_s})
        assert status == 201, body
        return body["token"]

    def agent(self, agent_id: str) -> dict:
        return self.get(f"/api/v1/agents/{agent_id}")

    def wait_state(self, agent_id: str, state: str, timeout: float = 20) -> dict:
        return wait_for(lambda: (a := self.agent(agent_id))["state"] == state and a, timeout, f"{agent_id} to be {state}")

    def command(self, agent_id: str, kind: str, spec: dict) -> str:
        status, body = self.call("POST", "/api/v1/commands", {"agent_id": agent_id, "kind": kind, "spec": spec})
        assert status == 202, body
        return body["id"]

    def wait_command(self, command_id: str, timeout: float = 30) -> dict:
        final = {"succeeded", "failed", "timed_out", "cancelled"}
        return wait_for(lambda: (c := self.get(f"/api/v1/commands/{command_id}"))["state"] in final and c, timeout,
                        f"command {command_id} to finish")

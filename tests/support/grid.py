"""A grid of real processes for end-to-end tests: a Master, Access relays and agents, each its own process."""

from __future__ import annotations

import asyncio
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

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


# Settings of relays and agents that redial within a second: tests wait for reconnections, not backoffs.
QUICK_RECONNECT = {"backoff_initial_s": 0.2, "backoff_max_s": 1.0}


def write_toml(path: Path, settings: dict[str, str | int | float | bool]) -> Path:
    """A flat TOML settings file (what ``--config`` takes), for settings no flag offers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items()))
    return path


def counted_spec(runs: Path, name: str, *, ignores_sigterm: bool = False) -> dict[str, Any]:
    """A process-runtime container that appends its pid to ``runs/<name>`` when it starts, then sleeps: the
    number of lines is the number of times the command ran. ``ignores_sigterm``: deleting it takes the
    delete's whole ``timeout_s`` (SIGKILL ends it), which keeps a delete command running that long.

    The pid is the host's: the command runs in a PID namespace of its own, where ``$$`` is small, so it reads its
    own /proc/self/stat (a redirection the shell itself opens, no child process), which the host's /proc numbers."""
    runs.mkdir(parents=True, exist_ok=True)
    trap = "trap '' TERM; " if ignores_sigterm else ""
    record = f"read -r pid _ < /proc/self/stat; echo $pid >> {runs / name}"
    return {"name": name, "image": "none", "command": ["sh", "-c", f"{trap}{record}; sleep 600"]}


def run_pids(runs: Path, name: str) -> list[int]:
    """The pids the container ``name`` of ``counted_spec`` started with, one per run."""
    path = runs / name
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


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

    def terminate(self, timeout: float = 10) -> int:
        """SIGTERM to the daemon alone (not its process group, so containers it started live on, as under a
        service manager) and wait for it to exit; its exit status."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def logged(self, text: str) -> bool:
        """Whether its log mentions ``text`` so far."""
        return self.log.exists() and text in self.log.read_text(errors="replace")

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
        self._master_extra: tuple[str, ...] = ()

    # --- processes -----------------------------------------------------------------------------

    def spawn(self, name: str, *args: str, environment: dict[str, str] | None = None) -> Daemon:
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "management.cli", *args],
                cwd=REPO,
                env={**os.environ, **(environment or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        daemon = Daemon(name, process, log)
        self.daemons.append(daemon)
        return daemon

    def start_master(self, *extra: str) -> Daemon:
        self._master_extra = extra
        self.master = self.spawn(
            "master",
            "master",
            "--state-dir",
            str(self.master_dir),
            "--api-port",
            str(self.api_port),
            "--link-port",
            str(self.link_port),
            "--heartbeat-s",
            str(self.heartbeat_s),
            *extra,
        )
        wait_for(lambda: self.get("/healthz", auth=False), 30, f"the Master to serve\n{self.master.tail()}")
        return self.master

    def restart_master(self) -> Daemon:
        """Start the Master again, as it was started last (same state directory, ports and flags)."""
        assert self.master is None or not self.master.alive(), "stop the Master first"
        return self.start_master(*self._master_extra)

    def start_relay(
        self,
        relay_id: str = "relay-1",
        region: str = "local",
        *,
        names: Sequence[str] = (),
        extra: Sequence[str] = (),
        wait_link: bool = True,
    ) -> RelayInfo:
        """Start (or restart, on the same ports) a relay; ``names``: host names its certificate holds besides
        localhost and 127.0.0.1, e.g. the target of its SRV record."""
        relay = self.plan_relay(relay_id, region)
        cert, key, ca = self.authority.write_server_identity(
            self.root / "relays" / relay_id, Role.ACCESS, relay_id, names=("localhost", *names)
        )
        relay.daemon = self.spawn(
            relay_id,
            "access",
            "--relay-id",
            relay_id,
            "--region",
            region,
            "--master-url",
            f"wss://127.0.0.1:{self.link_port}/link",
            "--agent-port",
            str(relay.agent_port),
            "--http-port",
            str(relay.http_port),
            "--cert",
            str(cert),
            "--key",
            str(key),
            "--ca",
            str(ca),
            *extra,
        )
        if wait_link:
            wait_for(lambda: self.relay_health(relay)["master_link"] == "up", 30, f"{relay_id} to link up\n{relay.daemon.tail()}")
        else:
            wait_for(lambda: self.relay_health(relay), 30, f"{relay_id} to serve\n{relay.daemon.tail()}")
        return relay

    def plan_relay(self, relay_id: str, region: str = "local") -> RelayInfo:
        """A relay's ports, chosen now for a relay started later by start_relay, so agents can be told its URL first."""
        return self.relays.setdefault(relay_id, RelayInfo(relay_id, region, free_port(), free_port()))

    def relay_health(self, relay: RelayInfo) -> dict:
        context = ssl.create_default_context(cafile=str(self.authority.ca_file))
        with urllib.request.urlopen(f"{relay.http_url}/healthz", timeout=2, context=context) as response:
            return json.loads(response.read())

    def relay_metrics(self, relay: RelayInfo) -> str:
        context = ssl.create_default_context(cafile=str(self.authority.ca_file))
        with urllib.request.urlopen(f"{relay.http_url}/metrics", timeout=2, context=context) as response:
            return response.read().decode()

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def enroll(self, name: str, relay: RelayInfo, token: str | None = None, *, region: str = "") -> subprocess.CompletedProcess:
        token = token or self.join_token()
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "management.cli",
                "agent",
                "--state-dir",
                str(self.agent_dir(name)),
                *(["--region", region] if region else []),
                "enroll",
                "--token",
                token,
                "--access",
                relay.http_url,
                "--ca-file",
                str(self.authority.ca_file),
                "--connect",
                relay.agent_url,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def agent_id(self, name: str) -> str:
        return json.loads((self.agent_dir(name) / "identity.json").read_text())["agent_id"]

    def start_agent(self, name: str, *extra: str, simulate: str = "h100:2") -> Daemon:
        """The process runtime, run as the agent's own user (process_user empty), so the containers the tests start
        can write where the test looks (pytest's directories are private to root)."""
        return self.spawn(
            name,
            "agent",
            "--state-dir",
            str(self.agent_dir(name)),
            "--simulate",
            simulate,
            "--no-bandwidth",
            "--runtime",
            "process",
            *extra,
            environment={"IDLEGRID_AGENT_PROCESS_USER": ""},
        )

    def run_agent(
        self, name: str, *, simulate: str = "a10:2", relay: str = "relay-1", **settings: str | int | float | bool
    ) -> tuple[str, Daemon]:
        """Enroll ``name`` (first time only), start it with ``settings`` (TOML, over quick reconnects) and wait
        until the Master has it ready; (agent id, daemon). Again for the same name: a restart, same settings."""
        if not (self.agent_dir(name) / "identity.json").exists():
            enrolled = self.enroll(name, self.relays[relay])
            assert enrolled.returncode == 0, enrolled.stderr
        config = self.root / "config" / f"{name}.toml"
        if settings or not config.exists():
            write_toml(config, {**QUICK_RECONNECT, **settings})
        daemon = self.start_agent(name, "--config", str(config), simulate=simulate)
        agent_id = self.agent_id(name)
        wait_for(lambda: self.agent(agent_id)["state"] in ("ready", "busy"), 30, f"{name} to be ready\n{daemon.tail()}")
        return agent_id, daemon

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
        return wait_for(
            lambda: (c := self.get(f"/api/v1/commands/{command_id}"))["state"] in final and c,
            timeout,
            f"command {command_id} to finish",
        )


HANDSHAKE_FAILURES = (ssl.SSLError, OSError, ConnectionClosed, InvalidHandshake, asyncio.TimeoutError)


async def refused(url: str, context: ssl.SSLContext) -> bool:
    """True when the relay will not carry frames for this client (handshake fails or it closes at once)."""
    try:
        async with connect(url, ssl=context, open_timeout=5) as ws:
            await ws.send(json.dumps({"type": "heartbeat", "seq": 1, "ts": 1.0}))
            await asyncio.wait_for(ws.recv(), timeout=3)
    except HANDSHAKE_FAILURES:
        return True
    return False

"""A grid of real processes for end-to-end tests: the local-grid launcher (management/devgrid/localgrid.py) with what
tests assert with (polling that fails as an assertion, the API as status and body, command helpers)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from management.client.api import ApiRequest
from management.devgrid.localgrid import Daemon, LocalGrid, RelayInfo, StartupFailed, free_port, wait_until
from master.states import FINAL_COMMAND_STATES

REPO = Path(__file__).resolve().parents[2]
TEST_PROVIDER = "prov-1"
FINISHED = frozenset(state.value for state in FINAL_COMMAND_STATES)  # a command's final states, as the API writes them

__all__ = [
    "REPO",
    "Daemon",
    "Grid",
    "RelayInfo",
    "free_port",
    "pid_alive",
    "refused",
    "run_pids",
    "running_grid",
    "wait_for",
    "write_toml",
]


def wait_for(predicate: Callable[..., Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; a test failure after ``timeout`` seconds.

    It is called with no arguments; ``...`` lets a loop bind its variable as a default (``lambda a=a: ...``), which
    mypy cannot check against ``Callable[[], Any]``."""
    try:
        return wait_until(predicate, timeout, what, interval_s=interval)
    except StartupFailed as exc:
        raise AssertionError(f"timed out: {exc}") from None


# Settings of relays and agents that redial within a second: tests wait for reconnections, not backoffs.
QUICK_RECONNECT = {"backoff_initial_s": 0.2, "backoff_max_s": 1.0}


@contextlib.contextmanager
def running_grid(
    root: Path, settings: Mapping[str, str | int | float | bool] | None = None, *, egress_allow: Sequence[str] = ()
) -> Iterator[Grid]:
    """A Master with ``settings`` (TOML; none: its defaults) and one relay, relay-1 in eu-west, as processes; all
    stopped afterwards. ``egress_allow``: the test's own servers on 127.0.0.1 (a moto store, a registry) that renters
    may name, allowed by name in the Master's config and in every agent's that ``run_agent`` starts."""
    g = Grid(root)
    g.egress_allow = list(egress_allow)
    master: dict[str, str | int | float | bool | list[str]] = dict(settings or {})
    if egress_allow:
        master["egress_allow"] = g.egress_allow
    try:
        g.start_master(*(("--config", str(write_toml(root / "master.toml", master))) if master else ()))
        g.start_relay("relay-1", "eu-west")
        yield g
    finally:
        g.stop()


def write_toml(path: Path, settings: Mapping[str, str | int | float | bool | list[str]]) -> Path:
    """A flat TOML settings file (what ``--config`` takes), for settings no flag offers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items()))
    return path


# Sets $me to "<pid> <start time> <PID namespace>" of the shell itself (no child process reads its /proc/self/stat),
# and $1.. to the fields of that stat. A sandboxed container sees only its own PID namespace: host_pid finds it.
WHO_AM_I = 'read -r stat < /proc/self/stat; set -- $stat; me="$1 ${22} $(readlink /proc/self/ns/pid)"'


def counted_spec(runs: Path, name: str, *, ignores_sigterm: bool = False) -> dict[str, Any]:
    """A process-runtime container that appends its pid to ``runs/<name>`` when it starts, then sleeps: the
    number of lines is the number of times the command ran. ``ignores_sigterm``: deleting it takes the
    delete's whole ``timeout_s`` (SIGKILL ends it), which keeps a delete command running that long.

    The command runs in PID and mount namespaces of its own with its own /proc, so it records its pid there (read
    from /proc/self/stat, a redirection the shell itself opens, no child process) and that namespace; ``run_pids``
    finds the host's pid from both."""
    runs.mkdir(parents=True, exist_ok=True)
    trap = "trap '' TERM; " if ignores_sigterm else ""
    record = f'{WHO_AM_I}; echo "$me" >> {runs / name}'
    return {"name": name, "image": "none", "command": ["sh", "-c", f"{trap}{record}; sleep 600"]}


def run_pids(runs: Path, name: str) -> list[int]:
    """The host pids the container ``name`` of ``counted_spec`` started with, one per run (0: that run has ended)."""
    path = runs / name
    lines = path.read_text().splitlines() if path.exists() else []
    return [host_pid(line) for line in lines]


def host_pid(me: str) -> int:
    """The host's pid of the process that wrote ``me`` with ``WHO_AM_I`` ("<pid> <start time> <PID namespace>", as its
    own /proc shows them), or 0 once it has ended. The start time tells it from a later process that got the same
    number in a namespace that got the same inode number."""
    pid, start, namespace = me.split()[:3]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "ns" / "pid") != namespace:
                continue
            status, stat = (entry / "status").read_text(), (entry / "stat").read_text()
        except OSError:
            continue
        nspids = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        if nspids and nspids[-1] == pid and stat.rsplit(")", 1)[1].split()[19] == start:
            return int(entry.name)
    return 0


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


class Grid(LocalGrid):
    """The launcher with agents' heartbeats every second, and the API seen the way tests assert on it."""

    heartbeat_s: float  # always given here (LocalGrid's None leaves the Master's default)

    def __init__(self, root: Path, heartbeat_s: float = 1.0) -> None:
        super().__init__(root, heartbeat_s=heartbeat_s)
        self.egress_allow: list[str] = []  # what running_grid allows its agents to reach (the test's own servers)

    @property
    def operator_key(self) -> str:
        return self.client.api_key or ""

    def call(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> tuple[int, Any]:
        """Status and JSON body of one API call, whatever the status."""
        client = self.client if auth else type(self.client)(self.api_url, None)
        return client.exchange(ApiRequest(method, path, body=body))

    def get(self, path: str, *, auth: bool = True) -> Any:
        status, body = self.call("GET", path, auth=auth)
        assert status == 200, (status, body)
        return body

    def join_token(self, provider: str = TEST_PROVIDER, ttl_s: float = 600) -> str:
        return super().join_token(provider, ttl_s)

    def agent(self, agent_id: str) -> dict[str, Any]:
        return dict(self.client.agent(agent_id))

    def start_agent(self, name: str, *extra: str, simulate: str = "h100:2", env: Mapping[str, str] | None = None) -> Daemon:
        """The process runtime, run as the agent's own user (process_user empty), so the containers the tests start
        can write where the test looks (pytest's directories are private to root)."""
        env = {"IDLEGRID_AGENT_PROCESS_USER": "", **(env or {})}
        return super().start_agent(name, "--runtime", "process", *extra, simulate=simulate, env=env)

    def start_podman_agent(self, name: str, podman: Any, *, simulate: str = "a10:1") -> Daemon:
        """An enrolled agent on the docker runtime against ``podman`` (tests.support.podman.PodmanService), whose GPU
        self-test runs its probe in the service's local image (its default image is on Docker Hub, out of reach)."""
        socket = ("--runtime", "docker", "--docker-socket", str(podman.socket_path))
        return self.start_agent(name, *socket, simulate=simulate, env={"IDLEGRID_AGENT_GPU_SELFTEST_IMAGE": podman.image})

    def run_agent(
        self,
        name: str,
        *,
        simulate: str = "a10:2",
        relay: str = "relay-1",
        env: Mapping[str, str] | None = None,
        **settings: str | int | float | bool,
    ) -> tuple[str, Daemon]:
        """Enroll ``name`` (first time only), start it with ``settings`` (TOML, over quick reconnects) and wait
        until the Master has it ready; (agent id, daemon). Again for the same name: a restart, same settings.
        ``env``: variables for the agent's process (they win over the TOML, e.g. IDLEGRID_AGENT_PROCESS_USER)."""
        if not self.enrolled(name):
            enrolled = self.enroll(name, self.relays[relay])
            assert enrolled.returncode == 0, enrolled.stderr
        config = self.root / "config" / f"{name}.toml"
        if settings or not config.exists():
            allowed = {"egress_allow": self.egress_allow} if self.egress_allow else {}
            write_toml(config, {**QUICK_RECONNECT, **allowed, **settings})
        daemon = self.start_agent(name, "--config", str(config), simulate=simulate, env=env)
        agent_id = self.agent_id(name)
        wait_for(lambda: self.agent(agent_id)["state"] in ("ready", "busy"), 30, f"{name} to be ready\n{daemon.tail()}")
        return agent_id, daemon

    def wait_state(self, agent_id: str, state: str, timeout: float = 20) -> dict[str, Any]:
        return wait_for(lambda: (a := self.agent(agent_id))["state"] == state and a, timeout, f"{agent_id} to be {state}")

    def command(self, agent_id: str, kind: str, spec: dict[str, Any]) -> str:
        return str(self.client.issue_command(agent_id, kind, spec)["id"])

    def wait_command(self, command_id: str, timeout: float = 30) -> dict[str, Any]:
        return wait_for(
            lambda: (c := self.client.command(command_id))["state"] in FINISHED and c,
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

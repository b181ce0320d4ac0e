"""The one local-grid launcher: a Master, Access relays and agents on this machine, each its own process.

Used by ``idlegrid demo``, the end-to-end tests (tests/support/grid.py) and the fleet benchmark. Everything a
grid keeps lives under one root directory: ``master/`` (store, CA, operator key), ``relays/<id>/`` (relay
certificates), ``agents/<name>/`` (agent state), ``logs/<name>.log`` and ``ports.json``. The ports are chosen
once and kept in ``ports.json``, so a grid started again on the same root listens where its enrolled agents
expect it. Daemons stop in the reverse order of the links they hold: agents first (their goodbyes go through
relays still linked), then relays (they hand the Master what they buffered), then the Master.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from common.errors import IdlegridError
from common.files import write_atomically
from common.pki import CertRole
from management.client.api import ApiClient, ApiError, instant
from management.devgrid.lighthouse import Lighthouse
from master.port import Authority

T = TypeVar("T")

HOST = "127.0.0.1"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1
PORTS_FILE = "ports.json"
OPERATOR_KEY_FILE = "operator.token"
AGENT_IDENTITY_FILE = "identity.json"
READY_STATES = frozenset({"ready", "busy"})
SLIRP4NETNS = "slirp4netns"  # the process runtime's way out of a sandboxed container's network namespace
# Stop order: an agent's goodbye must cross a linked relay, and a relay hands its buffer to a running Master.
STOP_ORDER = ("agent", "relay", "master", "other")
CLI = ("management.cli",)


class PortInUse(IdlegridError):
    code = "port_in_use"


class StartupFailed(IdlegridError):
    code = "startup_failed"


# Ports handed to daemons come from below the kernel's ephemeral range (where it puts the outgoing connections of
# every process), so no client can take a port between the moment it is chosen here and the moment a daemon binds it.
LISTEN_PORTS = (20000, 32767)
_handed_out: set[int] = set()  # never the same port twice from one process, though the first daemon has not bound yet
# Between processes (test workers side by side, each with grids of its own) a port chosen and not yet bound, or
# kept for a daemon that is restarted, is claimed by a lock on the byte at offset PORT of one shared file: the
# kernel holds it for the life of the process that chose the port and lets it go however that process ends.
RESERVATIONS_FILE = Path(tempfile.gettempdir()) / "idlegrid-ports.lock"
_reservations: list[int] = []  # the open file (at most one: closing any descriptor of it would drop every lock)


def _reservations_fd() -> int | None:
    if not _reservations:
        try:
            fd = os.open(RESERVATIONS_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except OSError:
            return None  # a file of another user's, unwritable: ports are then only checked, not claimed
        _reservations.append(fd)
    return _reservations[0]


def reserve_port(port: int) -> bool:
    """Claim ``port`` for this process against every other process that chooses ports here; False when one holds it."""
    fd = _reservations_fd()
    if fd is None:
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, port, os.SEEK_SET)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return False
        raise
    return True


def free_port() -> int:
    """A port nothing listens on and no other process has chosen, from ``LISTEN_PORTS``."""
    low, high = LISTEN_PORTS
    for _ in range(1000):
        port = random.randint(low, high)
        if port not in _handed_out and port_is_free(port) and reserve_port(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port between {low} and {high}")


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now (SO_REUSEADDR, as the daemons bind: TIME_WAIT is no obstacle)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
            raise
    return True


def wait_until(probe: Callable[[], T], timeout_s: float, what: str, *, interval_s: float = POLL_S) -> T:
    """Poll ``probe`` until it returns something truthy (exceptions count as "not yet"); StartupFailed after the time."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # the thing polled may not be up yet
            last_error = exc
        time.sleep(interval_s)
    raise StartupFailed(f"{what} did not happen within {timeout_s:g} s (last error: {last_error!r})")


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (when the process started, in clock ticks), or None if there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[19])  # the command's name may hold spaces and parentheses


def kill_recorded_containers(root: Path) -> set[str]:
    """SIGKILL each process-runtime container its agents' records under ``root`` name (``agents/*/containers/*.json``:
    the shim, init of the container's PID namespace, so the kernel ends the rest of it; and its slirp4netns), each
    only while its pid is still the recorded process (its start time); the pids killed. A sandboxed container (root's
    agent) runs in a mount namespace of its own, where its working directory reads ``/idlegrid/work``: the sweep by
    working directory never found it, and each grid stopped left its sandboxed workers running."""
    killed: set[str] = set()
    for path in sorted(root.glob("agents/*/containers/*.json")):
        try:
            record = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        for pid_key, ticks_key in (("pid", "start_ticks"), ("slirp_pid", "slirp_start_ticks")):
            pid, ticks = record.get(pid_key), record.get(ticks_key)
            if isinstance(pid, int) and pid > 1 and ticks is not None and _start_ticks(pid) == ticks:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(str(pid))
                except OSError:
                    pass
    return killed


def kill_processes_under(root: Path) -> None:
    """Process-runtime containers outlive their agent by design; stopping a grid stops those run under its root (by
    their agents' records, ``kill_recorded_containers``, and by working directory), and the slirp4netns of each (a
    sandboxed container's way out runs from a sandbox root of its own, not from under the grid's, and would otherwise
    outlive the container it served: ``slirp4netns ... PID tap0``)."""
    root_text = str(root.resolve())
    killed = kill_recorded_containers(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if os.readlink(entry / "cwd").startswith(root_text):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.add(entry.name)
        except OSError:
            pass
    for entry in Path("/proc").iterdir():
        try:
            args = [a.decode() for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            if entry.name.isdigit() and len(args) >= 3 and Path(args[0]).name == SLIRP4NETNS and args[-2] in killed:
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, UnicodeDecodeError):
            pass


@dataclass
class Daemon:
    """One process of the grid, in a session of its own (Ctrl-C reaches the launcher, which stops it in order)."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    role: str = "other"  # agent, relay or master: what decides when it stops (STOP_ORDER)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """``sig`` to its whole process group, then wait for it."""
        if self.alive():
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=timeout_s)

    def terminate(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM to the daemon alone (containers it started live on, as under a service manager); its exit status."""
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def logged(self, text: str) -> bool:
        return self.log.exists() and text in self.log.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def last_words(self) -> str:
        """The last line of its log that says something (a JSON log line's message), for a one-line error."""
        for line in reversed(self.tail(20).splitlines()):
            line = line.strip()
            if not line:
                continue
            try:
                entry = json.loads(line)
            except ValueError:
                return line
            return str(entry.get("msg", line)) if isinstance(entry, dict) else line
        return "no output"


@dataclass
class RelayInfo:
    relay_id: str
    region: str
    agent_port: int
    http_port: int
    daemon: Daemon | None = None

    @property
    def agent_url(self) -> str:
        return f"wss://{HOST}:{self.agent_port}"

    @property
    def http_url(self) -> str:
        return f"https://{HOST}:{self.http_port}"


@dataclass
class Ports:
    """The grid's ports, chosen once and kept under the root so a restarted grid listens where agents expect it."""

    api_port: int
    link_port: int
    relays: dict[str, RelayInfo] = field(default_factory=dict)
    links_port: int = 0  # the workloads' links (docs/links.md); 0 in a file from before links had a port: chosen now
    services: dict[str, int] = field(default_factory=dict)  # other servers of the grid by name (the demo's object store)

    def __post_init__(self) -> None:
        if not self.links_port:
            self.links_port = free_port()

    @classmethod
    def load(cls, path: Path) -> Ports:
        if not path.exists():
            return cls(free_port(), free_port())
        data = json.loads(path.read_text())
        relays = {
            rid: RelayInfo(rid, r["region"], int(r["agent_port"]), int(r["http_port"])) for rid, r in data["relays"].items()
        }
        services = {str(name): int(port) for name, port in data.get("services", {}).items()}
        ports = cls(int(data["api_port"]), int(data["link_port"]), relays, int(data.get("links_port", 0)), services)
        for port in ports.all():
            reserve_port(port)  # kept for this grid; held by another process, it is check_ports that says so at start
        return ports

    def all(self) -> list[int]:
        relays = [port for r in self.relays.values() for port in (r.agent_port, r.http_port)]
        return [self.api_port, self.link_port, self.links_port, *relays, *self.services.values()]

    def save(self, path: Path) -> None:
        relays = {
            r.relay_id: {"region": r.region, "agent_port": r.agent_port, "http_port": r.http_port} for r in self.relays.values()
        }
        data = {
            "api_port": self.api_port,
            "link_port": self.link_port,
            "links_port": self.links_port,
            "relays": relays,
            "services": self.services,
        }
        write_atomically(path, json.dumps(data, indent=2).encode())


class LocalGrid:
    """Starts and stops the processes of one grid under ``root``; ``client`` calls its API as the operator."""

    def __init__(self, root: Path, *, api_port: int | None = None, heartbeat_s: float | None = None) -> None:
        self.root = root.resolve()
        self.master_dir = self.root / "master"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.authority = Authority.open(self.master_dir)
        self.ports = Ports.load(self.root / PORTS_FILE)
        if api_port is not None:
            self.ports.api_port = api_port
        self.ports.save(self.root / PORTS_FILE)
        self.heartbeat_s = heartbeat_s
        self.daemons: list[Daemon] = []
        self.master: Daemon | None = None
        self._master_launch: tuple[tuple[str, ...], tuple[str, ...], dict[str, str]] = (CLI, (), {})
        self._client: ApiClient | None = None
        self.lighthouse: Lighthouse | None = None

    # --- where things are ---------------------------------------------------------------------------

    @property
    def api_port(self) -> int:
        return self.ports.api_port

    @property
    def link_port(self) -> int:
        return self.ports.link_port

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    @property
    def links_url(self) -> str:
        """Where the workloads' links are served (a listener of their own, never the API's origin)."""
        return f"http://{HOST}:{self.ports.links_port}"

    @property
    def relays(self) -> dict[str, RelayInfo]:
        return self.ports.relays

    @property
    def ca_file(self) -> Path:
        return self.authority.ca_file

    @property
    def operator_key_file(self) -> Path:
        return self.master_dir / OPERATOR_KEY_FILE

    @property
    def client(self) -> ApiClient:
        """The operator's API client (the key exists once the Master has started)."""
        if self._client is None:
            self._client = ApiClient.with_key_file(self.api_url, self.operator_key_file)
        return self._client

    def service_port(self, name: str, preferred: int | None = None) -> int:
        """The port of the grid's server ``name``, chosen on first use (``preferred`` when it is free) and kept."""
        port = self.ports.services.get(name)
        if port is None:
            free = preferred is not None and port_is_free(preferred) and reserve_port(preferred)
            port = self.ports.services[name] = preferred if free and preferred is not None else free_port()
            self.ports.save(self.root / PORTS_FILE)
        return port

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def enrolled(self, name: str) -> bool:
        return (self.agent_dir(name) / AGENT_IDENTITY_FILE).exists()

    def agent_id(self, name: str) -> str:
        return str(json.loads((self.agent_dir(name) / AGENT_IDENTITY_FILE).read_text())["agent_id"])

    # --- processes ----------------------------------------------------------------------------------

    def spawn(
        self, name: str, role: str, args: Sequence[str], *, program: Sequence[str] = CLI, env: Mapping[str, str] | None = None
    ) -> Daemon:
        """``python -m PROGRAM ARGS`` in a session of its own, its output appended to logs/NAME.log."""
        log = self.logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", *program, *args],
                env={**os.environ, **(env or {})},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        daemon = Daemon(name, process, log, role)
        self.daemons.append(daemon)
        return daemon

    def check_ports(self, ports: Mapping[int, str]) -> None:
        """PortInUse, naming the port and what it is for, when another process holds one of ``ports``."""
        for port, what in ports.items():
            if not port_is_free(port):
                raise PortInUse(
                    f"port {port} ({what}) is in use by another process; stop it, or remove {self.root / PORTS_FILE} "
                    "to let the grid choose new ports"
                )

    def start_master(
        self, *extra: str, program: Sequence[str] = CLI, env: Mapping[str, str] | None = None, timeout_s: float = START_TIMEOUT_S
    ) -> Daemon:
        """Start the Master and wait until its API answers."""
        self.check_ports(
            {
                self.api_port: "the Master's API",
                self.link_port: "the Master's relay link",
                self.ports.links_port: "the Master's links",
            }
        )
        self._master_launch = (tuple(program), tuple(extra), dict(env or {}))
        args = ["master", "--state-dir", str(self.master_dir), "--api-port", str(self.api_port)]
        args += ["--link-port", str(self.link_port), "--links-port", str(self.ports.links_port)]
        if self.heartbeat_s is not None:
            args += ["--heartbeat-s", str(self.heartbeat_s)]
        self.master = master = self.spawn("master", "master", [*args, *extra], program=program, env=env)
        self._wait_serving(master, lambda: self.health(), "the Master's API", timeout_s)
        return master

    def restart_master(self) -> Daemon:
        """Start the Master again as it was started last (same state directory, ports, flags)."""
        if self.master is not None and self.master.alive():
            raise IdlegridError("stop the Master before restarting it")
        program, extra, env = self._master_launch
        return self.start_master(*extra, program=program, env=env)

    def start_lighthouse(self) -> Lighthouse:
        """A gang overlay's lighthouse namespace under ``lighthouse/`` (ending first what an earlier launcher left
        there); list its ``endpoint`` in the Master's ``[overlay]``, then ``run_lighthouse`` once the Master is up.
        ``stop`` closes it. Needs what ``lighthouse_unavailable()`` checks."""
        workdir = self.root / "lighthouse"
        if workdir.exists():
            kill_processes_under(workdir)
        self.lighthouse = Lighthouse(workdir)  # set first: a stop during start closes what was made
        return self.lighthouse.start()

    def run_lighthouse(self) -> Lighthouse:
        """Issue the lighthouse from the Master's overlay CA and run its nebula (log: logs/lighthouse.log)."""
        if self.lighthouse is None:
            raise IdlegridError("start_lighthouse first: the Master's config lists its endpoint")
        self.lighthouse.run(self.master_dir, self.logs / "lighthouse.log")
        return self.lighthouse

    def plan_relay(self, relay_id: str, region: str = "local") -> RelayInfo:
        """A relay's ports, chosen now (and kept) for a relay started later, so agents can be told its URL first."""
        relay = self.ports.relays.get(relay_id)
        if relay is None:
            relay = self.ports.relays[relay_id] = RelayInfo(relay_id, region, free_port(), free_port())
            self.ports.save(self.root / PORTS_FILE)
        return relay

    def start_relay(
        self,
        relay_id: str = "relay-1",
        region: str = "local",
        *,
        names: Sequence[str] = (),
        extra: Sequence[str] = (),
        wait_link: bool = True,
        program: Sequence[str] = (*CLI, "access"),
        env: Mapping[str, str] | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> RelayInfo:
        """Start (or restart, on the same ports) a relay and wait until it serves (and, by default, has linked
        to the Master); ``names``: host names its certificate holds besides localhost and 127.0.0.1."""
        relay = self.plan_relay(relay_id, region)
        self.check_ports({relay.agent_port: f"{relay_id}'s agent port", relay.http_port: f"{relay_id}'s HTTPS port"})
        cert, key, ca = self.authority.write_server_identity(
            self.root / "relays" / relay_id, CertRole.ACCESS, relay_id, names=("localhost", *names)
        )
        args = ["--relay-id", relay_id, "--region", relay.region, "--master-url", f"wss://{HOST}:{self.link_port}/link"]
        args += ["--agent-port", str(relay.agent_port), "--http-port", str(relay.http_port)]
        args += ["--cert", str(cert), "--key", str(key), "--ca", str(ca), *extra]
        relay.daemon = daemon = self.spawn(relay_id, "relay", args, program=program, env=env)
        if wait_link:
            self._wait_serving(daemon, lambda: self.relay_health(relay)["master_link"] == "up", f"{relay_id}'s link", timeout_s)
        else:
            self._wait_serving(daemon, lambda: self.relay_health(relay), relay_id, timeout_s)
        return relay

    def enroll(
        self, name: str, relay: RelayInfo, token: str | None = None, *, region: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """``idlegrid agent enroll`` for agent ``name`` through ``relay`` (a fresh join token unless one is given)."""
        token = token or self.join_token()
        args = ["agent", "enroll", "--state-dir", str(self.agent_dir(name)), "--token", token]
        args += ["--access", relay.http_url, "--ca-file", str(self.ca_file), "--connect", relay.agent_url]
        if region:
            args += ["--region", region]
        return subprocess.run(
            [sys.executable, "-m", *CLI, *args],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S * 2,
            stdin=subprocess.DEVNULL,
        )

    def start_agent(self, name: str, *extra: str, simulate: str = "h100:2", env: Mapping[str, str] | None = None) -> Daemon:
        """Start an enrolled agent with simulated GPUs (bandwidth not measured: no speed test on every start)."""
        args = ["agent", "--state-dir", str(self.agent_dir(name)), "--simulate", simulate, "--no-bandwidth", *extra]
        return self.spawn(name, "agent", args, env=env)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Agents, then relays, then the Master (``stop_daemons``); then the lighthouse, and whatever still runs from
        under the root (process-runtime containers, ``kill_processes_under``)."""
        self.stop_daemons(timeout_s)
        self.stop_lighthouse()
        kill_processes_under(self.root)

    def stop_lighthouse(self) -> None:
        """The lighthouse, after the Master: nothing hands it out any more."""
        if self.lighthouse is not None:
            self.lighthouse.close()

    def stop_daemons(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Agents, then relays, then the Master: each group gets SIGTERM and up to ``timeout_s`` before SIGKILL."""
        for role in STOP_ORDER:
            group = [d for d in self.daemons if d.role == role and d.alive()]
            for daemon in group:
                try:
                    os.killpg(daemon.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            for daemon in group:
                try:
                    daemon.process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    daemon.kill(signal.SIGKILL)

    # --- what the grid says about itself ------------------------------------------------------------

    def health(self) -> Any:
        return ApiClient(self.api_url, None, timeout_s=2).health()

    def relay_health(self, relay: RelayInfo) -> Any:
        return json.loads(self._relay_get(relay, "/healthz"))

    def relay_metrics(self, relay: RelayInfo) -> str:
        return self._relay_get(relay, "/metrics")

    def _relay_get(self, relay: RelayInfo, path: str) -> str:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        with urllib.request.urlopen(f"{relay.http_url}{path}", timeout=2, context=context) as response:
            return str(response.read().decode())

    def join_token(self, provider: str = "local-provider", ttl_s: float = 600.0) -> str:
        """A join token for ``provider``, whose account is created first if it does not exist yet."""
        self.ensure_provider(provider)
        return str(self.client.create_join_token(provider, ttl_s=ttl_s)["token"])

    def ensure_provider(self, provider: str) -> None:
        """Create the provider account ``provider`` unless it exists (a join token must name one)."""
        self.ensure_account(provider, "provider")

    def ensure_account(self, account_id: str, role: str) -> None:
        """Create the account ``account_id`` with ``role`` unless it exists (its role is then left as it is)."""
        try:
            self.client.create_account(account_id, role, name=account_id)
        except ApiError as exc:
            if exc.status != 409:  # 409: it exists, as on a second run over the same state directory
                raise

    def ready_agents(self, agent_ids: Sequence[str], *, since: float = 0.0) -> set[str]:
        """Those of ``agent_ids`` the Master has ready (or busy) over a connection made at or after ``since``: a
        state left in the store by an earlier run does not count."""
        wanted = set(agent_ids)
        ready = set()
        for agent in self.client.list("/api/v1/agents"):
            connected = instant(agent.get("connected_since")) or 0.0
            if agent["id"] in wanted and agent["state"] in READY_STATES and connected >= since:
                ready.add(agent["id"])
        return ready

    def wait_agents_ready(self, agent_ids: Sequence[str], *, since: float = 0.0, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until every one of ``agent_ids`` is ready; StartupFailed names the missing ones and an agent that died."""
        deadline = time.monotonic() + timeout_s
        missing = set(agent_ids)
        while time.monotonic() < deadline:
            dead = [d for d in self.daemons if d.role == "agent" and not d.alive()]
            if dead:
                raise StartupFailed(f"agent {dead[0].name} exited: {dead[0].last_words()} (log: {dead[0].log})")
            try:
                missing = set(agent_ids) - self.ready_agents(agent_ids, since=since)
            except IdlegridError:
                pass  # the API answers once the Master is up; the deadline bounds the wait
            if not missing:
                return
            time.sleep(POLL_S * 2)
        names = ", ".join(sorted(missing))
        raise StartupFailed(f"{len(missing)} agent(s) not ready within {timeout_s:g} s: {names}; logs in {self.logs}")

    def _wait_serving(self, daemon: Daemon, probe: Callable[[], object], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not daemon.alive():
                raise StartupFailed(f"{daemon.name} exited at start: {daemon.last_words()} (log: {daemon.log})")
            try:
                if probe():
                    return
            except Exception:  # not serving yet
                pass
            time.sleep(POLL_S)
        raise StartupFailed(f"{what} did not come up within {timeout_s:g} s (log: {daemon.log})")

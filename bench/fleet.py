"""``python -m bench fleet``: a Master, Access relays and a simulated fleet, measured under load.

What happens, in order (every process is ours and is stopped at the end, whatever happens):

1. N agents are enrolled through the Master's own enrollment code (``bench.provision``).
2. Baseline: one fleet process with the flood agents dials a plain websockets echo server with the
   relay's TLS settings (``bench.echo``) and floods heartbeats: echoed messages per second.
3. The Master and the relays start on the embedded store; then the fleet processes, which load
   their agents and wait. Memory and CPU of every process are read here.
4. Ramp: every agent dials its relay at ``connect_rate``; ``ready_s`` is until the last welcome.
5. Hold for ``duration`` seconds: heartbeats and telemetry at the Master's intervals, commands through
   the management API at ``cmd_rate`` (create, then delete once it succeeded), the round trip of each
   timed from the API call to the final state; the relay buffers and the kernel's socket queues are
   sampled throughout for backlog.
6. Flood: the flood agents send heartbeats as fast as ``flood_rate`` asks through the relays; frames
   the relays delivered to the Master per second, against the echo baseline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import multiprocessing
import os
import shutil
import signal
import ssl
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench.competitor import CpuCompetitor
from bench.fleet_agents import AGENT_DIR_FORMAT
from bench.procs import BenchProcess, read_usage, spawn
from bench.profile import Profiler
from bench.provision import provision_agents
from bench.sockets import queued_bytes
from common.pki import CertRole
from management.client.api import ApiError, AsyncApiClient, read_key_file
from management.devgrid.localgrid import Daemon, LocalGrid, free_port
from master.config import MasterConfig

FINAL_STATES = frozenset({"succeeded", "failed", "timed_out", "cancelled"})
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 120.0
COMMAND_WAIT_S = 10.0  # the longest one read of a command waits for it (the API allows 20)
COMMAND_TIMEOUT_S = 30.0
SAMPLE_EVERY_S = 1.0
SETTLE_S = 2.0
DRAIN_TIMEOUT_S = 60.0
PACE_TIMEOUT_S = 90.0  # the longest the hold waits for the full report pace after the ramp
PACE_WINDOW_S = 5.0  # the fleet's sending rate is measured over this long
FULL_PACE_SHARE = 0.9  # of the expected rate: a fleet still at a pace factor of 1.125 sends 89 % of it
# From this many agents on, the simulated fleet runs in one process per relay. 10,000 agents in one Python process
# (3,000 frames a second over 10,000 TLS links, half a core) were the slowest stage of the quiet hold's command tail:
# its slowest commands waited in that process (``agent_run``, ``to_agent``: p99 102-133 ms where the grid's own
# phases were far under; bench/HISTORY.md), a wait 10,000 separate hosts would not add.
SPLIT_FROM_AGENTS = 5_000
DRAINED_BYTES = 64 * 1024  # queued on the links to the Master, in all: a few hundred frames at most


@dataclass
class FleetOptions:
    agents: int = 500
    gpus_per_agent: int = 8
    gpu_model: str = "h100"
    duration: float = 30.0  # the hold, after every agent is ready
    relays: int = 2
    fleet_procs: int = 0  # processes the simulated fleet runs in; 0: ``processes`` chooses
    connect_rate: float = 500.0
    heartbeat_s: float = 5.0
    telemetry_s: float = 10.0
    cmd_rate: float = 5.0  # creates per second; each successful create is followed by a delete
    latency_ms: float = 20.0
    jitter_ms: float = 5.0
    failure_rate: float = 0.0
    flood_seconds: float = 5.0
    flood_agents: int = 500
    flood_rate: float = 20_000.0  # heartbeats per second asked of the flood agents in all
    baseline: bool = True
    ready_timeout: float = 0.0  # 0: 60 s + 10 ms per agent
    work_dir: str = ""
    keep: bool = False
    log_level: str = "warning"
    profile_dir: str = ""  # py-spy every process during the ramp and the hold: raw stacks and a summary here
    relay_tls_buffer_kib: int = 0  # 0: the relay's own TLS read buffer (access/daemon.py); else this, to compare
    fold_interval_s: float | None = None  # the relays' fold_interval_s (0: folding off); None: the relay's default
    sample_s: float = 0.0  # backlog sampling period in the hold; 0: 1 s per 2,000 agents (/proc/net/tcp grows with N)
    competitor_share: float = 0.0  # overload: a process per core spinning this share of it for the whole run (0: none)
    storm: bool = False  # at the end, SIGKILL relay-1: its agents fail over to the others (a reconnect storm)
    storm_timeout: float = 120.0  # how long the storm phase waits for every agent to be back
    # The Master alone behind this many simulated relays (bench/fleet_sim.py), each with ``agents_per_relay`` agents
    # sending what a real relay's agents send (0: the real relays and agents above).
    relays_simulated: int = 0
    agents_per_relay: int = 10_000

    @property
    def processes(self) -> int:
        """How many processes run the simulated agents: ``fleet_procs`` when set; otherwise one per relay from
        ``SPLIT_FROM_AGENTS`` agents on (each then holds one relay's agents), one below."""
        if self.fleet_procs > 0:
            return self.fleet_procs
        return max(1, self.relays) if self.agents >= SPLIT_FROM_AGENTS else 1

    @property
    def simulate(self) -> str:
        """Every agent's GPUs, or, for a comma-separated ``gpu_model`` ("h100,mi300x"), the agents' in turn by index
        (bench/fleet_agents.py ``host_gpus``): a fleet of mixed vendors."""
        return "|".join(f"{model.strip()}:{self.gpus_per_agent}" for model in self.gpu_model.split(","))

    @property
    def flood_size(self) -> int:
        return max(1, min(self.flood_agents, self.agents))


# --- one fleet process, driven over JSON lines -------------------------------------------------


class FleetDriver:
    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log
        self._ids = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._loaded: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(), name=f"{name}-reader")
        self.readings: dict[str, Any] = {}

    @classmethod
    async def spawn(cls, name: str, args: list[str], logs: Path, module: str = "bench.fleet_agents") -> FleetDriver:
        """``module``: bench.fleet_agents (real agents), or bench.relay_sim (a simulated relay and its agents), which
        answer the same requests."""
        log = logs / f"{name}.log"
        with open(log, "ab") as err:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                module,
                "--control",
                *args,
                cwd=Path(__file__).resolve().parents[1],
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                limit=1 << 20,
            )
        return cls(name, process, log)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def loaded(self, timeout: float) -> dict[str, Any]:
        try:
            return await asyncio.wait_for(asyncio.shield(self._loaded), timeout)
        except TimeoutError:
            raise RuntimeError(f"{self.name} did not load its agents in {timeout:.0f} s; see {self.log}") from None

    async def request(self, op: str, timeout: float = REQUEST_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        self._ids += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[self._ids] = future
        assert self.process.stdin is not None
        self.process.stdin.write((json.dumps({"op": op, "id": self._ids, **fields}) + "\n").encode())
        await self.process.stdin.drain()
        try:
            answer = await asyncio.wait_for(future, timeout)
        finally:
            self._waiting.pop(self._ids, None)
        if not answer.get("ok"):
            raise RuntimeError(f"{self.name} refused {op}: {answer.get('error')}")
        return answer

    async def stop(self, timeout: float = 30.0) -> None:
        """Ask it to stop its agents (closing handshakes and all), then make sure it is gone."""
        if self.process.returncode is None and self.process.stdin is not None:
            try:
                self.process.stdin.write(b'{"op": "stop"}\n')
                await self.process.stdin.drain()
                self.process.stdin.close()
                await asyncio.wait_for(self.process.wait(), timeout)
            except (TimeoutError, ConnectionError, BrokenPipeError):
                pass
        if self.process.returncode is None:
            try:
                os.killpg(self.process.pid, 9)
            except ProcessLookupError:
                pass
            await self.process.wait()
        self._reader.cancel()

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if answer.get("op") == "loaded" and not self._loaded.done():
                self._loaded.set_result(answer)
            future = self._waiting.get(answer.get("id"))
            if future is not None and not future.done():
                future.set_result(answer)
        if not self._loaded.done():
            self._loaded.set_exception(RuntimeError(f"{self.name} exited before loading its agents; see {self.log}"))
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(RuntimeError(f"{self.name} exited; see {self.log}"))


# --- the grid under test -----------------------------------------------------------------------


@dataclass
class RelayCounters:
    frames_in: float = 0.0
    dropped: float = 0.0  # superseded or evicted on the way to the Master
    buffered: float = 0.0
    agents: float = 0.0

    def __add__(self, other: RelayCounters) -> RelayCounters:
        return RelayCounters(
            self.frames_in + other.frames_in,
            self.dropped + other.dropped,
            self.buffered + other.buffered,
            self.agents + other.agents,
        )

    @property
    def delivered(self) -> float:
        """Frames that have gone to the Master: taken in, not dropped, no longer waiting."""
        return self.frames_in - self.dropped - self.buffered


def parse_master_intake(text: str) -> dict[str, float]:
    """The Master's intake series (issue 29): telemetry shed there, the report pace, bytes waiting per lane; a Master
    without them gives {}."""
    figures: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(("idlegrid_master_", "idlegrid_store_write_seconds_count")):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("idlegrid_master_telemetry_shed_total"):
            figures["shed"] = figures.get("shed", 0.0) + float(value)
        elif name == "idlegrid_master_report_pace_factor":
            figures["pace_factor"] = float(value)
        elif name == "idlegrid_master_intake_frames_total":
            figures["link_frames"] = float(value)
        elif name.startswith("idlegrid_master_frames_received_total"):
            figures["agent_frames"] = figures.get("agent_frames", 0.0) + float(value)
        elif name.startswith("idlegrid_store_write_seconds_count"):
            figures["store_writes"] = figures.get("store_writes", 0.0) + float(value)
        elif name.startswith("idlegrid_master_intake_bytes"):
            lane = name.partition('lane="')[2].partition('"')[0]
            figures[f"{lane}_bytes"] = float(value)
    return figures


def parse_relay_metrics(text: str) -> RelayCounters:
    counters = RelayCounters()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0]
        if metric == "idlegrid_access_frames_in_total":
            counters.frames_in += float(value)
        elif metric == "idlegrid_access_frames_dropped_total" and ('reason="superseded"' in name or 'reason="evicted"' in name):
            counters.dropped += float(value)
        elif metric == "idlegrid_access_buffered_frames":
            counters.buffered += float(value)
        elif metric == "idlegrid_access_agents_connected":
            counters.agents += float(value)
    return counters


class BenchGrid:
    """A Master and relays started by the local-grid launcher, plus what the benchmark needs to talk to them."""

    def __init__(self, root: Path, options: FleetOptions) -> None:
        self.root = root
        self.options = options
        self.master_config = MasterConfig(
            state_dir=str(root / "master"), heartbeat_s=options.heartbeat_s, telemetry_s=options.telemetry_s
        )
        self.launcher = LocalGrid(root, heartbeat_s=options.heartbeat_s)
        self.logs = self.launcher.logs
        self.authority = self.launcher.authority
        self.api_port, self.link_port = self.launcher.api_port, self.launcher.link_port
        self.relays = [self.launcher.plan_relay(f"relay-{i + 1}", "bench") for i in range(options.relays)]
        self.echo: BenchProcess | None = None
        self.echo_port = 0
        self.tls = ssl.create_default_context(cafile=str(self.authority.ca_file))
        self.session: aiohttp.ClientSession | None = None
        self.client: AsyncApiClient | None = None

    @property
    def api(self) -> str:
        return self.launcher.api_url

    @property
    def processes(self) -> list[Daemon | BenchProcess]:
        return [*self.launcher.daemons, *([self.echo] if self.echo is not None else [])]

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), connector=aiohttp.TCPConnector(limit=64))

    async def start_echo(self) -> str:
        cert, key, ca = self.authority.write_server_identity(self.root / "echo", CertRole.ACCESS, "echo")
        self.echo_port = free_port()
        self.echo = spawn(
            "echo",
            ["bench.echo", "--port", str(self.echo_port), "--cert", str(cert), "--key", str(key), "--ca", str(ca)],
            self.logs,
        )
        await self._wait(lambda: _port_open(self.echo_port), "the echo server", self.echo)
        return f"wss://127.0.0.1:{self.echo_port}"

    def stop_echo(self) -> None:
        if self.echo is not None:
            self.echo.stop()

    async def start(self) -> None:
        """The Master, then each relay (under bench.gcwatch), each waited for by the launcher."""
        await self.start_master()
        await self.start_relays()

    async def start_master(self) -> None:
        """The Master alone (under bench.gcwatch), waited for by the launcher; the API client then opens."""
        env = {
            "IDLEGRID_MASTER_TELEMETRY_S": str(self.options.telemetry_s),
            "IDLEGRID_MASTER_LOG_LEVEL": self.options.log_level,
            # The command load comes from one key of one account, as fast as the hold asks: the per-key and the
            # per-account API rate limits are lifted (with the account's left on, its 429s and their Retry-After
            # made the slowest commands' 4-6 s, measuring the limiter instead of the grid).
            "IDLEGRID_MASTER_API_KEY_RATE_PER_S": "1e9",
            "IDLEGRID_MASTER_API_KEY_BURST": "1000000000",
            "IDLEGRID_MASTER_API_ACCOUNT_RATE_PER_S": "1e9",
            "IDLEGRID_MASTER_API_ACCOUNT_BURST": "1000000000",
        }
        await asyncio.to_thread(
            self.launcher.start_master, program=(*self._gcwatch("master"), "management.cli"), env=env, timeout_s=START_TIMEOUT_S
        )
        self.client = AsyncApiClient(self.api, read_key_file(self.launcher.operator_key_file))

    async def start_relays(self) -> None:
        per_agent_flood = self.options.flood_rate / self.options.flood_size
        relay_env = {
            "IDLEGRID_ACCESS_LOG_LEVEL": self.options.log_level,
            # The flood must not be cut by the per-agent rate limit; the limiter still runs on every frame.
            "IDLEGRID_ACCESS_RATE_PER_AGENT": str(max(50.0, 2 * per_agent_flood)),
            "IDLEGRID_ACCESS_BURST": str(max(200, math.ceil(2 * per_agent_flood))),
        }
        if self.options.fold_interval_s is not None:
            relay_env["IDLEGRID_ACCESS_FOLD_INTERVAL_S"] = str(self.options.fold_interval_s)
        for relay in self.relays:
            program = (
                ["bench.relay", "--tls-buffer-kib", str(self.options.relay_tls_buffer_kib)]
                if self.options.relay_tls_buffer_kib
                else ["management.cli", "access"]
            )
            await asyncio.to_thread(
                self.launcher.start_relay,
                relay.relay_id,
                relay.region,
                program=(*self._gcwatch(relay.relay_id), *program),
                env=relay_env,
                timeout_s=START_TIMEOUT_S,
            )

    def _gcwatch(self, name: str) -> list[str]:
        """Run the daemon under bench.gcwatch, which writes its garbage collector's pauses to gc/NAME.json."""
        (self.root / "gc").mkdir(exist_ok=True)
        return ["bench.gcwatch", str(self.root / "gc" / f"{name}.json")]

    def gc_figures(self) -> dict[str, Any]:
        figures = {}
        for path in sorted((self.root / "gc").glob("*.json")):
            try:
                figures[path.stem] = json.loads(path.read_text())
            except (OSError, ValueError):
                pass
        return figures

    async def stop(self) -> None:
        """Relays, then the Master (the launcher's order), then the echo server."""
        await asyncio.to_thread(self.launcher.stop)
        self.stop_echo()
        if self.client is not None:
            await self.client.close()
        if self.session is not None:
            await self.session.close()

    async def relay_counters(self) -> RelayCounters:
        assert self.session is not None
        total = RelayCounters()
        for relay in self.relays:
            async with self.session.get(f"{relay.http_url}/metrics", ssl=self.tls) as response:
                total = total + parse_relay_metrics(await response.text())
        return total

    async def master_intake(self) -> dict[str, float]:
        assert self.session is not None
        async with self.session.get(f"{self.api}/metrics") as response:
            return parse_master_intake(await response.text())

    async def _wait(self, probe: Any, what: str, process: BenchProcess) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not process.alive():
                raise RuntimeError(f"{what} exited at start:\n{process.tail()}")
            try:
                if await probe():
                    return
            except (aiohttp.ClientError, OSError, ValueError, KeyError):
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{what} did not come up in {START_TIMEOUT_S:.0f} s:\n{process.tail()}")


async def _port_open(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True


# --- commands through the API ------------------------------------------------------------------


# A command's round trip cut where it is stamped: the API call to the Master's record (``issue``), the record to
# the frame going out (``send``), out to the agent (``to_agent``: relay and the fleet's reading), the agent's ack
# (``agent_ack``), the ack back to the Master (``ack_back``), the agent's work to its result going out
# (``agent_run``), the result back to the Master (``result_back``), the Master's record to the bench's waiting read
# (``seen``). The Master's stamps are its record's (management/views/grid.py command_view), the agent's its fleet
# process's (bench/fleet_agents.py ``marks``). Every process here reads the same clock, so the phase that holds a
# slow command names where it waited.
PHASES = ("issue", "send", "to_agent", "agent_ack", "ack_back", "agent_run", "result_back", "seen")


def _unix(stamp: Any) -> float | None:
    return datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else None


def command_phases(
    issued_unix: float, seen_unix: float, record: dict[str, Any], agent: list[float] | None
) -> dict[str, float | None]:
    """Milliseconds per phase (``PHASES``) from the bench's two times, the record's stamps and the agent's marks
    ([came in, ack out, result out], 0 for not yet); None for a phase with a stamp missing (a command that failed
    before it went out has no ``sent_at``). The Master's stamps are milliseconds: a phase can read 1 ms off."""
    came, ack_out, result_out = (agent or [0.0, 0.0, 0.0])[:3]
    created, sent, acked, finished = (_unix(record.get(k)) for k in ("created_at", "sent_at", "acked_at", "finished_at"))
    came_, ack_, result_ = came or None, ack_out or None, result_out or None
    spans = (
        (issued_unix, created),
        (created, sent),
        (sent, came_),
        (came_, ack_),
        (ack_, acked),
        (ack_, result_),
        (result_, finished),
        (finished, seen_unix),
    )
    return {
        phase: round((end - begin) * 1000, 1) if begin is not None and end is not None else None
        for phase, (begin, end) in zip(PHASES, spans, strict=True)
    }


@dataclass
class CommandTiming:
    kind: str
    state: str
    rtt_s: float
    started: float = 0.0  # perf_counter at the API call
    phases: dict[str, float | None] = field(default_factory=dict)
    command_id: str = ""
    stamps: tuple[float, float, dict[str, Any]] | None = None  # issued and seen (unix), the final record

    def cut(self, agent_marks: dict[str, list[float]]) -> None:
        """Fill ``phases`` with the agents' marks (the fleets' ``marks``) beside the record's stamps."""
        if self.stamps is not None:
            issued, seen, record = self.stamps
            self.phases = command_phases(issued, seen, record, agent_marks.get(self.command_id))


class CommandLoad:
    """Creates at ``rate`` per second, each followed by a delete of the same container once it succeeded."""

    def __init__(self, client: AsyncApiClient, agent_ids: list[str], *, gpus_per_agent: int) -> None:
        """``gpus_per_agent``: each create asks for one GPU the host has (agents refuse a GPU they lack)."""
        self.gpus_per_agent = gpus_per_agent
        self.client = client
        self.agent_ids = agent_ids
        self.timings: list[CommandTiming] = []
        self.errors: list[str] = []
        self.started = time.perf_counter()
        self.wall_started = time.time()

    async def run(self, rate: float, seconds: float) -> None:
        if rate <= 0 or not self.agent_ids:
            return
        loop = asyncio.get_running_loop()
        started, count = loop.time(), int(rate * seconds)
        self.started = time.perf_counter()
        self.wall_started = time.time()
        tasks = []
        for n in range(count):
            delay = started + n / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._pair(n)))
        if tasks:
            await asyncio.wait(tasks, timeout=2 * COMMAND_TIMEOUT_S + 5)

    async def _pair(self, n: int) -> None:
        agent_id = self.agent_ids[n % len(self.agent_ids)]
        name = f"bench-{n}"
        spec = {"name": name, "image": "bench/sleep", "command": ["sleep", "60"], "gpus": [str(n % self.gpus_per_agent)]}
        created = await self._timed(agent_id, "create_container", spec)
        if created is not None and created.state == "succeeded":
            await self._timed(agent_id, "delete_container", {"name": name})

    async def _timed(self, agent_id: str, kind: str, spec: dict[str, Any]) -> CommandTiming | None:
        """From the API call to the answer that shows a final state: one read that waits for it (``wait_s``), as an
        operator's client would, not a poll that loads the very API it measures."""
        started, issued_unix = time.perf_counter(), time.time()
        try:
            try:
                command_id = (await self.client.issue_command(agent_id, kind, spec))["id"]
            except ApiError as exc:
                self.errors.append(f"{kind}: {exc}")
                return None
            while (left := COMMAND_TIMEOUT_S - (time.perf_counter() - started)) > 0:
                record = await self.client.command(command_id, wait_s=min(left, COMMAND_WAIT_S))
                state = record["state"]
                if state in FINAL_STATES:
                    stamps = (issued_unix, time.time(), record)
                    timing = CommandTiming(kind, state, time.perf_counter() - started, started, {}, command_id, stamps)
                    self.timings.append(timing)
                    return timing
        except (ApiError, aiohttp.ClientError, TimeoutError, KeyError, ValueError) as exc:
            self.errors.append(f"{kind}: {type(exc).__name__}: {exc}")
            return None
        self.timings.append(CommandTiming(kind, "no_final_state", time.perf_counter() - started, started))
        return None


async def _cut_phases(fleets: list[FleetDriver], load: CommandLoad, into: Path) -> None:
    """Every timed command's phases, with the agents' marks from every fleet process. Each writes its marks to a file
    in ``into``: a command's are about 90 bytes, and a long hold's would not fit the control pipe's 1 MiB line."""
    paths = [into / f"marks-{f.name}.json" for f in fleets]
    await asyncio.gather(*(f.request("marks", path=str(path)) for f, path in zip(fleets, paths, strict=True)))
    marks: dict[str, list[float]] = {}
    for path in paths:
        marks.update(json.loads(path.read_bytes()))
    for timing in load.timings:
        timing.cut(marks)


def _slowest(load: CommandLoad, zero_unix: float, count: int = 10) -> list[list[Any]]:
    """The ``count`` slowest commands: [issued (unix seconds less ``zero_unix``), kind, RTT ms, ms per phase]."""
    return [
        [round(load.wall_started + t.started - load.started - zero_unix, 2), t.kind, round(t.rtt_s * 1000, 1), t.phases]
        for t in sorted(load.timings, key=lambda t: -t.rtt_s)[:count]
    ]


def phase_summary(timings: list[CommandTiming]) -> dict[str, Any]:
    """Per phase (``PHASES``), p50 and p99 in ms over the commands that reached a final state; and, over the slowest
    1 % of them, how many spent most of their time in each phase: where the tail waits."""
    done = [t for t in timings if t.state in FINAL_STATES and t.phases]
    summary: dict[str, Any] = {}
    for phase in PHASES:
        values = [v for t in done if (v := t.phases.get(phase)) is not None]
        summary[phase] = {"p50_ms": _round(percentile(values, 50)), "p99_ms": _round(percentile(values, 99))}
    tail = sorted(done, key=lambda t: -t.rtt_s)[: max(1, math.ceil(len(done) / 100))] if done else []
    held: dict[str, int] = {}
    for timing in tail:
        phase = max(PHASES, key=lambda p: timing.phases.get(p) or 0.0)
        held[phase] = held.get(phase, 0) + 1
    summary["tail_held_in"] = held
    return summary


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Sampler:
    """Backlog over time: frames waiting in the relays and bytes waiting in the kernel's socket queues."""

    grid: BenchGrid
    every_s: float = SAMPLE_EVERY_S
    samples: list[dict[str, float]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        link_ports = {self.grid.link_port}
        agent_ports = {r.agent_port for r in self.grid.relays}
        started = time.monotonic()
        loop = asyncio.get_running_loop()
        # The kernel's table holds a line per connection (20,000 at 10,000 agents): parsed in a thread of this
        # process, it held the interpreter lock through every sample and stalled the very loop that times commands
        # (the slowest round trips fell on the sampling period, bench/HISTORY.md). A process of its own parses it.
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as parser:
            while not stop.is_set():
                counters = await self.grid.relay_counters()
                link, agents = await loop.run_in_executor(parser, queued_bytes, link_ports, agent_ports)
                self.samples.append(
                    {
                        "t": round(time.monotonic() - started, 2),
                        "relay_buffered": counters.buffered,
                        "link_queued_bytes": link,
                        "agent_queued_bytes": agents,
                    }
                )
                try:
                    await asyncio.wait_for(stop.wait(), self.every_s)
                except TimeoutError:
                    pass


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares growth per second; 0 for fewer than two points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0


async def _sum_stats(fleets: list[FleetDriver]) -> dict[str, Any]:
    """The fleets' figures added up: counts summed, durations (``*_s``, ``*_ms``) the largest of them."""
    answers = await asyncio.gather(*(f.request("stats") for f in fleets))
    total: dict[str, Any] = {"sent": {}}
    for answer in answers:
        for key, value in answer.items():
            if key in ("id", "op", "ok"):
                continue
            if key == "sent":
                for kind, n in value.items():
                    total["sent"][kind] = total["sent"].get(kind, 0) + n
            elif key == "gc_long_pauses":  # each process's own: listed, in time order
                total[key] = sorted([*total.get(key, []), *value])
            elif key.endswith(("_s", "_ms")):
                total[key] = _largest(total[key], value) if key in total else value
            elif isinstance(value, list):
                total[key] = [a + b for a, b in zip(total[key], value)] if key in total else value
            else:
                total[key] = total.get(key, 0) + value
    return total


def _largest(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None  # one fleet not there yet: neither is the whole
    if isinstance(a, list):
        return [max(x, y) for x, y in zip(a, b)]
    return max(a, b)


def _fleet_args(grid: BenchGrid, options: FleetOptions, urls: list[str], first: int, count: int, stride: int = 1) -> list[str]:
    return [
        "--agents-dir",
        str(grid.root / "agents"),
        *(a for url in urls for a in ("--access", url)),
        "--first",
        str(first),
        "--count",
        str(count),
        "--stride",
        str(stride),
        "--simulate",
        options.simulate,
        "--connect-rate",
        str(options.connect_rate / options.processes),
        "--latency-ms",
        str(options.latency_ms),
        "--jitter-ms",
        str(options.jitter_ms),
        "--failure-rate",
        str(options.failure_rate),
        "--log-level",
        options.log_level,
    ]


async def _flood(fleets: list[FleetDriver], options: FleetOptions) -> dict[str, float]:
    share = len(fleets)
    answers = await asyncio.gather(
        *(
            f.request(
                "flood",
                rate=options.flood_rate / share,
                agents=max(1, options.flood_size // share),
                seconds=options.flood_seconds,
                timeout=options.flood_seconds + 60,
            )
            for f in fleets
        )
    )
    elapsed = max(a["elapsed_s"] for a in answers) or options.flood_seconds
    return {
        "agents": sum(a["agents"] for a in answers),
        "sent": sum(a["sent"] for a in answers),
        "received": sum(a["received"] for a in answers),
        "elapsed_s": elapsed,
    }


async def measure_baseline(grid: BenchGrid, options: FleetOptions) -> dict[str, Any]:
    """The same harness, the flood agents only, against the echo server."""
    url = await grid.start_echo()
    fleet = await FleetDriver.spawn("fleet-echo", _fleet_args(grid, options, [url], 0, options.flood_size), grid.logs)
    try:
        await fleet.loaded(START_TIMEOUT_S + options.flood_size / 50)
        assert grid.echo is not None
        echo_idle = read_usage(grid.echo.pid).rss_kib
        await fleet.request("start")
        deadline = time.monotonic() + START_TIMEOUT_S
        while (await fleet.request("stats"))["open"] < options.flood_size and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(SETTLE_S)
        connected = (await fleet.request("stats"))["open"]
        echo_kib = (read_usage(grid.echo.pid).rss_kib - echo_idle) / max(1, connected)
        cpu_echo, cpu_fleet, wall = read_usage(grid.echo.pid).cpu_s, read_usage(fleet.pid).cpu_s, time.monotonic()
        flood = await _flood([fleet], options)
        wall = time.monotonic() - wall
        cpu = {
            "echo": round(100 * (read_usage(grid.echo.pid).cpu_s - cpu_echo) / wall, 1),
            "fleet-echo": round(100 * (read_usage(fleet.pid).cpu_s - cpu_fleet) / wall, 1),
        }
    finally:
        await fleet.stop()
        grid.stop_echo()
    return {
        "agents": flood["agents"],
        "sent_per_s": round(flood["sent"] / flood["elapsed_s"], 1),
        "echoed_per_s": round(flood["received"] / flood["elapsed_s"], 1),
        "cpu_pct": cpu,
        "echo_kib_per_connection": round(echo_kib, 1),
    }


async def run_fleet_bench(options: FleetOptions) -> dict[str, Any]:
    """The whole bench; with ``competitor_share``, beside a CPU competitor from start to end (bench/competitor.py)."""
    with CpuCompetitor(options.competitor_share):
        return await _run_fleet_bench(options)


async def _run_fleet_bench(options: FleetOptions) -> dict[str, Any]:
    if options.work_dir:
        Path(options.work_dir).mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=time.strftime("run-%Y%m%d-%H%M%S-"), dir=options.work_dir))
    else:
        root = Path(tempfile.mkdtemp(prefix="idlegrid-bench-"))
    grid = BenchGrid(root, options)
    fleets: list[FleetDriver] = []
    result: dict[str, Any] = {
        "agents": options.agents,
        "gpus_per_agent": options.gpus_per_agent,
        "options": asdict(options),
        "machine": machine_facts(),
    }
    await grid.open()
    try:
        provisioned = await provision_agents(grid.master_config, root / "agents", options.agents, region="bench")
        result["provision_s"] = round(provisioned.seconds, 2)
        if options.baseline:
            result["baseline"] = await measure_baseline(grid, options)
        await grid.start()
        urls = [r.agent_url for r in grid.relays]
        # Agent i dials relay i % len(relays) first; process p runs agents p, p + procs, ...: with as many processes
        # as relays, each process holds one relay's agents, so the storm's reconnecting agents (thousands of TLS
        # handshakes in their process) do not stall the agents that commands go to, as separate hosts would not.
        result["fleet_procs"] = procs = options.processes
        for p in range(procs):
            count = len(range(p, options.agents, procs))
            if count > 0:
                args = _fleet_args(grid, options, urls, p, count, stride=procs)
                fleets.append(await FleetDriver.spawn(f"fleet-{p + 1}", args, grid.logs))
        loads = await asyncio.gather(*(f.loaded(START_TIMEOUT_S + options.agents / 100) for f in fleets))
        result["fleet_load_s"] = max(a["load_s"] for a in loads)
        await asyncio.sleep(SETTLE_S)
        watched = _Watched(grid, fleets)
        watched.read("idle")
        profiler = Profiler(Path(options.profile_dir) / "ramp") if options.profile_dir else None
        if profiler is not None:
            profiler.start(watched.named_pids(), options.ready_timeout or 60.0 + options.agents / 100)
        result.update(await _ramp(fleets, options))
        watched.read("ready")
        if profiler is not None:
            result["profile_ramp"] = profiler.finish()
        result["drain_s"], result["drain_left_bytes"] = await _drain(grid, options)
        result.update(await _full_pace(grid, fleets, options))
        result.update(await _hold(grid, fleets, provisioned.agent_ids, options, watched))
        result.update(await _flood_through_relays(grid, fleets, options, watched))
        result["processes"] = watched.report(options.agents)
        result["relay_kib_per_agent"] = watched.kib_per_agent("relay", options.agents)
        result["master_kib_per_agent"] = watched.kib_per_agent("master", options.agents)
        master_pct = result["processes"].get("master", {}).get("cpu_hold_pct")
        result["master_cpu_hold_cores"] = round(master_pct / 100, 3) if master_pct is not None else None
        result["master_cpu_per_1000_agents"] = (
            round(master_pct / 100 * 1000 / options.agents, 4) if master_pct is not None else None
        )
        baseline = result.get("baseline", {}).get("echoed_per_s")
        result["baseline_msgs_per_s"] = baseline
        result["relay_vs_baseline"] = round(result["relay_msgs_per_s"] / baseline, 3) if baseline else None
        if options.storm and len(grid.relays) > 1:
            result["storm"] = await _storm(grid, fleets, provisioned.agent_ids, options)
    finally:
        for fleet in fleets:
            await fleet.stop()
        await grid.stop()
        if not options.keep and not options.work_dir:
            shutil.rmtree(root, ignore_errors=True)
    result["work_dir"] = str(root) if options.keep or options.work_dir else None
    return result


async def _drain(grid: BenchGrid, options: FleetOptions) -> tuple[float, int]:
    """Wait until the ramp's backlog on the relays' links to the Master has drained (bounded), so that the hold
    measures the steady state; how long that took is reported beside ``ready_s``."""
    started = time.monotonic()
    await asyncio.sleep(SETTLE_S)
    quiet, left = 0, 0
    while time.monotonic() - started < DRAIN_TIMEOUT_S:
        left, _ = await asyncio.to_thread(queued_bytes, {grid.link_port}, set())
        quiet = quiet + 1 if left <= DRAINED_BYTES else 0
        if quiet >= 3:
            break
        await asyncio.sleep(0.5)
    return round(time.monotonic() - started, 2), left


async def _full_pace(grid: BenchGrid, fleets: list[FleetDriver], options: FleetOptions) -> dict[str, Any]:
    """Wait (bounded) until the Master asks for reports at the full pace again and the fleet sends at it (heartbeats
    and telemetry over ``PACE_WINDOW_S`` at FULL_PACE_SHARE of the expected rate or more), so that the hold measures
    the full load: a ramp that left the pace slowed measured holds at about 2,000 messages a second instead of 3,000
    (bench/HISTORY.md). Returns how long that took, the pace then and the rate last measured."""
    started = time.monotonic()
    expected = options.agents / options.heartbeat_s + options.agents / options.telemetry_s
    factor: float | None = None
    rate = 0.0
    while time.monotonic() - started < PACE_TIMEOUT_S:
        before, began = await _sum_stats(fleets), time.monotonic()
        await asyncio.sleep(PACE_WINDOW_S)
        after = await _sum_stats(fleets)
        sent = sum(after["sent"].get(k, 0) - before["sent"].get(k, 0) for k in ("heartbeat", "telemetry"))
        rate = sent / (time.monotonic() - began)
        factor = (await grid.master_intake()).get("pace_factor")
        if (factor is None or factor <= 1.0) and rate >= FULL_PACE_SHARE * expected:
            break
    return {"pace_wait_s": round(time.monotonic() - started, 2), "pace_at_hold": factor, "rate_at_hold": round(rate, 1)}


async def _ramp(fleets: list[FleetDriver], options: FleetOptions) -> dict[str, Any]:
    timeout = options.ready_timeout or 60.0 + options.agents / 100
    await asyncio.gather(*(f.request("start") for f in fleets))
    started = time.monotonic()
    curve = []
    while True:
        stats = await _sum_stats(fleets)
        elapsed = time.monotonic() - started
        curve.append((round(elapsed, 1), stats["ever_ready"]))
        if stats["ever_ready"] >= options.agents or elapsed > timeout:
            break
        await asyncio.sleep(0.5)
    all_ready = stats["ever_ready"] >= options.agents
    ready_s = stats["all_ready_s"] if all_ready else None
    hellos = stats["sent"].get("hello", 0)
    return {
        "ready_s": ready_s,
        "ready_agents": stats["ever_ready"],
        "connect_rate_per_s": round(options.agents / ready_s, 1) if ready_s else None,
        "ready_curve": curve[:: max(1, len(curve) // 20)],
        "reconnects": max(0, hellos - stats["ever_ready"]),
    }


async def _hold(
    grid: BenchGrid, fleets: list[FleetDriver], agent_ids: list[str], options: FleetOptions, watched: _Watched
) -> dict[str, Any]:
    assert grid.session is not None
    before_fleet, before_relay = await _sum_stats(fleets), await grid.relay_counters()
    before_intake = await grid.master_intake()
    watched.read("hold_start")
    stop = asyncio.Event()
    sampler = Sampler(grid, every_s=options.sample_s or SAMPLE_EVERY_S * max(1, options.agents // 2000))
    sampling = asyncio.create_task(sampler.run(stop))
    profiler = Profiler(Path(options.profile_dir) / "hold") if options.profile_dir else None
    if profiler is not None:
        profiler.start(watched.named_pids(), options.duration)
    assert grid.client is not None
    load = CommandLoad(grid.client, agent_ids, gpus_per_agent=options.gpus_per_agent)
    started = time.monotonic()
    commands = asyncio.create_task(load.run(options.cmd_rate, options.duration))
    await asyncio.sleep(options.duration)
    held = time.monotonic() - started
    after_fleet, after_relay = await _sum_stats(fleets), await grid.relay_counters()
    after_intake = await grid.master_intake()
    watched.read("hold_end")
    stop.set()
    await sampling
    await commands  # bounded: each command gives up after COMMAND_TIMEOUT_S
    await _cut_phases(fleets, load, grid.root)
    profile = profiler.finish() if profiler is not None else None
    sent = {k: after_fleet["sent"].get(k, 0) - before_fleet["sent"].get(k, 0) for k in after_fleet["sent"]}
    rtts = [t.rtt_s * 1000 for t in load.timings if t.state in FINAL_STATES]
    states: dict[str, int] = {}
    for timing in load.timings:
        states[timing.state] = states.get(timing.state, 0) + 1
    buffered = [(s["t"], s["relay_buffered"]) for s in sampler.samples]
    link = [(s["t"], s["link_queued_bytes"]) for s in sampler.samples]
    expected = options.agents / options.heartbeat_s + options.agents / options.telemetry_s
    return {
        "hold_s": round(held, 1),
        "expected_msgs_per_s": round(expected, 1),
        "msgs_per_s": round((after_relay.delivered - before_relay.delivered) / held, 1),
        "relay_frames_in_per_s": round((after_relay.frames_in - before_relay.frames_in) / held, 1),
        # heartbeats/telemetry the relays let go in the hold (superseded by a newer one, evicted past the byte bound)
        "telemetry_shed_at_relays": round(after_relay.dropped - before_relay.dropped),
        # the Master's intake (issue 29; absent on a Master without it): shed in the hold, the pace told at its end
        "master_intake": {
            "shed": round(after_intake.get("shed", 0.0) - before_intake.get("shed", 0.0)) if after_intake else None,
            "pace_factor_end": after_intake.get("pace_factor"),
            "telemetry_bytes_end": after_intake.get("telemetry_bytes"),
        },
        # what the Master reads (absent from a Master without the series): link frames (a fold is one) and the agent
        # frames in them, folded or not
        "master_link_frames_per_s": _rate(before_intake, after_intake, "link_frames", held),
        "master_agent_frames_per_s": _rate(before_intake, after_intake, "agent_frames", held),
        "heartbeats_per_s": round(sent.get("heartbeat", 0) / held, 1),
        "telemetry_per_s": round(sent.get("telemetry", 0) / held, 1),
        "telemetry_samples_per_s": round(sent.get("telemetry", 0) * options.gpus_per_agent / held, 1),
        "backlog": {
            "relay_buffered_end": after_relay.buffered,
            "relay_buffered_max": max((b for _, b in buffered), default=0),
            "relay_buffered_growth_per_s": round(_slope(buffered), 2),
            "link_queued_bytes_max": max((b for _, b in link), default=0),
            "link_queued_bytes_end": link[-1][1] if link else 0,
            "link_queued_growth_bytes_per_s": round(_slope(link), 1),
            "agent_queued_bytes_max": max((s["agent_queued_bytes"] for s in sampler.samples), default=0),
            "samples": len(sampler.samples),
        },
        "agents_ready_end": after_fleet["ready"],
        "gc": {
            "fleet": {
                "collections": after_fleet.get("gc_collections"),
                "longest_ms": after_fleet.get("gc_longest_ms"),
                "total_s": after_fleet.get("gc_total_s"),
                "long_pauses": after_fleet.get("gc_long_pauses"),  # [unix, generation, wall ms, CPU ms, collected]
            },
            **grid.gc_figures(),
        },
        "commands": {
            "issued": len(load.timings),
            "states": states,
            "errors": load.errors[:5],
            "error_count": len(load.errors),
            "executed_by_fleet": after_fleet["commands_executed"],
            "duplicate_executions": after_fleet["duplicate_executions"],
        },
        "cmd_rtt_p50_ms": _round(percentile(rtts, 50)),
        "cmd_rtt_p99_ms": _round(percentile(rtts, 99)),
        "cmd_rtt_max_ms": _round(max(rtts) if rtts else None),
        # [unix time of the API call, kind, RTT ms, ms per phase]: to lay beside the processes' long GC pauses (gc.*.long_pauses)
        # and the minute turns (the Master writes the rollups of the minute just over at its next flush).
        "cmd_rtt_slowest": _slowest(load, 0.0),
        "cmd_phases": phase_summary(load.timings),
        "hold_started_unix": round(load.wall_started, 2),
        "profile_hold": profile,
    }


async def _storm(grid: BenchGrid, fleets: list[FleetDriver], agent_ids: list[str], options: FleetOptions) -> dict[str, Any]:
    """SIGKILL relay-1 with every agent in: its agents (every ``len(relays)``-th, the fleet rotates their relay lists)
    fail over to the others at once. Measured: how long until every agent is ready again, the fewest ready meanwhile,
    and the round trip of commands issued meanwhile to agents on the surviving relays (acceptance 2 of issue 29)."""
    assert grid.client is not None
    victim = grid.relays[0]
    survivors = [a for i, a in enumerate(agent_ids) if i % len(grid.relays) != 0]
    before = await _sum_stats(fleets)
    load = CommandLoad(grid.client, survivors, gpus_per_agent=options.gpus_per_agent)
    daemon = getattr(victim, "daemon", None)
    if daemon is None:
        return {"error": "relay-1 has no process to kill"}
    profiler = Profiler(Path(options.profile_dir) / "storm") if options.profile_dir else None
    if profiler is not None:
        pids = _Watched(grid, fleets).named_pids()
        profiler.start({name: pid for name, pid in pids.items() if name != victim.relay_id}, 40.0)
    await asyncio.to_thread(daemon.kill, signal.SIGKILL)
    killed_unix, started = time.time(), time.monotonic()
    commands = asyncio.create_task(load.run(options.cmd_rate, min(60.0, options.storm_timeout)))
    fewest, back_s, curve = options.agents, None, []
    while (elapsed := time.monotonic() - started) < options.storm_timeout:
        stats = await _sum_stats(fleets)
        fewest = min(fewest, stats["ready"])
        curve.append((round(elapsed, 1), stats["ready"]))
        if stats["ready"] >= options.agents and elapsed > 2.0:
            back_s = round(elapsed, 1)
            break
        await asyncio.sleep(0.5)
    await commands
    await _cut_phases(fleets, load, grid.root)
    after = await _sum_stats(fleets)
    rtts = [t.rtt_s * 1000 for t in load.timings if t.state in FINAL_STATES]
    states: dict[str, int] = {}
    for timing in load.timings:
        states[timing.state] = states.get(timing.state, 0) + 1
    return {
        "killed": victim.relay_id,
        "agents_on_it": len(agent_ids) - len(survivors),
        "all_back_s": back_s,
        "fewest_ready": fewest,
        "ready_curve": curve[:: max(1, len(curve) // 20)],
        "hellos": after["sent"].get("hello", 0) - before["sent"].get("hello", 0),
        "cmd_rtt_p50_ms": _round(percentile(rtts, 50)),
        "cmd_rtt_p99_ms": _round(percentile(rtts, 99)),
        "cmd_rtt_max_ms": _round(max(rtts) if rtts else None),
        "commands": {"issued": len(load.timings), "states": states, "duplicate_executions": after["duplicate_executions"]},
        # [seconds after the SIGKILL the command was issued, kind, RTT ms, ms per phase]
        "cmd_rtt_slowest": _slowest(load, killed_unix),
        "cmd_phases": phase_summary(load.timings),
        "profile_storm": profiler.finish() if profiler is not None else None,
        "gc": grid.gc_figures(),  # the daemons' collections up to now: a long pause of relay-2's in the storm shows here
    }


async def _flood_through_relays(
    grid: BenchGrid, fleets: list[FleetDriver], options: FleetOptions, watched: _Watched
) -> dict[str, Any]:
    before = await grid.relay_counters()
    watched.read("flood_start")
    flood = await _flood(fleets, options)
    after = await grid.relay_counters()
    watched.read("flood_end")
    elapsed = flood["elapsed_s"]
    return {
        "relay_msgs_per_s": round((after.delivered - before.delivered) / elapsed, 1),
        "flood": {
            "agents": flood["agents"],
            "sent_per_s": round(flood["sent"] / elapsed, 1),
            "relay_in_per_s": round((after.frames_in - before.frames_in) / elapsed, 1),
            "dropped": after.dropped - before.dropped,
            "buffered_end": after.buffered,
        },
    }


class _Watched:
    """RSS and CPU readings of every process at the phases of the run."""

    def __init__(self, grid: BenchGrid, fleets: list[FleetDriver]) -> None:
        running = [p for p in grid.processes if p.alive()]
        self.pids = {p.name: p.pid for p in running} | {f.name: f.pid for f in fleets} | {"bench": os.getpid()}
        self.readings: dict[str, dict[str, Any]] = {name: {} for name in self.pids}
        self.times: dict[str, float] = {}

    def named_pids(self) -> dict[str, int]:
        return {name: pid for name, pid in self.pids.items() if name != "bench"}

    def read(self, label: str) -> None:
        self.times[label] = time.monotonic()
        for name, pid in self.pids.items():
            try:
                self.readings[name][label] = read_usage(pid)
            except (OSError, StopIteration):
                pass

    def kib_per_agent(self, prefix: str, agents: int) -> float | None:
        deltas = [
            r["hold_end"].rss_kib - r["idle"].rss_kib
            for name, r in self.readings.items()
            if name.startswith(prefix) and "idle" in r and "hold_end" in r
        ]
        return round(sum(deltas) / agents, 1) if deltas else None

    def report(self, agents: int) -> dict[str, Any]:
        out = {}
        for name, r in self.readings.items():
            entry: dict[str, Any] = {}
            if "idle" in r and "hold_end" in r:
                entry["rss_idle_mib"] = round(r["idle"].rss_kib / 1024, 1)
                entry["rss_end_mib"] = round(r["hold_end"].rss_kib / 1024, 1)
                for phase in ("ready", "hold_start"):  # where between the two the memory came (the ramp, the hold)
                    if phase in r:
                        entry[f"rss_{phase}_mib"] = round(r[phase].rss_kib / 1024, 1)
            for phase, (a, b) in {
                "ramp": ("idle", "ready"),
                "hold": ("hold_start", "hold_end"),
                "flood": ("flood_start", "flood_end"),
            }.items():
                if a in r and b in r:
                    wall = self.times[b] - self.times[a]
                    entry[f"cpu_{phase}_pct"] = round(100 * (r[b].cpu_s - r[a].cpu_s) / wall, 1) if wall > 0 else None
            out[name] = entry
        return out


def _rate(before: dict[str, float], after: dict[str, float], key: str, seconds: float) -> float | None:
    if key not in before or key not in after or seconds <= 0:
        return None
    return round((after[key] - before[key]) / seconds, 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def machine_facts() -> dict[str, Any]:
    model = ""
    try:
        model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "load_avg_at_start": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "agent_dir_format": AGENT_DIR_FORMAT,
    }

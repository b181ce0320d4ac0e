"""The fleet simulator: thousands of real agents in one process, for benchmarks and scale tests.

Every simulated agent is an ``agent.daemon.Agent``: its own certificate, its own mutual-TLS WebSocket
to an Access relay, the agent's own hello, heartbeat, telemetry, command and result code. What is
simulated is only what a host would have: GPUs (``agent.simulate``), the container runtime
(``agent.runtime.simulated``, with latency and failures) and the command ledger, kept in memory
instead of one SQLite file per agent. The agents share one description of the host they run on.

The agents must be enrolled already: ``agents_dir`` holds one state directory per agent
(``agent-00000``, ``agent-00001``, ...), as ``idlegrid agent enroll`` writes it.

``python -m bench.fleet_agents`` runs a fleet until interrupted and prints its figures; with ``--control`` it
instead takes JSON lines on stdin (``start``, ``stats``, ``flood``, ``stop``) and answers on stdout,
which is how ``python -m bench fleet`` drives it.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import contextlib
import dataclasses
import gc
import json
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from websockets.exceptions import ConnectionClosed

from agent.config import AgentConfig
from agent.connector import RelayConnector, RelayTarget
from agent.daemon import Agent
from agent.directory import load_directory
from agent.host import collect_host_info
from agent.ledger import CommandLog, CommandLogEntry
from agent.runtime.simulated import Execution, SimulatedRuntime
from agent.session import AckCommand, Action, RunCommand, Welcomed
from common.config import load_config
from common.heap import tune_for_daemon
from common.logs import setup_logging
from common.loop import run as run_loop
from common.wire import CommandAck, CommandResult, RelayEntry, encode

log = logging.getLogger(__name__)

AGENT_DIR_FORMAT = "agent-{:05d}"
# The relay's figure (access/daemon.py): asyncio's 256 KiB per TLS connection would make the simulator,
# not the system under test, the first thing to run out of memory.
TLS_READ_BUFFER_BYTES = 4 * 1024
STOP_TIMEOUT_S = 15.0
LONG_GC_PAUSE_S = 0.1
FLOOD_TICK_S = 0.05


def host_gpus(simulate: str, index: int) -> str:
    """The GPUs of agent ``index`` in a fleet simulating ``simulate`` (``FleetSettings.simulate``)."""
    specs = simulate.split("|")
    return specs[index % len(specs)]


class FleetSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    agents_dir: str
    access_urls: list[str]  # agent i dials access_urls[i % n] first, the others on failover
    first: int = 0  # the agents run here: agents_dir/agent-<first> .. agent-<first + count - 1>
    count: int = 0  # 0: every agent directory from ``first`` on
    stride: int = 1  # every stride-th agent from ``first``: with one process per relay, each holds one relay's agents
    # GPUs of the simulated hosts: one agent spec ("h100:8"), or several joined by "|" ("h100:8|mi300x:8"), which the
    # agents take in turn by index (a fleet of mixed vendors)
    simulate: str = "h100:8"
    connect_rate: float = 500.0  # agents started per second during the ramp
    latency_ms: float = 20.0  # simulated runtime: time a create or delete takes
    jitter_ms: float = 5.0
    failure_rate: float = 0.0  # share of creates and deletes that fail
    seed: int = 1
    result_resend_s: float = 5.0
    distinct_sources: bool = True  # each agent dials from its own 127.x.y.z, as hosts have their own addresses
    max_openings: int = 64  # connections opening at once in this process (TLS and WebSocket handshakes)
    log_level: str = "warning"

    def __post_init__(self) -> None:
        problems = []
        if not self.access_urls:
            problems.append("access_urls must name at least one relay (wss://HOST:PORT)")
        if self.connect_rate <= 0:
            problems.append(f"connect_rate must be positive, got {self.connect_rate}")
        if not 0.0 <= self.failure_rate <= 1.0:
            problems.append(f"failure_rate must be between 0 and 1, got {self.failure_rate}")
        if self.latency_ms < 0 or self.jitter_ms < 0:
            problems.append("latency_ms and jitter_ms must not be negative")
        if self.first < 0 or self.count < 0:
            problems.append("first and count must not be negative")
        if self.stride < 1 or (self.stride > 1 and not self.count):
            problems.append("stride must be at least 1, and above 1 only with a count")
        if self.max_openings < 1:
            problems.append(f"max_openings must be at least 1, got {self.max_openings}")
        if problems:
            raise ValueError("; ".join(problems))


def agent_dir(agents_dir: Path, index: int) -> Path:
    return agents_dir / AGENT_DIR_FORMAT.format(index)


class MemoryCommandLog(CommandLog):
    """The command ledger kept in memory: same answers as the SQLite one, lost with the process.

    A simulated agent never outlives its process, so nothing is lost that a restart would need; what it
    saves is one database file, three descriptors and an ``fsync`` per command for each of thousands of agents.
    """

    def __init__(self) -> None:  # no database: deliberately not CommandLog.__init__
        self._entries: dict[str, CommandLogEntry] = {}
        self._finished_at: dict[str, float] = {}

    def close(self) -> None:
        self._entries.clear()

    def get(self, command_id: str) -> CommandLogEntry | None:
        return self._entries.get(command_id)

    def start(self, command_id: str, kind: str) -> None:
        self._entries.setdefault(command_id, CommandLogEntry(command_id, kind, False, None, {}, None, None, False))

    def finish(
        self, command_id: str, kind: str, *, ok: bool, result: dict[str, Any], error: str | None, error_code: str | None
    ) -> None:
        old = self._entries.get(command_id)
        acked = old.acked if old is not None else False
        self._entries[command_id] = CommandLogEntry(command_id, kind, True, ok, result, error, error_code, acked)
        self._finished_at[command_id] = time.time()

    def mark_acked(self, command_id: str) -> None:
        entry = self._entries.get(command_id)
        if entry is not None:
            self._entries[command_id] = dataclasses.replace(entry, acked=True)

    def unacked(self) -> list[CommandLogEntry]:
        waiting = [e for e in self._entries.values() if e.finished and not e.acked]
        return sorted(waiting, key=lambda e: self._finished_at.get(e.id, 0.0))

    def count(self) -> int:
        return len(self._entries)


def source_address(index: int) -> str:
    """A loopback address of its own for agent ``index`` (all of 127.0.0.0/8 is loopback on Linux).

    Each simulated host then dials from its own address, as real hosts do, so the relay's per-address
    limits (connections held, connections per second) apply per host, not to the whole fleet at once.
    """
    return f"127.{1 + (index >> 16)}.{(index >> 8) & 255}.{index & 255}"


class SimulatedHostConnector(RelayConnector):
    """The agent's own relay connector, dialling from the simulated host's address, one of a bounded number of
    openings at a time in this process.

    Real hosts each have a CPU for their own TLS handshake; here one process does them all, and past what it
    can do, handshakes time out and are retried, which only adds work (congestion collapse). The gate keeps the
    simulator from being what limits the ramp; it waits before dialling, so no relay sees a connection held open.
    """

    source: str | None = None
    gate: asyncio.Semaphore | None = None

    def dial(self, target: RelayTarget, **kwargs: Any) -> Any:
        if self.source is not None:
            kwargs.setdefault("local_addr", (self.source, 0))
        opening = super().dial(target, **kwargs)
        return opening if self.gate is None else _GatedOpening(opening, self.gate)


class _GatedOpening:
    """``async with`` a websockets ``connect``, holding a slot of ``gate`` only while the connection opens."""

    def __init__(self, opening: Any, gate: asyncio.Semaphore) -> None:
        self._opening = opening
        self._gate = gate

    async def __aenter__(self) -> Any:
        async with self._gate:
            return await self._opening.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> Any:
        return await self._opening.__aexit__(*exc_info)


class MemoryDirectory:
    """The relay directory kept in memory only (the agent's ``relay_directory``), not written to its state directory.

    A real host writes its own small file, fsynced, in a worker thread, on its own disk. Here 5,000 agents of one
    process wrote theirs at once when a relay died (the directory changed for all of them): thousands of writes and
    fsyncs queued on the process's worker threads, which took the interpreter lock from the event loop of every agent
    in it, and a command's 20 ms create took 2.7 s (bench/HISTORY.md, the storm). The agent's own file is tested with
    the agent (tests/agent). What a previous run left on disk is still read at the start, as the agent reads it."""

    def __init__(self, state_dir: Path) -> None:
        self._loaded = load_directory(state_dir)

    def load(self) -> list[RelayEntry]:
        return list(self._loaded)

    async def save(self, relays: Sequence[RelayEntry]) -> None:
        return


class LinkTally:
    """One simulated agent's ``LinkObserver``: the frames it sent (by type, into the fleet's counter), the messages
    it received, when it was first welcomed, and when each command came in and its ack and result first went out."""

    __slots__ = ("sent", "marks", "received", "ready_at")

    def __init__(self, sent: Counter[str], marks: dict[str, list[float]]) -> None:
        self.sent = sent
        self.marks = marks
        self.received = 0
        self.ready_at: float | None = None  # first welcome

    def message_received(self, action: Action) -> None:
        self.received += 1
        match action:
            case RunCommand(command):
                self.marks.setdefault(command.body.id, [time.time(), 0.0, 0.0])
            case AckCommand(command_id):
                self.marks.setdefault(command_id, [time.time(), 0.0, 0.0])
            case Welcomed() if self.ready_at is None:
                self.ready_at = time.monotonic()

    def frame_sent(self, frame: msgspec.Struct) -> None:
        self.sent[type(frame).__struct_config__.tag] += 1  # type: ignore[index]
        if isinstance(frame, (CommandAck, CommandResult)) and (marks := self.marks.get(frame.id)) is not None:
            slot = 1 if isinstance(frame, CommandAck) else 2
            marks[slot] = marks[slot] or time.time()  # the first time: a resend's is not the round trip's


class SimulatedAgent(Agent):
    """A real agent, built through the agent's public seams (runtime, ledger, host, connector, directory, observer),
    that also counts what it sends and receives, and can flood heartbeats for throughput tests."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        runtime: SimulatedRuntime,
        host: Any,
        source: str | None = None,
        gate: asyncio.Semaphore | None = None,
        sent: Counter[str] | None = None,
        marks: dict[str, list[float]] | None = None,
    ) -> None:
        """``sent``: frames sent, by type; ``marks``: command id -> [unix time it came in, its ack went out, its result
        went out] (0: not yet); a fleet passes one of each for all its agents."""
        directory = MemoryDirectory(config.state_path)
        connector = SimulatedHostConnector.from_config(config, static_urls=config.access_urls, directory=directory.load())
        connector.source, connector.gate = source, gate
        self.tally = LinkTally(sent if sent is not None else Counter(), marks if marks is not None else {})
        super().__init__(
            config,
            runtime=runtime,
            ledger=MemoryCommandLog(),
            host=host,
            connector=connector,
            directory=directory,
            observer=self.tally,
        )
        self.simulated_runtime = runtime

    @property
    def sent(self) -> Counter[str]:
        return self.tally.sent

    @property
    def marks(self) -> dict[str, list[float]]:
        return self.tally.marks

    @property
    def received(self) -> int:
        return self.tally.received

    @property
    def ready_at(self) -> float | None:
        return self.tally.ready_at

    @property
    def link_open(self) -> bool:
        return self.connection is not None

    async def flood(self, rate: float, until: float) -> int:
        """Send heartbeats at ``rate`` per second until the loop time ``until``; returns how many went out.

        Each says which containers run here, as a real heartbeat does, so the Master's view stays right. They go on
        the connection itself, past the tally: they are counted as ``flood``, not as the agent's own heartbeats.
        """
        loop = asyncio.get_running_loop()
        sent, owed, last = 0, 0.0, loop.time()
        while (now := loop.time()) < until:
            owed += (now - last) * rate
            last = now
            running = sorted(c.name for c in await self.runtime.list() if c.state == "running")
            try:
                while owed >= 1.0:
                    if (ws := self.connection) is None:
                        raise ConnectionError("not connected")
                    await ws.send(encode(self.session.heartbeat(time.time(), running)), text=True)
                    owed -= 1.0
                    sent += 1
            except (ConnectionError, ConnectionClosed):
                break
            await asyncio.sleep(FLOOD_TICK_S)
        self.tally.sent["flood"] += sent
        return sent


def settle_heap() -> None:
    """Collect once, then move every object alive now out of the garbage collector's sight (``gc.freeze``).

    One process here holds what thousands of hosts would each hold alone; a full collection walks all of it
    (about 1 s per 2,000 agents), stalling every agent at once, which no real host would see.
    """
    gc.collect()
    gc.freeze()


# While the agents run, the automatic collector stays off and the young generation is collected this often instead.
# The automatic one starts a young collection after 20,000 more allocations than frees (common.heap), but the frees
# of *older* objects count too: 10,000 agents' waits (a coroutine, a future, a timer each, living a few seconds) are
# made and freed at the same pace, so the count hardly moves while the young generation grows to half a million
# objects, and the collection that comes at last holds every agent of the process for 250-400 ms (bench/HISTORY.md,
# the slowest commands of a hold fell on them). A young collection each second walks a second's worth.
YOUNG_COLLECTION_EVERY_S = 1.0


class GcPauses:
    """How long the garbage collector stopped this process: a full collection walks every object of every agent."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.longest_ms = [0.0, 0.0, 0.0]
        self.total_s = 0.0
        # (unix time, generation, wall ms, CPU ms, collected), the last 20: a wall time well over the CPU time means
        # the process was waiting for a core, not collecting
        self.long_pauses: list[tuple[float, int, float, float, int]] = []
        self._started = self._started_cpu = 0.0

    def install(self) -> None:
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started, self._started_cpu = time.perf_counter(), time.thread_time()
            return
        took, generation = time.perf_counter() - self._started, info["generation"]
        cpu = time.thread_time() - self._started_cpu
        self.count[generation] += 1
        self.total_s += took
        self.longest_ms[generation] = max(self.longest_ms[generation], took * 1000)
        if took >= LONG_GC_PAUSE_S:
            self.long_pauses.append((time.time() - took, generation, took * 1000, cpu * 1000, info.get("collected", 0)))
            del self.long_pauses[:-20]

    def figures(self) -> dict[str, Any]:
        return {
            "collections": list(self.count),
            "longest_ms": [round(ms, 1) for ms in self.longest_ms],
            "total_s": round(self.total_s, 3),
            "long_pauses": [
                [round(at, 2), generation, round(ms, 1), round(cpu_ms, 1), collected]
                for at, generation, ms, cpu_ms, collected in self.long_pauses
            ],
        }


class Fleet:
    """Loads, ramps up, measures and stops a set of simulated agents in this process."""

    def __init__(self, settings: FleetSettings) -> None:
        self.settings = settings
        self.agents: list[SimulatedAgent] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._ramp: asyncio.Task[None] | None = None
        self.load_s = 0.0
        self.ramp_started: float | None = None  # monotonic
        self.all_ready_at: float | None = None
        self._watch: asyncio.Task[None] | None = None
        self._young: asyncio.Task[None] | None = None
        self.gc = GcPauses()
        self.sent: Counter[str] = Counter()  # every agent's frames, by type
        self.marks: dict[str, list[float]] = {}  # command id -> when it came in, its ack and its result went out
        self.journal: list[Execution] = []  # every agent's runtime operations, in order

    # --- lifecycle -----------------------------------------------------------------------------

    def load(self) -> None:
        """Build every agent from its state directory; nothing connects yet."""
        started = time.monotonic()
        settings = self.settings
        root = Path(settings.agents_dir)
        indexes = _indexes(root, settings.first, settings.count, settings.stride)
        host = collect_host_info(root)
        gate = asyncio.Semaphore(settings.max_openings)
        urls = settings.access_urls
        for index in indexes:
            rotated = urls[index % len(urls) :] + urls[: index % len(urls)]
            config = AgentConfig(
                state_dir=str(agent_dir(root, index)),
                access_urls=rotated,
                simulate=host_gpus(settings.simulate, index),
                runtime="simulated",
                measure_bandwidth=False,
                relay_probe=False,  # one machine: latency says nothing, and 10,000 probes would load the relays
                storage=False,  # no workload data moves in the simulated fleet: no data directory per agent
                result_resend_s=settings.result_resend_s,
            )
            runtime = SimulatedRuntime(
                latency_s=settings.latency_ms / 1000,
                jitter_s=settings.jitter_ms / 1000,
                failure_rate=settings.failure_rate,
                seed=settings.seed * 1_000_003 + index,
                journal=self.journal,
            )
            source = source_address(index) if settings.distinct_sources else None
            agent = SimulatedAgent(config, runtime=runtime, host=host, source=source, gate=gate, sent=self.sent, marks=self.marks)
            # A real agent loads its certificate once, at start, on its own CPU; here that is done before the
            # ramp, so that the ramp measures the handshakes and the Master, not thousands of file loads.
            agent.tls_context()
            self.agents.append(agent)
        self.load_s = time.monotonic() - started
        settle_heap()
        gc.enable()

    async def start(self) -> None:
        """Begin the ramp: agents start at ``connect_rate`` per second.

        The cyclic garbage collector is off until every agent is ready: the heap grows by a third with every
        few hundred connections, and each such growth would otherwise cost a full collection of this process.
        From then on it stays off, and the young generation is collected every ``YOUNG_COLLECTION_EVERY_S``.
        """
        if self._ramp is not None:
            return
        gc.disable()
        self.ramp_started = time.monotonic()
        self._ramp = asyncio.create_task(self._ramp_up(), name="fleet-ramp")
        self._watch = asyncio.create_task(self._watch_ready(), name="fleet-ready")

    async def wait_ready(self, timeout: float) -> bool:
        """Whether every agent has been welcomed by the Master within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.all_ready_at is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.all_ready_at is not None

    async def stop(self) -> None:
        gc.enable()
        for task in (self._ramp, self._watch, self._young):
            if task is not None:
                task.cancel()
        for agent in self.agents:
            agent.stop()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_TIMEOUT_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        self._tasks.clear()

    async def _ramp_up(self) -> None:
        assert self.ramp_started is not None
        interval = 1.0 / self.settings.connect_rate
        for n, agent in enumerate(self.agents):
            delay = self.ramp_started + n * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._tasks.append(asyncio.create_task(self._run_agent(agent), name=f"agent-{n}"))

    async def _run_agent(self, agent: SimulatedAgent) -> None:
        try:
            await agent.run()
        except Exception:  # one agent's bug must not end the fleet
            log.exception("simulated agent %s failed", agent.identity.agent_id)

    async def _watch_ready(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            if len(self._tasks) == len(self.agents) and all(a.ready_at is not None for a in self.agents):
                self.all_ready_at = max(a.ready_at for a in self.agents if a.ready_at is not None)
                settle_heap()
                self._young = asyncio.create_task(self._collect_young(), name="fleet-young-gc")
                return

    async def _collect_young(self) -> None:
        while True:
            await asyncio.sleep(YOUNG_COLLECTION_EVERY_S)
            gc.collect(0)

    # --- what the bench asks -------------------------------------------------------------------

    async def flood(self, rate: float, agents: int, seconds: float) -> dict[str, Any]:
        """``agents`` agents with a link open send heartbeats at ``rate`` per second in all, for ``seconds``."""
        chosen = [a for a in self.agents if a.link_open][: max(1, agents)]
        if not chosen:
            return {"agents": 0, "sent": 0, "received": 0, "elapsed_s": 0.0}
        received_before = sum(a.received for a in chosen)
        loop = asyncio.get_running_loop()
        started = loop.time()
        sent = await asyncio.gather(*(a.flood(rate / len(chosen), started + seconds) for a in chosen))
        elapsed = loop.time() - started
        return {
            "agents": len(chosen),
            "sent": sum(sent),
            "received": sum(a.received for a in chosen) - received_before,
            "elapsed_s": round(elapsed, 3),
        }

    def stats(self) -> dict[str, Any]:
        executions = Counter(e.command_id for e in self.journal if e.op == "create" and e.command_id)
        failed = sum(1 for e in self.journal if not e.ok)
        ready_times = [a.ready_at for a in self.agents if a.ready_at is not None]
        started = self.ramp_started
        return {
            "agents": len(self.agents),
            "started": len(self._tasks),
            "open": sum(1 for a in self.agents if a.link_open),
            "ready": sum(1 for a in self.agents if a.connected.is_set()),
            "ever_ready": len(ready_times),
            "load_s": round(self.load_s, 3),
            "all_ready_s": round(max(ready_times) - started, 3) if started and len(ready_times) == len(self.agents) else None,
            "first_ready_s": round(min(ready_times) - started, 3) if ready_times and started else None,
            "sent": dict(self.sent),
            "received": sum(a.received for a in self.agents),
            "commands_executed": len(executions),
            "duplicate_executions": sum(1 for n in executions.values() if n > 1),
            "failed_executions": failed,
            **{f"gc_{key}": value for key, value in self.gc.figures().items()},
        }


def _indexes(root: Path, first: int, count: int, stride: int = 1) -> list[int]:
    if count:
        indexes = list(range(first, first + count * stride, stride))
    else:
        indexes, index = [], first
        while agent_dir(root, index).is_dir():
            indexes.append(index)
            index += 1
    missing = [i for i in indexes if not (agent_dir(root, i) / "identity.json").exists()]
    if missing or not indexes:
        raise FileNotFoundError(
            f"no enrolled agent in {agent_dir(root, missing[0] if missing else first)}: provision the fleet first "
            "(python -m bench fleet does, or enroll each with `idlegrid agent --state-dir DIR enroll`)"
        )
    return indexes


# --- the command line --------------------------------------------------------------------------


async def _control(fleet: Fleet) -> None:
    """JSON lines on stdin, answers on stdout; end of input stops the fleet."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending: set[asyncio.Task[None]] = set()

    def answer(payload: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    async def handle(request: dict[str, Any]) -> None:
        op, ref = request.get("op"), request.get("id")
        try:
            if op == "start":
                await fleet.start()
                result: dict[str, Any] = {}
            elif op == "stats":
                result = fleet.stats()
            elif op == "marks":  # the bench's command round trips, cut at this process (bench.fleet.PHASES)
                Path(request["path"]).write_text(json.dumps(fleet.marks))
                result = {"commands": len(fleet.marks)}
            elif op == "flood":
                result = await fleet.flood(float(request["rate"]), int(request["agents"]), float(request["seconds"]))
            else:
                raise ValueError(f"unknown op {op!r}; expected start, stats, marks, flood or stop")
            answer({"id": ref, "op": op, "ok": True, **result})
        except Exception as exc:  # answered, so the driver is never left waiting
            answer({"id": ref, "op": op, "ok": False, "error": str(exc)})

    answer({"op": "loaded", "ok": True, "agents": len(fleet.agents), "load_s": round(fleet.load_s, 3)})
    while line := await reader.readline():
        request = json.loads(line)
        if request.get("op") == "stop":
            break
        task = asyncio.create_task(handle(request))
        pending.add(task)
        task.add_done_callback(pending.discard)
    for task in pending:
        task.cancel()
    await fleet.stop()
    answer({"op": "stop", "ok": True})


async def _standalone(fleet: Fleet, report_s: float, duration_s: float) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await fleet.start()
    deadline = loop.time() + duration_s if duration_s > 0 else None
    try:
        while not stopping.is_set() and (deadline is None or loop.time() < deadline):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), report_s)
            print(json.dumps(fleet.stats()), flush=True)
    finally:
        await fleet.stop()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.fleet_agents",
        description="Run many simulated agents in this process, each a real agent with its own mutual-TLS WebSocket "
        "to an Access relay. The agents must be enrolled already, one state directory each "
        f"({AGENT_DIR_FORMAT.format(0)}, ...) under --agents-dir.",
    )
    p.add_argument("--config", type=Path, help="TOML file with the settings below (as snake_case keys)")
    p.add_argument("--agents-dir", help="directory of enrolled agent state directories")
    p.add_argument("--access", action="append", dest="access_urls", help="wss://HOST:PORT of a relay (repeatable)")
    p.add_argument("--first", type=int, help="index of the first agent to run here (default 0)")
    p.add_argument("--count", type=int, help="how many agents to run here (default: all from --first on)")
    p.add_argument("--stride", type=int, help="run every STRIDE-th agent from --first on (default 1; needs --count)")
    p.add_argument("--simulate", help="GPUs of each simulated host (default h100:8)")
    p.add_argument("--connect-rate", type=float, help="agents started per second during the ramp (default 500)")
    p.add_argument("--latency-ms", type=float, help="simulated runtime: milliseconds per create or delete (default 20)")
    p.add_argument("--jitter-ms", type=float, help="simulated runtime: ± jitter on that latency (default 5)")
    p.add_argument("--failure-rate", type=float, help="simulated runtime: share of operations that fail (default 0)")
    p.add_argument("--seed", type=int, help="seed of the simulated runtimes (default 1)")
    p.add_argument("--log-level", help="log level of the simulator and its agents (default warning)")
    p.add_argument("--max-openings", type=int, help="connections opening at once in this process (default 64)")
    p.add_argument(
        "--shared-source",
        dest="distinct_sources",
        action="store_const",
        const=False,
        help="dial every relay from 127.0.0.1, like hosts behind one NAT (default: one loopback address each)",
    )
    p.add_argument(
        "--control", action="store_true", help="take JSON-line requests on stdin (start, stats, flood, stop) and answer on stdout"
    )
    p.add_argument("--report-s", type=float, default=5.0, help="without --control: seconds between figures (default 5)")
    p.add_argument(
        "--duration", type=float, default=0.0, help="without --control: stop after this many seconds (default: run until Ctrl-C)"
    )
    return p


def load_settings(args: argparse.Namespace) -> FleetSettings:
    overrides = {
        name: getattr(args, name)
        for name in (
            "agents_dir",
            "access_urls",
            "first",
            "count",
            "stride",
            "simulate",
            "connect_rate",
            "latency_ms",
            "jitter_ms",
            "failure_rate",
            "seed",
            "log_level",
            "distinct_sources",
            "max_openings",
        )
    }
    return load_config(FleetSettings, path=args.config, env_prefix="IDLEGRID_FLEET_", overrides=overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args)
    except Exception as exc:
        print(f"bench.fleet_agents: {exc}", file=sys.stderr)
        return 2
    setup_logging("fleet", settings.log_level)
    tune_for_daemon()
    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES
    fleet = Fleet(settings)
    fleet.gc.install()
    try:
        fleet.load()
    except (FileNotFoundError, OSError) as exc:
        print(f"bench.fleet_agents: {exc}", file=sys.stderr)
        return 2
    if args.control:
        run_loop(_control(fleet))
    else:
        run_loop(_standalone(fleet, args.report_s, args.duration))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A simulated Access relay: what a real relay with thousands of agents behind it sends the Master, from one process.

``bench fleet --relays-simulated N`` starts N of these beside the real Master (its real store) to measure the Master
at 100,000 agents on a machine that could not hold 100,000 agent connections (issue 42). What the Master sees is what
a real relay sends it (access/upstream.py): the relay's mutual-TLS link as role ``access``, its ``access_hello``
(``folds`` and ``directory_news`` on), each agent's ``agent_connected`` and ``hello`` at the ramp, its agents'
heartbeats and telemetry folded by the relay's own ``ReportFolder`` (access/fold.py) into one ``report_fold`` per
``fold_interval_s``, command acks and results answering the Master's commands, and ``access_stats``. Link frames go
as JSON arrays (the Master's welcome says ``batches``), control first, then hellos, then the fold.

What is simulated is what stands behind the relay: the agents' TLS sessions and their processes. Each agent here is a
few fields: its GPUs (``agent.simulate.SimulatedCollector``, the agent's own), the containers it runs (a heartbeat
says them), the ping nonce it echoes, and the commands it ran (each once: a resent command gets its first result
again). A command is acked at once and answered after ``latency_ms`` ± ``jitter_ms``, as the fleet's simulated runtime
does. Heartbeats come every ``heartbeat_s`` and telemetry every ``telemetry_s`` (the Master's report pace when it
sends one), agent ``i`` in the fold intervals where ``i`` falls due, so each interval carries an even share.

Driven like bench/fleet_agents.py: ``--control`` takes JSON lines on stdin (``start``, ``stats``, ``marks``, ``stop``)
and answers on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from access.fold import ReportFolder
from agent.host import collect_host_info
from agent.simulate import SimulatedCollector
from common.errors import ProtocolError
from common.inventory import GpuSample, HostInfo, Inventory
from common.logs import setup_logging
from common.loop import run as run_loop
from common.pki import client_tls_context
from common.wire import (
    HARD_FRAME_BYTES,
    PROTOCOL_VERSIONS,
    AccessHello,
    AccessStats,
    AccessWelcome,
    AgentConnected,
    Command,
    CommandAck,
    CommandResult,
    Error,
    Heartbeat,
    Hello,
    Ping,
    Relay,
    ReportPace,
    Telemetry,
    Welcome,
    decode_link_frame,
    decode_link_message,
    decode_master_frame,
    encode,
)

log = logging.getLogger(__name__)

FLUSH_S = 0.01  # control and hellos wait at most this long to share a message
MAX_MESSAGE_BYTES = 1024 * 1024  # a batch is cut here (the real relay's bound is larger; the Master takes 4 MiB)
STATS_EVERY_S = 10.0  # the relay's stats_interval_s
FOLD_MAX_SAMPLES, FOLD_MAX_BYTES = 20_000, 2 * 1024 * 1024  # the relay's defaults (access/config.py)
HELLO_REQUIRED = "hello_required"


class SimulatedAgent:
    """One agent behind this relay: only what the Master is told about it."""

    __slots__ = ("agent_id", "serial", "index", "uuids", "hello", "running", "ping", "ready_at", "seq", "executed")

    def __init__(self, agent_id: str, serial: str, index: int) -> None:
        self.agent_id = agent_id
        self.serial = serial
        self.index = index
        self.uuids: list[str] = []
        self.hello = b""
        self.running: list[str] = []
        self.ping: str | None = None
        self.ready_at: float | None = None
        self.seq = 0
        self.executed: dict[str, CommandResult] = {}  # command id -> its result (each command runs once)


class SimulatedRelay:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        listed = json.loads(Path(args.agents_file).read_text())
        self.agents = [SimulatedAgent(a["id"], a["serial"], i) for i, a in enumerate(listed)]
        self.by_id = {a.agent_id: a for a in self.agents}
        self.folder = ReportFolder(FOLD_MAX_SAMPLES, FOLD_MAX_BYTES)
        self.control: list[bytes] = []  # encoded link frames waiting, by lane: control, hellos, folds
        self.hellos: list[bytes] = []
        self.folds: list[bytes] = []
        self.wake = asyncio.Event()
        self.connection: ClientConnection | None = None
        self.sent: Counter[str] = Counter()  # agent frames by type, and link messages
        self.marks: dict[str, list[float]] = {}  # command id -> [came in, ack out, result out] (bench.fleet.PHASES)
        self.ramp_started: float | None = None
        self.heartbeat_s, self.telemetry_s = float(args.heartbeat_s), float(args.telemetry_s)
        self.admit_per_s = 0.0
        self.duplicates = 0
        self.failures: list[str] = []  # tasks that ended by themselves (the link closed, a bug)
        self.load_s = 0.0
        self.rng = random.Random(args.seed)
        self._tasks: list[asyncio.Task[Any]] = []
        self._host: HostInfo | None = None
        self._samples: dict[str, list[GpuSample]] = {}  # agent id -> its GPUs' idle reading (a fresh ts each report)

    # --- loading: each agent's hello, as its agent would say it --------------------------------

    def load(self) -> None:
        started = time.monotonic()
        self._host = collect_host_info()
        for agent in self.agents:
            collector = SimulatedCollector(self.args.simulate, host_key=agent.agent_id)
            gpus = collector.inventory()
            agent.uuids = [g.uuid for g in gpus]
            self._samples[agent.agent_id] = collector.sample()
            inventory = Inventory(
                host=self._host, gpus=gpus, simulated=True, runtime="simulated", isolation="container", images=[]
            )
            hello = Hello(versions=list(PROTOCOL_VERSIONS), agent_version="bench", inventory=inventory, region=self.args.region)
            agent.hello = encode(Relay(agent_id=agent.agent_id, frame=msgspec.Raw(encode(hello))))
        self.load_s = time.monotonic() - started

    # --- the link ----------------------------------------------------------------------------

    async def open(self) -> None:
        args = self.args
        context = client_tls_context(args.ca, args.cert, args.key)
        self.connection = await connect(
            args.master_url, ssl=context, max_size=HARD_FRAME_BYTES, compression=None, ping_interval=None
        )
        hello = AccessHello(
            versions=list(PROTOCOL_VERSIONS),
            relay_id=args.relay_id,
            region=args.region,
            directory_news=True,
            folds=True,
            batches=not args.no_batches_down,
        )
        await self.connection.send(encode(hello), text=True)
        welcome = decode_link_frame(await self.connection.recv(decode=False))
        if not isinstance(welcome, AccessWelcome) or not welcome.batches or not welcome.folds:
            raise RuntimeError(f"the Master's welcome takes no batches or folds: {welcome!r}")
        self._tasks = [
            self._task(self._read(), "read"),
            self._task(self._flush(), "flush"),
            self._task(self._report(), "report"),
            self._task(self._stats(), "stats"),
        ]

    def _task(self, work: Any, name: str) -> asyncio.Task[Any]:
        """A task whose end, other than by ``stop``, is logged: a relay whose reader or sender stopped would leave
        the Master's link silent (its pings unanswered) with nothing said."""
        task = asyncio.create_task(work, name=name)

        def ended(task: asyncio.Task[Any]) -> None:
            if task.cancelled() or (name == "ramp" and task.exception() is None):  # a ramp ends when all connected
                return
            error = task.exception()
            link = self.connection
            closed = f" (link closed: {link.close_code} {link.close_reason!r})" if link is not None and link.close_code else ""
            log.error("the simulated relay's %s task ended: %r%s", name, error, closed, exc_info=error)
            self.failures.append(f"{name}: {error!r}")

        task.add_done_callback(ended)
        return task

    async def start(self) -> None:
        self.ramp_started = time.time()
        self._tasks.append(self._task(self._ramp(), "ramp"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await task
        if self.connection is not None:
            await self.connection.close()

    def _queue(self, frame: bytes, *, hello: bool = False) -> None:
        (self.hellos if hello else self.control).append(frame)
        self.wake.set()

    async def _send(self, frames: list[bytes]) -> None:
        assert self.connection is not None
        message: list[bytes] = []
        size = 0
        for frame in frames:
            if size + len(frame) > MAX_MESSAGE_BYTES and message:
                await self.connection.send(b"[" + b",".join(message) + b"]", text=True)
                self.sent["messages"] += 1
                message, size = [], 0
            message.append(frame)
            size += len(frame) + 1
        if message:
            await self.connection.send(b"[" + b",".join(message) + b"]", text=True)
            self.sent["messages"] += 1

    async def _flush(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            await asyncio.sleep(FLUSH_S)
            frames = [*self.control, *self.hellos, *self.folds]
            self.control, self.hellos, self.folds = [], [], []
            if frames:
                await self._send(frames)

    async def _ramp(self) -> None:
        """Each agent connects (``agent_connected``, then its hello) at ``connect_rate``, or at the Master's admission
        pace when it sets one (``report_pace.admit_per_s``), as the relay admits sessions."""
        loop = asyncio.get_running_loop()
        began, admitted = loop.time(), 0
        for agent in self.agents:
            rate = min(self.args.connect_rate, self.admit_per_s) if self.admit_per_s > 0 else self.args.connect_rate
            delay = began + admitted / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            elif admitted % 64 == 0:
                await asyncio.sleep(0)
            admitted += 1
            self._connect(agent)

    def _connect(self, agent: SimulatedAgent) -> None:
        cert_not_after = time.time() + 86_400
        connected = AgentConnected(agent_id=agent.agent_id, serial=agent.serial, cert_not_after=cert_not_after)
        self._queue(encode(connected))
        self._send_hello(agent)

    def _send_hello(self, agent: SimulatedAgent) -> None:
        self.folder.renew(agent.agent_id)
        self._queue(agent.hello, hello=True)
        self.sent["hello"] += 1

    async def _report(self) -> None:
        """Every fold interval: the heartbeats and telemetry falling due, folded as the relay folds them."""
        interval = self.args.fold_interval_s
        loop = asyncio.get_running_loop()
        began, tick = loop.time(), 0
        while True:
            tick += 1
            delay = began + tick * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self._fold_due(tick, interval)
            fold = self.folder.take()
            if fold is not None:
                self.sent["report_fold"] += 1
                self.folds.append(encode(fold))  # the telemetry lane: behind control and hellos
                self.wake.set()

    def _fold_due(self, tick: int, interval: float) -> None:
        beat_every = max(1, round(self.heartbeat_s / interval))
        report_every = max(1, round(self.telemetry_s / interval))
        now = time.time()
        folder, sent = self.folder, self.sent
        for agent in self.agents[tick % beat_every :: beat_every]:
            if agent.ready_at is None:
                continue
            agent.seq += 1
            beat = Heartbeat(seq=agent.seq, ts=now, running=list(agent.running), ping=agent.ping)
            folder.add(agent.agent_id, beat, 48 + 24 * len(agent.running))
            sent["heartbeat"] += 1
        for agent in self.agents[tick % report_every :: report_every]:
            if agent.ready_at is None:
                continue
            samples = [msgspec.structs.replace(s, ts=now) for s in self._samples[agent.agent_id]]
            folder.add(agent.agent_id, Telemetry(ts=now, samples=samples), 110 + 240 * len(samples))
            sent["telemetry"] += 1

    async def _stats(self) -> None:
        while True:
            await asyncio.sleep(STATS_EVERY_S)
            ready = sum(1 for a in self.agents if a.ready_at is not None)
            frames = sum(v for k, v in self.sent.items() if k != "messages")
            self._queue(encode(AccessStats(agents=ready, frames_in=frames, frames_out=frames, buffered=0, refused=0)))

    # --- what the Master sends ---------------------------------------------------------------

    async def _read(self) -> None:
        assert self.connection is not None
        async for message in self.connection:
            for frame in decode_link_message(message if isinstance(message, bytes) else message.encode()):
                self._from_master(frame, message)

    def _from_master(self, frame: Any, message: bytes | str) -> None:
        """One frame of a message from the Master (a message is a frame, or an array of them: this relay takes
        batches, as its AccessHello says, unless ``--no-batches-down``)."""
        if isinstance(frame, ProtocolError):  # a frame this simulation does not know: the real relay logs it too
            log.warning("undecodable frame from the Master: %.200r", message)
            return
        if isinstance(frame, Relay):
            try:
                self._to_agent(frame)
            except ProtocolError as exc:  # an agent would answer with an error frame; here it is only logged
                log.warning("undecodable frame for agent %s: %s", frame.agent_id, exc)
        elif isinstance(frame, ReportPace):
            self.heartbeat_s, self.telemetry_s = frame.heartbeat_s, frame.telemetry_s
            self.admit_per_s = frame.admit_per_s

    def _to_agent(self, envelope: Relay) -> None:
        agent = self.by_id.get(envelope.agent_id)
        if agent is None:
            return
        frame = decode_master_frame(bytes(envelope.frame))
        if isinstance(frame, Welcome):
            if agent.ready_at is None:
                agent.ready_at = time.time()
        elif isinstance(frame, Command):
            self._command(agent, frame)
        elif isinstance(frame, Ping):
            agent.ping = frame.nonce
        elif isinstance(frame, Error) and frame.code == HELLO_REQUIRED:
            self._send_hello(agent)

    def _relay(self, agent: SimulatedAgent, frame: msgspec.Struct, kind: str) -> None:
        self._queue(encode(Relay(agent_id=agent.agent_id, frame=msgspec.Raw(encode(frame)))))
        self.sent[kind] += 1

    def _command(self, agent: SimulatedAgent, command: Command) -> None:
        body = command.body
        self.marks.setdefault(body.id, [time.time(), 0.0, 0.0])
        self._relay(agent, CommandAck(id=body.id), "command_ack")
        self.marks[body.id][1] = self.marks[body.id][1] or time.time()
        done = agent.executed.get(body.id)
        if done is not None:  # run once: a resent command gets its first result again
            self._relay(agent, done, "command_result")
            return
        delay = max(0.0, self.args.latency_ms + self.rng.uniform(-self.args.jitter_ms, self.args.jitter_ms)) / 1000
        asyncio.get_running_loop().call_later(delay, self._finish, agent, body.id, body.kind, dict(body.spec))

    def _finish(self, agent: SimulatedAgent, command_id: str, kind: str, spec: dict[str, Any]) -> None:
        if command_id in agent.executed:
            self.duplicates += 1
            return
        name = str(spec.get("name", ""))
        if kind == "create_container" and name:
            agent.running.append(name)
        elif kind == "delete_container" and name in agent.running:
            agent.running.remove(name)
        result = CommandResult(id=command_id, ok=True, result={})
        agent.executed[command_id] = result
        self._relay(agent, result, "command_result")
        self.marks[command_id][2] = time.time()

    def stats(self) -> dict[str, Any]:
        ready_times = [a.ready_at for a in self.agents if a.ready_at is not None]
        started = self.ramp_started
        executed = sum(len(a.executed) for a in self.agents)
        return {
            "agents": len(self.agents),
            "ready": len(ready_times),
            "ever_ready": len(ready_times),
            "load_s": round(self.load_s, 3),
            "all_ready_s": round(max(ready_times) - started, 3) if started and len(ready_times) == len(self.agents) else None,
            "sent": dict(self.sent),
            "commands_executed": executed,
            "duplicate_executions": self.duplicates,
            "pace": [self.heartbeat_s, self.telemetry_s, self.admit_per_s],
            "task_failures": len(self.failures),
        }


async def _control(relay: SimulatedRelay) -> None:
    """JSON lines on stdin, answers on stdout (bench/fleet_agents.py's protocol); end of input stops the relay."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)

    def answer(payload: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(payload) + "\n")
        sys.stdout.flush()

    relay.load()
    await relay.open()
    answer({"op": "loaded", "ok": True, "agents": len(relay.agents), "load_s": round(relay.load_s, 3)})
    while line := await reader.readline():
        request = json.loads(line)
        op, ref = request.get("op"), request.get("id")
        if op == "stop":
            break
        try:
            if op == "start":
                await relay.start()
                result: dict[str, Any] = {}
            elif op == "stats":
                result = relay.stats()
            elif op == "marks":
                Path(request["path"]).write_text(json.dumps(relay.marks))
                result = {"commands": len(relay.marks)}
            else:
                raise ValueError(f"unknown op {op!r}; expected start, stats, marks or stop")
            answer({"id": ref, "op": op, "ok": True, **result})
        except Exception as exc:  # answered, so the driver is never left waiting
            answer({"id": ref, "op": op, "ok": False, "error": str(exc)})
    await relay.stop()
    answer({"op": "stop", "ok": True})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.relay_sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--control", action="store_true", help="take JSON-line requests on stdin (how bench fleet drives it)")
    p.add_argument("--master-url", required=True)
    p.add_argument("--relay-id", required=True)
    p.add_argument("--region", default="bench")
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ca", required=True)
    p.add_argument("--agents-file", required=True, help='JSON list of {"id", "serial"}: the agents behind this relay')
    p.add_argument("--simulate", default="h100:8")
    p.add_argument("--connect-rate", type=float, default=500.0)
    p.add_argument("--heartbeat-s", type=float, default=5.0)
    p.add_argument("--telemetry-s", type=float, default=10.0)
    p.add_argument("--fold-interval-s", type=float, default=1.0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--jitter-ms", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--no-batches-down",
        action="store_true",
        help="say in the AccessHello that this relay takes one frame per message from the Master (as relays before it)",
    )
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    if not args.control:
        p.error("only --control is supported: bench fleet --relays-simulated drives this")
    setup_logging("relay-sim", args.log_level)
    run_loop(_control(SimulatedRelay(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``python -m bench.master_cpu [N]``: the Master's CPU per agent hello and per telemetry sample, in one process
(issue 42).

A real Master on SQLite (a temporary state directory) is told what ``bench fleet --relays-simulated`` tells it through
one relay link, without sockets: each message goes through the link's real intake (master/intake.py ``LinkIntake``,
hellos handled ``ADMIT_AT_ONCE`` at a time, their store writes joined), as a relay sends it (a JSON array of link
frames: ``agent_connected`` and the agent's hello, ``--batch`` agents a message). What the Master sends back goes to
a stand-in connection that counts and drops it, or with ``--socket`` through a real WebSocket connection (plain TCP on
127.0.0.1, no TLS, unlike a real link) to a process that reads and drops it, so that the Master's sends are counted
too; ``--batches`` has the link join them as a relay that takes batches asks (master/link.py).

Two phases, each timed by CPU, never wall time:

- the ramp: N agents of 8 simulated H100s say hello; CPU per hello until every agent is ready;
- the hold: ``--folds`` report folds of every agent's telemetry (8 GPU samples and a host sample each, dated a few
  seconds apart, as the relay's ``ReportFolder`` folds them: ``AGENTS_PER_FOLD`` agents a fold), encoded and decoded
  as a relay's fold is; CPU per GPU sample (the frame's whole handling at the Master divided by its 8 samples).

Each figure is given twice: the event loop's thread (``thread_time`` of the main thread: what bounds the Master, one
core) and the whole process (``process_time``: the store's thread too). ``--profile FILE`` writes a cProfile of the
phase named by ``--profile-phase``. Runs in seconds at 2,000 agents; compare a change beside its base in the same
window, alternately (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import gc
import json
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgspec

from agent.simulate import SimulatedCollector
from bench.master_memory import AGENTS_PER_FOLD, HOST  # the same host and folds as the memory census
from common.errors import ProtocolError
from common.inventory import HostSample, Inventory
from common.wire import (
    PROTOCOL_VERSIONS,
    AgentConnected,
    AgentReports,
    Hello,
    LinkFrame,
    Relay,
    ReportFold,
    Telemetry,
    encode,
)
from master.config import MasterConfig
from master.intake import LinkIntake
from master.link import AccessLink
from master.master import Master
from master.records import AgentRecord


class _Counting:
    """The relay's connection: what the Master sends is counted (messages, bytes) and dropped."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0

    async def send(self, data: bytes | str, text: bool = False) -> None:
        self.messages += 1
        self.bytes += len(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        pass


class _Counted:
    """A real connection, its messages counted as ``_Counting`` counts them."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.messages = 0
        self.bytes = 0

    async def send(self, data: bytes | str, text: bool = False) -> None:
        self.messages += 1
        self.bytes += len(data)
        await self.connection.send(data, text=text)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.connection.close(code, reason)


_READER = """
import asyncio, sys
from websockets.asyncio.client import connect
async def read():
    async with connect(sys.argv[1], max_size=None, compression=None, ping_interval=None) as connection:
        async for _ in connection:
            pass
asyncio.run(read())
"""


async def _socket() -> tuple[Any, subprocess.Popen[bytes], Any]:
    """A WebSocket server here, a process reading from it and dropping what it reads, and the server's connection."""
    from websockets.asyncio.server import serve

    loop = asyncio.get_running_loop()
    linked: asyncio.Future[Any] = loop.create_future()

    async def serve_one(connection: Any) -> None:
        linked.set_result(connection)
        await connection.wait_closed()

    server = await serve(serve_one, "127.0.0.1", 0, compression=None, max_size=None, ping_interval=None)
    port = server.sockets[0].getsockname()[1]
    reader = subprocess.Popen([sys.executable, "-c", _READER, f"ws://127.0.0.1:{port}"])
    return server, reader, await asyncio.wait_for(linked, 30)


class _Clock:
    """CPU of the loop's thread and of the process, from ``start`` to ``stop``."""

    def __init__(self) -> None:
        self.thread = self.process = 0.0

    def start(self) -> None:
        self._t, self._p = time.thread_time(), time.process_time()

    def stop(self) -> None:
        self.thread, self.process = time.thread_time() - self._t, time.process_time() - self._p


async def _bad(exc: ProtocolError) -> None:
    raise AssertionError(f"the Master refused a frame: {exc}")


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    agents, folds = args.agents, args.folds
    with tempfile.TemporaryDirectory() as state_dir:
        # Hour-long heartbeats: no agent goes offline while the bench runs, whatever the machine's load.
        master = Master(MasterConfig(state_dir=state_dir, link_port=0, heartbeat_s=3600.0))
        await master.start()
        try:
            socket = await _socket() if args.socket else None
            connection: _Counting | _Counted = _Counting() if socket is None else _Counted(socket[2])
            link = AccessLink(relay_id="relay-a", region="eu", connection=connection, folds=True)  # type: ignore[arg-type]
            if args.batches:
                link.batches = True  # (an attribute of nothing on a Master from before batching: no effect there)
            master.hub.links[link.relay_id] = link
            channel = master.channel
            handled = [0]  # agents' reports handled (the hold's end)

            async def handle(frame: LinkFrame | AgentReports) -> None:
                if isinstance(frame, AgentReports):
                    handled[0] += 1
                await channel.on_link_frame(link, frame)

            intake = link.intake = LinkIntake(
                handle,
                _bad,
                master.hub.lanes,
                master.hub.intake,
                master.hub.heard,
                link.agents,
                alive=functools.partial(channel.alive_at_once, link),
            )
            handler = asyncio.create_task(intake.run(), name="intake")

            ids = [f"agt-{i:06d}" for i in range(agents)]
            collectors = {a: SimulatedCollector("h100:8", host_key=a) for a in ids}
            hellos = {}
            for agent_id in ids:
                inventory = Inventory(
                    host=HOST, gpus=collectors[agent_id].inventory(), simulated=True, runtime="simulated", isolation="container"
                )
                hello = Hello(versions=list(PROTOCOL_VERSIONS), agent_version="bench", inventory=inventory, region="eu")
                hellos[agent_id] = encode(Relay(agent_id=agent_id, frame=msgspec.Raw(encode(hello))))
            for agent_id in ids:  # enrolled, as the fleet bench writes them before its Master starts
                record = AgentRecord(id=agent_id, provider="prov", state="enrolled", enrolled_at=time.time())
                await master.store.agents.put(record)
                await master.registry.add(record)
            messages = []
            for first in range(0, agents, args.batch):
                frames = []
                for agent_id in ids[first : first + args.batch]:
                    frames.append(encode(AgentConnected(agent_id=agent_id, serial="", cert_not_after=time.time() + 86_400)))
                    frames.append(hellos[agent_id])
                messages.append(b"[" + b",".join(frames) + b"]")
            idle = {a: c.sample() for a, c in collectors.items()}
            del collectors

            gc.collect()
            profile = cProfile.Profile() if args.profile else None
            ramp = _Clock()
            if profile is not None and args.profile_phase == "ramp":
                profile.enable()
            ramp.start()
            wall = time.perf_counter()
            sessions = channel.sessions
            for message in messages:
                await intake.take(message)
                await asyncio.sleep(0)
            welcomed = 0  # agents welcomed, in order (the Master welcomes them about in the order they came)
            while welcomed < agents:
                session = sessions.get(ids[welcomed])
                if session is not None and session.helloed:
                    welcomed += 1
                else:
                    await asyncio.sleep(0.005)
            ramp.stop()
            ramp_wall = time.perf_counter() - wall
            if profile is not None and args.profile_phase == "ramp":
                profile.disable()
            sent_ramp = connection.messages

            # The hold: folds of every agent's telemetry (and heartbeats folded as alive names), a few seconds apart.
            start = time.time() - folds * 10.0  # dated in the past, never ahead of the Master's clock
            encoded = []
            for n in range(folds):
                ts = start + n * 10.0
                reports = [
                    AgentReports(
                        agent_id=agent_id,
                        frames=[
                            Telemetry(
                                ts=ts,
                                samples=[msgspec.structs.replace(s, ts=ts) for s in idle[agent_id]],
                                host=HostSample(ts=ts, cpu_pct=3.0, load_1m=0.2, ram_used_mib=9_000, ram_total_mib=1_548_000),
                            )
                        ],
                    )
                    for agent_id in ids
                ]
                for first in range(0, agents, AGENTS_PER_FOLD):
                    fold = ReportFold(reports=reports[first : first + AGENTS_PER_FOLD])
                    encoded.append(encode(fold))
            samples = sum(len(s) for s in idle.values()) * folds
            gc.collect()
            hold = _Clock()
            if profile is not None and args.profile_phase == "hold":
                profile.enable()
            hold.start()
            for message in encoded:
                await intake.take(message)
                while intake.queue.telemetry_waiting:
                    await asyncio.sleep(0)
                await asyncio.sleep(0)
            while handled[0] < agents * folds:
                await asyncio.sleep(0.001)
            hold.stop()
            if profile is not None:
                profile.disable()
                profile.dump_stats(args.profile)
            intake.close()
            await handler
            master.hub.links.pop(link.relay_id, None)
            if socket is not None:
                await socket[2].close()
                socket[0].close()
                socket[1].wait(30)
            result = {
                "agents": agents,
                "gpus": len(master.registry.gpus),
                "ramp_wall_s": round(ramp_wall, 3),
                "hello_loop_us": round(ramp.thread / agents * 1e6, 1),
                "hello_process_us": round(ramp.process / agents * 1e6, 1),
                "messages_to_relay_in_ramp": sent_ramp,
                "samples": samples,
                "sample_loop_us": round(hold.thread / samples * 1e6, 2),
                "sample_process_us": round(hold.process / samples * 1e6, 2),
                "latest": len(master.telemetry.latest),
            }
        finally:
            await master.stop()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("agents", type=int, nargs="?", default=2_000)
    p.add_argument("--folds", type=int, default=3, help="report folds of every agent's telemetry after the ramp (default 3)")
    p.add_argument("--batch", type=int, default=50, help="agents' hellos a relay message carries (default 50)")
    p.add_argument("--socket", action="store_true", help="send through a real WebSocket connection to a reader process")
    p.add_argument("--batches", action="store_true", help="the link joins what it sends as for a relay that takes batches")
    p.add_argument("--profile", default="", help="write a cProfile of one phase to this file")
    p.add_argument("--profile-phase", choices=("ramp", "hold"), default="ramp")
    p.add_argument("--json", default="", help="write the figures here too")
    args = p.parse_args()
    result = asyncio.run(measure(args))
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

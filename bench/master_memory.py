"""``python -m bench.master_memory [N]``: what the Master's parts hold per agent, in one process (issue 42, point 2).

A real Master on SQLite (a temporary state directory) is told what ``bench fleet --relays-simulated`` tells it, without
sockets (tests/master/linked.py's stand-in link): N agents of 8 simulated H100s say hello, then ``folds`` report folds
each carry every agent's heartbeat and telemetry, their samples dated over two minutes, so that the telemetry holds an
open minute and an ended one per GPU, as it does between two flushes. tracemalloc, started once the Master is up,
gives the bytes still held per agent, by the source line that allocated them (and by call path with ``--frames``).

Cheap beside the fleet bench (seconds at 2,000 agents, no other process), so a change to what the Master keeps can be
measured before and after; the fleet bench's figure (RSS per agent, its backlog included) is the one the target is
read against (bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
import tracemalloc

import msgspec

from agent.simulate import SimulatedCollector
from common.inventory import HostInfo
from common.wire import AgentReports, Heartbeat, ReportFold, Telemetry, decode_link_frame, encode
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from tests.master.linked import connect

# Agents a report fold carries: a real relay's folds are bounded by their bytes (access/fold.py), a few hundred agents'
# telemetry each.
AGENTS_PER_FOLD = 250

HOST = HostInfo(
    hostname="bench-host",
    cpu_model="AMD EPYC 9654 96-Core Processor",
    cpu_cores=192,
    ram_mib=1_548_000,
    disk_total_gib=7_000.0,
    disk_free_gib=6_500.0,
    os="Ubuntu 22.04.4 LTS",
    kernel="6.5.0-35-generic",
)


class _Discarding:
    """The relay's connection: what the Master sends its agents (welcomes) is not kept here, as a relay passes it on."""

    async def send(self, data: bytes | str, text: bool = False) -> None:
        pass

    async def close(self, code: int = 1000, reason: str = "") -> None:
        pass


async def measure(agents: int, folds: int, frames: int, top: int) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        # Hour-long heartbeats: the ramp here takes a minute or more, and no agent must go offline meanwhile.
        master = Master(MasterConfig(state_dir=state_dir, link_port=0, heartbeat_s=3600.0))
        await master.start()
        try:
            link = AccessLink(relay_id="relay-a", region="eu", connection=_Discarding())  # type: ignore[arg-type]
            collectors = {f"agt-{i:06d}": SimulatedCollector("h100:8", host_key=f"agt-{i:06d}") for i in range(agents)}
            inventories = {agent_id: c.inventory() for agent_id, c in collectors.items()}
            idle = {agent_id: c.sample() for agent_id, c in collectors.items()}
            gc.collect()
            tracemalloc.start(frames)
            before = tracemalloc.take_snapshot()
            for agent_id, inventory in inventories.items():
                await connect(master, link, agent_id, inventory, host=HOST, runtime="simulated", isolation="container")
            # Two minutes of samples: the first folds of the minute before this one, the rest of this one.
            now = time.time()
            start = (now // 60) * 60 - 30.0
            for n in range(folds):
                ts = start + n * 60.0 / folds
                reports = [
                    AgentReports(
                        agent_id=agent_id,
                        frames=[
                            Heartbeat(seq=n + 1, ts=ts),
                            Telemetry(ts=ts, samples=[msgspec.structs.replace(s, ts=ts) for s in idle[agent_id]]),
                        ],
                    )
                    for agent_id in inventories
                ]
                for first in range(0, len(reports), AGENTS_PER_FOLD):
                    # Through the wire, as a relay's fold comes: the Master keeps what it decoded, not these objects.
                    fold = ReportFold(reports=reports[first : first + AGENTS_PER_FOLD])
                    await master.channel.on_link_frame(link, decode_link_frame(encode(fold)))
            del reports, fold
            gc.collect()
            after = tracemalloc.take_snapshot()
            held = sum(s.size_diff for s in after.compare_to(before, "filename"))
            print(f"{agents} agents, {folds} folds: {held / agents:,.0f} B per agent traced ({held / 1e6:.1f} MB)")
            print(f"  GPUs {len(master.registry.gpus)}, with a latest sample {len(master.telemetry.latest)}")
            key = "traceback" if frames > 1 else "lineno"
            for stat in after.compare_to(before, key)[:top]:
                if stat.size_diff <= 0:
                    continue
                where = " <- ".join(str(f) for f in reversed(stat.traceback)) if frames > 1 else str(stat.traceback)
                print(f"{stat.size_diff / agents:>9,.0f} B/agent {stat.count_diff / agents:>7.1f} obj/agent  {where}")
            tracemalloc.stop()
        finally:
            await master.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("agents", type=int, nargs="?", default=2_000)
    p.add_argument("--folds", type=int, default=6, help="report folds after the hellos (default 6)")
    p.add_argument("--frames", type=int, default=1, help="tracemalloc frames per allocation (default 1: by line)")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    asyncio.run(measure(args.agents, args.folds, args.frames, args.top))


if __name__ == "__main__":
    main()

"""``python -m bench.lanes [--against REF] [--rounds N]``: the relay's buffer towards the Master and the Master's intake
queue, per frame, on this checkout's code and (``--against``) on another commit's, in alternate rounds.

No sockets, no event loop: the queues alone, driven as their shells drive them. The relay's ``FrameBuffer`` gets
what ``MasterLink`` gives it (an ``Outbound`` made per frame, ``offer``, then the sender's ``take`` of a batch and
``done``); the Master's ``LaneQueue`` what ``LinkIntake`` gives it (``push`` per frame, ``pop`` by its handlers). Frames
are those of ``agents`` agents: a heartbeat (300 bytes) each, a telemetry report (3,000 bytes) every second agent
and a command result (500 bytes) every twentieth, round after round. Scenarios:

- ``relay-up``: the link is up and keeps up (a batch of up to 500 frames taken every 100 frames offered).
- ``relay-overload``: the link is up and slow (100 frames taken every 1,000): telemetry past its coalescing bound,
  replaced and evicted.
- ``relay-down``: the Master is away (coalescing), three rounds buffered, then all sent.
- ``intake``: the Master's intake of one link: every frame pushed, a pop after each.

Figures: nanoseconds of CPU per frame, the minimum and median of ``rounds`` runs of each; the two codes' runs alternate, so
a machine's load falls on both alike. The old code is read with ``git show REF:access/upstream.py`` (and
``common/lanes.py``) and loaded beside this checkout's modules.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT, TELEMETRY, RESULT = 300, 3000, 500

Frames = list[tuple[str, str, bytes]]


def frames(agents: int, rounds: int) -> Frames:
    """(agent id, kind, data) of ``rounds`` rounds of every agent's reports, a result every twentieth agent."""
    out: Frames = []
    for r in range(rounds):
        for n in range(agents):
            agent = f"agent-{n:05d}"
            out.append((agent, "heartbeat", b"h" * HEARTBEAT))
            if n % 2 == r % 2:
                out.append((agent, "telemetry", b"t" * TELEMETRY))
            if n % 20 == r % 20:
                out.append((agent, "command_result", b"r" * RESULT))
    return out


def load(ref: str, path: str, name: str) -> ModuleType:
    """The module at ``path`` as of ``ref``, under ``name``, importing this checkout's other modules."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:{path}"], check=True, capture_output=True).stdout
    folder = Path(tempfile.mkdtemp(prefix="bench-lanes-"))
    file = folder / f"{name}.py"
    file.write_bytes(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def relay_run(upstream: ModuleType, work: Frames, *, coalesce: bool, every: int, batch: int) -> int:
    """Offer every frame, taking ``batch`` every ``every`` frames (``every`` 0: only at the end); frames sent."""
    buffer = upstream.FrameBuffer(10_000, telemetry_bytes=4 * 1024 * 1024, coalesce_bytes=512 * 1024)
    buffer.coalesce = coalesce
    outbound, sent = upstream.Outbound, 0
    for n, (agent, kind, data) in enumerate(work, 1):
        buffer.offer(outbound(agent, kind, data))
        if every and n % every == 0:
            sent += len(buffer.take(batch, 1024 * 1024))
            buffer.done()
    while taken := buffer.take(500, 1024 * 1024):
        sent += len(taken)
        buffer.done()
    return sent


def intake_run(lanes: ModuleType, work: Frames) -> int:
    queue = lanes.LaneQueue(lanes.LaneBounds())
    control, telemetry, popped = lanes.Lane.CONTROL, lanes.Lane.TELEMETRY, 0
    for agent, kind, data in work:
        if kind == "command_result":
            queue.push(data, control, len(data))
        else:
            queue.push(data, telemetry, len(data), (agent, kind))
        if queue.pop() is not None:
            popped += 1
    while queue.pop() is not None:
        popped += 1
    return popped


def scenarios(agents: int) -> dict[str, tuple[Frames, Callable[[ModuleType, ModuleType, Frames], int]]]:
    steady = frames(agents, 3)
    return {
        "relay-up": (steady, lambda up, _, w: relay_run(up, w, coalesce=False, every=100, batch=500)),
        "relay-overload": (steady, lambda up, _, w: relay_run(up, w, coalesce=False, every=1000, batch=100)),
        "relay-down": (steady, lambda up, _, w: relay_run(up, w, coalesce=True, every=0, batch=0)),
        "intake": (steady, lambda _, lanes, w: intake_run(lanes, w)),
    }


def timed(run: Callable[[ModuleType, ModuleType, Frames], Any], code: tuple[ModuleType, ModuleType], work: Frames) -> float:
    """Nanoseconds of this process's CPU per frame of one run (CPU, not wall time: on a machine shared with other work,
    time spent waiting for a core is not the code's)."""
    gc.collect()
    began = time.process_time()
    run(*code, work)
    return (time.process_time() - began) * 1e9 / len(work)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lanes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a commit whose FrameBuffer and LaneQueue run in alternate rounds")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each scenario on each code (default 5)")
    parser.add_argument("--agents", type=int, default=10_000, help="agents whose frames are queued (default 10,000)")
    args = parser.parse_args(argv)
    import access.upstream
    import common.lanes

    codes: dict[str, tuple[ModuleType, ModuleType]] = {"this": (access.upstream, common.lanes)}
    if args.against:
        codes[args.against] = (
            load(args.against, "access/upstream.py", "bench_old_upstream"),
            load(args.against, "common/lanes.py", "bench_old_lanes"),
        )
    print(f"{args.agents:,} agents, {args.rounds} rounds; ns per frame, min / median")
    for name, (work, run) in scenarios(args.agents).items():
        times: dict[str, list[float]] = {code: [] for code in codes}
        for _ in range(args.rounds):
            for code, modules in codes.items():
                times[code].append(timed(run, modules, work))
        cells = [f"{code}: {min(t):.0f} / {statistics.median(t):.0f}" for code, t in times.items()]
        print(f"{name:15} {len(work):7,} frames  " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

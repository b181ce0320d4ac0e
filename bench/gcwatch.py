"""``python -m bench.gcwatch OUT MODULE ARGS``: run ``python -m MODULE ARGS`` and record its garbage collector's pauses.

A full collection walks every object of the process and stops its event loop meanwhile; with the state of
thousands of agents that can take a second, and it shows up as latency nothing else explains. The figures
(collections and longest pause per generation, total pause) are written to OUT every second, as JSON.

SIGUSR2 writes a census of the heap beside OUT (``OUT.census-N.txt``): the garbage collector's objects by type (how
many, and their own sizes), and the frozen ones counted apart. With ``IDLEGRID_BENCH_TRACEMALLOC=1`` in the daemon's
environment it adds the 40 source lines that allocated the most memory still held (tracemalloc, started before the
daemon's imports; it slows the daemon, so its timings are not the bench's). Built to read what the Master's memory per agent
is made of (docs/capacity.md, item 3); not yet run on it.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import runpy
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType

from bench.fleet_agents import GcPauses

WRITE_EVERY_S = 1.0


def _write_forever(out: Path, pauses: GcPauses) -> None:
    while True:
        time.sleep(WRITE_EVERY_S)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(pauses.figures()))
        tmp.replace(out)


def census(top: int = 40) -> str:
    """The heap's census as text: the collector's objects by type, the most memory first (and tracemalloc's top lines
    where it runs)."""
    counts: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        name = type(obj).__qualname__
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj)
    lines = [f"tracked objects {sum(counts.values())}, frozen {gc.get_freeze_count()}, their own sizes {sum(sizes.values())} B"]
    lines += [f"{sizes[name]:>14,} B {counts[name]:>11,}  {name}" for name, _ in sizes.most_common(top)]
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot()
        stats = snapshot.statistics("lineno")
        lines.append(f"tracemalloc: {sum(s.size for s in stats):,} B held")
        lines += [f"{stat.size:>14,} B {stat.count:>11,}  {stat.traceback}" for stat in stats[:top]]
        if tracemalloc.get_traceback_limit() > 1:
            lines.append(f"tracemalloc by call path ({tracemalloc.get_traceback_limit()} frames, innermost first):")
            for stat in snapshot.statistics("traceback")[:top]:
                lines.append(f"{stat.size:>14,} B {stat.count:>11,}")
                lines += [f"{'':>32}{frame}" for frame in reversed(stat.traceback)]
    return "\n".join(lines) + "\n"


def _census_on_signal(out: Path) -> None:
    taken = [0]

    def write(signum: int, frame: FrameType | None) -> None:
        taken[0] += 1
        out.with_name(f"{out.name}.census-{taken[0]}.txt").write_text(census())

    signal.signal(signal.SIGUSR2, write)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m bench.gcwatch OUT MODULE [ARGS]")
    out, module = Path(sys.argv[1]), sys.argv[2]
    frames = os.environ.get("IDLEGRID_BENCH_TRACEMALLOC", "")
    if frames.isdigit() and int(frames) >= 1:
        tracemalloc.start(int(frames))
    _census_on_signal(out)
    pauses = GcPauses()
    pauses.install()
    threading.Thread(target=_write_forever, args=(out, pauses), daemon=True, name="gcwatch").start()
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

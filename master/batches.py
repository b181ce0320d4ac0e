"""Large writes (a minute of telemetry, a heartbeat flush) cut into batches and paced.

The store works on its own thread. A long batch there, busy in Python code, takes the interpreter lock for most
of every switch interval (CPython's 5 ms; the Master sets 1 ms, common/heap.py); the event loop, which gives that
lock up on every socket call, then waits that long each time it wants it back, and all traffic slows to a crawl
for as long as the batch lasts, command round trips included (bench/HISTORY.md: 80,000 rollups and 10,000 agents
took 3.4 s under load and held commands up to 1.8 s). Small batches, with a pause after each as long as the batch
took, keep the store at most half busy and let the loop catch up in between; queued commands wait for one small
batch, not for the whole flush. A command's own write waits for the batch being written: at 500 rows (20-50 ms on
a busy machine) that was most of a quiet hold's ``send`` phase (p99 50 ms); at 100 rows, 20 ms (bench/HISTORY.md,
"Results beside hellos, writes side by side, the full pace").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

BATCH = 100  # rows per write: what a command's write may find ahead of it on the store's thread
DUTY = 0.5  # share of the time the store may be kept busy by one flush


async def write_paced(
    items: Sequence[T],
    write: Callable[[Sequence[T]], Awaitable[None]],
    *,
    batch: int = BATCH,
    duty: float = DUTY,
    spread_s: float = 0.0,
) -> None:
    """``write`` every item, ``batch`` at a time; after each batch, rest so that writing takes at most ``duty``.

    ``spread_s``: rest longer where that spreads the batches evenly over about that long (the batches left start at
    even steps over what is left of it, at the pace the batches so far took). A minute of telemetry written as a
    burst at half duty took 10-13 s of a busy machine and slowed every command in those seconds; spread over the
    next half minute, it is a low hum (bench/HISTORY.md, "The minute's write, the storm's window and the hellos")."""
    if not 0 < duty <= 1:
        raise ValueError(f"duty must be in (0, 1], got {duty}")
    if spread_s < 0:
        raise ValueError(f"spread_s must not be negative, got {spread_s}")
    total = -(-len(items) // batch)
    began_all = time.monotonic()
    busy = 0.0
    for done, start in enumerate(range(0, len(items), batch), start=1):
        began = time.monotonic()
        await write(items[start : start + batch])
        took = time.monotonic() - began
        busy += took
        left = total - done
        if not left:
            break
        rest = took * (1 - duty) / duty
        if spread_s > 0:  # what is left of the window, less the work left, shared among the batches left
            window_left = spread_s - (time.monotonic() - began_all) - left * busy / done
            rest = max(rest, window_left / left)
        if rest > 0:
            await asyncio.sleep(rest)

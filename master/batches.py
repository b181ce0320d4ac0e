"""Large writes (a minute of telemetry, a heartbeat flush) cut into batches and paced.

The store works on its own thread. A long batch there, busy in Python code, takes the interpreter lock
for most of every switch interval (5 ms); the event loop, which gives that lock up on every socket call,
then waits that long each time it wants it back, and all traffic slows to a crawl for as long as the
batch lasts, command round trips included (bench/README.md: 80,000 rollups and 10,000 agents took
3.4 s under load and held commands up to 1.8 s). Small batches, with a pause after each as long as the
batch took, keep the store at most half busy and let the loop catch up in between; queued commands
wait for one small batch, not for the whole flush.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

BATCH = 500
DUTY = 0.5  # share of the time the store may be kept busy by one flush


async def write_paced(
    items: Sequence[T], write: Callable[[Sequence[T]], Awaitable[None]], *, batch: int = BATCH, duty: float = DUTY
) -> None:
    """``write`` every item, ``batch`` at a time; after each batch, rest so that writing takes at most ``duty``."""
    if not 0 < duty <= 1:
        raise ValueError(f"duty must be in (0, 1], got {duty}")
    for start in range(0, len(items), batch):
        began = time.monotonic()
        await write(items[start : start + batch])
        if start + batch < len(items) and duty < 1:
            await asyncio.sleep((time.monotonic() - began) * (1 - duty) / duty)

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
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

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


class GroupWrite(Generic[T]):
    """Writes of concurrent callers joined into one store write each time (a group commit), at most ``batch`` items.

    ``put(items)`` returns once its items are written, as a write of its own would; what callers put while a write is
    under way goes into the next one, so a burst (the hellos of a ramp, each with its events, GPUs and agent record)
    costs a store write per group, not per caller (bench/HISTORY.md, "100,000 agents"). Order is kept: items are
    written in the order they were put, and a caller's items are never split over two writes.

    A group's write that fails is retried caller by caller, so that one caller's unstorable record (a non-finite
    figure in an agent's report) fails that caller alone, as before; the others' writes are done then one by one.
    """

    def __init__(self, write: Callable[[Sequence[T]], Awaitable[None]], batch: int = BATCH) -> None:
        self._write = write
        self._batch = batch
        self._waiting: deque[tuple[list[T], asyncio.Future[None]]] = deque()
        self._writer: asyncio.Task[None] | None = None
        self.writes = 0  # store writes made (groups, and retries one by one)

    async def put(self, items: Sequence[T]) -> None:
        if not items:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((list(items), future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="group-write")
        await asyncio.shield(future)  # a caller that gives up does not take the group's write with it

    async def _drain(self) -> None:
        while self._waiting:
            group: list[tuple[list[T], asyncio.Future[None]]] = []
            size = 0
            while self._waiting and (not group or size + len(self._waiting[0][0]) <= self._batch):
                items, future = self._waiting.popleft()
                group.append((items, future))
                size += len(items)
            try:
                self.writes += 1
                await self._write([item for items, _ in group for item in items])
            except Exception as exc:
                if len(group) == 1:
                    _settle(group[0][1], exc)
                    continue
                for items, future in group:  # whose record it was: each caller's own write, as before
                    try:
                        self.writes += 1
                        await self._write(items)
                    except Exception as own:
                        _settle(future, own)
                    else:
                        _settle(future, None)
                continue
            for _, future in group:
                _settle(future, None)


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)

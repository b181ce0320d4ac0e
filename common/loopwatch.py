"""How long a daemon's event loop was held, and how much of that was the garbage collector.

Everything a daemon does for every agent runs on one event loop: while one callback holds it (a full garbage
collection walking every object, a blocking call, a long computation), every command, heartbeat and tunnel byte
behind it waits. Such a stall shows up only as a latency nothing else explains, so each daemon measures it:

- ``LoopWatch.run`` sleeps ``every_s`` again and again and records how late each wake-up was (the lag): in a
  Prometheus histogram (``idlegrid_event_loop_lag_seconds{daemon}``) where the daemon has a registry, and as one
  warning per ``quiet_s`` at most when a wake-up was ``report_s`` or more late, saying how much of it the collector
  took (``gc_s``) and which generation, so a stall in a log says whether GC is the cause.
- ``GcClock`` (one per process, ``gc.callbacks``) keeps every collection's pause: totals per generation
  (``idlegrid_gc_pause_seconds_total{generation}``, ``idlegrid_gc_longest_pause_seconds{generation}``) and the
  recent ones with their times, which ``LoopWatch`` reads to explain a stall.

The lag is wall time: a process waiting for a core (a machine busier than its cores) is held as surely as one
running a long callback, and the warning's ``gc_s`` of 0 then says the collector is not the cause, not that work on
the loop is. The cost is one timer per ``every_s`` (20 a second by default) and two clock reads per collection.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RECENT_PAUSES = 256  # collections remembered with their times, enough to explain any stall of the last seconds
GENERATIONS = 3


@dataclass(slots=True)
class Pause:
    ended: float  # time.monotonic() at its end
    generation: int
    seconds: float


@dataclass
class GcClock:
    """The garbage collector's pauses in this process (install once: ``GcClock.shared()``)."""

    count: list[int] = field(default_factory=lambda: [0] * GENERATIONS)
    total_s: list[float] = field(default_factory=lambda: [0.0] * GENERATIONS)
    longest_s: list[float] = field(default_factory=lambda: [0.0] * GENERATIONS)
    recent: deque[Pause] = field(default_factory=lambda: deque(maxlen=RECENT_PAUSES))
    _started: float = 0.0

    _instance: ClassVar[GcClock | None] = None  # the process's one clock

    @classmethod
    def shared(cls) -> GcClock:
        """The clock of this process, installed in ``gc.callbacks`` on first use."""
        if GcClock._instance is None:
            clock = cls()
            gc.callbacks.append(clock.on_gc)
            GcClock._instance = clock
        return GcClock._instance

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = now
            return
        generation = min(max(int(info.get("generation", 0)), 0), GENERATIONS - 1)
        took = now - self._started
        self.count[generation] += 1
        self.total_s[generation] += took
        self.longest_s[generation] = max(self.longest_s[generation], took)
        self.recent.append(Pause(now, generation, took))

    def within(self, start: float, end: float) -> tuple[float, int]:
        """Seconds of collection that ended in (``start``, ``end``] (monotonic), and the oldest generation among them
        (-1 when none)."""
        seconds, oldest = 0.0, -1
        for pause in reversed(self.recent):
            if pause.ended <= start:
                break
            if pause.ended <= end:
                seconds += pause.seconds
                oldest = max(oldest, pause.generation)
        return seconds, oldest


@dataclass
class LoopWatch:
    """Measures the lag of the running loop (``run`` as a task, or ``watching``); see the module docstring."""

    daemon: str
    every_s: float = 0.05
    report_s: float = 0.1
    quiet_s: float = 10.0
    clock: GcClock = field(default_factory=GcClock.shared)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LAG_BUCKETS) + 1))
    lag_sum_s: float = 0.0
    longest_s: float = 0.0
    stalls: int = 0  # wake-ups report_s or more late
    _last_report: float = float("-inf")
    _unreported: int = 0

    def observe(self, lag_s: float, start: float, end: float) -> None:
        """Count one wake-up ``lag_s`` late, the loop having been asleep from ``start`` to ``end`` (monotonic)."""
        lag_s = max(lag_s, 0.0)
        index = next((i for i, bound in enumerate(LAG_BUCKETS) if lag_s <= bound), len(LAG_BUCKETS))
        self.buckets[index] += 1
        self.lag_sum_s += lag_s
        self.longest_s = max(self.longest_s, lag_s)
        if lag_s < self.report_s:
            return
        self.stalls += 1
        if end - self._last_report < self.quiet_s:
            self._unreported += 1
            return
        gc_s, generation = self.clock.within(start, end)
        log.warning(
            "the %s's event loop was held for %.0f ms (garbage collection: %.0f ms%s)",
            self.daemon,
            lag_s * 1000,
            gc_s * 1000,
            f", generation {generation}" if generation >= 0 else "",
            extra={"lag_ms": round(lag_s * 1000, 1), "gc_ms": round(gc_s * 1000, 1), "unreported": self._unreported},
        )
        self._last_report, self._unreported = end, 0

    async def run(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(self.every_s)
            end = time.monotonic()
            self.observe(end - start - self.every_s, start, end)

    def collect(self) -> Iterator[HistogramMetricFamily | CounterMetricFamily | GaugeMetricFamily]:
        lag = HistogramMetricFamily(
            "idlegrid_event_loop_lag_seconds",
            "How late the event loop woke a timer: how long callbacks (or the garbage collector) held it",
            labels=["daemon"],
        )
        cumulative, running = [], 0
        for bound, count in zip((*LAG_BUCKETS, float("inf")), self.buckets, strict=True):
            running += count
            cumulative.append((str(bound) if bound != float("inf") else "+Inf", running))
        lag.add_metric([self.daemon], cumulative, self.lag_sum_s)
        yield lag
        pauses = CounterMetricFamily(
            "idlegrid_gc_pause_seconds", "Seconds the garbage collector stopped this process", labels=["generation"]
        )
        longest = GaugeMetricFamily(
            "idlegrid_gc_longest_pause_seconds", "The longest garbage collection of this process", labels=["generation"]
        )
        for generation in range(GENERATIONS):
            pauses.add_metric([str(generation)], self.clock.total_s[generation])
            longest.add_metric([str(generation)], self.clock.longest_s[generation])
        yield pauses
        yield longest


class _WatchCollector(Collector):
    def __init__(self, watch: LoopWatch) -> None:
        self._watch = watch

    def collect(self) -> Iterator[Any]:
        return self._watch.collect()


@contextlib.asynccontextmanager
async def watching(daemon: str, registry: CollectorRegistry | None = None) -> AsyncIterator[LoopWatch]:
    """Watch the running loop while the block runs; its series on ``registry`` when given."""
    watch = LoopWatch(daemon)
    collector = _WatchCollector(watch)
    if registry is not None:
        registry.register(collector)
    task = asyncio.create_task(watch.run(), name=f"loop-watch-{daemon}")
    try:
        yield watch
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if registry is not None:
            registry.unregister(collector)

"""The event-loop watch (common/loopwatch.py): a held loop is measured, logged with the collector's share of it, and
exported; stalls are not logged more than once per quiet period."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from common.loopwatch import GcClock, LoopWatch, watching


def _garbage(n: int) -> list[object]:
    """Enough container objects that a full collection takes a while (every one is walked)."""
    return [[i] for i in range(n)]


async def _until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the watch never saw it"
        await asyncio.sleep(0.01)


async def test_a_loop_held_by_a_callback_is_measured_and_logged_once_with_no_collection_in_it(caplog):
    caplog.set_level(logging.WARNING, logger="common.loopwatch")
    registry = CollectorRegistry()
    async with watching("relay", registry) as watch:
        await asyncio.sleep(0.12)  # the watch's first sleep is under way
        time.sleep(0.3)  # a blocking call on the loop
        await _until(lambda: watch.stalls >= 1)
        time.sleep(0.3)  # a second stall within the quiet period: counted, not logged again
        await _until(lambda: watch.stalls >= 2)
        text = generate_latest(registry).decode()
    assert watch.longest_s >= 0.25
    held = [r for r in caplog.records if "event loop was held" in r.getMessage()]
    assert len(held) == 1, [r.getMessage() for r in held]
    assert held[0].lag_ms >= 250 and "relay" in held[0].getMessage()
    assert 'idlegrid_event_loop_lag_seconds_bucket{daemon="relay",le="0.25"}' in text
    assert 'idlegrid_event_loop_lag_seconds_bucket{daemon="relay",le="+Inf"}' in text
    assert "idlegrid_gc_pause_seconds_total" in text
    assert "idlegrid_event_loop_lag_seconds" not in generate_latest(registry).decode()  # gone with the watch


async def test_a_stall_a_full_collection_caused_says_so(caplog):
    caplog.set_level(logging.WARNING, logger="common.loopwatch")
    clock = GcClock.shared()
    heap = _garbage(2_000_000)
    async with watching("master") as watch:
        await asyncio.sleep(0.12)
        before = clock.count[2]
        started = time.monotonic()
        while time.monotonic() - started < 0.15:  # at least report_s of collections, whatever this machine's speed
            gc.collect()
        await _until(lambda: watch.stalls >= 1)
    del heap
    assert clock.count[2] > before and clock.longest_s[2] > 0
    held = [r for r in caplog.records if "event loop was held" in r.getMessage()]
    assert held and held[0].gc_ms > 0 and "generation 2" in held[0].getMessage()
    assert held[0].gc_ms <= held[0].lag_ms + watch.every_s * 1000  # the collector's share is within the stall


def test_pauses_are_attributed_to_the_window_they_ended_in():
    clock = GcClock()
    clock.on_gc("start", {"generation": 1})
    clock.on_gc("stop", {"generation": 1})
    ended = clock.recent[-1].ended
    assert clock.within(ended - 1, ended) == (pytest.approx(clock.recent[-1].seconds), 1)
    assert clock.within(ended, ended + 1) == (0.0, -1)  # ended before this window began


def test_lag_is_counted_in_cumulative_buckets_and_below_the_report_bound_is_not_a_stall():
    watch = LoopWatch("agent", clock=GcClock())
    for lag in (0.001, 0.03, 0.2, 20.0, -0.001):  # a negative lag (the clock's resolution) counts as none
        watch.observe(lag, 0.0, 1.0)
    assert watch.stalls == 2 and watch.longest_s == 20.0
    (family,) = [m for m in watch.collect() if m.name == "idlegrid_event_loop_lag_seconds"]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert buckets["0.005"] == 2 and buckets["0.05"] == 3 and buckets["0.25"] == 4 and buckets["+Inf"] == 5

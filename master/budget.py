"""Each agent's budget of event reports: a host may tell the Master what happens on it, not flood its store.

Two token buckets per agent (events and bytes), refilled evenly over a window; the clock is passed in.
What is over budget is dropped and counted; the first drop of a window asks for one note in the event
log (``agent_report.budget_exceeded``), so a flood costs the store one record per window, not one per frame.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from common.tokenbucket import TokenBucket


@dataclass(frozen=True, slots=True)
class ReportLimits:
    events_per_window: int
    bytes_per_window: int
    window_s: float


class Spend(enum.Enum):
    TAKEN = "taken"
    DROPPED = "dropped"  # over budget, already noted this window
    DROPPED_NOTE = "dropped_note"  # over budget, the first drop this window: record one note


class ReportBudget:
    __slots__ = ("_events", "_bytes", "_window_s", "_noted_at", "dropped", "dropped_bytes")

    def __init__(self, limits: ReportLimits, now: float) -> None:
        self._events = TokenBucket(limits.events_per_window / limits.window_s, limits.events_per_window, now)
        self._bytes = TokenBucket(limits.bytes_per_window / limits.window_s, limits.bytes_per_window, now)
        self._window_s = limits.window_s
        self._noted_at = float("-inf")
        self.dropped = 0  # reports dropped since this budget was made
        self.dropped_bytes = 0

    def spend(self, size: int, now: float) -> Spend:
        """Charge one report of ``size`` bytes; both buckets must cover it, or nothing is taken."""
        if self._events.wait_s(now) == 0.0 and self._bytes.allow(now, size):
            self._events.allow(now)
            return Spend.TAKEN
        self.dropped += 1
        self.dropped_bytes += size
        if now - self._noted_at >= self._window_s:
            self._noted_at = now
            return Spend.DROPPED_NOTE
        return Spend.DROPPED

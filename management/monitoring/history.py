"""Telemetry history queries: one GPU's (or one host's own) rollups over a window, at a step, read from the minutes
or the hours.

A window is ``[from, to)`` in unix seconds, cut to whole minutes; ``step`` is a whole number of minutes. A step of
an hour or more, or a window reaching back past the minutes' retention, reads the hourly rollups (what the Master's
history loop made, master/history.py) and tops them up from the minutes for the hours not downsampled yet (the
current one, and any finished since the loop last ran); a finer step reads the minutes. Either is then merged into
the step's buckets by master.history.downsample, so a bucket with no data is absent, never a zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from common.errors import InvalidTelemetryWindow
from common.inventory import HostSample
from master.port import MINUTES_PER_HOUR, HostRollup, ManagementStore, TelemetryRollup, downsample, downsample_host

DEFAULT_SPAN_S = 86400.0  # a window with no ``from`` reaches back a day
# A week at one minute (both ends partial minutes: 10,081): more points per series are refused (ask for a coarser step).
MAX_POINTS = 7 * 24 * 60 + 1
DEFAULT_POINTS = 1_440  # a window with no ``step`` gets the finest whole-minute step giving at most this many


@dataclass(frozen=True)
class Window:
    """Whole minutes ``[since_minute, until_minute)`` and a step of ``step_minutes``."""

    since_minute: int
    until_minute: int
    step_minutes: int

    @property
    def hourly(self) -> bool:
        """Whether the step is coarse enough for the hourly rollups (a whole number of hours)."""
        return self.step_minutes % MINUTES_PER_HOUR == 0

    def clamped(self, since_s: float | None, until_s: float | None) -> Window | None:
        """This window cut to ``[since_s, until_s)`` (a run of a workload); None where they do not meet."""
        since = self.since_minute if since_s is None else max(self.since_minute, int(since_s // 60))
        until = self.until_minute if until_s is None else min(self.until_minute, math.ceil(until_s / 60))
        return Window(since, until, self.step_minutes) if since < until else None


def window_of(from_s: float | None, to_s: float | None, step_s: int | None, *, now: float) -> Window:
    """The window a query names, with its defaults: ``to`` now, ``from`` a day before ``to``, ``step`` the finest
    whole minute that gives at most DEFAULT_POINTS points. InvalidTelemetryWindow naming the parameter otherwise."""
    until_s = now if to_s is None else to_s
    since_s = until_s - DEFAULT_SPAN_S if from_s is None else from_s
    if since_s >= until_s:
        raise InvalidTelemetryWindow(f"from: must be before to (from={since_s:.0f}, to={until_s:.0f}, unix seconds)")
    since, until = int(since_s // 60), math.ceil(until_s / 60)
    minutes = until - since
    if step_s is None:
        step = max(1, math.ceil(minutes / DEFAULT_POINTS))
    else:
        if step_s < 60 or step_s % 60:
            raise InvalidTelemetryWindow(f"step: must be a whole number of minutes, in seconds (60, 300, 3600...); got {step_s}")
        step = step_s // 60
    if math.ceil(minutes / step) > MAX_POINTS:
        finest = math.ceil(minutes / MAX_POINTS) * 60
        raise InvalidTelemetryWindow(
            f"step: {step * 60} s over this window gives more than {MAX_POINTS} points; use a step of at least {finest} s"
        )
    return Window(since, until, step)


@dataclass(frozen=True)
class GpuSeries:
    """One GPU's points. For a workload, one series per GPU and run: ``unit`` is what the run was given (the GPU, or
    a MIG instance of it: the points are then the whole card's), ``since``/``until`` the run's bounds."""

    gpu_uuid: str
    agent_id: str
    points: list[TelemetryRollup]
    unit: str = ""
    since: float | None = None
    until: float | None = None  # None: still running


@dataclass(frozen=True)
class TelemetryHistory:
    """What a telemetry query answers: its window, the resolution the data had, and a series per GPU."""

    subject: str  # "gpu" | "host" | "workload"
    subject_id: str
    window: Window
    resolution_minutes: int  # 1: read from the minutes; 60: from the hours (a coarse step, or past the minutes' retention)
    series: list[GpuSeries]
    host_latest: HostSample | None = None  # a host's: its latest sample of itself
    host_points: list[HostRollup] | None = None  # a host's: its own readings (CPU, memory, disk, network) per step


def resolution_of(window: Window, *, minutes_kept_since: int) -> int:
    """The minutes each stored rollup read for ``window`` spans: 60 where the hourly rollups are read."""
    return MINUTES_PER_HOUR if window.hourly or window.since_minute < minutes_kept_since else 1


async def gpu_history(store: ManagementStore, gpu_uuid: str, window: Window, *, minutes_kept_since: int) -> list[TelemetryRollup]:
    """One GPU's rollups in ``window``, one per step that has data, ascending. ``minutes_kept_since``: the first
    minute the one-minute rollups still hold (retention); before it only hours are left, whatever the step."""
    if resolution_of(window, minutes_kept_since=minutes_kept_since) == MINUTES_PER_HOUR:
        return downsample(await _hours_topped_up(store, gpu_uuid, window), window.step_minutes)
    minutes = await store.rollups.list(gpu_uuid, since_minute=window.since_minute, until_minute=window.until_minute)
    return downsample(minutes, window.step_minutes)


async def host_history(store: ManagementStore, agent_id: str, window: Window, *, minutes_kept_since: int) -> list[HostRollup]:
    """One host's own rollups in ``window``, one per step that has data, ascending; read as ``gpu_history`` reads."""
    if resolution_of(window, minutes_kept_since=minutes_kept_since) == MINUTES_PER_HOUR:
        hours = await _host_hours_topped_up(store, agent_id, window)
        return downsample_host(hours, window.step_minutes)
    minutes = await store.host_rollups.list(agent_id, since_minute=window.since_minute, until_minute=window.until_minute)
    return downsample_host(minutes, window.step_minutes)


async def _hours_topped_up(store: ManagementStore, gpu_uuid: str, window: Window) -> list[TelemetryRollup]:
    """The hourly rollups of the window's hours, then the minutes after the last of them (not downsampled yet)."""
    first_hour = window.since_minute - window.since_minute % MINUTES_PER_HOUR
    hours = await store.hourly_rollups.list(gpu_uuid, since_minute=first_hour, until_minute=window.until_minute)
    rest_from = hours[-1].minute + MINUTES_PER_HOUR if hours else window.since_minute
    if rest_from >= window.until_minute:
        return hours
    rest = await store.rollups.list(gpu_uuid, since_minute=rest_from, until_minute=window.until_minute)
    return [*hours, *rest]


async def _host_hours_topped_up(store: ManagementStore, agent_id: str, window: Window) -> list[HostRollup]:
    """``_hours_topped_up`` for a host's own rollups."""
    first_hour = window.since_minute - window.since_minute % MINUTES_PER_HOUR
    hours = await store.host_hourly_rollups.list(agent_id, since_minute=first_hour, until_minute=window.until_minute)
    rest_from = hours[-1].minute + MINUTES_PER_HOUR if hours else window.since_minute
    if rest_from >= window.until_minute:
        return hours
    rest = await store.host_rollups.list(agent_id, since_minute=rest_from, until_minute=window.until_minute)
    return [*hours, *rest]

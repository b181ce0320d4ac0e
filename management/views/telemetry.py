"""Telemetry history (management/monitoring/history.py) of a GPU, a host or a workload: points per step, a
host's own readings, each series' bounds."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Literal, cast

import msgspec

from common.inventory import HostSample
from management.monitoring.history import TelemetryHistory
from management.views.base import Time, View, instant, rfc3339
from master.port import (
    HostRollup,
    TelemetryRollup,
)


class TelemetryPointView(View):
    """One step of one GPU: averages over its samples, maxima, and the error counters' highest value (counters since
    the agent started). ``minutes``: how many one-minute rollups it summarizes (fewer than the step: gaps)."""

    ts: Time  # the step's start
    minutes: int
    samples: int
    utilization_avg: float
    utilization_max: float
    memory_used_mib_avg: float | None
    memory_used_mib_max: int
    temperature_avg: float | None
    temperature_max: float | None
    power_avg_w: float | None
    power_max_w: float | None
    clock_sm_avg_mhz: float | None
    clock_mem_avg_mhz: float | None
    ecc_corrected: int
    ecc_uncorrected: int
    xid_count: int
    throttle_reasons: list[str]


class TelemetrySeriesView(View):
    gpu_uuid: str
    agent_id: str
    unit: str | None  # a workload's: the GPU or MIG instance it was given
    since: Time | None  # a workload's run: its bounds (until null: still running)
    until: Time | None
    points: list[TelemetryPointView]


class HostSampleView(View):
    """A host's latest reading of itself (common.inventory.HostSample); null fields: the host did not say."""

    ts: Time | None
    cpu_pct: float | None
    load_1m: float | None
    ram_used_mib: int | None
    ram_total_mib: int | None
    disk_used_gib: float | None
    disk_free_gib: float | None
    net_rx_bytes: int | None
    net_tx_bytes: int | None


class HostPointView(View):
    """One step of a host's own readings: averages over its samples, maxima, the lowest free disk, the latest total
    memory, and the network's bytes per second over the minutes with data. Null: the host did not say."""

    ts: Time  # the step's start
    minutes: int
    samples: int
    cpu_pct_avg: float | None
    cpu_pct_max: float | None
    load_1m_avg: float | None
    ram_used_mib_avg: float | None
    ram_used_mib_max: int | None
    ram_total_mib: int | None
    disk_used_gib: float | None
    disk_free_gib_min: float | None
    net_rx_bytes_per_s: float | None
    net_tx_bytes_per_s: float | None


TelemetrySubject = Literal["gpu", "host", "workload"]


class TelemetryView(View):
    """A GPU's, a host's or a workload's telemetry history: a series per GPU (per GPU and run for a workload)."""

    subject: TelemetrySubject
    id: str
    from_: Time = msgspec.field(name="from")
    to: Time
    step_s: int
    resolution_s: int  # 60: read from the one-minute rollups; 3600: from the hourly ones
    host: HostSampleView | None  # a host's answer: its latest sample of itself; null otherwise
    host_points: list[HostPointView] | None  # a host's answer: its own history at the step; null otherwise
    series: list[TelemetrySeriesView]


@functools.lru_cache(maxsize=128)
def _day_text(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, UTC).strftime("%Y-%m-%d")


def minute_time(minute: int) -> str:
    """A whole minute (unix time // 60) as ``rfc3339`` writes it, without a datetime per call: a week at one-minute
    steps is 10,080 of them in one answer."""
    day, rest = divmod(minute, 1440)
    hour, minute_of_hour = divmod(rest, 60)
    return f"{_day_text(day)}T{hour:02d}:{minute_of_hour:02d}:00.000Z"


def telemetry_point_view(point: TelemetryRollup) -> TelemetryPointView:
    return TelemetryPointView(
        ts=minute_time(point.minute),
        minutes=point.minutes,
        samples=point.samples,
        utilization_avg=point.utilization_avg,
        utilization_max=point.utilization_max,
        memory_used_mib_avg=point.memory_used_mib_avg,
        memory_used_mib_max=point.memory_used_mib_max,
        temperature_avg=point.temperature_avg,
        temperature_max=point.temperature_max,
        power_avg_w=point.power_avg_w,
        power_max_w=point.power_max_w,
        clock_sm_avg_mhz=point.clock_sm_avg_mhz,
        clock_mem_avg_mhz=point.clock_mem_avg_mhz,
        ecc_corrected=point.ecc_corrected,
        ecc_uncorrected=point.ecc_uncorrected,
        xid_count=point.xid_count,
        throttle_reasons=list(point.throttle_reasons),
    )


def host_sample_view(sample: HostSample) -> HostSampleView:
    fields = msgspec.structs.asdict(sample)
    fields["ts"] = rfc3339(sample.ts)
    return HostSampleView(**fields)


def _per_second(moved: int | None, minutes: int) -> float | None:
    return None if moved is None else round(moved / (minutes * 60), 2)


def host_point_view(point: HostRollup) -> HostPointView:
    """One step of a host's own history; network as bytes per second over the minutes it has data for."""
    return HostPointView(
        ts=minute_time(point.minute),
        minutes=point.minutes,
        samples=point.samples,
        cpu_pct_avg=point.cpu_pct_avg,
        cpu_pct_max=point.cpu_pct_max,
        load_1m_avg=point.load_1m_avg,
        ram_used_mib_avg=point.ram_used_mib_avg,
        ram_used_mib_max=point.ram_used_mib_max,
        ram_total_mib=point.ram_total_mib,
        disk_used_gib=point.disk_used_gib,
        disk_free_gib_min=point.disk_free_gib_min,
        net_rx_bytes_per_s=_per_second(point.net_rx_bytes, point.minutes),
        net_tx_bytes_per_s=_per_second(point.net_tx_bytes, point.minutes),
    )


def telemetry_view(history: TelemetryHistory) -> TelemetryView:
    window = history.window
    return TelemetryView(
        subject=cast(TelemetrySubject, history.subject),  # the history's subject is one of the three
        id=history.subject_id,
        from_=instant(window.since_minute * 60.0),
        to=instant(window.until_minute * 60.0),
        step_s=window.step_minutes * 60,
        resolution_s=history.resolution_minutes * 60,
        host=host_sample_view(history.host_latest) if history.host_latest is not None else None,
        host_points=None if history.host_points is None else [host_point_view(p) for p in history.host_points],
        series=[
            TelemetrySeriesView(
                gpu_uuid=s.gpu_uuid,
                agent_id=s.agent_id,
                unit=s.unit or None,
                since=rfc3339(s.since),
                until=rfc3339(s.until),
                points=[telemetry_point_view(p) for p in s.points],
            )
            for s in history.series
        ],
    )

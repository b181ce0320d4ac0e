"""Telemetry history: one-minute rollups downsampled to hourly ones, and both kept only as long as configured.

``merge_rollups`` is the one way rollups are combined: into an hour here, into a query's step in
management/monitoring/history.py. ``HistoryKeeper.step`` is the Master's "history" loop: every finished hour
of every GPU it knows is read back from the minutes, merged, written as that hour's rollup (an upsert, so a
second run over one hour rewrites the same record), and then what is past retention is deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TypeVar

from master.batches import DUTY, write_paced
from master.records import HostRollup, TelemetryRollup
from master.store.base import Store

MINUTES_PER_HOUR = 60
Rollup = TypeVar("Rollup", TelemetryRollup, HostRollup)


def hour_start(minute: int) -> int:
    """The first minute of the hour ``minute`` falls in (minutes count from the epoch, as rollups do)."""
    return minute - minute % MINUTES_PER_HOUR


def _weighted(pairs: Iterable[tuple[float | None, int]]) -> float | None:
    """The average of the values that are not None, each weighted by its count of samples."""
    total = weight = 0.0
    for value, samples in pairs:
        if value is not None:
            total += value * samples
            weight += samples
    return round(total / weight, 2) if weight else None


def _highest(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def merge_rollups(rollups: Sequence[TelemetryRollup], minute: int) -> TelemetryRollup:
    """One rollup standing for ``rollups`` (of one GPU, in any order), dated ``minute``.

    Averages are weighted by samples, so an hour's average is its samples' average whatever its minutes
    held; maxima and the counters (since the agent started) are the highest; throttle reasons the union.
    ``minutes`` adds up, so a gap (minutes nobody reported) shows as fewer than the span. ValueError for none.
    """
    if not rollups:
        raise ValueError("merge_rollups needs at least one rollup")
    weights = [r.samples for r in rollups]
    return TelemetryRollup(
        gpu_uuid=rollups[0].gpu_uuid,
        agent_id=max(rollups, key=lambda r: r.minute).agent_id,  # where it reported last
        minute=minute,
        samples=sum(weights),
        minutes=sum(r.minutes for r in rollups),
        utilization_avg=_weighted((r.utilization_avg, r.samples) for r in rollups) or 0.0,
        utilization_max=max(r.utilization_max for r in rollups),
        memory_used_mib_max=max(r.memory_used_mib_max for r in rollups),
        memory_used_mib_avg=_weighted((r.memory_used_mib_avg, r.samples) for r in rollups),
        temperature_max=_highest(r.temperature_max for r in rollups),
        temperature_avg=_weighted((r.temperature_avg, r.samples) for r in rollups),
        power_avg_w=_weighted((r.power_avg_w, r.samples) for r in rollups),
        power_max_w=_highest(r.power_max_w for r in rollups),
        clock_sm_avg_mhz=_weighted((r.clock_sm_avg_mhz, r.samples) for r in rollups),
        clock_mem_avg_mhz=_weighted((r.clock_mem_avg_mhz, r.samples) for r in rollups),
        ecc_corrected=max(r.ecc_corrected for r in rollups),
        ecc_uncorrected=max(r.ecc_uncorrected for r in rollups),
        xid_count=max(r.xid_count for r in rollups),
        throttle_reasons=sorted({reason for r in rollups for reason in r.throttle_reasons}),
    )


def downsample(rollups: Sequence[TelemetryRollup], step_minutes: int) -> list[TelemetryRollup]:
    """One GPU's rollups merged into one per ``step_minutes`` bucket (aligned to the epoch), ascending; empty
    buckets are left out. ``rollups`` in ascending minute, as the store lists them."""
    return _bucketed(rollups, step_minutes, merge_rollups)


def _bucketed(rollups: Sequence[Rollup], step_minutes: int, merge: Callable[[Sequence[Rollup], int], Rollup]) -> list[Rollup]:
    """``downsample``'s work for either kind of rollup, each merged by its own ``merge``."""
    if step_minutes < 1:
        raise ValueError("step_minutes must be at least 1")
    if step_minutes == 1 and all(a.minute < b.minute and b.minutes == 1 for a, b in pairwise(rollups)):
        if not rollups or rollups[0].minutes == 1:
            return list(rollups)  # one-minute rollups of distinct minutes: each is its own step already
    buckets: list[Rollup] = []
    run: list[Rollup] = []
    start = 0
    for rollup in rollups:
        bucket = rollup.minute - rollup.minute % step_minutes
        if run and bucket != start:
            buckets.append(run[0] if len(run) == 1 and run[0].minute == start else merge(run, start))
            run = []
        start = bucket
        run.append(rollup)
    if run:
        buckets.append(run[0] if len(run) == 1 and run[0].minute == start else merge(run, start))
    return buckets


# --- a host's own history: CPU, memory, disk, network (HostRollup) --------------------------------------------------


def _lowest(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _total(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def merge_host_rollups(rollups: Sequence[HostRollup], minute: int) -> HostRollup:
    """One host rollup standing for ``rollups`` (of one host, in any order), dated ``minute``: averages weighted by
    samples, maxima the highest, free disk the lowest, bytes moved added up, the total memory the latest reading;
    ``minutes`` adds up, so gaps show. ValueError for none."""
    if not rollups:
        raise ValueError("merge_host_rollups needs at least one rollup")
    latest_total = [r.ram_total_mib for r in sorted(rollups, key=lambda r: r.minute) if r.ram_total_mib is not None]
    ram_max = _highest(r.ram_used_mib_max for r in rollups)
    return HostRollup(
        agent_id=rollups[0].agent_id,
        minute=minute,
        samples=sum(r.samples for r in rollups),
        minutes=sum(r.minutes for r in rollups),
        cpu_pct_avg=_weighted((r.cpu_pct_avg, r.samples) for r in rollups),
        cpu_pct_max=_highest(r.cpu_pct_max for r in rollups),
        load_1m_avg=_weighted((r.load_1m_avg, r.samples) for r in rollups),
        ram_used_mib_avg=_weighted((r.ram_used_mib_avg, r.samples) for r in rollups),
        ram_used_mib_max=None if ram_max is None else int(ram_max),
        ram_total_mib=latest_total[-1] if latest_total else None,
        disk_used_gib=_highest(r.disk_used_gib for r in rollups),
        disk_free_gib_min=_lowest(r.disk_free_gib_min for r in rollups),
        net_rx_bytes=_total(r.net_rx_bytes for r in rollups),
        net_tx_bytes=_total(r.net_tx_bytes for r in rollups),
    )


def downsample_host(rollups: Sequence[HostRollup], step_minutes: int) -> list[HostRollup]:
    """One host's rollups merged into one per ``step_minutes`` bucket, as ``downsample`` does a GPU's."""
    return _bucketed(rollups, step_minutes, merge_host_rollups)


@dataclass
class HistoryKeeper:
    """The Master's history loop: downsampling finished hours, and retention.

    ``gpu_uuids``: the GPUs to keep history for (the registry's, read at each step); ``agent_ids``: the hosts whose
    own history (HostRollup) is kept alike, hours downsampled and retention applied. ``done_until``: the first
    hour (as a minute) not yet downsampled by this process; on start, the hour before the current one is done
    again (its minutes may have come in while no Master ran), which an upsert makes harmless."""

    store: Store
    gpu_uuids: Callable[[], Collection[str]]
    minute_retention_s: float
    hourly_retention_s: float
    done_until: int | None = None
    duty: float = DUTY
    agent_ids: Callable[[], Collection[str]] = field(default=lambda: ())

    async def step(self, now: float) -> dict[str, int]:
        """Downsample every finished hour not yet done and, when there was one, delete what is past retention;
        returns counts (GPUs' and hosts' together)."""
        current_hour = hour_start(int(now // 60))
        first = self.done_until if self.done_until is not None else current_hour - MINUTES_PER_HOUR
        uuids = sorted(self.gpu_uuids())
        agent_ids = sorted(self.agent_ids())
        hours = written = 0
        for hour in range(first, current_hour, MINUTES_PER_HOUR):
            written += await self._downsample_hour(uuids, hour)
            written += await self._downsample_host_hour(agent_ids, hour)
            hours += 1
            self.done_until = hour + MINUTES_PER_HOUR
        if self.done_until is None:
            self.done_until = current_hour
        deleted = 0
        if hours:  # once an hour: retention is in whole minutes and hours, and a pass costs a delete per GPU
            minute_cutoff = int((now - self.minute_retention_s) // 60)
            hour_cutoff = hour_start(int((now - self.hourly_retention_s) // 60))
            deleted = await self._delete(uuids, minute_cutoff, hour_cutoff)
            deleted += await self._delete_hosts(agent_ids, minute_cutoff, hour_cutoff)
        return {"hours": hours, "hourly_rollups": written, "deleted": deleted}

    async def _downsample_hour(self, uuids: Sequence[str], hour: int) -> int:
        written = 0

        async def write(batch: Sequence[str]) -> None:
            nonlocal written
            merged = []
            for uuid in batch:
                minutes = await self.store.rollups.list(uuid, since_minute=hour, until_minute=hour + MINUTES_PER_HOUR)
                if minutes:
                    merged.append(merge_rollups(minutes, hour))
            await self.store.hourly_rollups.put_many(merged)
            written += len(merged)

        await write_paced(uuids, write, duty=self.duty)
        return written

    async def _delete(self, uuids: Sequence[str], minute_cutoff: int, hour_cutoff: int) -> int:
        deleted = 0

        async def delete(batch: Sequence[str]) -> None:
            nonlocal deleted
            deleted += await self.store.rollups.delete_before(batch, minute_cutoff)
            deleted += await self.store.hourly_rollups.delete_before(batch, hour_cutoff)

        await write_paced(uuids, delete, duty=self.duty)
        return deleted

    # --- a host's own history, hour and retention alike ---

    async def _downsample_host_hour(self, agent_ids: Sequence[str], hour: int) -> int:
        written = 0

        async def write(batch: Sequence[str]) -> None:
            nonlocal written
            merged = []
            for agent_id in batch:
                until = hour + MINUTES_PER_HOUR
                minutes = await self.store.host_rollups.list(agent_id, since_minute=hour, until_minute=until)
                if minutes:
                    merged.append(merge_host_rollups(minutes, hour))
            await self.store.host_hourly_rollups.put_many(merged)
            written += len(merged)

        await write_paced(agent_ids, write, duty=self.duty)
        return written

    async def _delete_hosts(self, agent_ids: Sequence[str], minute_cutoff: int, hour_cutoff: int) -> int:
        deleted = 0

        async def delete(batch: Sequence[str]) -> None:
            nonlocal deleted
            deleted += await self.store.host_rollups.delete_before(batch, minute_cutoff)
            deleted += await self.store.host_hourly_rollups.delete_before(batch, hour_cutoff)

        await write_paced(agent_ids, delete, duty=self.duty)
        return deleted

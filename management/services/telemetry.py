"""Telemetry history by GPU, host and workload (management/monitoring/history.py), and a host's live samples.

``owner`` (as the API's auth decided it): a provider sees its own hosts' GPUs, a renter its own workloads; another
account's answers NotFound, as a missing one does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.errors import NotFound
from common.inventory import GpuSample
from management.monitoring.history import GpuSeries, TelemetryHistory, Window, gpu_history, host_history, resolution_of, window_of
from management.services.hosts import HostsService
from management.services.workloads import WorkloadsService
from management.store import rental_repo
from master.port import GpuRecord, MasterPort


@dataclass(frozen=True)
class HostSamples:
    """One host's GPUs and their recent samples (uuid -> samples, oldest first)."""

    agent_id: str
    gpus: list[GpuRecord]
    samples: dict[str, list[GpuSample]]


class TelemetryService:
    def __init__(self, master: MasterPort, hosts: HostsService, workloads: WorkloadsService) -> None:
        self._master = master
        self._hosts = hosts
        self._workloads = workloads

    def recent_samples(self, agent_id: str, *, owner: str | None = None) -> HostSamples:
        """The host's recent telemetry per GPU, oldest first, for live charts. Asking watches the host: from then on
        the Master keeps a short ring of its samples (master/telemetry.py, RecentSamples), for a while after the
        last ask; the first answer holds each GPU's latest sample."""
        agent = self._hosts.owned_agent(agent_id, owner)
        gpus = self._master.registry.gpus_of(agent.id)
        return HostSamples(agent.id, gpus, self._master.watch_host_samples(agent.id, time.time()))

    def _bounds(self, from_s: float | None, to_s: float | None, step_s: int | None) -> tuple[Window, int]:
        now = time.time()
        window = window_of(from_s, to_s, step_s, now=now)
        kept_since = int((now - self._master.config.history_minute_retention_s) // 60)
        return window, kept_since

    async def _gpu_series(self, gpu: GpuRecord, window: Window, kept_since: int) -> GpuSeries:
        points = await gpu_history(self._master.store, gpu.uuid, window, minutes_kept_since=kept_since)
        return GpuSeries(gpu.uuid, gpu.agent_id, points)

    async def gpu_telemetry(
        self, uuid: str, *, from_s: float | None, to_s: float | None, step_s: int | None, owner: str | None = None
    ) -> TelemetryHistory:
        """One GPU's history over the window, at the step."""
        gpu = self._master.registry.gpus.get(uuid)
        if gpu is None or (owner is not None and self._hosts.provider_of(gpu.agent_id) != owner):
            raise NotFound(f"no GPU {uuid!r}")
        window, kept_since = self._bounds(from_s, to_s, step_s)
        series = [await self._gpu_series(gpu, window, kept_since)]
        return TelemetryHistory("gpu", uuid, window, resolution_of(window, minutes_kept_since=kept_since), series)

    async def host_telemetry(
        self, agent_id: str, *, from_s: float | None, to_s: float | None, step_s: int | None, owner: str | None = None
    ) -> TelemetryHistory:
        """Every GPU of one host, a series each; the host's own readings (CPU, memory, disk, network) at the same
        step, and its latest sample of itself."""
        agent = self._hosts.owned_agent(agent_id, owner)
        window, kept_since = self._bounds(from_s, to_s, step_s)
        series = [await self._gpu_series(g, window, kept_since) for g in self._master.registry.gpus_of(agent.id)]
        resolution = resolution_of(window, minutes_kept_since=kept_since)
        host_latest = self._master.telemetry.latest_hosts.get(agent.id)
        host_points = await host_history(self._master.store, agent.id, window, minutes_kept_since=kept_since)
        return TelemetryHistory("host", agent.id, window, resolution, series, host_latest=host_latest, host_points=host_points)

    async def workload_telemetry(
        self,
        workload_id: str,
        *,
        from_s: float | None,
        to_s: float | None,
        step_s: int | None,
        account: str | None = None,
    ) -> TelemetryHistory:
        """The GPUs a workload ran on over its life, one series per GPU and run, each cut to the run: its rentals
        (every run that started), and the placement it holds now if no open rental covers it yet."""
        workload = await self._workloads.get_workload(workload_id, account=account)
        window, kept_since = self._bounds(from_s, to_s, step_s)
        runs: list[tuple[str, str, float | None, float | None]] = []  # (agent id, unit, since, until)
        rentals = await rental_repo(self._master.store).list(workload_id=workload.id)
        for rental in rentals:
            runs += [(h.agent_id, unit, rental.started_at, rental.ended_at) for h in rental.hosts for unit in h.units]
        if not any(r.ended_at is None for r in rentals):
            since = workload.started_at or workload.scheduled_at
            runs += [(a.agent_id, unit, since, workload.finished_at) for a in workload.assignments for unit in a.units]
        series = []
        for agent_id, unit, since, until in runs:
            gpu = self._hosts.gpu_of_unit(agent_id, unit)
            part = window.clamped(since, until)
            if gpu is None or part is None:
                continue
            points = await gpu_history(self._master.store, gpu.uuid, part, minutes_kept_since=kept_since)
            series.append(GpuSeries(gpu.uuid, agent_id, points, unit=unit, since=since, until=until))
        resolution = resolution_of(window, minutes_kept_since=kept_since)
        return TelemetryHistory("workload", workload.id, window, resolution, series)

"""Fair-share usage: GPU-seconds per account and per project, decayed with the policy's half-life (Slurm's model).

The loop advances the meter once per cycle: what decayed since the last cycle decays, and every job holding
units is charged for the time between. The figures are what ``Snapshot.usage`` carries to the core.
"""

from __future__ import annotations

from collections.abc import Iterable

from management.scheduler.model import Job, decay


class UsageMeter:
    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.usage: dict[str, float] = {}
        self.project_usage: dict[tuple[str, str], float] = {}
        self._at: float | None = None

    def advance(self, now: float, holding: Iterable[Job]) -> None:
        """Decay to ``now`` and charge ``holding`` jobs for the time since the last call (the first call only starts
        the clock). A clock that went back charges nothing."""
        last, self._at = self._at, now if self._at is None else max(self._at, now)
        if last is None or now <= last:
            return
        elapsed = now - last
        self.usage = decay(self.usage, elapsed, self.half_life_s)
        self.project_usage = decay(self.project_usage, elapsed, self.half_life_s)
        for job in holding:
            if not job.assignment:
                continue
            gpu_seconds = sum(len(replica) for replica in job.assignment) * elapsed
            self.usage[job.account] = self.usage.get(job.account, 0.0) + gpu_seconds
            key = (job.account, job.project)
            self.project_usage[key] = self.project_usage.get(key, 0.0) + gpu_seconds

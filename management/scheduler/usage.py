"""Fair-share usage: GPU-seconds per account and per project, decayed with the policy's half-life (Slurm's model).

The loop advances the meter once per cycle: what decayed since the last cycle decays, and every job holding
units is charged for the time between. The figures are what ``Snapshot.usage`` carries to the core.
They outlive the Master through the store: ``snapshot_for_store`` gives the records to save, ``restore`` takes them back
decayed across the time between (management/scheduler/usage_saving.py does both for the loop).
"""

from __future__ import annotations

from collections.abc import Iterable

from management.scheduler.model import Job, decay
from master.port import FairShareUsage


class UsageMeter:
    def __init__(self, half_life_s: float) -> None:
        self.half_life_s = half_life_s
        self.usage: dict[str, float] = {}
        self.project_usage: dict[tuple[str, str], float] = {}
        self._at: float | None = None

    @property
    def at(self) -> float | None:
        """The time the figures are decayed to (None before the clock has started)."""
        return self._at

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

    def restore(self, saved: Iterable[FairShareUsage], now: float) -> None:
        """Add figures saved earlier, each decayed from its ``decayed_to`` to the meter's clock (``now`` when the clock
        has not started, which it then starts). What the meter charged meanwhile is kept: the two add up. A figure
        saved "in the future" (a clock that went back) is taken as it is."""
        if self._at is None:
            self._at = now
        for rec in saved:
            (figure,) = decay({0: rec.gpu_seconds}, self._at - rec.decayed_to, self.half_life_s).values()
            if rec.project is None:
                self.usage[rec.account] = self.usage.get(rec.account, 0.0) + figure
            else:
                key = (rec.account, rec.project)
                self.project_usage[key] = self.project_usage.get(key, 0.0) + figure

    def snapshot_for_store(self) -> list[FairShareUsage]:
        """Every figure as a record to save, decayed to the meter's clock; none before the clock has started."""
        if self._at is None:
            return []
        at = self._at
        accounts = [FairShareUsage(account=a, gpu_seconds=v, decayed_to=at) for a, v in sorted(self.usage.items())]
        projects = [
            FairShareUsage(account=a, project=p, gpu_seconds=v, decayed_to=at) for (a, p), v in sorted(self.project_usage.items())
        ]
        return accounts + projects

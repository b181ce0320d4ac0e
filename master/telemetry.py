"""Telemetry: the latest sample of every GPU in memory, one-minute rollups persisted."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from common.inventory import GpuSample
from master.batches import DUTY, write_paced
from master.records import TelemetryRollup
from master.store.base import Store


@dataclass(slots=True)
class _Minute:
    agent_id: str
    samples: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    mem_max: int = 0
    temp_max: float | None = None
    power_sum: float = 0.0
    power_n: int = 0
    ecc_uncorrected: int = 0

    def add(self, s: GpuSample) -> None:
        self.samples += 1
        self.util_sum += s.utilization_pct
        self.util_max = max(self.util_max, s.utilization_pct)
        self.mem_max = max(self.mem_max, s.memory_used_mib)
        if s.temperature_c is not None:
            self.temp_max = s.temperature_c if self.temp_max is None else max(self.temp_max, s.temperature_c)
        if s.power_w is not None:
            self.power_sum += s.power_w
            self.power_n += 1
        self.ecc_uncorrected = max(self.ecc_uncorrected, s.ecc_uncorrected)


@dataclass
class TelemetryAggregator:
    store: Store
    latest: dict[str, GpuSample] = field(default_factory=dict)
    _open: dict[tuple[str, int], _Minute] = field(default_factory=dict)
    _unwritten: list[TelemetryRollup] = field(default_factory=list)  # a failed flush's rest, tried again first

    def ingest(self, agent_id: str, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            self.latest[sample.uuid] = sample
            key = (sample.uuid, int(sample.ts // 60))
            minute = self._open.get(key)
            if minute is None:
                minute = self._open[key] = _Minute(agent_id)
            minute.add(sample)

    async def flush(self, now: float, *, everything: bool = False, duty: float | None = None) -> int:
        """Persist the minutes that are over (all of them on shutdown); returns how many rollups were written.

        Paced (master/batches.py): a minute of 10,000 agents is 80,000 rollups, which written at once would
        stall every frame and command behind them for seconds. ``duty``: the pacing's (default: rest as long as
        each batch took; none when everything is flushed on shutdown).
        """
        current = int(now // 60)
        done = [key for key in self._open if everything or key[1] < current]
        retry, self._unwritten = self._unwritten, []
        if duty is None:
            duty = 1.0 if everything else DUTY
        written = 0

        async def put(rollups: list[TelemetryRollup]) -> None:
            nonlocal written
            try:
                await self.store.rollups.put_many(rollups)
            except BaseException:
                self._unwritten.extend(rollups)  # kept for the next flush (upserts: no doubles)
                raise
            written += len(rollups)

        async def write(keys: Sequence[tuple[str, int]]) -> None:
            # Each batch's rollups are made when it is written, not all at once: 80,000 of them would hold the event
            # loop for a quarter of a second. A minute not yet written stays open (a late sample still counts).
            await put([self._rollup(key, minute) for key in keys if (minute := self._open.pop(key, None)) is not None])

        if retry:
            await put(retry)  # a failed batch of an earlier flush (more of them stay open until written)
        await write_paced(done, write, duty=duty)
        return written

    @staticmethod
    def _rollup(key: tuple[str, int], m: _Minute) -> TelemetryRollup:
        return TelemetryRollup(
            gpu_uuid=key[0],
            agent_id=m.agent_id,
            minute=key[1],
            samples=m.samples,
            utilization_avg=round(m.util_sum / m.samples, 2),
            utilization_max=m.util_max,
            memory_used_mib_max=m.mem_max,
            temperature_max=m.temp_max,
            power_avg_w=round(m.power_sum / m.power_n, 2) if m.power_n else None,
            ecc_uncorrected=m.ecc_uncorrected,
        )

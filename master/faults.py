"""GPU health: which agent reports and telemetry samples make a GPU faulty, and when it is healthy again.

Pure decisions, no I/O: the registry applies them (the GPU state machine's ``fault`` and ``repair`` events, the
fault stored on the GpuRecord). Three causes:

- an Xid error in the configured fatal list (``MasterConfig.fatal_xids``), reported by the agent as a ``gpu_xid``
  event: faulty until an operator repairs the GPU;
- uncorrectable ECC errors: a ``gpu_ecc`` event, or a telemetry sample whose (volatile) uncorrectable count is above
  the count accepted at the last repair: faulty until repaired;
- overheating: ``overheat_samples`` samples in a row at or above ``max_temperature_c``. Healthy again by itself
  after ``cool_samples`` samples in a row below the limit (hysteresis).

A stronger cause replaces overheating (an overheated card that then reports an Xid stays faulty until repaired).
Only the streak counters live in memory; a Master restart starts them again, the fault itself is stored.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from common.inventory import GpuSample
from common.wire import AgentEvent, AgentEventKind
from master.records import GpuFault, GpuRecord

XID = "xid"
ECC = "ecc"
OVERHEAT = "overheat"
# Faults that only an operator's repair clears.
LASTING = frozenset({XID, ECC})


@dataclass(frozen=True, slots=True)
class FaultRules:
    fatal_xids: frozenset[int]
    max_temperature_c: float
    overheat_samples: int
    cool_samples: int


@dataclass(frozen=True, slots=True)
class Recovered:
    """The GPU is healthy again (it cooled down)."""

    reason: str


HealthVerdict = GpuFault | Recovered


@dataclass(slots=True)
class HealthWatch:
    """Per-GPU streaks of hot (or, for an overheated GPU, cool) samples; everything else is read off the record."""

    rules: FaultRules
    _streaks: dict[str, int] = field(default_factory=dict)

    def on_report(self, gpu: GpuRecord, report: AgentEvent, now: float) -> GpuFault | None:
        """A fault when ``report`` (an agent's gpu_xid / gpu_ecc event about ``gpu``) calls for one."""
        if gpu.fault is not None and gpu.fault.kind in LASTING:
            return None  # already faulty until repaired: the first cause stands
        code = report.code
        if report.kind == AgentEventKind.GPU_XID and code is not None and code in self.rules.fatal_xids:
            detail = f": {report.message}" if report.message else ""
            return GpuFault(kind=XID, reason=f"Xid {code}{detail}", since=now, code=code)
        if report.kind == AgentEventKind.GPU_ECC and code is not None and code > 0:
            return GpuFault(kind=ECC, reason=f"{code} uncorrectable ECC error(s) reported", since=now, code=code)
        return None

    def on_sample(self, gpu: GpuRecord, sample: GpuSample) -> HealthVerdict | None:
        """What ``sample`` of ``gpu`` changes about its health, if anything. Called for every sample: cheap."""
        if sample.ecc_uncorrected > gpu.ecc_acknowledged and (gpu.fault is None or gpu.fault.kind not in LASTING):
            self._streaks.pop(gpu.uuid, None)
            count = sample.ecc_uncorrected
            return GpuFault(
                kind=ECC, reason=f"{count} uncorrectable ECC error(s) since the driver loaded", since=sample.ts, code=count
            )
        temperature = sample.temperature_c
        if temperature is None:
            return None
        hot = temperature >= self.rules.max_temperature_c
        if gpu.fault is None:
            if not hot:
                if self._streaks:
                    self._streaks.pop(gpu.uuid, None)
                return None
            streak = self._streaks[gpu.uuid] = self._streaks.get(gpu.uuid, 0) + 1
            if streak < self.rules.overheat_samples:
                return None
            self._streaks.pop(gpu.uuid, None)
            return GpuFault(
                kind=OVERHEAT,
                reason=f"{temperature:g} °C for {streak} samples in a row (limit {self.rules.max_temperature_c:g} °C)",
                since=sample.ts,
                code=round(temperature),
            )
        if gpu.fault.kind != OVERHEAT:
            return None
        if hot:
            self._streaks.pop(gpu.uuid, None)
            return None
        streak = self._streaks[gpu.uuid] = self._streaks.get(gpu.uuid, 0) + 1
        if streak < self.rules.cool_samples:
            return None
        self._streaks.pop(gpu.uuid, None)
        return Recovered(
            f"cooled to {temperature:g} °C for {streak} samples in a row (limit {self.rules.max_temperature_c:g} °C)"
        )

    def forget(self, uuids: Collection[str]) -> None:
        for uuid in uuids:
            self._streaks.pop(uuid, None)

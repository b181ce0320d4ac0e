"""Simulated GPUs for hosts without NVML: the local demo, the fleet simulator and the tests.

A simulated GPU reports what a healthy card of its catalog model reports through NVML, marked
``simulated=True`` so the Master and renters can tell. Its telemetry wanders like a real card's
under changing load, always within the model's limits.
"""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass

import msgspec

from agent.errors import SimulationSpecError
from agent.fault_injection import FaultInjection, InjectedFault
from common.catalog import GpuModel, UnknownGpuModel, reference_gpu_info, resolve_alias
from common.inventory import MAX_MIG_INSTANCES, GpuInfo, GpuPartition, GpuSample, MigInstance, UnofferedGpu
from common.mig import MigLayoutError, instance_memory_mib, lay_out
from common.wire import AgentEvent, AgentEventKind

MAX_SIMULATED_GPUS = 64  # per host; keeps simulated PCI bus ids in range and a typo like "h100:800" out
# What a current datacenter driver reports; nothing depends on the exact values.
SIMULATED_DRIVER_VERSION = "550.54.15"
SIMULATED_CUDA_VERSION = "12.4"
# An MI300-series card (gfx942) as amdgpu ships it: whole (SPX), one memory domain (NPS1), and the modes it may be set to.
SIMULATED_MI300_PARTITION = GpuPartition(
    compute="SPX", memory="NPS1", compute_modes=("SPX", "DPX", "QPX", "CPX"), memory_modes=("NPS1", "NPS4")
)
SIMULATED_AMDGPU_VERSION = "6.7.0"  # what amd-smi reports of a ROCm 6.2 host's amdgpu driver; AMD cards have no CUDA
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "simulated-gpu.idlegrid")
_FIRST_PCI_BUS = 0x10
_IDLE_POWER_FRACTION = 0.1  # of TDP, what an idle card draws
_IDLE_UTILIZATION_MAX = 0.01  # an idle card reads 0 to 1 %
_IDLE_MEMORY_FRACTION = 0.005  # the driver's own use
_BUSY_UTILIZATION_MIN = 0.6  # a card a container holds reads 60 to 100 %
_AMBIENT_C, _FULL_LOAD_RISE_C = 30.0, 50.0
# The catalog has no memory clock per model: every simulated card reports an H100's (HBM3), which a real one kept
# at 2619 MHz idle and busy alike (read through NVML on an H100, driver 580).
_MEMORY_CLOCK_MHZ = 2619
_THERMAL_SLOWDOWN_C = 85.0  # a card this hot reports a thermal slowdown among its throttle reasons


@dataclass(frozen=True)
class SimulatedGroup:
    """``count`` GPUs of ``model``, each partitioned into ``mig`` (MIG profile names) when ``mig`` is not None."""

    model: GpuModel
    count: int
    mig: tuple[str, ...] | None = None


def parse_simulate_spec(spec: str) -> list[tuple[GpuModel, int]]:
    """Models and counts from "h100:8", "h100:4,a10:2" or "rtx4090" (count 1).

    SimulationSpecError (a ConfigError, and a ValueError) says what is wrong, in one line."""
    return [(group.model, group.count) for group in parse_simulate_groups(spec)]


def parse_simulate_groups(spec: str) -> list[SimulatedGroup]:
    """Groups of ``MODEL[:COUNT][:mig=LAYOUT]``, comma-separated. LAYOUT is MIG profiles joined by "+", each with an
    optional "*N" ("1g.10gb*7", "3g.40gb+2g.20gb+1g.10gb*2"); every GPU of the group is split alike. An empty
    LAYOUT ("a100:1:mig=") is a GPU in MIG mode with no instances yet."""
    if not spec.strip():
        raise SimulationSpecError("empty GPU simulation spec; expected e.g. 'h100:8' or 'h100:4,a10:2'")
    groups = [_parse_group(spec, item) for item in spec.split(",")]
    total = sum(group.count for group in groups)
    if total > MAX_SIMULATED_GPUS:
        raise SimulationSpecError(f"GPU simulation spec {spec!r} asks for {total} GPUs; at most {MAX_SIMULATED_GPUS} per host")
    return groups


def _parse_group(spec: str, item: str) -> SimulatedGroup:
    item, has_mig, layout = item.partition(":mig=")
    name, has_count, count_text = item.partition(":")
    if not name.strip():
        raise SimulationSpecError(f"GPU simulation spec {spec!r}: {item.strip()!r} names no GPU model; expected MODEL[:COUNT]")
    try:
        model = resolve_alias(name.strip())
    except UnknownGpuModel as exc:
        raise SimulationSpecError(f"GPU simulation spec {spec!r}: {exc}") from None
    count = 1
    if has_count:
        try:
            count = int(count_text.strip())
        except ValueError:
            raise SimulationSpecError(
                f"GPU simulation spec {spec!r}: count {count_text.strip()!r} is not a whole number"
            ) from None
        if count < 1:
            raise SimulationSpecError(f"GPU simulation spec {spec!r}: count for {name.strip()!r} must be at least 1, got {count}")
    mig = _parse_layout(spec, model, layout) if has_mig else None
    return SimulatedGroup(model, count, mig)


# "+" joins profiles, but "+me" is part of a profile's name ("1g.10gb+me").
_LAYOUT_SEPARATOR = re.compile(r"\+(?!\s*me\s*(?:\*|\+|$))")


def _parse_layout(spec: str, model: GpuModel, layout: str) -> tuple[str, ...]:
    names: list[str] = []
    for part in filter(None, (p.strip() for p in _LAYOUT_SEPARATOR.split(layout))):
        profile, has_times, times_text = part.partition("*")
        try:
            times = int(times_text) if has_times else 1
        except ValueError:
            raise SimulationSpecError(f"GPU simulation spec {spec!r}: {part!r}: {times_text!r} is not a whole number") from None
        if not 1 <= times <= MAX_MIG_INSTANCES:
            raise SimulationSpecError(f"GPU simulation spec {spec!r}: {part!r}: the count must be 1 to {MAX_MIG_INSTANCES}")
        names.extend([profile.strip()] * times)
    try:
        lay_out(model.key, names)
    except MigLayoutError as exc:
        raise SimulationSpecError(f"GPU simulation spec {spec!r}: {exc}") from None
    return tuple(names)


@dataclass
class _Load:
    """One simulated card's workload, drifting between samples."""

    utilization: float  # 0..1
    memory_fraction: float  # of total memory, 0..1


class SimulatedCollector:
    """The GPU collector the agent uses when asked to simulate; same members as the NVML collector."""

    simulated = True

    def __init__(self, spec: str, *, seed: int | None = None, host_key: str = "", faults: FaultInjection | None = None) -> None:
        """``host_key`` (e.g. the agent's state directory) keeps UUIDs stable across restarts of one host;
        without it they derive from ``seed``, and without a seed they are fresh for each collector.
        ``faults``: where a test or an operator injects faults (agent/fault_injection.py); none by default."""
        self.faults = faults
        groups = parse_simulate_groups(spec)
        self._rng = random.Random(seed)
        identity = host_key or (f"seed:{seed}" if seed is not None else uuid.uuid4().hex)
        cards = [(group.model, group.mig) for group in groups for _ in range(group.count)]
        models = [model for model, _ in cards]
        self._gpus = [_simulated_info(model, i, identity, mig) for i, (model, mig) in enumerate(cards)]
        self._models = models
        self._loads = [_Load(0.0, _IDLE_MEMORY_FRACTION) for _ in models]  # idle until a container holds the card
        self._held: frozenset[str] = frozenset()  # GPU (or MIG instance) uuids that running containers hold
        self._xid_counts: dict[str, int] = {}  # GPU uuid -> injected Xid errors reported so far (sampled as xid_count)

    def inventory(self) -> list[GpuInfo]:
        return list(self._gpus)

    def unoffered(self) -> list[UnofferedGpu]:
        """A simulated host has every card it simulates on offer."""
        return []

    def hold(self, units: Collection[str]) -> None:
        """The GPUs (or MIG instances) running containers hold now: a held card is busy, any other idle (a real card
        measures its own load; a simulated one has only this to go on)."""
        self._held = frozenset(units)

    def sample(self) -> list[GpuSample]:
        now = time.time()
        rows = zip(self._gpus, self._models, self._loads)
        samples = [self._sample(info, model, load, now) for info, model, load in rows]
        if self.faults is None:
            return samples
        injected = self.faults.current()
        return [_with_fault(s, injected[s.uuid]) if s.uuid in injected else s for s in samples]

    def reports(self) -> list[AgentEvent]:
        """Xid errors injected since the last call, as the agent reports them."""
        if self.faults is None:
            return []
        now = time.time()
        xids = self.faults.new_xids()
        for gpu_uuid in xids:
            self._xid_counts[gpu_uuid] = self._xid_counts.get(gpu_uuid, 0) + 1
        return [
            AgentEvent(kind=AgentEventKind.GPU_XID, ts=now, gpu_uuid=uuid, code=xid, message="injected (simulated GPU)")
            for uuid, xid in xids.items()
        ]

    def close(self) -> None:
        """Nothing to release; here so the agent treats both collectors alike."""

    def _busy(self, info: GpuInfo) -> bool:
        return info.uuid in self._held or any(m.uuid in self._held for m in info.mig_instances)

    def _sample(self, info: GpuInfo, model: GpuModel, load: _Load, now: float) -> GpuSample:
        self._drift(load, busy=self._busy(info))
        rng, u = self._rng, load.utilization
        power = model.tdp_w * (_IDLE_POWER_FRACTION + (1 - _IDLE_POWER_FRACTION) * u) + rng.gauss(0, 0.02 * model.tdp_w)
        temperature = _AMBIENT_C + _FULL_LOAD_RISE_C * u + rng.gauss(0, 1.5)
        return GpuSample(
            uuid=info.uuid,
            ts=now,
            utilization_pct=round(100 * u, 1),
            memory_used_mib=int(load.memory_fraction * model.memory_mib),
            temperature_c=round(_clamp(temperature, 20.0, 90.0), 1),
            power_w=round(_clamp(power, 0.05 * model.tdp_w, model.tdp_w), 1),
            clock_sm_mhz=int(model.sm_clock_max_mhz * (0.3 + 0.7 * u)),  # idle cards clock down
            clock_mem_mhz=_MEMORY_CLOCK_MHZ,
            xid_count=self._xid_counts.get(info.uuid, 0),
            throttle_reasons=("gpu_idle",) if u < 0.05 else (),
        )

    def _drift(self, load: _Load, *, busy: bool) -> None:
        """An idle card reads about 0 % with a little memory in use; a held one is busy (60 to 100 %), its load
        wandering a little between samples and now and then jumping (a new phase of the job)."""
        rng = self._rng
        if not busy:
            load.utilization = rng.uniform(0.0, _IDLE_UTILIZATION_MAX)
            load.memory_fraction = _IDLE_MEMORY_FRACTION
        elif load.utilization < _BUSY_UTILIZATION_MIN or rng.random() < 0.1:
            load.utilization, load.memory_fraction = rng.uniform(0.75, 1.0), rng.uniform(0.3, 0.95)
        else:
            load.utilization = _clamp(load.utilization + rng.gauss(0, 0.05), _BUSY_UTILIZATION_MIN, 1.0)
            load.memory_fraction = _clamp(load.memory_fraction + rng.gauss(0, 0.03), 0.1, 0.95)


def _with_fault(sample: GpuSample, fault: InjectedFault) -> GpuSample:
    """``sample`` as the injected fault has the card read."""
    if fault.temperature_c is not None:
        sample = msgspec.structs.replace(sample, temperature_c=fault.temperature_c)
        if fault.temperature_c >= _THERMAL_SLOWDOWN_C:  # a real card slows its clocks down when this hot
            sample = msgspec.structs.replace(sample, throttle_reasons=(*sample.throttle_reasons, "sw_thermal"))
    if fault.ecc_uncorrected is not None:
        sample = msgspec.structs.replace(sample, ecc_uncorrected=fault.ecc_uncorrected)
    return sample


def _simulated_info(model: GpuModel, index: int, identity: str, mig: tuple[str, ...] | None) -> GpuInfo:
    reference = reference_gpu_info(
        model,
        index=index,
        uuid=f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{identity}/{index}/{model.key}')}",
        pci_bus_id=f"00000000:{_FIRST_PCI_BUS + index:02X}:00.0",
    )
    if model.vendor == "amd":  # named as the agent names a real AMD card: "GPU-" and its unique id (agent/amd_gpus.py)
        unique = uuid.uuid5(_UUID_NAMESPACE, f"{identity}/{index}/{model.key}").hex[:16]
        info = msgspec.structs.replace(
            reference,
            simulated=True,
            uuid=f"GPU-{unique}",
            driver_version=SIMULATED_AMDGPU_VERSION,
            partition=SIMULATED_MI300_PARTITION if model.gfx_target == "gfx942" else None,
        )
    else:
        info = msgspec.structs.replace(
            reference, simulated=True, driver_version=SIMULATED_DRIVER_VERSION, cuda_version=SIMULATED_CUDA_VERSION
        )
    if mig is None:
        return info
    return msgspec.structs.replace(info, mig_enabled=True, mig_instances=tuple(_mig_instances(model, info.uuid, mig)))


def _mig_instances(model: GpuModel, gpu_uuid: str, names: tuple[str, ...]) -> list[MigInstance]:
    """The instances of a simulated partition: stable MIG uuids (from the GPU's), GPU instance ids from 1."""
    return [
        MigInstance(
            uuid=f"MIG-{uuid.uuid5(_UUID_NAMESPACE, f'{gpu_uuid}/mig/{i}/{profile.name}@{start}')}",
            profile=profile.name,
            memory_mib=instance_memory_mib(model.memory_mib, profile),
            gpu_instance_id=i + 1,
            compute_instance_id=0,
            index=i,
        )
        for i, (profile, start) in enumerate(lay_out(model.key, names))
    ]


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))

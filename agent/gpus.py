"""NVIDIA GPUs' inventory and telemetry read through NVML (nvidia-ml-py, imported as ``pynvml``), and the collector
the agent opens (``open_collector``): simulated GPUs, or every vendor's cards reconciled with the PCI bus
(agent/detect.py).

A host without a usable NVIDIA driver gets one actionable line (``NvmlUnavailable``), never a
traceback. A field a GPU does not have (NVLink on a PCIe card, ECC on a consumer card) reads as
None, 0 or [] for that field only; a GPU that stops answering is left out and logged, so one bad
card never hides the others.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pynvml

from common.errors import NvmlUnavailable
from common.inventory import MAX_MIG_INSTANCES, GpuInfo, GpuSample, MigInstance, NvLink, UnofferedGpu
from common.wire import AgentEvent, AgentEventKind

log = logging.getLogger(__name__)

T = TypeVar("T")
MIB = 1024 * 1024
MAX_EVENTS_PER_READ = 64  # fault events taken per telemetry tick; the rest wait for the next
SIMULATE_HINT = "or run the agent with --simulate MODEL:COUNT for a test host"

# NVML error class name -> (what is wrong, what the provider can do about it).
_INIT_FAILURES: dict[str, tuple[str, str]] = {
    "NVMLError_LibraryNotFound": (
        "libnvidia-ml.so.1 not found (the NVIDIA driver is not installed)",
        "install the NVIDIA driver",
    ),
    "NVMLError_DriverNotLoaded": (
        "the NVIDIA kernel driver is not loaded",
        "load it (modprobe nvidia) or reboot after installing the driver; `nvidia-smi` must work",
    ),
    "NVMLError_NoPermission": (
        "no permission to open the NVIDIA device files (/dev/nvidia*)",
        "run the agent as a user that may open them, or pass the devices into its container",
    ),
    "NVMLError_LibRmVersionMismatch": (
        "the NVML library and the loaded kernel driver have different versions",
        "reboot (or reload the nvidia module) after the driver upgrade",
    ),
    "NVMLError_FunctionNotFound": (
        "the NVIDIA driver is too old for this agent's NVML bindings",
        "upgrade the NVIDIA driver",
    ),
    "NVMLError_GpuIsLost": (
        "a GPU has fallen off the bus",
        "check the card and its power, then reboot; `nvidia-smi` must list every GPU",
    ),
    "NVMLError_InsufficientPower": (
        "a GPU's external power cables are not properly attached",
        "attach the power cables and reboot",
    ),
}


class GpuCollector(Protocol):
    """What the agent needs from a GPU source: real (agent/detect.py), simulated, or none."""

    simulated: bool

    def inventory(self) -> list[GpuInfo]: ...

    def unoffered(self) -> list[UnofferedGpu]:
        """Cards the host has and does not offer, each with why and what to install (agent/detect.py)."""
        ...

    def sample(self) -> list[GpuSample]: ...

    def reports(self) -> list[AgentEvent]:
        """GPU faults seen since the last call (Xid errors, uncorrectable ECC errors), as events to send."""
        ...

    def hold(self, units: Collection[str]) -> None:
        """The GPUs (or MIG instances) running containers hold now. A real card measures its own load and ignores
        it; a simulated one is busy while held and idle otherwise."""
        ...

    def close(self) -> None: ...


class NvmlCollector:
    """Reads every GPU that NVML sees. NVML is thread-safe, so ``sample`` may run in a worker thread."""

    simulated = False

    def __init__(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(_init_failure_message(exc)) from None
        try:
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except pynvml.NVMLError as exc:
            self.close()
            raise NvmlUnavailable(_init_failure_message(exc)) from None
        self._closed = False
        self._events = _fault_event_set(self._handles)
        self._xid_counts: dict[str, int] = {}  # GPU uuid -> Xid errors read by ``reports`` (sampled as xid_count)

    def inventory(self) -> list[GpuInfo]:
        driver = _text(_optional(pynvml.nvmlSystemGetDriverVersion) or "")
        cuda = _cuda_version(_optional(pynvml.nvmlSystemGetCudaDriverVersion))
        gpus = []
        for index, handle in enumerate(self._handles):
            try:
                gpus.append(_gpu_info(index, handle, driver, cuda))
            except pynvml.NVMLError as exc:
                log.error("GPU %d left out of the inventory: NVML says %s", index, exc, extra={"gpu_index": index})
        return gpus

    def sample(self) -> list[GpuSample]:
        now = time.time()
        samples = []
        for index, handle in enumerate(self._handles):
            try:
                samples.append(_gpu_sample(handle, now, self._xid_counts))
            except pynvml.NVMLError as exc:
                log.warning("GPU %d not sampled: NVML says %s", index, exc, extra={"gpu_index": index})
        return samples

    def reports(self) -> list[AgentEvent]:
        """Xid critical errors and double-bit ECC errors NVML queued since the last call; never waits.

        Untested on hardware (no GPU where this was written): it follows NVML's documented event API."""
        if self._events is None:
            return []
        found: list[AgentEvent] = []
        now = time.time()
        while len(found) < MAX_EVENTS_PER_READ:
            try:
                data = pynvml.nvmlEventSetWait_v2(self._events, 0)
            except pynvml.NVMLError_Timeout:
                break  # nothing (more) queued
            except pynvml.NVMLError as exc:
                log.warning("reading GPU fault events failed: NVML says %s", exc)
                break
            uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
            if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                self._xid_counts[uuid] = self._xid_counts.get(uuid, 0) + 1
                found.append(AgentEvent(kind=AgentEventKind.GPU_XID, ts=now, gpu_uuid=uuid, code=int(data.eventData)))
            elif data.eventType & pynvml.nvmlEventTypeDoubleBitEccError:
                found.append(
                    AgentEvent(kind=AgentEventKind.GPU_ECC, ts=now, gpu_uuid=uuid, code=1, message="double-bit ECC error")
                )
        return found

    def hold(self, units: Collection[str]) -> None:
        """A real card's utilization is measured, not told."""

    def close(self) -> None:
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if getattr(self, "_events", None) is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._events)
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:  # shutting down must never stop the agent from exiting
            log.debug("nvmlShutdown failed: %s", exc)


class EmptyCollector:
    """Stands in when no GPU library reads a card: the host offers no GPUs, says why, and reports the cards its PCI bus
    shows (``unoffered``)."""

    simulated = False

    def __init__(self, unavailable_reason: str, *, unoffered: Sequence[UnofferedGpu] = ()) -> None:
        self.unavailable_reason = unavailable_reason
        self._unoffered = list(unoffered)

    def inventory(self) -> list[GpuInfo]:
        return []

    def unoffered(self) -> list[UnofferedGpu]:
        return list(self._unoffered)

    def sample(self) -> list[GpuSample]:
        return []

    def reports(self) -> list[AgentEvent]:
        return []

    def hold(self, units: Collection[str]) -> None:
        """No GPU to hold."""

    def close(self) -> None:
        """Nothing to release."""


def open_collector(
    simulate: str | None, *, host_key: str = "", faults_file: Path | None = None, sysfs_root: Path = Path("/sys")
) -> GpuCollector:
    """Simulated GPUs when ``simulate`` names them (faults injected through ``faults_file``, if given), else every
    vendor's cards the host's bindings read, reconciled with its PCI bus under ``sysfs_root`` (agent/detect.py), else
    an empty collector with the reason."""
    if simulate:
        from agent.fault_injection import FaultInjection
        from agent.simulate import SimulatedCollector

        faults = FaultInjection(faults_file) if faults_file is not None else None
        return SimulatedCollector(simulate, host_key=host_key, faults=faults)
    from agent.detect import detect_gpus

    return detect_gpus(sysfs_root, host_key=host_key)


def _fault_event_set(handles: list[Any]) -> Any:
    """An NVML event set for Xid critical errors and double-bit ECC errors on every GPU that supports them, or None
    (logged once) when none does: faults then show only in the ECC counters of telemetry."""
    try:
        events = pynvml.nvmlEventSetCreate()
    except pynvml.NVMLError as exc:
        log.warning("GPU fault events unavailable (NVML says %s): Xid errors will not be reported", exc)
        return None
    wanted = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    registered = 0
    for index, handle in enumerate(handles):
        try:
            supported = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & wanted
            if supported:
                pynvml.nvmlDeviceRegisterEvents(handle, supported, events)
                registered += 1
        except pynvml.NVMLError as exc:
            log.warning("GPU %d: fault events unavailable (NVML says %s)", index, exc, extra={"gpu_index": index})
    if not registered:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlEventSetFree(events)
        return None
    return events


# ---------------------------------------------------------------- reading one GPU


def _gpu_info(index: int, handle: Any, driver: str, cuda: str) -> GpuInfo:
    major_minor = _optional(lambda: pynvml.nvmlDeviceGetCudaComputeCapability(handle))
    power_mw = _optional(lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))
    mig_enabled, mig_instances = _mig(index, handle)
    return GpuInfo(
        index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
        memory_total_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).total // MIB,
        compute_capability=f"{major_minor[0]}.{major_minor[1]}" if major_minor else "",
        driver_version=driver,
        cuda_version=cuda,
        # The link generation an idle card runs drops to save power; what the card and its slot
        # can run together is the figure a tier needs. The width does not drop at idle, so the
        # current width shows a degraded link (a x16 card running x8) that the maximum would hide.
        pcie_gen=_optional(lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        pcie_width=_optional(lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
        nvlinks=_nvlinks(handle),
        clock_sm_max_mhz=_optional(lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        clock_mem_max_mhz=_optional(lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
        power_limit_w=power_mw / 1000.0 if power_mw is not None else None,
        memory_bus_width_bits=_optional(lambda: pynvml.nvmlDeviceGetMemoryBusWidth(handle)),
        mig_enabled=mig_enabled,
        mig_instances=tuple(mig_instances),
    )


# ---------------------------------------------------------------- MIG (untested on hardware: no GPU where written)


def _mig(index: int, handle: Any) -> tuple[bool, list[MigInstance]]:
    """Whether the GPU runs in MIG mode, and the instances it is split into now.

    A card without MIG (most) answers NotSupported: not in MIG mode, said nowhere. A GPU in MIG mode whose
    instances cannot be read is reported in MIG mode with none (it is then placed nowhere), and the log says why."""
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return False, []
    except pynvml.NVMLError as exc:
        log.warning("GPU %d: MIG mode unreadable (NVML says %s); taken as off", index, exc, extra={"gpu_index": index})
        return False, []
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return False, []
    try:
        slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except pynvml.NVMLError as exc:
        log.warning(
            "GPU %d is in MIG mode but its instances cannot be listed (NVML says %s): it takes no work until they can",
            index,
            exc,
            extra={"gpu_index": index},
        )
        return True, []
    instances: list[MigInstance] = []
    for slot in range(slots):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue  # no instance in this slot
        try:
            instances.append(_mig_instance(handle, mig, slot))
        except pynvml.NVMLError as exc:
            log.warning("GPU %d: MIG device %d left out (NVML says %s)", index, slot, exc, extra={"gpu_index": index})
        if len(instances) == MAX_MIG_INSTANCES:
            break
    return True, instances


def _mig_instance(parent: Any, mig: Any, slot: int) -> MigInstance:
    memory_mib = pynvml.nvmlDeviceGetMemoryInfo(mig).total // MIB
    gpu_instance = _optional(lambda: pynvml.nvmlDeviceGetGpuInstanceId(mig))
    return MigInstance(
        uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
        profile=_mig_profile(parent, mig, gpu_instance),
        memory_mib=memory_mib,
        gpu_instance_id=gpu_instance,
        compute_instance_id=_optional(lambda: pynvml.nvmlDeviceGetComputeInstanceId(mig)),
        index=slot,
    )


def _mig_profile(parent: Any, mig: Any, gpu_instance: int | None) -> str:
    """The instance's profile name ("1g.10gb"): NVIDIA's own name from its GPU instance's profile where NVML hands
    it out (it may need more privilege), else made from the device's slices and memory as NVIDIA names them
    ("<slices>g.<GiB rounded up>gb", "<c>c.<g>g.<GiB>gb" for a compute instance smaller than its GPU instance;
    a "+me" instance then reads as its plain profile). "" when neither can be read: matched by no request."""
    if gpu_instance is not None:
        try:
            info = pynvml.nvmlGpuInstanceGetInfo(pynvml.nvmlDeviceGetGpuInstanceById(parent, gpu_instance))
            name = _text(pynvml.nvmlDeviceGetGpuInstanceProfileInfoById(parent, info.profileId).name)
            return name.removeprefix("MIG ").strip()
        except pynvml.NVMLError as exc:
            log.debug("MIG profile name unreadable (NVML says %s); derived from the device's attributes", exc)
    try:
        attributes = pynvml.nvmlDeviceGetAttributes(mig)
    except pynvml.NVMLError as exc:
        log.warning("MIG device profile unreadable (NVML says %s): it matches no request", exc)
        return ""
    slices, compute = attributes.gpuInstanceSliceCount, attributes.computeInstanceSliceCount
    name = f"{slices}g.{math.ceil(attributes.memorySizeMB / 1024)}gb"
    return name if compute in (0, slices) else f"{compute}c.{name}"


def _nvlinks(handle: Any) -> tuple[NvLink, ...]:
    links = []
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_InvalidArgument):
            break  # a PCIe card has no NVLink; an NVLink card answers InvalidArgument past its last link
        active = state == pynvml.NVML_FEATURE_ENABLED
        remote = _optional(functools.partial(_remote_bus_id, handle, link)) if active else None
        links.append(NvLink(link=link, active=active, remote_pci_bus_id=_text(remote) if remote else None))
    return tuple(links)


def _remote_bus_id(handle: Any, link: int) -> Any:
    return pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId


def _gpu_sample(handle: Any, now: float, xid_counts: Mapping[str, int]) -> GpuSample:
    utilization = _optional(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    power_mw = _optional(lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    temperature = _optional(lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
    uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
    return GpuSample(
        uuid=uuid,
        ts=now,
        utilization_pct=float(utilization.gpu) if utilization is not None else 0.0,
        memory_used_mib=pynvml.nvmlDeviceGetMemoryInfo(handle).used // MIB,
        temperature_c=float(temperature) if temperature is not None else None,
        power_w=power_mw / 1000.0 if power_mw is not None else None,
        clock_sm_mhz=_optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
        ecc_corrected=_ecc_total(handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
        ecc_uncorrected=_ecc_total(handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        clock_mem_mhz=_optional(lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
        xid_count=xid_counts.get(uuid, 0),
        throttle_reasons=throttle_reason_names(_optional(lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))),
    )


# NVML's throttle reason bits (nvmlClocksThrottleReason*), by the names common.inventory.THROTTLE_REASONS gives them.
_THROTTLE_BITS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
    (0x100, "display_clocks"),
)


def throttle_reason_names(mask: int | None) -> tuple[str, ...]:
    """NVML's throttle reason bitmask as names; () for none, or when the driver does not say."""
    if not mask:
        return ()
    return tuple(name for bit, name in _THROTTLE_BITS if mask & bit)


def _ecc_total(handle: Any, error_type: int) -> int:
    """Errors since the driver loaded (volatile); 0 on a card without ECC or with ECC switched off."""
    count = _optional(lambda: pynvml.nvmlDeviceGetTotalEccErrors(handle, error_type, pynvml.NVML_VOLATILE_ECC))
    return int(count or 0)


# ---------------------------------------------------------------- helpers


def _optional(query: Callable[[], T]) -> T | None:
    """None for a reading this GPU or driver does not offer; any other NVML error is the caller's."""
    try:
        return query()
    except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_FunctionNotFound):
        return None


def _text(value: str | bytes) -> str:
    """Older bindings return bytes, newer ones str."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    return value.rstrip("\x00")


def _cuda_version(version: int | None) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    if not version:
        return ""
    return f"{version // 1000}.{version % 1000 // 10}"


def _init_failure_message(exc: Exception) -> str:
    cause, remedy = _INIT_FAILURES.get(type(exc).__name__, (f"NVML failed to start ({exc})", "check that `nvidia-smi` works"))
    return f"NVML is not available: {cause}; {remedy}, {SIMULATE_HINT}"

"""Which GPUs a host offers, and which cards it has but does not offer, with why: detection that never hides a card.

The PCI bus (agent/pci.py) says what cards the host has; each vendor's binding says which it can read (NVIDIA through
NVML, agent/gpus.py; AMD through amdsmi, amd-smi, rocm-smi or sysfs, agent/amd_gpus.py). ``reconcile`` sets one
against the other, and is pure:

- a card a binding reads is offered, unless the bus shows it integrated (agent/pci.py's rule), it has under
  ``DISPLAY_ONLY_MAX_MIB`` of memory of its own (a card that drives a screen and holds no workload worth renting), or
  its compute is split into several devices (an AMD card in a partition mode other than SPX: its partitions are
  reported, not sold yet, and a renter given the card would get one of them);
- a card the bus shows that no binding reads is reported unoffered (common.inventory.UnofferedGpu) with the reason and
  what to install: no kernel driver, another driver bound (nouveau, vfio-pci), no library or tool, or a vendor idlegrid
  does not run workloads on yet (Intel, Habana);
- where the bus cannot be read (WSL, a container without /sys/bus/pci) the bindings alone say what the host offers.

``HostGpus`` is the collector the agent runs on such a host: it re-reads its bindings at each inventory and
reconciles.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Protocol

from agent.amd_gpus import AmdSource, CommandRunner, open_amd_source, run_command
from agent.gpus import EmptyCollector, GpuCollector, NvmlCollector
from agent.pci import SYSFS_ROOT, PciGpu, integrated_reason, list_pci_gpus, normal_address
from common.errors import NvmlUnavailable
from common.inventory import GpuInfo, GpuPartition, GpuSample, UnofferedGpu
from common.wire import AgentEvent

log = logging.getLogger(__name__)

DISPLAY_ONLY_MAX_MIB = 2048  # a card with less memory of its own than this is not offered
# What each vendor's binding needs bound to the card, and what a provider installs when it is not.
_OWN_DRIVER = {"nvidia": "nvidia", "amd": "amdgpu"}
_INSTALL_DRIVER = {
    "nvidia": "install NVIDIA's driver (`nvidia-smi` must list the card), then restart the agent",
    "amd": "install AMD's amdgpu driver (ROCm's amdgpu-dkms package) and reboot; `amd-smi list` must show the card",
}
_INSTALL_BINDING = {
    "nvidia": "check that `nvidia-smi` lists the card; the agent reads it through NVML, the library nvidia-smi uses",
    "amd": "install amd-smi (ROCm's amd-smi-lib package) or the amdsmi Python package beside ROCm, then restart the agent",
}
_UNSUPPORTED = {
    "intel": "idlegrid does not run workloads on Intel GPUs yet",
    "habana": "idlegrid does not run workloads on Habana Gaudi accelerators yet",
}


class NvidiaCards(Protocol):
    """What HostGpus reads NVIDIA's cards through: agent/gpus.py's NvmlCollector."""

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def reports(self) -> list[AgentEvent]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class BindingReport:
    """What one vendor's binding read: its cards, and why it read none (or fewer than the bus shows) when it did not."""

    cards: Sequence[GpuInfo] = ()
    problem: str = ""


@dataclass(frozen=True)
class Detection:
    offered: list[GpuInfo] = field(default_factory=list)
    unoffered: list[UnofferedGpu] = field(default_factory=list)


def reconcile(bus: Sequence[PciGpu] | None, bindings: dict[str, BindingReport]) -> Detection:
    """The module docstring's rules: the cards offered, the cards seen and not offered (bus order, then the rest)."""
    integrated = {gpu.address: reason for gpu in bus or () if (reason := integrated_reason(gpu))}
    offered: list[GpuInfo] = []
    unoffered: list[UnofferedGpu] = []
    read: set[str] = set()
    partitioned: set[str] = set()
    for vendor, report in bindings.items():
        for card in report.cards:
            address = normal_address(card.pci_bus_id)
            read.add(address)
            if address in integrated:
                continue  # reported below, from the bus
            if card.partition is not None and card.partition.split:
                if address not in partitioned:  # each partition may be listed as a device of its own
                    partitioned.add(address)
                    unoffered.append(_partitioned(card, card.partition, vendor, address))
            elif card.memory_total_mib < DISPLAY_ONLY_MAX_MIB:
                unoffered.append(_display_only(card, vendor, address))
            else:
                offered.append(card)
    for gpu in bus or ():
        if gpu.address in integrated:
            unoffered.append(_unoffered(gpu, "integrated", integrated[gpu.address]))
        elif gpu.address not in read:
            unoffered.append(_unread(gpu, bindings.get(gpu.vendor)))
    return Detection(offered=offered, unoffered=unoffered)


def _unread(gpu: PciGpu, report: BindingReport | None) -> UnofferedGpu:
    if gpu.vendor in _UNSUPPORTED:
        return _unoffered(gpu, "unsupported", _UNSUPPORTED[gpu.vendor])
    own = _OWN_DRIVER[gpu.vendor]
    if gpu.driver is None:
        return _unoffered(gpu, "no_driver", "no kernel driver is bound to it", _INSTALL_DRIVER[gpu.vendor])
    if gpu.driver == "vfio-pci":
        reason = "it is bound to vfio-pci: passed through to a virtual machine, not usable on this host"
        return _unoffered(gpu, "no_driver", reason, "unbind it from vfio-pci if this host should offer it")
    if gpu.driver != own:
        reason = f"the {gpu.driver} driver is bound to it, not {own}"
        return _unoffered(gpu, "no_driver", reason, f"{_INSTALL_DRIVER[gpu.vendor]} (and blacklist {gpu.driver})")
    problem = report.problem if report is not None and report.problem else "its vendor's library does not list it"
    return _unoffered(gpu, "no_binding", f"the {own} driver is bound, but {problem}", _INSTALL_BINDING[gpu.vendor])


def _unoffered(gpu: PciGpu, kind: str, reason: str, fix: str = "") -> UnofferedGpu:
    return UnofferedGpu(
        pci_bus_id=gpu.address, vendor=gpu.vendor, device_id=gpu.device_hex, kind=kind, reason=reason[:512], fix=fix
    )


def _partitioned(card: GpuInfo, partition: GpuPartition, vendor: str, address: str) -> UnofferedGpu:
    reason = (
        f"its compute is split into several devices ({partition.describe()}): partitions are not sold yet, and a renter "
        "given the card would get one of them"
    )
    fix = "to offer it whole: sudo amd-smi set --gpu all --compute-partition SPX (no workload may run), then restart the agent"
    return UnofferedGpu(
        pci_bus_id=address, vendor=vendor, name=card.name, kind="partitioned", reason=reason, fix=fix, partition=partition
    )


def _display_only(card: GpuInfo, vendor: str, address: str) -> UnofferedGpu:
    reason = (
        f"{card.memory_total_mib} MiB of memory of its own, under {DISPLAY_ONLY_MAX_MIB} MiB: it can drive a screen"
        " but holds no workload worth renting"
    )
    return UnofferedGpu(pci_bus_id=address, vendor=vendor, name=card.name, kind="display_only", reason=reason)


class HostGpus:
    """The collector of a host with real GPUs: NVML's and an AMD source's cards, reconciled with the bus at each inventory.
    NVML and amdsmi are thread-safe, so ``sample`` may run in a worker thread as before."""

    simulated = False

    def __init__(
        self, bus: Sequence[PciGpu] | None, nvml: NvidiaCards | None, nvml_problem: str, amd: AmdSource | None, amd_problem: str
    ) -> None:
        self._bus = bus
        self._nvml, self._nvml_problem = nvml, nvml_problem
        self._amd, self._amd_problem = amd, amd_problem
        self._withheld: frozenset[str] = frozenset()  # uuids of cards a binding reads and the host does not offer
        self.latest = self.detection()  # what the latest inventory found

    def detection(self) -> Detection:
        nvidia = BindingReport(self._nvml.inventory() if self._nvml else (), self._nvml_problem)
        amd = BindingReport(self._amd.cards() if self._amd else (), self._amd_problem)
        found = reconcile(self._bus, {"nvidia": nvidia, "amd": amd})
        offered = {card.uuid for card in found.offered}
        self._withheld = frozenset(card.uuid for card in (*nvidia.cards, *amd.cards) if card.uuid not in offered)
        self.latest = found
        return found

    def inventory(self) -> list[GpuInfo]:
        return self.detection().offered

    def unoffered(self) -> list[UnofferedGpu]:
        return self.detection().unoffered

    def sample(self) -> list[GpuSample]:
        """Every offered card's reading. The cards withheld are those of the latest inventory (not re-read here: an
        inventory reads every NVLink and MIG slot, too much for each telemetry tick)."""
        samples = [*(self._nvml.sample() if self._nvml else ()), *(self._amd.sample() if self._amd else ())]
        return [s for s in samples if s.uuid not in self._withheld]

    def reports(self) -> list[AgentEvent]:
        """NVML's fault events and the AMD source's (its RAS errors and amdsmi's events, as what means the same)."""
        return [*(self._nvml.reports() if self._nvml else ()), *(self._amd.reports() if self._amd else ())]

    def hold(self, units: Collection[str]) -> None:
        """A real card's utilization is measured, not told."""

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.close()
        if self._amd is not None:
            self._amd.close()


def detect_gpus(
    sysfs_root: Path = SYSFS_ROOT,
    *,
    host_key: str = "",
    open_nvml: Callable[[], NvidiaCards] = NvmlCollector,
    import_module: Callable[[str], ModuleType] | None = None,
    runner: CommandRunner = run_command,
) -> GpuCollector:
    """The host's GPUs, every vendor's binding tried (module docstring). A host where no binding reads a card gets an
    ``EmptyCollector`` saying why, with the cards its bus shows reported unoffered."""
    bus = list_pci_gpus(sysfs_root)
    nvml: NvidiaCards | None = None
    nvml_problem = ""
    try:
        nvml = open_nvml()
    except NvmlUnavailable as exc:
        nvml_problem = str(exc)
    amd: AmdSource | None = None
    amd_problem = ""
    if bus is None or any(gpu.vendor == "amd" and integrated_reason(gpu) is None for gpu in bus):
        options = {"import_module": import_module} if import_module is not None else {}
        amd, tried = open_amd_source(bus or (), sysfs_root, host_key=host_key, runner=runner, **options)
        amd_problem = "no AMD library or tool read it (" + "; ".join(tried) + ")" if amd is None else ""
        if amd is not None:
            log.info("AMD GPUs read through %s", amd.name, extra={"tried": tried})
        elif bus is not None:
            log.warning("AMD GPUs on the bus, but %s", amd_problem)
    collector = HostGpus(bus, nvml, nvml_problem, amd, amd_problem)
    detection = collector.latest
    for card in detection.unoffered:
        log.warning("GPU %s (%s) not offered: %s", card.pci_bus_id, card.vendor, card.reason, extra={"fix": card.fix})
    if nvml is None and amd is None:
        if nvml_problem:
            log.warning("%s", nvml_problem, extra={"code": NvmlUnavailable.code})
        return EmptyCollector(_why_none(bus, nvml_problem, amd_problem), unoffered=detection.unoffered)
    return collector


def _why_none(bus: Sequence[PciGpu] | None, nvml_problem: str, amd_problem: str) -> str:
    """Why no library read a card: NVML's reason on a host that may have an NVIDIA card (the bus shows one, or cannot
    be read, or shows none at all), AMD's where the bus shows AMD cards."""
    nvidia_possible = bus is None or not bus or any(gpu.vendor == "nvidia" for gpu in bus)
    reasons = [text for text in (nvml_problem if nvidia_possible else "", amd_problem) if text]
    return "; ".join(reasons) or nvml_problem or "no GPU library read a card"

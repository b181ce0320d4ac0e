"""What an agent reports about its host and GPUs: the inventory sent in ``hello`` and telemetry samples."""

from __future__ import annotations

import msgspec


class NvLink(msgspec.Struct, frozen=True, kw_only=True):
    link: int
    active: bool
    remote_pci_bus_id: str | None = None


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Static facts of one GPU, as read from NVML (or simulated, then ``simulated`` is true)."""

    index: int
    uuid: str
    name: str  # as NVML reports it, e.g. "NVIDIA H100 80GB HBM3"
    pci_bus_id: str
    memory_total_mib: int
    compute_capability: str  # "9.0"
    driver_version: str = ""
    cuda_version: str = ""
    pcie_gen: int | None = None
    pcie_width: int | None = None
    nvlinks: list[NvLink] = []
    clock_sm_max_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    power_limit_w: float | None = None
    memory_bus_width_bits: int | None = None
    simulated: bool = False


class GpuSample(msgspec.Struct, frozen=True, kw_only=True):
    """One telemetry reading of one GPU."""

    uuid: str
    ts: float
    utilization_pct: float = 0.0
    memory_used_mib: int = 0
    temperature_c: float | None = None
    power_w: float | None = None
    clock_sm_mhz: int | None = None
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0


class HostInfo(msgspec.Struct, frozen=True, kw_only=True):
    hostname: str
    cpu_model: str
    cpu_cores: int
    ram_mib: int
    disk_total_gib: float
    disk_free_gib: float
    os: str
    kernel: str
    bandwidth_mbps_down: float | None = None
    bandwidth_mbps_up: float | None = None
    latency_ms: float | None = None


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    host: HostInfo
    gpus: list[GpuInfo] = []
    simulated: bool = False

"""What an agent reports about its host and GPUs: the inventory sent in ``hello`` and telemetry samples."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from common.containers import canonical_image, registry_matches, registry_of

# Bounds on what a host may say about itself: a hello is taken from an untrusted host, so every string
# and list has a ceiling. The Master applies a tighter, configurable bound on GPUs per host.
ShortText = Annotated[str, msgspec.Meta(max_length=128)]
LongText = Annotated[str, msgspec.Meta(max_length=512)]
MAX_GPUS_IN_REPORT = 64  # hard wire limit; the Master's own limit (default 16) is applied on top
# The images a host already has, in hello: the most recently used first, at most this many, so renters can prefer a
# warm host without one host's thousand images swelling every offer.
MAX_IMAGES_IN_REPORT = 32
MAX_REGISTRY_PATTERNS = 32  # of a host's image_registries_allowed or _denied, in hello
MAX_NVLINKS = 32
MAX_MIG_INSTANCES = 8  # MIG splits a GPU into at most 7 GPU instances today; one spare
# NVML's clock throttle reasons, named as a sample reports them (nvmlClocksEventReasons / ClocksThrottleReasons).
THROTTLE_REASONS = (
    "gpu_idle",
    "applications_clocks",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
    "display_clocks",
)
MAX_THROTTLE_REASONS = 16
# A GPU's memory as a hello may state it: 4 TiB, over ten times the largest GPU's today (288 GB). The Master bounds a
# sample's memory use by it (master/telemetry.py, plausible_gpu), so it must not be the sky either.
MAX_GPU_MEMORY_MIB = 4 * 1024 * 1024
GpuMemoryMiB = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPU_MEMORY_MIB)]

# Who made a GPU, as GpuInfo and UnofferedGpu name it; by PCI vendor id (agent/pci.py lists the bus by these).
GPU_VENDORS = ("nvidia", "amd", "intel", "habana")
# Why a card seen on the host's PCI bus is not offered (UnofferedGpu.kind): "integrated" (an iGPU sharing the host's
# memory), "display_only" (too little memory of its own to hold a workload), "no_driver" (no kernel driver bound to it),
# "no_binding" (a driver, but no library or tool the agent reads it through), "unsupported" (a vendor idlegrid does
# not run workloads on yet). A newer agent may send a kind this list lacks: it is shown as sent.
# "partitioned": an AMD card whose compute is split into several devices (CPX and the like): its partitions are reported,
# not sold yet, and the card is not sold whole either.
UNOFFERED_KINDS = ("integrated", "display_only", "no_driver", "no_binding", "unsupported", "partitioned")
# An AMD card's compute partition modes, as amd-smi names them: SPX is the whole card as one device; DPX, TPX, QPX and
# CPX split it into 2, 3, 4 and (on an MI300X) 8 devices. Memory partition modes are NPS1 (one NUMA domain) to NPS4.
WHOLE_COMPUTE_PARTITION = "SPX"
MAX_PARTITION_MODES = 8

RUNTIMES = ("docker", "process", "simulated")  # what runs renters' containers on the host
ISOLATIONS = ("container", "sandbox", "none")  # how well a workload is kept from the host


# The descriptions and samples of GPUs and hosts are frozen and hold only strings, numbers and tuples of each other, so
# they can never be part of a reference cycle: they are out of the garbage collector's sight (``gc=False``). The
# Master keeps one of each per GPU of the fleet (800,000 descriptions and latest samples at 100,000 agents): with the
# collector's header each cost 16 bytes more, and each one tracked (a description always was, a sample naming a
# throttle reason too) a visit in every full collection (docs/capacity.md, "Where the next wall is").
class NvLink(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    link: int
    active: bool
    remote_pci_bus_id: ShortText | None = None


class MigInstance(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One MIG instance of a partitioned GPU: a GPU instance with its compute instance, placed on its own.

    ``uuid`` is what CUDA_VISIBLE_DEVICES and the NVIDIA container toolkit accept ("MIG-…"); ``profile`` is
    NVIDIA's name without the "MIG " prefix ("1g.10gb", "3g.40gb", "1g.10gb+me")."""

    uuid: ShortText
    profile: ShortText
    memory_mib: GpuMemoryMiB
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    index: int = 0  # the MIG device's index on its GPU, as NVML numbers them


class GpuPartition(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """How an AMD card is partitioned (MI300-series; MIG has no AMD equivalent): its compute partition mode (``SPX``:
    whole; ``CPX``: one device per compute die) and memory partition mode (``NPS1``, ``NPS4``), as amd-smi names
    them, and the modes the card can be set to. Reported and shown to the provider, never sold (issue 41): a card
    split into several devices is not offered at all (agent/detect.py). "" where the card does not say."""

    compute: ShortText = ""
    memory: ShortText = ""
    compute_modes: Annotated[tuple[ShortText, ...], msgspec.Meta(max_length=MAX_PARTITION_MODES)] = ()
    memory_modes: Annotated[tuple[ShortText, ...], msgspec.Meta(max_length=MAX_PARTITION_MODES)] = ()

    @property
    def split(self) -> bool:
        """Whether the card's compute is split into several devices (a mode other than SPX)."""
        return bool(self.compute) and self.compute.upper() != WHOLE_COMPUTE_PARTITION

    def describe(self) -> str:
        """ "CPX, NPS4 (can be SPX, DPX, QPX, CPX; NPS1, NPS4)", or "" when nothing is known."""
        now = ", ".join(mode for mode in (self.compute, self.memory) if mode)
        can = "; ".join(", ".join(modes) for modes in (self.compute_modes, self.memory_modes) if modes)
        return f"{now} (can be {can})" if now and can else now


class GpuInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Static facts of one GPU, as read from NVML (or simulated, then ``simulated`` is true)."""

    index: int  # the vendor's own numbering on the host (NVML's index, amdsmi's), not unique across vendors
    uuid: ShortText
    name: ShortText  # as the vendor's library reports it, e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"
    pci_bus_id: ShortText
    memory_total_mib: GpuMemoryMiB
    compute_capability: ShortText  # "9.0"
    driver_version: ShortText = ""
    cuda_version: ShortText = ""
    pcie_gen: int | None = None
    pcie_width: int | None = None
    # A tuple, like ``mig_instances``: the Master keeps one tuple for every card of the same links (an H100 SXM has 18),
    # not a list and 18 link objects per GPU (master/sharing.py).
    nvlinks: Annotated[tuple[NvLink, ...], msgspec.Meta(max_length=MAX_NVLINKS)] = ()
    clock_sm_max_mhz: int | None = None
    clock_mem_max_mhz: int | None = None
    power_limit_w: float | None = None
    memory_bus_width_bits: int | None = None
    simulated: bool = False
    # MIG: whether the GPU runs in MIG mode, and its instances. A GPU in MIG mode runs CUDA work only in its
    # instances, so it is placed instance by instance (none, while it is not partitioned), never whole.
    mig_enabled: bool = False
    # A tuple: the empty default is one shared object, not an empty list per GPU (10,000 hosts × 8 GPUs on the Master).
    mig_instances: Annotated[tuple[MigInstance, ...], msgspec.Meta(max_length=MAX_MIG_INSTANCES)] = ()
    # One of GPU_VENDORS. "nvidia" by default: every agent older than the field read its GPUs through NVML alone.
    vendor: ShortText = "nvidia"
    # An AMD card's partition modes (None: not partitionable, not read, or an older agent): reported, not sold.
    partition: GpuPartition | None = None


class UnofferedGpu(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A card the host's PCI bus shows that the agent does not offer, and why (agent/detect.py): a provider is told what
    to install, never left with a card silently missing. ``fix`` is "" where there is nothing to do (an iGPU)."""

    pci_bus_id: ShortText  # "0000:17:00.0", as sysfs names it
    vendor: ShortText  # one of GPU_VENDORS
    device_id: ShortText = ""  # the PCI device id, "0x74a1"
    name: ShortText = ""  # what is known of its name ("AMD Instinct MI300X"), "" when nothing read it
    kind: ShortText  # one of UNOFFERED_KINDS
    reason: LongText
    fix: LongText = ""
    partition: GpuPartition | None = None  # a "partitioned" card's modes


class GpuSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One telemetry reading of one GPU."""

    uuid: ShortText
    ts: float
    utilization_pct: float = 0.0
    memory_used_mib: int = 0
    temperature_c: float | None = None
    power_w: float | None = None
    clock_sm_mhz: int | None = None
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    # --- telemetry history (issue 13); defaults keep older agents' samples valid ---
    clock_mem_mhz: int | None = None
    xid_count: int = 0  # Xid errors the agent saw on this GPU since it started (a counter, like the ECC ones)
    # Why the clocks are held down now, NVML's reasons by name (THROTTLE_REASONS); () when they run free or unknown.
    throttle_reasons: Annotated[tuple[ShortText, ...], msgspec.Meta(max_length=MAX_THROTTLE_REASONS)] = ()


class HostSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One telemetry reading of the host itself (Linux /proc and the state directory's disk). ``cpu_pct``: busy share
    of every core since the previous sample (None on the first); network bytes are counters since boot, summed over
    every interface but loopback. None: the host did not say."""

    ts: float
    cpu_pct: float | None = None
    load_1m: float | None = None
    ram_used_mib: int | None = None
    ram_total_mib: int | None = None
    disk_used_gib: float | None = None
    disk_free_gib: float | None = None
    net_rx_bytes: int | None = None
    net_tx_bytes: int | None = None


class HostInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    hostname: ShortText
    cpu_model: ShortText
    cpu_cores: int
    ram_mib: int
    disk_total_gib: float
    disk_free_gib: float
    os: ShortText
    kernel: ShortText
    bandwidth_mbps_down: float | None = None
    bandwidth_mbps_up: float | None = None
    latency_ms: float | None = None


class GpuReach(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Whether one GPU reaches a container of the host's runtime: the agent's self-test, run before the host is offered
    (agent/runtime/base.py ``gpu_selftest``). A GPU found unreachable is not offered (master/allocations.py), and the
    provider is shown ``detail`` (what the test saw) and ``fix`` (what to do about it)."""

    uuid: ShortText
    reachable: bool
    detail: LongText = ""
    fix: LongText = ""


class ImageSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where a host's container engine gets the images it runs (the agent's image settings, docs/images.md): what the
    Master needs to refuse at submit an image no host of the grid could ever start. Sent in hello by agents of a
    container engine; None from agents older than it and from runtimes that run no image, taken as "gets anything"."""

    pull: bool = True  # image_pull: off, only images already on the host run
    registries_allowed: Annotated[list[ShortText], msgspec.Meta(max_length=MAX_REGISTRY_PATTERNS)] = []  # []: any
    registries_denied: Annotated[list[ShortText], msgspec.Meta(max_length=MAX_REGISTRY_PATTERNS)] = []

    @classmethod
    def of_settings(cls, pull: bool, allowed: Sequence[str], denied: Sequence[str]) -> ImageSource | None:
        """The source a host's settings make; None (unknown, so never a refusal) when it allows more registries than a
        hello carries. Denied registries past the bound are left out: the Master then refuses less, never more."""
        if len(allowed) > MAX_REGISTRY_PATTERNS:
            return None
        return cls(pull=pull, registries_allowed=list(allowed), registries_denied=list(denied[:MAX_REGISTRY_PATTERNS]))


def image_refusal(source: ImageSource | None, images: Sequence[str], reference: str) -> str | None:
    """Why a host that gets images from ``source`` and has ``images`` (hello's: warm first, bounded) can never start
    ``reference``, as a verb phrase a count can precede ("pull only from ..."), or None. An unknown source, and a list
    as long as the bound (the image may be past it), refuse nothing."""
    if source is None:
        return None
    registry = registry_of(reference)
    denied = any(registry_matches(registry, p) for p in source.registries_denied)
    allowed = not source.registries_allowed or any(registry_matches(registry, p) for p in source.registries_allowed)
    if source.pull and allowed and not denied:
        return None
    if len(images) >= MAX_IMAGES_IN_REPORT or canonical_image(reference) in {canonical_image(i) for i in images}:
        return None
    if not source.pull:
        return f"lack image {reference}, with image pulls off (image_pull)"
    if denied:
        return f"refuse images from {registry} (image_registries_denied)"
    return f"pull only from {', '.join(source.registries_allowed)}, not from {registry} (image_registries_allowed)"


class Inventory(msgspec.Struct, frozen=True, kw_only=True):
    host: HostInfo
    gpus: Annotated[list[GpuInfo], msgspec.Meta(max_length=MAX_GPUS_IN_REPORT)] = []
    simulated: bool = False
    runtime: ShortText = ""  # one of RUNTIMES; "" from agents older than the field
    isolation: ShortText = ""  # one of ISOLATIONS: "container" (an engine), "sandbox" (the process runtime), "none"
    # The GPU self-test's result, one per GPU tested; a GPU not listed was not tested (agents older than the field,
    # runtimes without a self-test) and is taken as reachable.
    gpu_reach: Annotated[list[GpuReach], msgspec.Meta(max_length=MAX_GPUS_IN_REPORT)] = []
    images: Annotated[list[LongText], msgspec.Meta(max_length=MAX_IMAGES_IN_REPORT)] = []  # references, warm first
    # The host's Nebula public key (PEM, common/nebula.py) when it can run gangs' overlays; "" otherwise.
    overlay_key: Annotated[str, msgspec.Meta(max_length=256)] = ""
    image_source: ImageSource | None = None  # where its engine gets images; None: no engine, or an agent older than it
    # Cards on the host's PCI bus it does not offer, each with why and what to install (docs/gpus.md); [] from agents
    # older than the field, which never looked past NVML.
    unoffered: Annotated[list[UnofferedGpu], msgspec.Meta(max_length=MAX_GPUS_IN_REPORT)] = []

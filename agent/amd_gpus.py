"""AMD GPUs, read through the first of these that works (as GPUStack's runtime library does, one binding per vendor):

1. ``amdsmi``, AMD's Python binding (ships with ROCm, or ``pip install amdsmi`` beside ROCm's libamd_smi.so); imported
   only here, lazily, never required;
2. the ``amd-smi`` command (``amd-smi static --json``);
3. the older ``rocm-smi`` command (``rocm-smi --showproductname --showmeminfo vram --showbus --showuniqueid --json``);
4. sysfs alone, where the amdgpu kernel driver is bound: its memory (``mem_info_vram_total``) and, for telemetry,
   ``gpu_busy_percent``, ``mem_info_vram_used`` and its hwmon's temperature and power.

Each source answers ``cards()`` (a GpuInfo per card, ``vendor="amd"``), ``sample()`` and ``reports()``. The
command-line and sysfs sources sample from sysfs: running a command every telemetry tick would cost more than the
reading is worth.

Faults (``RasWatch``): amdgpu's RAS counts each block's uncorrectable errors (sysfs ``ras/<block>_err_count``,
amdsmi's ``amdsmi_get_gpu_ecc_count``). A rise since the agent started is reported as NVIDIA's driver reports the
error that means the same, so the Master's fault rules (master/faults.py, ``fatal_xids``) hold for both vendors:
memory (``umc``) as an uncorrectable ECC event (``gpu_ecc``, Xid 48's meaning); the XGMI links between cards
(``xgmi_wafl``, AMD's NVLink) as Xid 74 (NVLink error); any other block on the chip (gfx, sdma, mmhub, df, ...) as Xid
95 (uncontained error: amdgpu resets the GPU, as Xid 95 asks). Counts already there when the agent starts are not
reported (NVML's events too start when the agent listens); the sample's ECC count carries memory errors since the
driver loaded, which the Master weighs against the count accepted at the last repair.

Through amdsmi, its event API too (``EventWatch``): a GPU reset as Xid 43 (the work on the card lost), a reset that
does not end as Xid 79 (the card gone), a VM fault as Xid 31, thermal throttling as a ``gpu_throttled`` report. A
binding without it, or a driver that refuses it, leaves the rest as it is.

Partition modes (MI300-series: compute SPX to CPX, memory NPS1 to NPS4) are read too, from amdsmi, amd-smi's
``partition`` table or sysfs (``current_compute_partition``, ``available_compute_partition``, and the memory ones);
agent/detect.py reports a card split into several devices and does not offer it.

A card's uuid is "GPU-" and its unique id in hex (what ROCR_VISIBLE_DEVICES accepts) where the card has one, else made
from the host and the card's PCI address, so it stays the same across restarts.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import msgspec

from agent.pci import PciGpu, normal_address
from common.inventory import MAX_PARTITION_MODES, GpuInfo, GpuPartition, GpuSample
from common.wire import AgentEvent, AgentEventKind

log = logging.getLogger(__name__)

MIB = 1024 * 1024
COMMAND_TIMEOUT_S = 20.0  # amd-smi on an 8-card host answers in a few seconds
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "amd-gpu.idlegrid")
# Names by PCI device id, for cards read from sysfs alone (no library to name them): the catalog's AMD models, named as
# amd-smi names them, so the catalog matches them (common/catalog.py).
AMD_DEVICE_NAMES = {
    0x74A1: "AMD Instinct MI300X",
    0x74A5: "AMD Instinct MI325X",
    0x740C: "AMD Instinct MI250X/MI250",
    0x740F: "AMD Instinct MI210",
    0x744C: "AMD Radeon RX 7900 XTX",
    0x7448: "AMD Radeon PRO W7900",
}

# What runs a command: (argv, timeout) -> stdout, raising OSError or subprocess.SubprocessError when it cannot.
CommandRunner = Callable[[Sequence[str], float], str]


class AmdSource(Protocol):
    name: str  # "amdsmi", "amd-smi", "rocm-smi" or "sysfs": which one read the cards

    def cards(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuSample]: ...

    def reports(self) -> list[AgentEvent]:
        """RAS errors counted since the last call, as the events NVIDIA's driver would send (module docstring)."""
        ...

    def close(self) -> None: ...


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """The command's standard output; OSError when it is not installed, SubprocessError when it fails."""
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(f"{argv[0]} not found on PATH")
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=True).stdout


def open_amd_source(
    bus: Sequence[PciGpu],
    sysfs_root: Path,
    *,
    host_key: str,
    import_module: Callable[[str], ModuleType] = importlib.import_module,
    runner: CommandRunner = run_command,
) -> tuple[AmdSource | None, list[str]]:
    """The first source that reads at least one AMD card, and why each one before it did not (for the log and the
    provider); (None, reasons) when none does. ``bus``: the AMD cards on the PCI bus, for the sysfs source."""
    tried: list[str] = []
    try:
        module = import_module("amdsmi")
        source: AmdSource = AmdSmiSource(module, host_key=host_key)
    except Exception as exc:  # an ImportError; KeyError('libamd_smi.so') without ROCm's library; amdsmi's own at init
        tried.append(f"amdsmi: not usable ({type(exc).__name__}: {_first_line(exc)})")
    else:
        if source.cards():
            return source, tried
        source.close()
        tried.append("amdsmi: it lists no GPU")
    for make in (AmdSmiCommand, RocmSmiCommand):
        try:
            command: AmdSource = make(runner, sysfs_root, host_key=host_key)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            tried.append(f"{make.name}: {_first_line(exc)}")
            continue
        if command.cards():
            return command, tried
        tried.append(f"{make.name}: it lists no GPU")
    sysfs = SysfsSource(bus, sysfs_root, host_key=host_key)
    if sysfs.cards():
        return sysfs, tried
    tried.append("sysfs: no card under amdgpu that reports its memory (mem_info_vram_total)")
    return None, tried


# ---------------------------------------------------------------- 1. the amdsmi binding


class AmdSmiSource:
    """AMD's Python binding. Untested on hardware (no AMD GPU where this was written): it follows amdsmi's documented
    API, and tests drive it through a stand-in module (tests/agent/fake_amdsmi.py)."""

    name = "amdsmi"

    def __init__(self, amdsmi: ModuleType, *, host_key: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._smi = amdsmi
        amdsmi.amdsmi_init()
        self._handles = list(amdsmi.amdsmi_get_processor_handles())
        read = [(handle, self._info(index, handle, host_key)) for index, handle in enumerate(self._handles)]
        self._cards = [info for _, info in read if info]
        self._ras = RasWatch(self._cards, self._ras_counts)
        self._events = EventWatch(amdsmi, [(handle, info) for handle, info in read if info], clock=clock)

    def cards(self) -> list[GpuInfo]:
        return list(self._cards)

    def reports(self) -> list[AgentEvent]:
        return [*self._ras.reports(), *self._events.reports()]

    def _ras_counts(self, card: GpuInfo) -> dict[str, int]:
        """Uncorrectable errors by RAS block (amdsmi's AmdSmiGpuBlock, named in lower case as sysfs names them)."""
        smi = self._smi
        [handle] = [h for h in self._handles if normal_address(smi.amdsmi_get_gpu_device_bdf(h)) == card.pci_bus_id]
        counts = {}
        for block in smi.AmdSmiGpuBlock:
            if block.name in ("INVALID", "LAST", "RESERVED"):
                continue
            found = _optional(functools.partial(smi.amdsmi_get_gpu_ecc_count, handle, block)) or {}
            count = _number(found.get("uncorrectable_count"))
            if count is not None:
                counts[block.name.lower()] = int(count)
        return counts

    def sample(self) -> list[GpuSample]:
        now = time.time()
        samples = []
        by_uuid = {info.pci_bus_id: info.uuid for info in self._cards}
        for handle in self._handles:
            try:
                address = normal_address(self._smi.amdsmi_get_gpu_device_bdf(handle))
                if address in by_uuid:
                    samples.append(self._sample(handle, by_uuid[address], now))
            except Exception as exc:  # one card that stops answering leaves the others sampled
                log.warning("an AMD GPU was not sampled: amdsmi says %s", _first_line(exc))
        return samples

    def close(self) -> None:
        self._events.close()
        with contextlib.suppress(Exception):
            self._smi.amdsmi_shut_down()

    def _info(self, index: int, handle: Any, host_key: str) -> GpuInfo | None:
        smi = self._smi
        try:
            address = normal_address(smi.amdsmi_get_gpu_device_bdf(handle))
            asic = smi.amdsmi_get_gpu_asic_info(handle)
            memory = smi.amdsmi_get_gpu_memory_total(handle, smi.AmdSmiMemoryType.VRAM)
        except Exception as exc:
            log.error("AMD GPU %d left out of the inventory: amdsmi says %s", index, _first_line(exc))
            return None
        # The ASIC serial is sysfs' unique_id, what the other sources name the card by: a host whose amdsmi breaks keeps
        # its cards' uuids when it falls back to a command or sysfs.
        serial = asic.get("asic_serial") or _optional(lambda: smi.amdsmi_get_gpu_device_uuid(handle)) or ""
        driver = _optional(lambda: smi.amdsmi_get_gpu_driver_info(handle)) or {}
        power = _optional(lambda: smi.amdsmi_get_power_cap_info(handle)) or {}
        cap = power.get("power_cap")  # microwatts
        compute = _mode(_optional(lambda: smi.amdsmi_get_gpu_compute_partition(handle)))
        numa = _mode(_optional(lambda: smi.amdsmi_get_gpu_memory_partition(handle)))
        return GpuInfo(
            index=index,
            uuid=card_uuid(str(serial), address, host_key),
            name=str(asic.get("market_name") or _name_of(asic.get("device_id"))),
            pci_bus_id=address,
            memory_total_mib=int(memory) // MIB,
            compute_capability="",
            driver_version=str(driver.get("driver_version", "")),
            power_limit_w=cap / 1e6 if isinstance(cap, int | float) and cap > 0 else None,
            vendor="amd",
            partition=GpuPartition(compute=compute, memory=numa) if compute or numa else None,
        )

    def _sample(self, handle: Any, card: str, now: float) -> GpuSample:
        smi = self._smi
        activity = _optional(lambda: smi.amdsmi_get_gpu_activity(handle)) or {}
        used = _optional(lambda: smi.amdsmi_get_gpu_memory_usage(handle, smi.AmdSmiMemoryType.VRAM))
        temperature = _temperature(smi, handle)
        power = _optional(lambda: smi.amdsmi_get_power_info(handle)) or {}
        ecc = _optional(lambda: smi.amdsmi_get_gpu_total_ecc_count(handle)) or {}
        watts = power.get("current_socket_power") or power.get("average_socket_power")
        xids = self._ras.xid_counts.get(card, 0) + self._events.xid_counts.get(card, 0)
        return GpuSample(
            uuid=card,
            ts=now,
            utilization_pct=float(_number(activity.get("gfx_activity")) or 0.0),
            memory_used_mib=int(used or 0) // MIB,
            temperature_c=temperature,
            power_w=float(watts) if isinstance(watts, int | float) else None,
            ecc_corrected=int(_number(ecc.get("correctable_count")) or 0),
            ecc_uncorrected=int(_number(ecc.get("uncorrectable_count")) or 0),
            xid_count=xids,
        )


def _temperature(smi: ModuleType, handle: Any) -> float | None:
    """The card's edge temperature where it has that sensor (what NVIDIA's GPU temperature compares with, so the
    Master's overheat rule means the same for both), else its hotspot (an MI300 has no edge sensor)."""
    metric = smi.AmdSmiTemperatureMetric.CURRENT
    for sensor in (smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureType.HOTSPOT):
        value = _optional(functools.partial(smi.amdsmi_get_temp_metric, handle, sensor, metric))
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


# ---------------------------------------------------------------- 2. and 3. the command-line tools


class _CommandCards:
    """A vendor command's cards, read once when made (``ARGV``'s output through ``parse``), sampled from sysfs after."""

    name: str
    ARGV: tuple[str, ...]

    def __init__(self, runner: CommandRunner, sysfs_root: Path, *, host_key: str) -> None:
        parsed = self.parse(runner(self.ARGV, COMMAND_TIMEOUT_S), host_key=host_key)
        self._cards = [with_sysfs_partition(card, sysfs_root) for card in parsed]
        self._sampler = SysfsSampler(sysfs_root, self._cards)

    def parse(self, text: str, *, host_key: str) -> list[GpuInfo]:
        raise NotImplementedError

    def cards(self) -> list[GpuInfo]:
        return list(self._cards)

    def sample(self) -> list[GpuSample]:
        return self._sampler.sample()

    def reports(self) -> list[AgentEvent]:
        return self._sampler.ras.reports()

    def close(self) -> None:
        """Nothing held between calls."""


class AmdSmiCommand(_CommandCards):
    """``amd-smi static --json``: a list of cards (amd-smi 24.x) or {"gpu_data": [...]} (amd-smi 25 and later); sizes
    as {"value": N, "unit": "MB"} or "N MB" depending on the version."""

    name = "amd-smi"
    ARGV = ("amd-smi", "static", "--json")

    def parse(self, text: str, *, host_key: str) -> list[GpuInfo]:
        return parse_amd_smi_static(text, host_key=host_key)


class RocmSmiCommand(_CommandCards):
    """``rocm-smi --json``: {"card0": {"Card series": ..., "VRAM Total Memory (B)": ..., "PCI Bus": ...}, ...}."""

    name = "rocm-smi"
    ARGV = ("rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showbus", "--showuniqueid", "--json")

    def parse(self, text: str, *, host_key: str) -> list[GpuInfo]:
        return parse_rocm_smi(text, host_key=host_key)


def parse_amd_smi_static(text: str, *, host_key: str) -> list[GpuInfo]:
    """The cards ``amd-smi static --json`` lists; ValueError when it is not that command's JSON."""
    document = json.loads(text)
    entries = document.get("gpu_data", []) if isinstance(document, dict) else document
    if not isinstance(entries, list):
        raise ValueError("amd-smi static --json: neither a list of GPUs nor {'gpu_data': [...]}")
    cards = []
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        asic, bus, vram = _table(entry, "asic"), _table(entry, "bus"), _table(entry, "vram")
        address = normal_address(str(bus.get("bdf", "")))
        if not address:
            continue
        limit, driver, split = _table(entry, "limit"), _table(entry, "driver"), _table(entry, "partition")
        compute = _mode(split.get("compute_partition") or split.get("accelerator_partition"))
        memory = _mode(split.get("memory_partition"))
        cards.append(
            GpuInfo(
                index=int(_number(entry.get("gpu")) or position),
                uuid=card_uuid(str(asic.get("asic_serial", "")), address, host_key),
                name=str(asic.get("market_name") or _name_of(asic.get("device_id"))),
                pci_bus_id=address,
                memory_total_mib=_mib(vram.get("size"), unit="MB"),
                compute_capability="",
                driver_version=str(driver.get("version", "")),
                pcie_width=_int_or_none(bus.get("max_pcie_width")),
                power_limit_w=_number(limit.get("max_power")),
                memory_bus_width_bits=_int_or_none(vram.get("bit_width")),
                vendor="amd",
                partition=GpuPartition(compute=compute, memory=memory) if compute or memory else None,
            )
        )
    return cards


def parse_rocm_smi(text: str, *, host_key: str) -> list[GpuInfo]:
    """The cards ``rocm-smi ... --json`` lists (its keys "card0", "card1", ...); ValueError when it is not its JSON."""
    document = json.loads(text)
    if not isinstance(document, dict):
        raise ValueError("rocm-smi --json: not an object of cards")
    cards: list[GpuInfo] = []
    for key, entry in document.items():
        if not key.startswith("card") or not isinstance(entry, dict):
            continue  # "system" and the like
        address = normal_address(str(entry.get("PCI Bus", "")))
        if not address:
            continue
        device = entry.get("Device ID") or entry.get("Card model") or entry.get("Card Model")
        cards.append(
            GpuInfo(
                index=int(key.removeprefix("card")) if key.removeprefix("card").isdigit() else len(cards),
                uuid=card_uuid(str(entry.get("Unique ID", "")), address, host_key),
                name=str(entry.get("Card Series") or entry.get("Card series") or _name_of(device)),
                pci_bus_id=address,
                memory_total_mib=_mib(entry.get("VRAM Total Memory (B)"), unit="B"),
                compute_capability="",
                vendor="amd",
            )
        )
    return cards


# ---------------------------------------------------------------- 4. sysfs alone


class SysfsSource:
    """Cards the amdgpu driver is bound to, read from sysfs alone: a name from the device id (``AMD_DEVICE_NAMES``,
    else "AMD GPU 0x...."), the memory amdgpu reports, the unique id where the card has one."""

    name = "sysfs"

    def __init__(self, bus: Sequence[PciGpu], sysfs_root: Path, *, host_key: str) -> None:
        cards: list[GpuInfo] = []
        for gpu in bus:
            if gpu.vendor != "amd" or gpu.driver != "amdgpu" or gpu.vram_bytes is None:
                continue
            unique = _read(sysfs_root / "bus" / "pci" / "devices" / gpu.address / "unique_id") or ""
            cards.append(
                GpuInfo(
                    index=len(cards),
                    uuid=card_uuid(unique, gpu.address, host_key),
                    name=_name_of(gpu.device_id),
                    pci_bus_id=gpu.address,
                    memory_total_mib=gpu.vram_bytes // MIB,
                    compute_capability="",
                    vendor="amd",
                    partition=sysfs_partition(sysfs_root / "bus" / "pci" / "devices" / gpu.address),
                )
            )
        self._cards = cards
        self._sampler = SysfsSampler(sysfs_root, cards)

    def cards(self) -> list[GpuInfo]:
        return list(self._cards)

    def sample(self) -> list[GpuSample]:
        return self._sampler.sample()

    def reports(self) -> list[AgentEvent]:
        return self._sampler.ras.reports()

    def close(self) -> None:
        """Nothing held."""


class SysfsSampler:
    """Telemetry of amdgpu cards from sysfs: ``gpu_busy_percent``, ``mem_info_vram_used``, the first hwmon's
    ``temp*_input`` (millidegrees; the edge sensor where the card has one) and ``power1_average``/``power1_input``
    (microwatts), and RAS's memory ECC counts. A reading a card lacks reads as None (0 for utilization, memory and
    ECC)."""

    def __init__(self, sysfs_root: Path, cards: Sequence[GpuInfo]) -> None:
        self._root = sysfs_root / "bus" / "pci" / "devices"
        self._cards = list(cards)
        self.ras = RasWatch(self._cards, lambda card: ras_counts(self._root / card.pci_bus_id))

    def sample(self) -> list[GpuSample]:
        now = time.time()
        return [self._sample(card, now) for card in self._cards]

    def _sample(self, card: GpuInfo, now: float) -> GpuSample:
        device = self._root / card.pci_bus_id
        hwmon = _first_hwmon(device)
        power = _int_or_none(_read(hwmon / "power1_average") or _read(hwmon / "power1_input")) if hwmon else None
        temperature = _edge_temperature(hwmon) if hwmon else None
        uncorrected, corrected = _memory_errors(device)
        return GpuSample(
            uuid=card.uuid,
            ts=now,
            utilization_pct=float(_int_or_none(_read(device / "gpu_busy_percent")) or 0),
            memory_used_mib=(_int_or_none(_read(device / "mem_info_vram_used")) or 0) // MIB,
            temperature_c=temperature / 1000.0 if temperature is not None else None,
            power_w=power / 1e6 if power is not None else None,
            ecc_corrected=corrected,
            ecc_uncorrected=uncorrected,
            xid_count=self.ras.xid_counts.get(card.uuid, 0),
        )


def _first_hwmon(device: Path) -> Path | None:
    try:
        return min((device / "hwmon").iterdir())
    except (OSError, ValueError):
        return None


def _edge_temperature(hwmon: Path) -> int | None:
    """amdgpu labels its sensors "edge", "junction" and "mem": the edge one where the card has it (what NVIDIA's GPU
    temperature compares with, so the Master's overheat rule means the same), else the junction (an MI300 has no edge
    sensor), else the first."""
    labels = {(_read(hwmon / f"temp{index}_label") or "").lower(): index for index in (1, 2, 3)}
    for label in ("edge", "junction"):
        if label in labels:
            return _int_or_none(_read(hwmon / f"temp{labels[label]}_input"))
    return _int_or_none(_read(hwmon / "temp1_input"))


def _memory_errors(device: Path) -> tuple[int, int]:
    """(uncorrectable, correctable) memory ECC errors amdgpu's RAS counts on the card's memory controller
    (``ras/umc_err_count``: "ue: N" and "ce: N" lines), what NVIDIA's ECC counters count; (0, 0) without RAS."""
    counts = {"ue": 0, "ce": 0}
    for line in (_read(device / "ras" / "umc_err_count") or "").splitlines():
        name, _, value = line.partition(":")
        if name.strip() in counts:
            counts[name.strip()] = _int_or_none(value) or 0
    return counts["ue"], counts["ce"]


# ---------------------------------------------------------------- partition modes


def sysfs_partition(device: Path) -> GpuPartition | None:
    """The card's partition modes from amdgpu's sysfs files (an MI300's; other cards have none: None)."""
    compute, memory = _mode(_read(device / "current_compute_partition")), _mode(_read(device / "current_memory_partition"))
    if not compute and not memory:
        return None
    return GpuPartition(
        compute=compute,
        memory=memory,
        compute_modes=_modes(_read(device / "available_compute_partition")),
        memory_modes=_modes(_read(device / "available_memory_partition")),
    )


def with_sysfs_partition(card: GpuInfo, sysfs_root: Path) -> GpuInfo:
    """``card`` with what sysfs says of its partitions where its source did not say (rocm-smi) or said less (the
    modes it can be set to)."""
    found = sysfs_partition(sysfs_root / "bus" / "pci" / "devices" / card.pci_bus_id)
    if found is None:
        return card
    told = card.partition or GpuPartition()
    merged = GpuPartition(
        compute=told.compute or found.compute,
        memory=told.memory or found.memory,
        compute_modes=told.compute_modes or found.compute_modes,
        memory_modes=told.memory_modes or found.memory_modes,
    )
    return msgspec.structs.replace(card, partition=merged)


def _mode(value: Any) -> str:
    """A partition mode as the tools write it ("SPX", "CPX", "NPS1"), upper case; "" for "N/A" and the like."""
    text = str(value or "").strip().upper()
    return text if text and text.isalnum() and len(text) <= 16 else ""


def _modes(text: str | None) -> tuple[str, ...]:
    """ "SPX, DPX, QPX, CPX" -> ("SPX", "DPX", "QPX", "CPX")."""
    return tuple(mode for part in (text or "").split(",") if (mode := _mode(part)))[:MAX_PARTITION_MODES]


# ---------------------------------------------------------------- RAS errors as faults

MEMORY_BLOCK = "umc"  # the memory controller: its uncorrectable errors are memory ECC errors
XGMI_XID = 74  # NVIDIA's NVLink error: XGMI (its "wafl" physical layer) is AMD's link between cards
UNCONTAINED_XID = 95  # NVIDIA's uncontained error, GPU reset needed: what amdgpu does on an uncorrectable chip error
_XID_MEANING = {XGMI_XID: "a link error, NVLink's Xid 74", UNCONTAINED_XID: "an uncontained error, Xid 95: reset needed"}

# What reads one card's uncorrectable error counts by RAS block ("umc", "xgmi_wafl", "gfx", ...).
RasCounts = Callable[[GpuInfo], dict[str, int]]


def ras_xid(block: str) -> int | None:
    """The Xid an uncorrectable error of ``block`` is reported as; None for memory, reported as ECC (module docstring)."""
    if block == MEMORY_BLOCK:
        return None
    return XGMI_XID if block.startswith("xgmi") else UNCONTAINED_XID


class RasWatch:
    """The rise of each card's uncorrectable RAS counts between calls, as fault events (the module docstring); the
    Xids reported so far per card (a sample's ``xid_count``). A card whose counts cannot be read reports nothing."""

    def __init__(self, cards: Sequence[GpuInfo], read: RasCounts) -> None:
        self._cards = list(cards)
        self._read = read
        self._seen = {card.uuid: self._counts(card) for card in self._cards}  # what was there before the agent
        self.xid_counts: dict[str, int] = {}

    def reports(self) -> list[AgentEvent]:
        now = time.time()
        events = []
        for card in self._cards:
            counts = self._counts(card)
            before = self._seen.get(card.uuid, {})
            for block, count in sorted(counts.items()):
                new = count - before.get(block, 0)
                if new > 0:
                    events.append(self._event(card.uuid, block, new, now))
            self._seen[card.uuid] = {**before, **counts}  # a count that fell (the driver reloaded) is the new base
        return events

    def _event(self, uuid: str, block: str, new: int, now: float) -> AgentEvent:
        xid = ras_xid(block)
        if xid is None:
            message = f"{new} uncorrectable memory ({block}) error(s), counted by AMD's RAS"
            return AgentEvent(kind=AgentEventKind.GPU_ECC, ts=now, gpu_uuid=uuid, code=new, message=message)
        self.xid_counts[uuid] = self.xid_counts.get(uuid, 0) + 1
        message = f"AMD RAS: {new} uncorrectable {block} error(s), {_XID_MEANING[xid]}"
        return AgentEvent(kind=AgentEventKind.GPU_XID, ts=now, gpu_uuid=uuid, code=xid, message=message)

    def _counts(self, card: GpuInfo) -> dict[str, int]:
        try:
            return self._read(card)
        except Exception as exc:  # one card that stops answering leaves the others watched
            log.warning("AMD GPU %s: its RAS error counts were not read: %s", card.uuid, _first_line(exc))
            return {}


def ras_counts(device: Path) -> dict[str, int]:
    """Uncorrectable errors by block from amdgpu's ``ras/<block>_err_count`` files ("ue: N" lines); {} without RAS."""
    try:
        names = sorted(name for name in os.listdir(device / "ras") if name.endswith("_err_count"))
    except OSError:
        return {}
    counts = {}
    for name in names:
        for line in (_read(device / "ras" / name) or "").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "ue" and (count := _int_or_none(value)) is not None:
                counts[name.removesuffix("_err_count")] = count
    return counts


# ---------------------------------------------------------------- amdsmi's events as faults

RESET_XID = 43  # NVIDIA's "GPU stopped processing": the work on the card is lost, the card itself goes on
LOST_XID = 79  # NVIDIA's "GPU has fallen off the bus": the card is gone until it is reset or the host restarts
VM_FAULT_XID = 31  # NVIDIA's "GPU memory page fault": a process touched GPU memory it has not mapped
# A reset whose end (GPU_POST_RESET) has not come this long after its start (GPU_PRE_RESET) did not end: far beyond
# what a reset of one card, or of a hive of 8 linked by XGMI (reset together), is expected to take (seconds to tens).
RESET_DEADLINE_S = 300.0
AMDSMI_STATUS_NO_DATA = 40  # amdsmi_wrapper's AMDSMI_STATUS_NO_DATA: no event queued (not a failure)
EVENTS_PER_READ = 32  # events asked of one amdsmi read
MAX_EVENTS_PER_REPORT = 256  # read per ``reports`` call at most; the rest wait for the next
# The event types listened to (amdsmi's AmdSmiEvtNotificationType names). The others (migrations, page faults of
# shared virtual memory, queue evictions, process start and end) trace processes and mean no fault; a listener gets its
# own processes' only, or every process's with root's rights.
WATCHED_EVENTS = ("VMFAULT", "THERMAL_THROTTLE", "GPU_PRE_RESET", "GPU_POST_RESET")


class EventWatch:
    """amdsmi's event API (``AmdSmiEventReader``: the C library's ``amdsmi_init_gpu_event_notification``,
    ``amdsmi_set_gpu_event_notification_mask``, ``amdsmi_get_gpu_event_notification`` and
    ``amdsmi_stop_gpu_event_notification``), read without waiting each telemetry tick, as NVML's events are, and turned
    into what NVIDIA's driver sends for what means the same (docs/gpus.md, "Faults of AMD cards"):

    - ``GPU_PRE_RESET`` (amdgpu resets the card: a hung job on one of its rings, a hung scheduler, an uncorrectable RAS
      error, an operator): Xid 43, the work on the card is lost and the card comes back. Not Xid 79: a renter's hung
      kernel causes most resets, and would take a provider's card off the market until an operator repairs it; a
      reset for a RAS error is reported as Xid 95 through the RAS counts (``RasWatch``);
    - a reset whose ``GPU_POST_RESET`` has not come ``RESET_DEADLINE_S`` after it began: Xid 79, the card is gone;
    - ``VMFAULT`` (a process touched GPU memory it has not mapped): Xid 31, an application's fault;
    - ``THERMAL_THROTTLE``: a ``gpu_throttled`` report (the throttle bits), no fault: overheating is judged on the
      samples' temperatures, as for NVIDIA, whose throttling is no Xid either.

    amdsmi returns every started card's events from one read, whichever card's reader reads; an event names its card by
    a handle equal to the card's in ``.value`` only. A binding without the event API (older than it), a driver that
    refuses it, or a read that fails leaves the cards read and sampled: their resets and VM faults go unreported, and
    the log says so once."""

    def __init__(
        self, amdsmi: ModuleType, cards: Sequence[tuple[Any, GpuInfo]], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self._uuids: dict[Any, str] = {}
        self._readers: list[Any] = []
        self._resets: dict[str, float] = {}  # card -> when (clock) its reset began, until it ends or is reported lost
        self._lost: set[str] = set()  # cards reported lost (Xid 79) whose reset has not ended since
        self._failing = False  # the last read failed (logged once until a read works again)
        self._odd = False  # an answer was of no documented shape (logged once)
        self.xid_counts: dict[str, int] = {}  # card -> Xids reported (a sample's ``xid_count``)
        try:
            self._uuids = {_handle_key(handle): card.uuid for handle, card in cards}
            reader = getattr(amdsmi, "AmdSmiEventReader", None)
            types = getattr(amdsmi, "AmdSmiEvtNotificationType", None)
            if reader is None or types is None:
                log.info("amdsmi has no event API (older than it): AMD GPU resets and VM faults are not reported")
                return
            wanted = [types[name] for name in WATCHED_EVENTS if name in types.__members__]
        except Exception as exc:  # a binding whose event API or handles are not what its documentation says
            log.warning("amdsmi's event API is not used (%s): AMD GPU resets and VM faults are not reported", _first_line(exc))
            return
        refused = []
        for handle, card in cards:
            try:
                self._readers.append(reader(handle, wanted))
            except Exception as exc:  # a driver without KFD's events, a card that stopped answering
                refused.append(f"{card.uuid}: {_first_line(exc)}")
        if refused:
            log.warning(
                "amdsmi's events are not read for %d of %d AMD GPU(s), whose resets and VM faults are not reported (%s)",
                len(refused),
                len(cards),
                "; ".join(refused[:3]),
            )

    def reports(self) -> list[AgentEvent]:
        """What the driver sent since the last call, and the resets that did not end in time; never waits, never
        raises (a failure is logged and nothing is reported)."""
        if not self._readers:
            return []
        try:
            return self._reports()
        except Exception as exc:  # an answer of a shape no version documents: the agent goes on without events
            if not self._odd:
                self._odd = True
                log.warning("AMD GPU events were not read (logged once): %s", _first_line(exc))
            return []

    def _reports(self) -> list[AgentEvent]:
        now, wall = self._clock(), time.time()
        found: list[AgentEvent] = []
        vm_faults: dict[str, int] = {}
        throttles: dict[str, list[str]] = {}
        for item in self._read():
            uuid = self._uuids.get(_handle_key(item.get("processor_handle")))
            if uuid is None:
                continue  # a card left out of the inventory
            kind, message = str(item.get("event", "")), _printable(item.get("message"))
            if kind == "GPU_PRE_RESET":
                self._resets.setdefault(uuid, now)
                text = f"AMD GPU reset (amdsmi GPU_PRE_RESET {message}): the work on the card is lost, Xid 43's meaning"
                found.append(self._xid(uuid, RESET_XID, text, wall))
            elif kind == "GPU_POST_RESET":
                self._resets.pop(uuid, None)
                if uuid in self._lost:
                    self._lost.discard(uuid)
                    log.warning("AMD GPU %s: its reset ended after it was reported lost (Xid 79); a repair returns it", uuid)
            elif kind == "VMFAULT":  # its message names the process (pid:name): a renter's, not sent on
                vm_faults[uuid] = vm_faults.get(uuid, 0) + 1
            elif kind == "THERMAL_THROTTLE":
                throttles.setdefault(uuid, []).append(message)
        for uuid, count in vm_faults.items():  # one report per card and read: a faulting kernel can send many
            text = f"AMD GPU VM fault x{count}: a process touched GPU memory it has not mapped, Xid 31's meaning"
            found.append(self._xid(uuid, VM_FAULT_XID, text, wall))
        for uuid, bits in throttles.items():
            text = f"AMD GPU thermal throttling (amdsmi THERMAL_THROTTLE x{len(bits)}, throttle bits:count {bits[-1]})"
            found.append(AgentEvent(kind=AgentEventKind.GPU_THROTTLED, ts=wall, gpu_uuid=uuid, message=text))
        for uuid, began in list(self._resets.items()):
            if now - began >= RESET_DEADLINE_S:
                del self._resets[uuid]
                self._lost.add(uuid)
                text = (
                    f"AMD GPU reset began {now - began:.0f} s ago and has not ended (no GPU_POST_RESET): the card is "
                    "unusable until it is reset again or the host restarts, Xid 79's meaning"
                )
                found.append(self._xid(uuid, LOST_XID, text, wall))
        return found

    def _read(self) -> list[dict[str, Any]]:
        """The queued events, read through any one reader (amdsmi returns every started card's)."""
        found: list[dict[str, Any]] = []
        while len(found) < MAX_EVENTS_PER_REPORT:
            try:
                batch = self._readers[0].read(0, EVENTS_PER_READ)  # 0 ms: never waits
            except Exception as exc:
                if getattr(exc, "err_code", None) == AMDSMI_STATUS_NO_DATA:
                    self._failing = False  # nothing queued: amdsmi says so by raising
                elif not self._failing:
                    self._failing = True
                    log.warning("reading AMD GPU events failed (amdsmi says %s): tried again each tick", _first_line(exc))
                break
            self._failing = False
            found.extend(item for item in batch if isinstance(item, dict))
            if len(batch) < EVENTS_PER_READ:
                break
        return found

    def _xid(self, uuid: str, xid: int, message: str, wall: float) -> AgentEvent:
        self.xid_counts[uuid] = self.xid_counts.get(uuid, 0) + 1
        return AgentEvent(kind=AgentEventKind.GPU_XID, ts=wall, gpu_uuid=uuid, code=xid, message=message)

    def close(self) -> None:
        for reader in self._readers:
            with contextlib.suppress(Exception):
                reader.stop()
        self._readers = []


def _handle_key(handle: Any) -> Any:
    """What identifies a card's amdsmi handle: a ctypes pointer's address (two handle objects of one card are not
    equal), else the handle itself."""
    value = getattr(handle, "value", None)
    return value if isinstance(value, int) else handle


def _printable(value: Any) -> str:
    """An event's message as it may be sent on: printable, short."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value or "")
    return "".join(c for c in text.strip() if c.isprintable())[:80]


# ---------------------------------------------------------------- helpers


def card_uuid(unique: str, address: str, host_key: str) -> str:
    """ "GPU-" and the card's unique id in lower-case hex (ROCR_VISIBLE_DEVICES' form), else "AMD-" and a uuid made of
    the host and the card's address."""
    digits = unique.strip().lower().removeprefix("0x").removeprefix("gpu-")
    if digits and all(c in "0123456789abcdef-" for c in digits) and set(digits) - {"0", "-"}:
        return f"GPU-{digits}"
    return f"AMD-{uuid.uuid5(_UUID_NAMESPACE, f'{host_key}/{address}')}"


def _name_of(device: Any) -> str:
    device_id = device if isinstance(device, int) else _int_or_none(device, base=16)
    if device_id is None:
        return "AMD GPU"
    return AMD_DEVICE_NAMES.get(device_id, f"AMD GPU 0x{device_id:04x}")


def _table(entry: dict[str, Any], key: str) -> dict[str, Any]:
    value = entry.get(key)
    return value if isinstance(value, dict) else {}


def _mib(value: Any, *, unit: str) -> int:
    """A memory size as amd-smi or rocm-smi writes it ({"value": 196592, "unit": "MB"}, "196592 MB", 206158430208),
    in MiB. amd-smi's "MB" are MiB (it divides bytes by 1024²)."""
    if isinstance(value, dict):
        value, unit = value.get("value"), str(value.get("unit", unit))
    if isinstance(value, str):
        number, _, written = value.strip().partition(" ")
        value, unit = number, written or unit
    amount = _number(value)
    if amount is None:
        return 0
    scale = {"B": 1 / MIB, "KB": 1 / 1024, "MB": 1, "GB": 1024}.get(unit.strip().upper(), 1)
    return int(amount * scale)


def _number(value: Any) -> float | None:
    """A figure as the tools write it: 750, "750 W", {"value": 750, "unit": "W"}; None for "N/A" and the like."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip().split(" ")[0])
        except ValueError:
            return None
    return None


def _int_or_none(value: Any, *, base: int = 10) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip(), base)  # base 16 takes a "0x" prefix
        except ValueError:
            return None
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _optional(query: Callable[[], Any]) -> Any:
    """A reading this card or driver may not offer: None when amdsmi refuses it."""
    try:
        return query()
    except Exception:
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]

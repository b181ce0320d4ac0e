"""AMD GPUs, read through the first of these that works (as GPUStack's runtime library does, one binding per vendor):

1. ``amdsmi``, AMD's Python binding (ships with ROCm, or ``pip install amdsmi`` beside ROCm's libamd_smi.so); imported
   only here, lazily, never required;
2. the ``amd-smi`` command (``amd-smi static --json``);
3. the older ``rocm-smi`` command (``rocm-smi --showproductname --showmeminfo vram --showbus --showuniqueid --json``);
4. sysfs alone, where the amdgpu kernel driver is bound: its memory (``mem_info_vram_total``) and, for telemetry,
   ``gpu_busy_percent``, ``mem_info_vram_used`` and its hwmon's temperature and power.

Each source answers ``cards()`` (a GpuInfo per card, ``vendor="amd"``) and ``sample()``. The command-line and sysfs
sources sample from sysfs: running a command every telemetry tick would cost more than the reading is worth.

A card's uuid is "GPU-" and its unique id in hex (what ROCR_VISIBLE_DEVICES accepts) where the card has one, else made
from the host and the card's PCI address, so it stays the same across restarts.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from agent.pci import PciGpu, normal_address
from common.inventory import GpuInfo, GpuSample

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

    def __init__(self, amdsmi: ModuleType, *, host_key: str) -> None:
        self._smi = amdsmi
        amdsmi.amdsmi_init()
        self._handles = list(amdsmi.amdsmi_get_processor_handles())
        self._cards = [info for index, handle in enumerate(self._handles) if (info := self._info(index, handle, host_key))]

    def cards(self) -> list[GpuInfo]:
        return list(self._cards)

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
        )

    def _sample(self, handle: Any, card: str, now: float) -> GpuSample:
        smi = self._smi
        activity = _optional(lambda: smi.amdsmi_get_gpu_activity(handle)) or {}
        used = _optional(lambda: smi.amdsmi_get_gpu_memory_usage(handle, smi.AmdSmiMemoryType.VRAM))
        temperature = _temperature(smi, handle)
        power = _optional(lambda: smi.amdsmi_get_power_info(handle)) or {}
        ecc = _optional(lambda: smi.amdsmi_get_gpu_total_ecc_count(handle)) or {}
        watts = power.get("current_socket_power") or power.get("average_socket_power")
        return GpuSample(
            uuid=card,
            ts=now,
            utilization_pct=float(_number(activity.get("gfx_activity")) or 0.0),
            memory_used_mib=int(used or 0) // MIB,
            temperature_c=temperature,
            power_w=float(watts) if isinstance(watts, int | float) else None,
            ecc_corrected=int(_number(ecc.get("correctable_count")) or 0),
            ecc_uncorrected=int(_number(ecc.get("uncorrectable_count")) or 0),
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
        self._cards = self.parse(runner(self.ARGV, COMMAND_TIMEOUT_S), host_key=host_key)
        self._sampler = SysfsSampler(sysfs_root, self._cards)

    def parse(self, text: str, *, host_key: str) -> list[GpuInfo]:
        raise NotImplementedError

    def cards(self) -> list[GpuInfo]:
        return list(self._cards)

    def sample(self) -> list[GpuSample]:
        return self._sampler.sample()

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
        limit, driver = _table(entry, "limit"), _table(entry, "driver")
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
                )
            )
        self._cards = cards
        self._sampler = SysfsSampler(sysfs_root, cards)

    def cards(self) -> list[GpuInfo]:
        return list(self._cards)

    def sample(self) -> list[GpuSample]:
        return self._sampler.sample()

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

"""A stand-in for AMD's ``amdsmi`` Python module, answering as the real one does for the cards an ``amd-smi static
--json`` fixture lists (tests/fixtures/gpus/commands/).

Why a stand-in: the real package (``pip install amdsmi``, 7.0.2) installs here, but importing it fails with
``KeyError: 'libamd_smi.so'`` without ROCm's library, which needs an AMD GPU's driver stack. The functions below keep
the real module's names, arguments and answer shapes (read from amdsmi 7.0.2's amdsmi_interface.py): ``asic_info``'s
``device_id`` an int and ``asic_serial`` text, sizes in bytes, power in microwatts, "N/A" where a card has no reading.
"""

from __future__ import annotations

import enum
import json
import types
from pathlib import Path
from typing import Any


class AmdSmiException(Exception):
    """The real module's base error."""


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


def stand_in(amd_smi_static: Path, *, broken: frozenset[int] = frozenset()) -> types.ModuleType:
    """A module object answering for the cards ``amd_smi_static`` lists; cards at positions in ``broken`` raise
    AmdSmiException for every query, as a card fallen off the bus does."""
    document = json.loads(amd_smi_static.read_text())
    cards: list[dict[str, Any]] = document["gpu_data"] if isinstance(document, dict) else document
    module = types.ModuleType("amdsmi")
    state = {"initialized": False}

    def card(handle: int) -> dict[str, Any]:
        if not state["initialized"]:
            raise AmdSmiException("AMDSMI_STATUS_NOT_INIT")
        if handle in broken:
            raise AmdSmiException("AMDSMI_STATUS_NOT_FOUND")
        return cards[handle]

    def vram_bytes(entry: dict[str, Any]) -> int:
        size = entry["vram"]["size"]
        mib = size["value"] if isinstance(size, dict) else int(str(size).split()[0])
        return int(mib) * 1024 * 1024

    def init(flag: int = 0) -> None:
        state["initialized"] = True

    def shut_down() -> None:
        state["initialized"] = False

    def asic_info(handle: int) -> dict[str, Any]:
        asic = card(handle)["asic"]
        return {
            "market_name": asic["market_name"],
            "vendor_id": int(asic["vendor_id"], 16),
            "device_id": int(asic["device_id"], 16),
            "asic_serial": asic["asic_serial"],
            "target_graphics_version": asic.get("target_graphics_version", "N/A"),
        }

    def memory_total(handle: int, kind: AmdSmiMemoryType) -> int:
        return vram_bytes(card(handle))

    def memory_usage(handle: int, kind: AmdSmiMemoryType) -> int:
        return vram_bytes(card(handle)) // 100  # 1 % in use

    def power_cap(handle: int) -> dict[str, Any]:
        watts = card(handle)["limit"]["max_power"]["value"]
        return {"power_cap": watts * 1_000_000, "default_power_cap": watts * 1_000_000}

    def power_info(handle: int) -> dict[str, Any]:
        card(handle)
        return {"socket_power": 141, "current_socket_power": 141, "average_socket_power": "N/A"}

    def temperature(handle: int, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
        card(handle)
        if sensor == AmdSmiTemperatureType.EDGE:  # an MI300X has no edge sensor
            raise AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")
        return 40 + handle

    module.__dict__.update(
        AmdSmiException=AmdSmiException,
        AmdSmiMemoryType=AmdSmiMemoryType,
        AmdSmiTemperatureType=AmdSmiTemperatureType,
        AmdSmiTemperatureMetric=AmdSmiTemperatureMetric,
        amdsmi_init=init,
        amdsmi_shut_down=shut_down,
        amdsmi_get_processor_handles=lambda: list(range(len(cards))),
        amdsmi_get_gpu_device_bdf=lambda handle: card(handle)["bus"]["bdf"],
        amdsmi_get_gpu_device_uuid=lambda handle: f"{handle:08x}-0000-1000-8000-{handle:012x}",
        amdsmi_get_gpu_asic_info=asic_info,
        amdsmi_get_gpu_memory_total=memory_total,
        amdsmi_get_gpu_memory_usage=memory_usage,
        amdsmi_get_gpu_driver_info=lambda handle: {"driver_name": "amdgpu", "driver_version": card(handle)["driver"]["version"]},
        amdsmi_get_power_cap_info=power_cap,
        amdsmi_get_power_info=power_info,
        amdsmi_get_gpu_activity=lambda handle: {"gfx_activity": 10 * handle, "umc_activity": 0, "mm_activity": "N/A"},
        amdsmi_get_temp_metric=temperature,
        amdsmi_get_gpu_total_ecc_count=lambda handle: {
            "correctable_count": handle,
            "uncorrectable_count": 0,
            "deferred_count": 0,
        },
    )
    return module

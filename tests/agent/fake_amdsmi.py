"""A stand-in for AMD's ``amdsmi`` Python module, answering as the real one does for the cards an ``amd-smi static
--json`` fixture lists (tests/fixtures/gpus/commands/).

Why a stand-in: the real package (``pip install amdsmi``, 7.0.2) installs here, but importing it fails with
``KeyError: 'libamd_smi.so'`` without ROCm's library, which needs an AMD GPU's driver stack. The functions below keep
the real module's names, arguments and answer shapes (read from amdsmi 7.0.2's amdsmi_interface.py): ``asic_info``'s
``device_id`` an int and ``asic_serial`` text, sizes in bytes, power in microwatts, "N/A" where a card has no reading.
Processor handles are ``ctypes.c_void_p`` as the real ones are (two handles of one card are not ``==``: compare
``.value``).

The event API (``AmdSmiEventReader``, ``AmdSmiEvtNotificationType``) answers as amdsmi 7.0.2's does: the reader's
constructor calls the C library's ``amdsmi_init_gpu_event_notification`` and ``amdsmi_set_gpu_event_notification_mask``
(the mask a bit per type, ``1 << (type - 1)``), ``read(timeout_ms, num_elem=10)`` its
``amdsmi_get_gpu_event_notification``, which returns the events of every card whose notification is started, whichever
reader reads, as ``{"processor_handle": c_void_p, "event": "GPU_PRE_RESET", "message": str}``, and raises
``AmdSmiLibraryException`` with ``AMDSMI_STATUS_NO_DATA`` when none is queued; ``stop()`` its
``amdsmi_stop_gpu_event_notification``. The messages are what amdgpu's KFD writes (include/uapi/linux/kfd_ioctl.h's
``KFD_EVENT_FMT_*``) as ROCm SMI's reader keeps them: the first word after the event number (``fscanf("%lx %63s")``),
so a reset's message is its sequence number, not its cause. A test queues events in ``gpu_events``.
"""

from __future__ import annotations

import ctypes
import enum
import json
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class AmdSmiException(Exception):
    """The real module's base error."""


# amdsmi_wrapper's status codes, those the stand-in answers with.
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NO_DATA = 40


class AmdSmiLibraryException(AmdSmiException):
    """The real module's error for a status the C library returned (``err_code``: the status, e.g. 40, NO_DATA)."""

    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = abs(err_code)


class AmdSmiParameterException(AmdSmiException):
    """The real module's error for an argument of the wrong type."""

    def __init__(self, received: object, expected: object) -> None:
        super().__init__(f"Invalid parameter. Expected {expected}, received {received!r}")
        self.err_code = None


class AmdSmiEvtNotificationType(enum.IntEnum):
    """As the real module numbers them (amdsmi_wrapper's AMDSMI_EVT_NOTIF_*, KFD's kfd_smi_event). The real enum maps
    PAGE_FAULT_START to AMDSMI_EVT_NOTIF_PAGE_FAULT_END (8), so it is an alias there, and here too."""

    NONE = 0
    VMFAULT = 1
    THERMAL_THROTTLE = 2
    GPU_PRE_RESET = 3
    GPU_POST_RESET = 4
    MIGRATE_START = 5
    MIGRATE_END = 6
    PAGE_FAULT_START = 8
    PAGE_FAULT_END = 8
    QUEUE_EVICTION = 9
    QUEUE_RESTORE = 10
    UNMAP_FROM_GPU = 11
    PROCESS_START = 12
    PROCESS_END = 13


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


class AmdSmiGpuBlock(enum.IntEnum):
    """The RAS blocks, as the real module numbers them (a bit each)."""

    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384
    VCN = 32768
    JPEG = 65536
    IH = 131072
    MPIO = 262144
    LAST = 262144
    RESERVED = 1 << 63


_HANDLE_BASE = 0x55D0_0000  # where the stand-in's handles point: any address but 0 (c_void_p(0).value is None)


def handle_of(position: int) -> ctypes.c_void_p:
    """A new handle object for the card at ``position``, as the C library hands one out (equal in ``.value`` only)."""
    return ctypes.c_void_p(_HANDLE_BASE + 0x1000 * position)


def position_of(handle: object) -> int:
    """The card a handle stands for; AmdSmiParameterException for anything but a handle, as the real module checks."""
    if not isinstance(handle, ctypes.c_void_p) or handle.value is None:
        raise AmdSmiParameterException(handle, ctypes.c_void_p)
    return (handle.value - _HANDLE_BASE) // 0x1000


def stand_in(amd_smi_static: Path, *, broken: frozenset[int] = frozenset(), events: str = "work") -> types.ModuleType:
    """A module object answering for the cards ``amd_smi_static`` lists; cards at positions in ``broken`` raise
    AmdSmiException for every query, as a card fallen off the bus does. Its ``ras_errors`` ({(position, block name):
    uncorrectable count}) is what ``amdsmi_get_gpu_ecc_count`` answers, for a test to raise; its ``gpu_events`` (a list
    of (position, AmdSmiEvtNotificationType, message)) what the driver has queued for the event API to read.

    ``events``: "work"; "missing": the module has no event API (``AmdSmiEventReader`` and its enum absent, as in a
    binding older than it); "unsupported": starting a card's notification fails (a driver without KFD's SMI events);
    "broken": starting works and every read fails with a status other than NO_DATA."""
    document = json.loads(amd_smi_static.read_text())
    cards: list[dict[str, Any]] = document["gpu_data"] if isinstance(document, dict) else document
    module = types.ModuleType("amdsmi")
    state = {"initialized": False}

    def card(handle: object) -> dict[str, Any]:
        position = position_of(handle)
        if not state["initialized"]:
            raise AmdSmiException("AMDSMI_STATUS_NOT_INIT")
        if position in broken:
            raise AmdSmiException("AMDSMI_STATUS_NOT_FOUND")
        return cards[position]

    def vram_bytes(entry: dict[str, Any]) -> int:
        size = entry["vram"]["size"]
        mib = size["value"] if isinstance(size, dict) else int(str(size).split()[0])
        return int(mib) * 1024 * 1024

    def init(flag: int = 0) -> None:
        state["initialized"] = True

    def shut_down() -> None:
        state["initialized"] = False

    def asic_info(handle: ctypes.c_void_p) -> dict[str, Any]:
        asic = card(handle)["asic"]
        return {
            "market_name": asic["market_name"],
            "vendor_id": int(asic["vendor_id"], 16),
            "device_id": int(asic["device_id"], 16),
            "asic_serial": asic["asic_serial"],
            "target_graphics_version": asic.get("target_graphics_version", "N/A"),
        }

    def memory_total(handle: ctypes.c_void_p, kind: AmdSmiMemoryType) -> int:
        return vram_bytes(card(handle))

    def memory_usage(handle: ctypes.c_void_p, kind: AmdSmiMemoryType) -> int:
        return vram_bytes(card(handle)) // 100  # 1 % in use

    def power_cap(handle: ctypes.c_void_p) -> dict[str, Any]:
        watts = card(handle)["limit"]["max_power"]["value"]
        return {"power_cap": watts * 1_000_000, "default_power_cap": watts * 1_000_000}

    def power_info(handle: ctypes.c_void_p) -> dict[str, Any]:
        card(handle)
        return {"socket_power": 141, "current_socket_power": 141, "average_socket_power": "N/A"}

    ras_errors: dict[tuple[int, str], int] = {}

    def ecc_count(handle: ctypes.c_void_p, block: AmdSmiGpuBlock) -> dict[str, Any]:
        card(handle)
        if block in (AmdSmiGpuBlock.MPIO, AmdSmiGpuBlock.RESERVED):
            raise AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")  # a block this card's RAS does not cover
        count = ras_errors.get((position_of(handle), block.name), 0)
        return {"correctable_count": 0, "uncorrectable_count": count, "deferred_count": 0}

    def temperature(handle: ctypes.c_void_p, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
        card(handle)
        if sensor == AmdSmiTemperatureType.EDGE:  # an MI300X has no edge sensor
            raise AmdSmiException("AMDSMI_STATUS_NOT_SUPPORTED")
        return 40 + position_of(handle)

    # The event API: which cards' notification is started, with their masks, and what the driver has queued.
    gpu_events: list[tuple[int, AmdSmiEvtNotificationType, str]] = []
    notifying: dict[int, int] = {}  # position -> mask

    class AmdSmiEventReader:
        """amdsmi 7.0.2's reader (module docstring)."""

        def __init__(self, processor_handle: ctypes.c_void_p, event_types: Iterable[AmdSmiEvtNotificationType]) -> None:
            if not isinstance(processor_handle, ctypes.c_void_p):
                raise AmdSmiParameterException(processor_handle, ctypes.c_void_p)
            if not isinstance(event_types, Iterable):
                raise AmdSmiParameterException(event_types, Iterable)
            for event_type in event_types:
                if not isinstance(event_type, AmdSmiEvtNotificationType):
                    raise AmdSmiParameterException(event_type, AmdSmiEvtNotificationType)
            self.processor_handle = processor_handle
            mask = 0
            for event_type in event_types:
                if event_type != AmdSmiEvtNotificationType.NONE:
                    mask |= 1 << (int(event_type) - 1)
            position = position_of(processor_handle)
            card(processor_handle)
            if events == "unsupported":  # amdsmi_init_gpu_event_notification: the KFD ioctl is refused
                raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
            notifying[position] = mask  # amdsmi_init_gpu_event_notification, amdsmi_set_gpu_event_notification_mask

        def read(self, timestamp: int, num_elem: int = 10) -> list[dict[str, Any]]:
            """amdsmi_get_gpu_event_notification: every started card's queued events, not this reader's card's only."""
            if num_elem < 1:
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
            if events == "broken":
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
            found = []
            for queued in list(gpu_events):
                position, event_type, message = queued
                mask = notifying.get(position)
                if mask is None:
                    continue  # the driver queues a card's events only for a started listener
                gpu_events.remove(queued)
                if mask & (1 << (int(event_type) - 1)):
                    found.append({"processor_handle": handle_of(position), "event": event_type.name, "message": message})
                if len(found) == num_elem:
                    break
            if not found:
                raise AmdSmiLibraryException(AMDSMI_STATUS_NO_DATA)
            return found

        def stop(self) -> None:
            """amdsmi_stop_gpu_event_notification."""
            if notifying.pop(position_of(self.processor_handle), None) is None:
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)

        def __enter__(self) -> AmdSmiEventReader:
            return self

        def __exit__(self, *exc: object) -> None:
            self.stop()

    module.__dict__.update(
        AmdSmiException=AmdSmiException,
        AmdSmiLibraryException=AmdSmiLibraryException,
        AmdSmiParameterException=AmdSmiParameterException,
        AmdSmiMemoryType=AmdSmiMemoryType,
        AmdSmiTemperatureType=AmdSmiTemperatureType,
        AmdSmiTemperatureMetric=AmdSmiTemperatureMetric,
        AmdSmiGpuBlock=AmdSmiGpuBlock,
        ras_errors=ras_errors,
        gpu_events=gpu_events,
        notifying=notifying,
        amdsmi_get_gpu_ecc_count=ecc_count,
        amdsmi_get_gpu_compute_partition=lambda handle: card(handle).get("partition", {}).get("compute_partition", "N/A"),
        amdsmi_get_gpu_memory_partition=lambda handle: card(handle).get("partition", {}).get("memory_partition", "N/A"),
        amdsmi_init=init,
        amdsmi_shut_down=shut_down,
        amdsmi_get_processor_handles=lambda: [handle_of(position) for position in range(len(cards))],
        amdsmi_get_gpu_device_bdf=lambda handle: card(handle)["bus"]["bdf"],
        amdsmi_get_gpu_device_uuid=lambda handle: f"{position_of(handle):08x}-0000-1000-8000-{position_of(handle):012x}",
        amdsmi_get_gpu_asic_info=asic_info,
        amdsmi_get_gpu_memory_total=memory_total,
        amdsmi_get_gpu_memory_usage=memory_usage,
        amdsmi_get_gpu_driver_info=lambda handle: {"driver_name": "amdgpu", "driver_version": card(handle)["driver"]["version"]},
        amdsmi_get_power_cap_info=power_cap,
        amdsmi_get_power_info=power_info,
        amdsmi_get_gpu_activity=lambda handle: {
            "gfx_activity": 10 * position_of(handle),
            "umc_activity": 0,
            "mm_activity": "N/A",
        },
        amdsmi_get_temp_metric=temperature,
        amdsmi_get_gpu_total_ecc_count=lambda handle: {
            "correctable_count": position_of(handle),
            "uncorrectable_count": 0,
            "deferred_count": 0,
        },
    )
    if events != "missing":
        module.__dict__.update(AmdSmiEventReader=AmdSmiEventReader, AmdSmiEvtNotificationType=AmdSmiEvtNotificationType)
    return module

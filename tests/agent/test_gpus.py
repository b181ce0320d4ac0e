"""GPU inventory and telemetry through NVML.

Two kinds of test. The first run the real NVML bindings against whatever this host has: on a host
without an NVIDIA driver they check that NVML fails with one clear line; on a GPU host they read
the real cards. The others map NVML readings to GpuInfo/GpuSample through a FAKE ``pynvml``
module, a stand-in used only because no GPU exists on the machines that run these tests; it
raises the real ``pynvml`` error classes, so the error handling under test is the real one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from agent import gpus
from agent.gpus import EmptyCollector, NvmlCollector, open_collector
from common.errors import NvmlUnavailable
from common.inventory import NvLink

MIB = 1024 * 1024


def _real_nvml_works() -> bool:
    try:
        NvmlCollector().close()
    except NvmlUnavailable:
        return False
    return True


HAS_NVML = _real_nvml_works()
no_gpu_here = pytest.mark.skipif(HAS_NVML, reason="this host has a working NVIDIA driver")
needs_gpu = pytest.mark.skipif(not HAS_NVML, reason="no NVIDIA driver on this host")


# ---------------------------------------------------------------- the real NVML


@no_gpu_here
def test_real_nvml_without_a_driver_fails_with_one_actionable_line():
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlCollector()
    message = str(caught.value)
    assert caught.value.code == "nvml_unavailable"
    assert message.startswith("NVML is not available: ")
    assert "libnvidia-ml.so.1" in message and "install the NVIDIA driver" in message
    assert "--simulate MODEL:COUNT" in message
    assert "\n" not in message and "Traceback" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@no_gpu_here
def test_open_collector_without_a_driver_reports_no_gpus_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="agent.gpus"):
        collector = open_collector(None)
    assert isinstance(collector, EmptyCollector)
    assert collector.simulated is False
    assert collector.inventory() == [] and collector.sample() == []
    assert collector.unavailable_reason.startswith("NVML is not available: ")
    assert [r.getMessage() for r in caplog.records] == [collector.unavailable_reason]
    collector.close()


@needs_gpu
def test_real_nvml_reads_every_gpu_consistently():
    collector = NvmlCollector()
    try:
        inventory, samples = collector.inventory(), collector.sample()
    finally:
        collector.close()
    assert inventory, "NVML works but reports no GPU"
    assert [g.index for g in inventory] == list(range(len(inventory)))
    for gpu in inventory:
        assert gpu.uuid.startswith(("GPU-", "MIG-")) and gpu.name and gpu.memory_total_mib > 0
        assert gpu.compute_capability.count(".") == 1 and gpu.driver_version and not gpu.simulated
    assert {s.uuid for s in samples} == {g.uuid for g in inventory}
    for sample, gpu in zip(samples, inventory):
        assert 0 <= sample.utilization_pct <= 100 and 0 <= sample.memory_used_mib <= gpu.memory_total_mib


def test_open_collector_with_a_spec_simulates_whatever_the_host_has():
    collector = open_collector("h100:2", host_key="/tmp/agent-a")
    assert collector.simulated is True
    assert [g.simulated for g in collector.inventory()] == [True, True]


# ---------------------------------------------------------------- a fake NVML (no GPU here)


@dataclass
class FakeGpu:
    uuid: str | bytes
    name: str | bytes
    bus_id: bytes
    memory_total: int
    memory_used: int
    capability: tuple[int, int]
    max_pcie_gen: int
    pcie_width: int
    clocks_max: dict[int, int]
    sm_clock: int
    power_limit_mw: int
    power_mw: int
    temperature: int
    utilization: int
    bus_width: int
    nvlinks: list[tuple[bool, bytes]] | None  # None: a PCIe card, NVML answers NotSupported
    ecc: dict[int, int] | None  # None: no ECC, NVML answers NotSupported
    lost: bool = False
    # MIG: None for a card without MIG (NVML answers NotSupported); else the mode and the instances by slot.
    mig_mode: int | None = None
    mig: dict[int, FakeMig] | None = None
    mem_clock: int = 1593
    throttle_mask: int = 0  # NVML's clocks throttle reason bits


@dataclass
class FakeMig:
    """One MIG device as NVML shows it. ``profile_name`` None: the GPU instance's profile is not readable
    (NVML answers NoPermission), so the agent derives the name from the device's attributes."""

    uuid: str
    memory_total: int
    gpu_instance_id: int
    compute_instance_id: int
    profile_id: int
    profile_name: bytes | None
    slices: int
    compute_slices: int


def fake_nvml(gpus: list[FakeGpu], *, init_error: type[pynvml.NVMLError] | None = None) -> SimpleNamespace:
    """A stand-in for the ``pynvml`` module: real constants and error classes, readings from ``gpus``."""
    real = {name: getattr(pynvml, name) for name in dir(pynvml) if name.startswith(("NVML_", "NVMLError"))}
    state: dict[str, Any] = {"initialized": False, "shutdowns": 0, "events": [], "event_sets_freed": 0, "gpus": gpus}
    real |= {name: getattr(pynvml, name) for name in ("nvmlEventTypeXidCriticalError", "nvmlEventTypeDoubleBitEccError")}

    def gpu(handle: int) -> FakeGpu:
        if gpus[handle].lost:
            raise pynvml.NVMLError_GpuIsLost()
        return gpus[handle]

    def init() -> None:
        if init_error is not None:
            raise init_error()
        state["initialized"] = True

    def shutdown() -> None:
        state["shutdowns"] += 1

    def nvlink_remote(handle: int, link: int) -> SimpleNamespace:
        links = gpu(handle).nvlinks
        assert links is not None, "a PCIe card's links have no remote end"
        return SimpleNamespace(busId=links[link][1])

    def nvlink_state(handle: int, link: int) -> int:
        links = gpu(handle).nvlinks
        if links is None:
            raise pynvml.NVMLError_NotSupported()
        if link >= len(links):
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED if links[link][0] else pynvml.NVML_FEATURE_DISABLED

    def ecc_errors(handle: int, error_type: int, counter: int) -> int:
        assert counter == pynvml.NVML_VOLATILE_ECC
        ecc = gpu(handle).ecc
        if ecc is None:
            raise pynvml.NVMLError_NotSupported()
        return ecc[error_type]

    def event_wait(event_set: str, timeout_ms: int) -> SimpleNamespace:
        assert timeout_ms == 0  # never blocks the agent
        if not state["events"]:
            raise pynvml.NVMLError_Timeout()
        handle, kind, data = state["events"].pop(0)
        return SimpleNamespace(device=handle, eventType=kind, eventData=data)

    def mig_mode(handle: int) -> list[int]:
        mode = gpu(handle).mig_mode
        if mode is None:
            raise pynvml.NVMLError_NotSupported()
        return [mode, mode]

    def mig_device(handle: int, slot: int) -> tuple[int, int]:
        found = (gpu(handle).mig or {}).get(slot)
        if found is None:
            raise pynvml.NVMLError_NotFound()
        return (handle, slot)  # a MIG device handle: (its GPU, its slot)

    def mig_of(handle: Any) -> FakeMig:
        return gpus[handle[0]].mig[handle[1]]

    def instance_by_id(handle: int, gi: int) -> tuple[int, int]:
        return next((handle, slot) for slot, m in (gpu(handle).mig or {}).items() if m.gpu_instance_id == gi)

    def profile_by_id(handle: int, profile_id: int) -> SimpleNamespace:
        found = next(m for m in (gpu(handle).mig or {}).values() if m.profile_id == profile_id)
        if found.profile_name is None:
            raise pynvml.NVMLError_NoPermission()
        return SimpleNamespace(id=profile_id, name=found.profile_name)

    def uuid_of(handle: Any) -> str | bytes:
        return mig_of(handle).uuid if isinstance(handle, tuple) else gpu(handle).uuid

    def memory_of(handle: Any) -> SimpleNamespace:
        if isinstance(handle, tuple):
            return SimpleNamespace(total=mig_of(handle).memory_total, used=0)
        return SimpleNamespace(total=gpu(handle).memory_total, used=gpu(handle).memory_used)

    functions: dict[str, Any] = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlSystemGetDriverVersion": lambda: "550.54.15",
        "nvmlSystemGetCudaDriverVersion": lambda: 12040,
        "nvmlDeviceGetUUID": uuid_of,
        "nvmlDeviceGetName": lambda h: gpu(h).name,
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=gpu(h).bus_id),
        "nvmlDeviceGetMemoryInfo": memory_of,
        "nvmlDeviceGetCudaComputeCapability": lambda h: gpu(h).capability,
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: gpu(h).max_pcie_gen,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: gpu(h).pcie_width,
        "nvmlDeviceGetNvLinkState": nvlink_state,
        "nvmlDeviceGetNvLinkRemotePciInfo": nvlink_remote,
        "nvmlDeviceGetMaxClockInfo": lambda h, clock: gpu(h).clocks_max[clock],
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: gpu(h).power_limit_mw,
        "nvmlDeviceGetMemoryBusWidth": lambda h: gpu(h).bus_width,
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=gpu(h).utilization, memory=0),
        "nvmlDeviceGetTemperature": lambda h, sensor: gpu(h).temperature,
        "nvmlDeviceGetPowerUsage": lambda h: gpu(h).power_mw,
        "nvmlDeviceGetClockInfo": lambda h, clock: gpu(h).sm_clock if clock == pynvml.NVML_CLOCK_SM else gpu(h).mem_clock,
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: gpu(h).throttle_mask,
        "nvmlDeviceGetTotalEccErrors": ecc_errors,
        # Fault events: ``state["events"]`` holds what the driver queued, (handle, event type, Xid) each.
        "nvmlEventSetCreate": lambda: "event-set",
        "nvmlDeviceGetSupportedEventTypes": lambda h: (
            pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
        ),
        "nvmlDeviceRegisterEvents": lambda h, types, event_set: None,
        "nvmlEventSetWait_v2": event_wait,
        "nvmlEventSetFree": lambda event_set: state.__setitem__("event_sets_freed", state["event_sets_freed"] + 1),
        # MIG: a MIG device handle is (GPU handle, slot); a GPU instance handle is the same pair.
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_device,
        "nvmlDeviceGetGpuInstanceId": lambda h: mig_of(h).gpu_instance_id,
        "nvmlDeviceGetComputeInstanceId": lambda h: mig_of(h).compute_instance_id,
        "nvmlDeviceGetGpuInstanceById": instance_by_id,
        "nvmlGpuInstanceGetInfo": lambda gi: SimpleNamespace(id=mig_of(gi).gpu_instance_id, profileId=mig_of(gi).profile_id),
        "nvmlDeviceGetGpuInstanceProfileInfoById": profile_by_id,
        "nvmlDeviceGetAttributes": lambda h: SimpleNamespace(
            gpuInstanceSliceCount=mig_of(h).slices,
            computeInstanceSliceCount=mig_of(h).compute_slices,
            memorySizeMB=mig_of(h).memory_total // MIB,
        ),
    }
    return SimpleNamespace(**real, **functions, state=state)


def h100_sxm() -> FakeGpu:
    """An NVLink card with ECC, bindings returning str."""
    return FakeGpu(
        uuid="GPU-11111111-2222-3333-4444-555555555555",
        name="NVIDIA H100 80GB HBM3",
        bus_id=b"00000000:1B:00.0",
        memory_total=81559 * MIB,
        memory_used=1024 * MIB,
        capability=(9, 0),
        max_pcie_gen=5,
        pcie_width=16,
        clocks_max={pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619},
        sm_clock=1755,
        power_limit_mw=700_000,
        power_mw=312_456,
        temperature=41,
        utilization=87,
        bus_width=5120,
        nvlinks=[(True, b"00000000:2A:00.0"), (True, b"00000000:2B:00.0"), (False, b"")],
        ecc={pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: 3, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: 0},
    )


def rtx_4090() -> FakeGpu:
    """A consumer PCIe card: no NVLink, no ECC, and older bindings returning bytes."""
    return FakeGpu(
        uuid=b"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        name=b"NVIDIA GeForce RTX 4090",
        bus_id=b"00000000:41:00.0",
        memory_total=24564 * MIB,
        memory_used=300 * MIB,
        capability=(8, 9),
        max_pcie_gen=4,
        pcie_width=16,
        clocks_max={pynvml.NVML_CLOCK_SM: 3120, pynvml.NVML_CLOCK_MEM: 10501},
        sm_clock=210,
        power_limit_mw=450_000,
        power_mw=21_000,
        temperature=35,
        utilization=0,
        bus_width=384,
        nvlinks=None,
        ecc=None,
    )


@pytest.fixture
def two_gpu_host(monkeypatch) -> SimpleNamespace:
    fake = fake_nvml([h100_sxm(), rtx_4090()])
    monkeypatch.setattr(gpus, "pynvml", fake)
    return fake


def test_inventory_maps_nvml_readings_of_every_gpu(two_gpu_host):
    h100, rtx = NvmlCollector().inventory()

    assert h100.index == 0 and rtx.index == 1
    assert h100.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert h100.name == "NVIDIA H100 80GB HBM3"
    assert h100.pci_bus_id == "00000000:1B:00.0"
    assert h100.memory_total_mib == 81559
    assert h100.compute_capability == "9.0"
    assert (h100.driver_version, h100.cuda_version) == ("550.54.15", "12.4")
    assert (h100.pcie_gen, h100.pcie_width) == (5, 16)
    assert (h100.clock_sm_max_mhz, h100.clock_mem_max_mhz) == (1980, 2619)
    assert h100.power_limit_w == 700.0 and h100.memory_bus_width_bits == 5120
    assert h100.simulated is False
    assert h100.nvlinks == (
        NvLink(link=0, active=True, remote_pci_bus_id="00000000:2A:00.0"),
        NvLink(link=1, active=True, remote_pci_bus_id="00000000:2B:00.0"),
        NvLink(link=2, active=False, remote_pci_bus_id=None),
    )


def test_a_gpu_without_nvlink_reports_no_links_and_still_decodes_bytes(two_gpu_host):
    rtx = NvmlCollector().inventory()[1]

    assert rtx.nvlinks == ()
    assert rtx.uuid == "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert rtx.name == "NVIDIA GeForce RTX 4090"
    assert rtx.compute_capability == "8.9" and rtx.memory_total_mib == 24564 and rtx.power_limit_w == 450.0


def test_sample_maps_telemetry_and_reads_missing_ecc_as_zero(two_gpu_host):
    h100, rtx = NvmlCollector().sample()

    assert h100.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert h100.utilization_pct == 87.0 and h100.memory_used_mib == 1024
    assert h100.temperature_c == 41.0 and h100.power_w == pytest.approx(312.456) and h100.clock_sm_mhz == 1755
    assert (h100.ecc_corrected, h100.ecc_uncorrected) == (3, 0)
    assert rtx.uuid == "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert (rtx.ecc_corrected, rtx.ecc_uncorrected) == (0, 0)
    assert rtx.power_w == 21.0 and rtx.utilization_pct == 0.0
    assert h100.ts == rtx.ts > 0
    assert h100.clock_mem_mhz == 1593 and h100.throttle_reasons == () and h100.xid_count == 0


def test_sample_names_the_throttle_reasons_and_counts_the_xids_read(two_gpu_host):
    two_gpu_host.state["gpus"][0].throttle_mask = (
        pynvml.nvmlClocksThrottleReasonSwThermalSlowdown | pynvml.nvmlClocksThrottleReasonHwSlowdown
    )
    two_gpu_host.state["gpus"][1].throttle_mask = pynvml.nvmlClocksThrottleReasonGpuIdle
    collector = NvmlCollector()
    two_gpu_host.state["events"] += [(1, pynvml.nvmlEventTypeXidCriticalError, 79), (1, pynvml.nvmlEventTypeXidCriticalError, 48)]
    collector.reports()

    h100, rtx = collector.sample()
    assert h100.throttle_reasons == ("hw_slowdown", "sw_thermal") and h100.xid_count == 0
    assert rtx.throttle_reasons == ("gpu_idle",) and rtx.xid_count == 2
    collector.close()


def test_a_reading_the_driver_does_not_offer_is_none_not_a_failure(monkeypatch, two_gpu_host):
    def not_supported(*args):
        raise pynvml.NVMLError_NotSupported()

    for name in (
        "nvmlDeviceGetMemoryBusWidth",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetUtilizationRates",
    ):
        monkeypatch.setattr(two_gpu_host, name, not_supported)
    collector = NvmlCollector()

    gpu, sample = collector.inventory()[0], collector.sample()[0]
    assert gpu.memory_bus_width_bits is None and gpu.power_limit_w is None
    assert sample.temperature_c is None and sample.power_w is None and sample.utilization_pct == 0.0


def test_a_lost_gpu_is_left_out_and_the_others_still_report(monkeypatch, caplog):
    lost = rtx_4090()
    monkeypatch.setattr(gpus, "pynvml", fake_nvml([h100_sxm(), lost]))
    collector = NvmlCollector()
    lost.lost = True

    with caplog.at_level(logging.WARNING, logger="agent.gpus"):
        inventory, samples = collector.inventory(), collector.sample()

    assert [g.name for g in inventory] == ["NVIDIA H100 80GB HBM3"]
    assert [s.uuid for s in samples] == [inventory[0].uuid]
    assert sum("GPU 1" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (pynvml.NVMLError_LibraryNotFound, "libnvidia-ml.so.1 not found"),
        (pynvml.NVMLError_DriverNotLoaded, "kernel driver is not loaded"),
        (pynvml.NVMLError_NoPermission, "no permission to open the NVIDIA device files"),
        (pynvml.NVMLError_LibRmVersionMismatch, "different versions"),
        (pynvml.NVMLError_Unknown, "NVML failed to start (Unknown Error)"),
    ],
)
def test_each_nvml_start_failure_gets_its_own_actionable_message(monkeypatch, error, says):
    monkeypatch.setattr(gpus, "pynvml", fake_nvml([], init_error=error))

    with pytest.raises(NvmlUnavailable) as caught:
        NvmlCollector()

    assert says in str(caught.value) and "--simulate MODEL:COUNT" in str(caught.value)


def test_close_shuts_nvml_down_once(two_gpu_host):
    collector = NvmlCollector()
    collector.close()
    collector.close()
    assert two_gpu_host.state["shutdowns"] == 1


def test_xid_and_double_bit_ecc_events_are_reported_once_without_waiting(two_gpu_host):
    """Against the fake NVML only: the event API is untested on real hardware."""
    collector = NvmlCollector()
    assert collector.reports() == []
    two_gpu_host.state["events"] += [(1, pynvml.nvmlEventTypeXidCriticalError, 79), (0, pynvml.nvmlEventTypeDoubleBitEccError, 0)]
    xid, ecc = collector.reports()
    uuids = [g.uuid for g in collector.inventory()]
    assert (xid.kind.value, xid.gpu_uuid, xid.code) == ("gpu_xid", uuids[1], 79)
    assert (ecc.kind.value, ecc.gpu_uuid, ecc.code) == ("gpu_ecc", uuids[0], 1)
    assert collector.reports() == []
    collector.close()
    assert two_gpu_host.state["event_sets_freed"] == 1


# ---------------------------------------------------------------- MIG, through the fake NVML (untested on hardware)


def partitioned_h100() -> FakeGpu:
    """An H100 in MIG mode, split 3g.40gb + 1g.10gb in slots 0 and 2 (slot 1 empty), as ``nvidia-smi mig -lgi``
    would show it; the 1g.10gb's profile needs more privilege than the agent has."""
    card = h100_sxm()
    card.mig_mode = pynvml.NVML_DEVICE_MIG_ENABLE
    card.mig = {
        0: FakeMig("MIG-aaaaaaaa-0000-0000-0000-000000000001", 40448 * MIB, 1, 0, 9, b"MIG 3g.40gb", 3, 3),
        2: FakeMig("MIG-aaaaaaaa-0000-0000-0000-000000000002", 9984 * MIB, 13, 0, 19, None, 1, 1),
    }
    return card


def test_a_gpu_in_mig_mode_reports_its_instances_with_profile_memory_and_ids(monkeypatch):
    monkeypatch.setattr(gpus, "pynvml", fake_nvml([partitioned_h100(), rtx_4090()]))

    h100, rtx = NvmlCollector().inventory()

    assert h100.mig_enabled is True
    big, small = h100.mig_instances
    assert (big.uuid, big.profile, big.memory_mib) == ("MIG-aaaaaaaa-0000-0000-0000-000000000001", "3g.40gb", 40448)
    assert (big.gpu_instance_id, big.compute_instance_id, big.index) == (1, 0, 0)
    # No permission for the profile: named from the device's slices and memory (9.75 GiB rounds up to 10).
    assert (small.profile, small.memory_mib, small.gpu_instance_id, small.index) == ("1g.10gb", 9984, 13, 2)
    assert (rtx.mig_enabled, rtx.mig_instances) == (False, ())


def test_mig_capable_gpu_with_mig_off_is_placed_whole(monkeypatch):
    card = h100_sxm()
    card.mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE
    monkeypatch.setattr(gpus, "pynvml", fake_nvml([card]))

    (gpu,) = NvmlCollector().inventory()

    assert (gpu.mig_enabled, gpu.mig_instances) == (False, ())


def test_instances_that_cannot_be_listed_leave_the_gpu_in_mig_mode_with_none_and_say_why(monkeypatch, caplog):
    fake = fake_nvml([partitioned_h100()])

    def broken(handle: int) -> int:
        raise pynvml.NVMLError_Unknown()

    monkeypatch.setattr(fake, "nvmlDeviceGetMaxMigDeviceCount", broken)
    monkeypatch.setattr(gpus, "pynvml", fake)

    with caplog.at_level(logging.WARNING, logger="agent.gpus"):
        (gpu,) = NvmlCollector().inventory()

    assert (gpu.mig_enabled, gpu.mig_instances) == (True, ())
    assert any("MIG mode but its instances cannot be listed" in r.getMessage() for r in caplog.records)

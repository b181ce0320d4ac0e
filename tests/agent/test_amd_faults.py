"""AMD telemetry and faults (agent/amd_gpus.py): utilization, memory, power, temperature and ECC/RAS counts from sysfs
fixtures and the amdsmi stand-in, and RAS errors turned into the events NVIDIA's driver sends for errors that mean the
same, which the Master's fault rules (master/faults.py) then judge as they judge an NVIDIA card's.

The fixtures (tests/fixtures/gpus/, its README) are reconstructed from amdgpu's documented sysfs files, not recorded;
the real amdsmi cannot run here (tests/agent/fake_amdsmi.py says why)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from agent.amd_gpus import (
    LOST_XID,
    RESET_DEADLINE_S,
    RESET_XID,
    UNCONTAINED_XID,
    VM_FAULT_XID,
    XGMI_XID,
    AmdSmiSource,
    EventWatch,
    ras_counts,
    ras_xid,
)
from agent.detect import detect_gpus
from agent.gpus import GpuCollector
from common.inventory import GpuInfo
from common.wire import AgentEventKind
from master.config import MasterConfig
from master.faults import FaultRules, HealthWatch
from master.records import GpuRecord
from tests.agent.fake_amdsmi import AmdSmiEvtNotificationType, stand_in
from tests.agent.gpu_hosts import COMMANDS, MI300X_BUSES, MI300X_UUIDS, SYSFS, Commands, no_amdsmi, no_nvml


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A writable copy of the MI300X host's sysfs tree, so a test can raise its counters."""
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "mi300x-8", root, symlinks=True)
    return root


def ras_file(root: Path, card: int, block: str) -> Path:
    return root / "bus" / "pci" / "devices" / f"0000:{MI300X_BUSES[card]}:00.0" / "ras" / f"{block}_err_count"


def count(root: Path, card: int, block: str, ue: int) -> None:
    ras_file(root, card, block).write_text(f"ue: {ue}\nce: 7\n")


def test_each_ras_block_is_reported_as_what_nvidias_driver_sends_for_the_same_error():
    assert ras_xid("umc") is None  # memory: an uncorrectable ECC event, as NVIDIA's double-bit ECC
    assert ras_xid("xgmi_wafl") == XGMI_XID == 74  # the link between cards: NVLink's Xid
    assert {ras_xid(block) for block in ("gfx", "sdma", "mmhub", "df", "pcie_bif")} == {UNCONTAINED_XID} == {95}
    assert {XGMI_XID, UNCONTAINED_XID} <= set(MasterConfig().fatal_xids)  # faults by the default rules


def test_sysfs_ras_counts_are_read_by_block():
    device = SYSFS / "mi300x-8" / "bus" / "pci" / "devices" / "0000:05:00.0"
    assert ras_counts(device) == {"gfx": 0, "umc": 0, "xgmi_wafl": 0}
    assert ras_counts(SYSFS / "nvidia-beside-amd-igpu") == {}


def test_a_rise_of_ras_errors_after_the_agent_starts_is_reported_once_as_xid_and_ecc_events(host: Path):
    count(host, 5, "xgmi_wafl", 4)  # there before the agent: not reported (NVML's events too start when it listens)
    collector = detect_gpus(host, open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    assert collector.reports() == []

    count(host, 2, "xgmi_wafl", 3)
    count(host, 0, "gfx", 1)
    count(host, 0, "umc", 2)
    count(host, 5, "xgmi_wafl", 5)
    events = collector.reports()
    assert sorted((e.gpu_uuid, e.kind, e.code) for e in events) == sorted(
        [
            (MI300X_UUIDS[0], AgentEventKind.GPU_XID, UNCONTAINED_XID),
            (MI300X_UUIDS[0], AgentEventKind.GPU_ECC, 2),
            (MI300X_UUIDS[2], AgentEventKind.GPU_XID, XGMI_XID),
            (MI300X_UUIDS[5], AgentEventKind.GPU_XID, XGMI_XID),
        ]
    )
    [xgmi] = [e for e in events if e.gpu_uuid == MI300X_UUIDS[2]]
    assert "3 uncorrectable xgmi_wafl error(s)" in xgmi.message and "NVLink" in xgmi.message
    assert collector.reports() == []  # reported once

    samples = {s.uuid: s for s in collector.sample()}
    assert samples[MI300X_UUIDS[0]].xid_count == 1 and samples[MI300X_UUIDS[1]].xid_count == 0
    assert (samples[MI300X_UUIDS[0]].ecc_uncorrected, samples[MI300X_UUIDS[0]].ecc_corrected) == (2, 7)


def test_the_sysfs_readings_of_an_amd_card_are_its_utilization_memory_power_and_temperature(host: Path):
    collector = detect_gpus(host, open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    first = collector.sample()[0]
    device = host / "bus" / "pci" / "devices" / "0000:05:00.0"
    expected_used = int((device / "mem_info_vram_used").read_text()) // 1024**2
    assert first.utilization_pct == float((device / "gpu_busy_percent").read_text())
    assert first.memory_used_mib == expected_used and first.power_w and first.temperature_c


def test_amdsmis_ras_counts_by_block_are_reported_the_same_way():
    module = stand_in(COMMANDS / "amd-smi-static-mi300x-8.json")
    collector = detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=lambda name: module, runner=Commands())
    assert collector.reports() == []
    module.ras_errors[(1, "XGMI_WAFL")] = 1
    module.ras_errors[(3, "SDMA")] = 2
    events = collector.reports()
    assert sorted((e.gpu_uuid, e.code) for e in events) == sorted(
        [(MI300X_UUIDS[1], XGMI_XID), (MI300X_UUIDS[3], UNCONTAINED_XID)]
    )
    assert {s.uuid: s.xid_count for s in collector.sample()}[MI300X_UUIDS[1]] == 1


def test_an_amd_cards_ras_errors_fault_it_by_the_masters_rules_for_nvidias_xids(host: Path):
    collector = detect_gpus(host, open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    card: GpuInfo = collector.inventory()[2]
    count(host, 2, "xgmi_wafl", 1)
    [event] = collector.reports()
    config = MasterConfig()
    watch = HealthWatch(FaultRules(frozenset(config.fatal_xids), config.max_temperature_c, 3, 3))
    record = GpuRecord(uuid=card.uuid, agent_id="agt-amd", index=2, model="mi300x", info=card, state="available")
    fault = watch.on_report(record, event, now=1.0)
    assert fault is not None and (fault.kind, fault.code) == ("xid", XGMI_XID)
    assert fault.reason.startswith("Xid 74: AMD RAS: 1 uncorrectable xgmi_wafl error(s)")


# ---------------------------------------------------------------- amdsmi's event API

EVENT_TYPES = AmdSmiEvtNotificationType


def amdsmi_host(events: str = "work") -> tuple[ModuleType, GpuCollector]:
    module = stand_in(COMMANDS / "amd-smi-static-mi300x-8.json", events=events)
    return module, detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=lambda name: module, runner=Commands())


def test_amdsmis_events_are_reported_as_the_xids_that_mean_the_same(caplog: pytest.LogCaptureFixture):
    module, collector = amdsmi_host()
    # Every card listens to resets, VM faults and throttling (amdsmi's mask: a bit per type), nothing else.
    wanted = {EVENT_TYPES.VMFAULT, EVENT_TYPES.THERMAL_THROTTLE, EVENT_TYPES.GPU_PRE_RESET, EVENT_TYPES.GPU_POST_RESET}
    assert module.notifying == {card: sum(1 << (t - 1) for t in wanted) for card in range(8)}
    assert collector.reports() == []  # nothing queued: amdsmi raises NO_DATA, which is no failure
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    module.gpu_events.extend(
        [
            (2, EVENT_TYPES.GPU_PRE_RESET, "1"),  # ROCm's reader keeps the first word: the reset's sequence number
            (2, EVENT_TYPES.GPU_POST_RESET, "1"),
            *[(4, EVENT_TYPES.VMFAULT, "1f3a:python3") for _ in range(3)],
            (6, EVENT_TYPES.THERMAL_THROTTLE, "40:1c"),
            (1, EVENT_TYPES.MIGRATE_START, "12 -1f3a @7f00(200) 0->1 0:0 1"),  # not listened to: never queued for us
        ]
    )
    events = collector.reports()
    assert sorted((e.gpu_uuid, e.kind, e.code) for e in events) == sorted(
        [
            (MI300X_UUIDS[2], AgentEventKind.GPU_XID, RESET_XID),
            (MI300X_UUIDS[4], AgentEventKind.GPU_XID, VM_FAULT_XID),  # three faults of one read: one report
            (MI300X_UUIDS[6], AgentEventKind.GPU_THROTTLED, None),
        ]
    )
    by_card = {e.gpu_uuid: e for e in events}
    assert "reset" in by_card[MI300X_UUIDS[2]].message and "Xid 43" in by_card[MI300X_UUIDS[2]].message
    assert "x3" in by_card[MI300X_UUIDS[4]].message and "python3" not in by_card[MI300X_UUIDS[4]].message
    assert "40:1c" in by_card[MI300X_UUIDS[6]].message
    assert collector.reports() == []  # reported once
    xids = {s.uuid: s.xid_count for s in collector.sample()}
    assert (xids[MI300X_UUIDS[2]], xids[MI300X_UUIDS[4]], xids[MI300X_UUIDS[6]]) == (1, 1, 0)

    collector.close()
    assert module.notifying == {}  # each card's notification stopped


def test_the_events_fault_a_card_by_the_masters_rules_for_nvidias_xids():
    """A reset that ends and a VM fault are not a broken card (an application's hung or faulting kernel causes them, as
    NVIDIA's Xids 43 and 31); a reset that never ends is (Xid 79)."""
    config = MasterConfig()
    assert RESET_XID not in config.fatal_xids and VM_FAULT_XID not in config.fatal_xids
    assert LOST_XID in config.fatal_xids
    module = stand_in(COMMANDS / "amd-smi-static-mi300x-8.json")
    now = [1000.0]
    source = AmdSmiSource(module, host_key="host", clock=lambda: now[0])
    card = source.cards()[3]
    watch = HealthWatch(FaultRules(frozenset(config.fatal_xids), config.max_temperature_c, 3, 3))
    record = GpuRecord(uuid=card.uuid, agent_id="agt-amd", index=3, model="mi300x", info=card, state="available")

    module.gpu_events.append((3, EVENT_TYPES.GPU_PRE_RESET, "2"))
    [reset] = source.reports()
    assert (reset.gpu_uuid, reset.code) == (card.uuid, RESET_XID)
    assert watch.on_report(record, reset, now=1.0) is None
    now[0] += RESET_DEADLINE_S - 1
    assert source.reports() == []  # still resetting
    now[0] += 1
    [lost] = source.reports()
    assert (lost.gpu_uuid, lost.code) == (card.uuid, LOST_XID) and "has not ended" in lost.message
    fault = watch.on_report(record, lost, now=2.0)
    assert fault is not None and (fault.kind, fault.code) == ("xid", LOST_XID)
    now[0] += RESET_DEADLINE_S
    assert source.reports() == []  # reported once

    module.gpu_events.extend([(5, EVENT_TYPES.GPU_PRE_RESET, "1"), (5, EVENT_TYPES.GPU_POST_RESET, "1")])
    assert [e.code for e in source.reports()] == [RESET_XID]
    now[0] += 2 * RESET_DEADLINE_S
    assert source.reports() == []  # it ended: never reported lost
    source.close()


@pytest.mark.parametrize("events", ["missing", "unsupported", "broken"])
def test_a_binding_without_a_working_event_api_still_reads_samples_and_reports_ras_errors(
    events: str, caplog: pytest.LogCaptureFixture
):
    """An amdsmi older than the event API, a driver that refuses it, reads that fail: the cards are offered and sampled,
    their RAS errors reported; the log says once what is not reported."""
    caplog.set_level(logging.INFO, logger="agent.amd_gpus")
    module, collector = amdsmi_host(events)
    assert [card.uuid for card in collector.inventory()] == MI300X_UUIDS
    module.gpu_events.append((2, EVENT_TYPES.GPU_PRE_RESET, "1"))
    module.ras_errors[(1, "XGMI_WAFL")] = 1
    assert [(e.gpu_uuid, e.code) for e in collector.reports()] == [(MI300X_UUIDS[1], XGMI_XID)]
    assert collector.reports() == []
    assert len(collector.sample()) == 8
    said = [r.getMessage() for r in caplog.records if "AMD GPU" in r.getMessage() and "event" in r.getMessage()]
    assert len(said) == 1, said  # once, not per card or per tick
    assert ("no event API" in said[0]) == (events == "missing")
    collector.close()


def test_an_event_api_that_answers_in_no_documented_shape_is_set_aside():
    """Handles the watch cannot key by (unhashable, no address), or a reader that reads something else: no event, no
    failure."""
    module = stand_in(COMMANDS / "amd-smi-static-mi300x-8.json")
    card = AmdSmiSource(module, host_key="host").cards()[0]
    assert EventWatch(module, [([0x55D00000], card)]).reports() == []

    class Odd:
        def __init__(self, handle: object, types: object) -> None:
            pass

        def read(self, timeout_ms: int, count: int) -> object:
            return [None, {"processor_handle": None, "event": 3}, 42]

        def stop(self) -> None:
            raise OSError("stop failed")

    module.__dict__["AmdSmiEventReader"] = Odd  # replaces the stand-in's reader
    watch = EventWatch(module, [(module.amdsmi_get_processor_handles()[0], card)])
    assert watch.reports() == []
    watch.close()

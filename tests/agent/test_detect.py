"""Detection that never hides a card (issue 41): the PCI bus read from fake sysfs trees, AMD's cards read through each
of their sources from reconstructed outputs, and every card the bus shows either offered or reported with why.

The fixtures (tests/fixtures/gpus/, its README) are reconstructed from the tools' documented formats, not recorded.
NVML and the real ``amdsmi`` cannot run here: tests/agent/gpu_hosts.py's stand-ins answer for them (it says why).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

import msgspec
import pytest

from agent.amd_gpus import AmdSmiCommand, RocmSmiCommand, SysfsSampler, parse_amd_smi_static, parse_rocm_smi
from agent.detect import DISPLAY_ONLY_MAX_MIB, BindingReport, HostGpus, detect_gpus, reconcile
from agent.gpus import EmptyCollector
from agent.pci import PciGpu, integrated_reason, list_pci_gpus, normal_address
from common.inventory import GpuInfo, GpuPartition, HostInfo, Inventory
from tests.agent.fake_amdsmi import stand_in
from tests.agent.gpu_hosts import (
    COMMANDS,
    MI300X_BUSES,
    MI300X_MIB,
    MI300X_UUIDS,
    SYSFS,
    Commands,
    FakeNvml,
    amdsmi_module,
    no_amdsmi,
    no_nvml,
    rtx4090,
)

# ---------------------------------------------------------------- the bus


def test_the_bus_lists_gpus_by_class_and_vendor_and_leaves_other_functions_out():
    gpus = list_pci_gpus(SYSFS / "nvidia-beside-amd-igpu")
    assert gpus is not None
    assert [(g.address, g.vendor, g.device_hex, g.driver) for g in gpus] == [
        ("0000:01:00.0", "nvidia", "0x2684", "nvidia"),  # its audio function 01:00.1 is no GPU
        ("0000:0e:00.0", "amd", "0x164e", "amdgpu"),
    ]
    igpu = gpus[1]
    assert igpu.boot_vga and igpu.vram_bytes == 512 * 1024**2


def test_a_server_bmcs_vga_is_no_gpu_and_mi300x_accelerators_are():
    gpus = list_pci_gpus(SYSFS / "mi300x-8")
    assert gpus is not None
    assert [g.address for g in gpus] == [f"0000:{bus}:00.0" for bus in MI300X_BUSES]  # the ASPEED VGA is not listed
    assert {g.class_code for g in gpus} == {0x120000}


def test_a_host_without_a_pci_bus_in_sysfs_reads_as_unknown_not_as_empty():
    assert list_pci_gpus(SYSFS / "wsl") is None


def test_integrated_gpus_by_the_documented_rule():
    gpus = {g.address: g for g in list_pci_gpus(SYSFS / "driver-not-loaded") or []}
    assert integrated_reason(gpus["0000:00:02.0"]) is not None  # Intel on bus 0
    assert integrated_reason(gpus["0000:03:00.0"]) is None  # an RX 7900 XTX, even with no driver to say its memory
    apu = list_pci_gpus(SYSFS / "nvidia-beside-amd-igpu") or []
    assert integrated_reason(apu[1]) is not None and integrated_reason(apu[0]) is None
    # An AMD device not on the APU list is still caught by its small carve-out; a discrete one is not.
    unknown = PciGpu(address="0000:c1:00.0", vendor="amd", device_id=0x9999, class_code=0x030000, driver="amdgpu")
    assert integrated_reason(PciGpu(**{**unknown.__dict__, "vram_bytes": 512 * 1024**2})) is not None
    assert integrated_reason(PciGpu(**{**unknown.__dict__, "vram_bytes": 8 * 1024**3})) is None


def test_addresses_are_matched_whichever_way_a_library_writes_them():
    assert normal_address("00000000:1A:00.0") == "0000:1a:00.0"  # NVML
    assert normal_address("0000:1a:00.0") == "0000:1a:00.0"  # sysfs, amd-smi


# ---------------------------------------------------------------- detection


def test_an_amd_igpu_never_hides_the_nvidia_card_beside_it():
    nvml = FakeNvml([rtx4090()])
    commands = Commands()
    collector = detect_gpus(SYSFS / "nvidia-beside-amd-igpu", open_nvml=lambda: nvml, import_module=no_amdsmi, runner=commands)
    assert [card.name for card in collector.inventory()] == ["NVIDIA GeForce RTX 4090"]
    [igpu] = collector.unoffered()
    assert (igpu.pci_bus_id, igpu.vendor, igpu.kind, igpu.fix) == ("0000:0e:00.0", "amd", "integrated", "")
    assert commands.ran == []  # no AMD card of its own on the bus: AMD's tools are not run
    assert [s.uuid for s in collector.sample()] == ["GPU-4090"]


def test_an_apu_that_amdsmi_lists_is_not_offered():
    apu = GpuInfo(
        index=0,
        uuid="GPU-apu",
        name="AMD Radeon Graphics",
        pci_bus_id="0000:0e:00.0",
        memory_total_mib=4096,
        compute_capability="",
    )
    bus = list_pci_gpus(SYSFS / "nvidia-beside-amd-igpu")
    detection = reconcile(bus, {"nvidia": BindingReport([rtx4090()]), "amd": BindingReport([apu])})
    assert [card.uuid for card in detection.offered] == ["GPU-4090"]
    assert [(u.pci_bus_id, u.kind) for u in detection.unoffered] == [("0000:0e:00.0", "integrated")]


def test_an_mi300x_host_read_through_amdsmi():
    collector = detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=amdsmi_module, runner=Commands())
    cards = collector.inventory()
    assert [c.uuid for c in cards] == MI300X_UUIDS
    assert {(c.vendor, c.name, c.memory_total_mib, c.power_limit_w, c.driver_version) for c in cards} == {
        ("amd", "AMD Instinct MI300X", MI300X_MIB, 750.0, "6.7.0")
    }
    assert [c.pci_bus_id for c in cards] == [f"0000:{bus}:00.0" for bus in MI300X_BUSES]
    assert collector.unoffered() == []
    samples = collector.sample()
    assert [s.uuid for s in samples] == MI300X_UUIDS
    assert (samples[3].utilization_pct, samples[3].temperature_c, samples[3].power_w) == (30.0, 43.0, 141.0)
    assert samples[3].memory_used_mib == MI300X_MIB // 100


@pytest.mark.parametrize(
    "commands",
    [
        pytest.param(Commands(amd_smi=COMMANDS / "amd-smi-static-mi300x-8.json"), id="amd-smi"),
        pytest.param(Commands(rocm_smi=COMMANDS / "rocm-smi-mi300x-8.json"), id="rocm-smi"),
        pytest.param(Commands(), id="sysfs alone"),
    ],
)
def test_an_mi300x_host_without_amdsmi_falls_back_and_keeps_its_cards_uuids(commands):
    collector = detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=no_amdsmi, runner=commands)
    cards = collector.inventory()
    assert [c.uuid for c in cards] == MI300X_UUIDS  # the same cards whichever source read them
    assert {(c.vendor, c.name, c.memory_total_mib) for c in cards} == {("amd", "AMD Instinct MI300X", MI300X_MIB)}
    samples = collector.sample()  # from sysfs: gpu_busy_percent, the junction sensor (no edge one), power1_average, RAS
    assert (samples[2].utilization_pct, samples[2].temperature_c, samples[2].power_w) == (20.0, 42.0, 142.0)
    assert (samples[2].ecc_corrected, samples[2].ecc_uncorrected) == (2, 0)
    assert collector.unoffered() == []


def test_sysfs_telemetry_reads_the_edge_sensor_where_a_card_has_one_as_nvidias_gpu_temperature_compares():
    card = GpuInfo(
        index=0, uuid="GPU-apu", name="AMD GPU", pci_bus_id="0000:0e:00.0", memory_total_mib=512, compute_capability=""
    )
    [sample] = SysfsSampler(SYSFS / "nvidia-beside-amd-igpu", [card]).sample()
    assert (sample.temperature_c, sample.power_w, sample.memory_used_mib) == (33.0, 9.0, 118)  # edge 33, junction 41
    assert (sample.ecc_corrected, sample.ecc_uncorrected) == (0, 0)  # no RAS on this card


def test_the_commands_are_tried_in_order_and_only_while_none_answered():
    commands = Commands(amd_smi=COMMANDS / "amd-smi-static-mi300x-8.json", rocm_smi=COMMANDS / "rocm-smi-mi300x-8.json")
    detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=no_amdsmi, runner=commands)
    assert commands.ran == [AmdSmiCommand.ARGV]
    later = Commands(rocm_smi=COMMANDS / "rocm-smi-mi300x-8.json")
    detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=no_amdsmi, runner=later)
    assert later.ran == [AmdSmiCommand.ARGV, RocmSmiCommand.ARGV]


def test_a_card_amdsmi_stops_reading_is_reported_not_dropped():
    broken = stand_in(COMMANDS / "amd-smi-static-mi300x-8.json", broken=frozenset({5}))
    collector = detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=lambda name: broken, runner=Commands())
    assert len(collector.inventory()) == 7
    [missing] = collector.unoffered()
    assert (missing.pci_bus_id, missing.kind) == ("0000:a5:00.0", "no_binding")
    assert "amd-smi" in missing.fix
    assert len(collector.sample()) == 7


def test_cards_whose_driver_is_not_loaded_are_reported_with_what_to_install():
    collector = detect_gpus(SYSFS / "driver-not-loaded", open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    assert isinstance(collector, EmptyCollector)
    assert collector.inventory() == []
    assert collector.unavailable_reason.startswith("NVML is not available")
    found = {card.pci_bus_id: card for card in collector.unoffered()}
    assert {address: card.kind for address, card in found.items()} == {
        "0000:00:02.0": "integrated",
        "0000:03:00.0": "no_driver",
        "0000:17:00.0": "no_driver",
        "0000:31:00.0": "no_driver",
        "0000:4b:00.0": "no_driver",
        "0000:98:00.0": "unsupported",
    }
    assert "amdgpu" in found["0000:03:00.0"].fix
    assert "NVIDIA's driver" in found["0000:17:00.0"].fix
    assert "vfio-pci" in found["0000:31:00.0"].reason
    assert "nouveau" in found["0000:4b:00.0"].reason and "blacklist nouveau" in found["0000:4b:00.0"].fix
    assert "Habana" in found["0000:98:00.0"].reason
    assert all(card.reason for card in found.values())


def test_an_amd_host_whose_cards_no_library_reads_says_why_in_amds_words_not_nvmls(tmp_path):
    # An RX 7900 XTX under amdgpu whose sysfs says nothing of its memory (written here: a tree of one odd card).
    card = tmp_path / "bus" / "pci" / "devices" / "0000:03:00.0"
    card.mkdir(parents=True)
    for name, value in (("vendor", "0x1002"), ("device", "0x744c"), ("class", "0x030000")):
        (card / name).write_text(value + "\n")
    (card / "driver").symlink_to("../../../bus/pci/drivers/amdgpu")
    collector = detect_gpus(tmp_path, open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    assert isinstance(collector, EmptyCollector)
    assert collector.unavailable_reason.startswith("no AMD library or tool read it (amdsmi: not usable (KeyError: ")
    assert "NVML" not in collector.unavailable_reason
    [unread] = collector.unoffered()
    assert unread.kind == "no_binding" and "amd-smi" in unread.fix


def test_an_nvidia_card_the_driver_has_but_nvml_does_not_read_says_why():
    bus = [PciGpu(address="0000:17:00.0", vendor="nvidia", device_id=0x27B8, class_code=0x030200, driver="nvidia")]
    problem = "NVML is not available: the NVML library and the loaded kernel driver have different versions; reboot"
    [card] = reconcile(bus, {"nvidia": BindingReport((), problem)}).unoffered
    assert card.kind == "no_binding" and problem in card.reason


def test_wsl_offers_what_nvml_reads_with_no_bus_to_check():
    collector = detect_gpus(SYSFS / "wsl", open_nvml=lambda: FakeNvml([rtx4090()]), import_module=no_amdsmi, runner=Commands())
    assert [card.uuid for card in collector.inventory()] == ["GPU-4090"]
    assert collector.unoffered() == []


def test_a_card_with_too_little_memory_of_its_own_is_display_only():
    small = GpuInfo(
        index=1,
        uuid="GPU-nvs",
        name="NVIDIA NVS 510",
        pci_bus_id="0000:02:00.0",
        memory_total_mib=DISPLAY_ONLY_MAX_MIB - 1,
        compute_capability="3.0",
    )
    detection = reconcile(None, {"nvidia": BindingReport([rtx4090(), small])})
    assert [card.uuid for card in detection.offered] == ["GPU-4090"]
    assert [(u.name, u.kind) for u in detection.unoffered] == [("NVIDIA NVS 510", "display_only")]


def test_a_withheld_card_is_not_sampled():
    small = GpuInfo(
        index=1,
        uuid="GPU-nvs",
        name="NVIDIA NVS 510",
        pci_bus_id="00000000:02:00.0",
        memory_total_mib=1024,
        compute_capability="3.0",
    )
    nvml = FakeNvml([rtx4090(), small])
    collector = detect_gpus(SYSFS / "wsl", open_nvml=lambda: nvml, import_module=no_amdsmi, runner=Commands())
    assert [card.uuid for card in collector.inventory()] == ["GPU-4090"]
    assert [s.uuid for s in collector.sample()] == ["GPU-4090"]
    assert [(u.name, u.kind) for u in collector.unoffered()] == [("NVIDIA NVS 510", "display_only")]


def test_closing_the_host_collector_closes_its_bindings():
    nvml = FakeNvml([rtx4090()])
    collector = detect_gpus(SYSFS / "wsl", open_nvml=lambda: nvml, import_module=no_amdsmi, runner=Commands())
    assert isinstance(collector, HostGpus)
    collector.close()
    assert nvml.closed


# ---------------------------------------------------------------- the command outputs


def test_amd_smi_25s_wrapped_output_with_sizes_as_text():
    [card] = parse_amd_smi_static((COMMANDS / "amd-smi-static-w7900-gpu-data.json").read_text(), host_key="h")
    assert (card.name, card.memory_total_mib, card.pcie_width, card.power_limit_w, card.memory_bus_width_bits) == (
        "AMD Radeon PRO W7900",
        49136,
        16,
        295.0,
        384,
    )
    assert card.uuid == "GPU-2f1a5c7e903b6d11" and card.vendor == "amd"


def test_rocm_smi_output_names_cards_by_their_unique_id():
    cards = parse_rocm_smi((COMMANDS / "rocm-smi-mi300x-8.json").read_text(), host_key="h")
    assert [c.uuid for c in cards] == MI300X_UUIDS
    assert [c.index for c in cards] == list(range(8))


def test_a_card_without_a_unique_id_keeps_a_stable_one_per_host():
    text = (COMMANDS / "amd-smi-static-w7900-gpu-data.json").read_text().replace("0x2F1A5C7E903B6D11", "N/A")
    first = parse_amd_smi_static(text, host_key="/var/lib/idlegrid")[0].uuid
    assert first.startswith("AMD-")
    assert parse_amd_smi_static(text, host_key="/var/lib/idlegrid")[0].uuid == first
    assert parse_amd_smi_static(text, host_key="/other/host")[0].uuid != first


def test_output_that_is_not_the_tools_json_is_refused():
    with pytest.raises(ValueError):
        parse_amd_smi_static('"no GPUs found"', host_key="h")
    with pytest.raises(ValueError):
        parse_rocm_smi("[]", host_key="h")


def test_a_failing_command_falls_through_to_the_next_source():
    def failing(argv: Sequence[str], timeout_s: float) -> str:
        raise subprocess.CalledProcessError(1, list(argv), stderr="amdgpu driver not initialized")

    collector = detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=no_amdsmi, runner=failing)
    assert [c.uuid for c in collector.inventory()] == MI300X_UUIDS  # read from sysfs


# ---------------------------------------------------------------- the wire


def test_hello_carries_the_unoffered_cards_and_an_older_agents_hello_still_decodes():
    collector = detect_gpus(SYSFS / "driver-not-loaded", open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    host = HostInfo(
        hostname="h", cpu_model="c", cpu_cores=1, ram_mib=1, disk_total_gib=1.0, disk_free_gib=1.0, os="l", kernel="k"
    )
    sent = Inventory(host=host, unoffered=collector.unoffered())
    received = msgspec.json.decode(msgspec.json.encode(sent), type=Inventory)
    assert received.unoffered == sent.unoffered and len(received.unoffered) == 6
    older = msgspec.json.decode(msgspec.json.encode({"host": msgspec.to_builtins(host), "gpus": []}), type=Inventory)
    assert older.unoffered == []
    nvidia = msgspec.json.decode(msgspec.json.encode(msgspec.to_builtins(rtx4090())), type=GpuInfo)
    assert nvidia.vendor == "nvidia"  # an agent older than the field read NVIDIA cards only


# ---------------------------------------------------------------- partition modes (MI300-series): reported, not sold


@pytest.mark.parametrize(
    ("import_module", "commands", "modes"),
    [
        pytest.param(amdsmi_module, Commands(), (), id="amdsmi"),  # amdsmi says the modes in use, not those possible
        pytest.param(
            no_amdsmi, Commands(amd_smi=COMMANDS / "amd-smi-static-mi300x-8.json"), ("SPX", "DPX", "QPX", "CPX"), id="amd-smi"
        ),
        pytest.param(
            no_amdsmi, Commands(rocm_smi=COMMANDS / "rocm-smi-mi300x-8.json"), ("SPX", "DPX", "QPX", "CPX"), id="rocm-smi"
        ),
        pytest.param(no_amdsmi, Commands(), ("SPX", "DPX", "QPX", "CPX"), id="sysfs alone"),
    ],
)
def test_each_source_reads_an_mi300x_cards_partition_modes(import_module, commands, modes):
    collector = detect_gpus(SYSFS / "mi300x-8", open_nvml=no_nvml, import_module=import_module, runner=commands)
    partitions = {c.partition for c in collector.inventory()}
    assert len(partitions) == 1
    [partition] = partitions
    assert partition is not None and (partition.compute, partition.memory, partition.compute_modes) == ("SPX", "NPS1", modes)
    assert not partition.split  # whole: offered as one GPU
    assert len(collector.inventory()) == 8


def test_a_card_split_into_cpx_partitions_is_reported_with_its_modes_and_not_sold(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(SYSFS / "mi300x-8", root, symlinks=True)
    device = root / "bus" / "pci" / "devices" / f"0000:{MI300X_BUSES[1]}:00.0"
    (device / "current_compute_partition").write_text("CPX\n")
    (device / "current_memory_partition").write_text("NPS4\n")
    collector = detect_gpus(root, open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    assert [c.uuid for c in collector.inventory()] == [u for i, u in enumerate(MI300X_UUIDS) if i != 1]
    [split] = collector.unoffered()
    assert (split.pci_bus_id, split.kind, split.name) == (f"0000:{MI300X_BUSES[1]}:00.0", "partitioned", "AMD Instinct MI300X")
    assert split.partition is not None and (split.partition.compute, split.partition.memory) == ("CPX", "NPS4")
    assert "CPX, NPS4 (can be SPX, DPX, QPX, CPX; NPS1, NPS4)" in split.reason and "not sold" in split.reason
    assert "--compute-partition SPX" in split.fix
    assert MI300X_UUIDS[1] not in {s.uuid for s in collector.sample()}  # withheld: not sampled either


def test_a_partitioned_card_listed_once_per_partition_is_reported_once():
    cpx = GpuPartition(compute="CPX", memory="NPS1")
    parts = [
        GpuInfo(
            index=i,
            uuid=f"GPU-part{i}",
            name="AMD Instinct MI300X",
            pci_bus_id="0000:05:00.0",
            memory_total_mib=MI300X_MIB // 8,
            compute_capability="",
            vendor="amd",
            partition=cpx,
        )
        for i in range(8)
    ]
    bus = list_pci_gpus(SYSFS / "mi300x-8")
    assert bus is not None
    detection = reconcile(bus[:1], {"amd": BindingReport(parts)})
    assert detection.offered == [] and [(u.pci_bus_id, u.kind) for u in detection.unoffered] == [("0000:05:00.0", "partitioned")]

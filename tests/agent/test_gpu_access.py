"""How a container is given its GPUs whichever vendor made them (agent/runtime/gpu_access.py): an MI300X host's cards
mapped to their render nodes from a fake sysfs tree (tests/fixtures/gpus/, reconstructed, not recorded: no AMD GPU
here), and the container create bodies and process environment built from them. Podman itself takes these bodies in
tests/agent/test_runtime_docker.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.detect import detect_gpus
from agent.pci import drm_nodes
from agent.runtime.docker import create_body, libpod_create_body
from agent.runtime.gpu_access import KFD, DeviceNode, GpuAccess, GpuDevices, GpuPlan, device_groups, host_gpu_access
from agent.runtime.process import child_env
from agent.runtime.process_sandbox import drop_privileges_argv
from common.containers import ContainerSpec
from common.errors import RuntimeFailure
from common.inventory import GpuInfo
from tests.agent.gpu_hosts import MI300X_BUSES, MI300X_UUIDS, SYSFS, Commands, no_amdsmi, no_nvml, rtx4090

MI300X_HOST = SYSFS / "mi300x-8"


def mi300x_cards() -> list[GpuInfo]:
    """The eight MI300X as the agent reads them from sysfs alone (no amdsmi, no tool)."""
    collector = detect_gpus(MI300X_HOST, open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands())
    return collector.inventory()


def amd_host_table() -> GpuDevices:
    return GpuDevices(host_gpu_access(mi300x_cards(), MI300X_HOST))


def test_each_amd_card_is_mapped_to_its_render_node_from_sysfs():
    cards = mi300x_cards()
    access = host_gpu_access(cards, MI300X_HOST)
    assert [a.uuid for a in access] == MI300X_UUIDS
    assert [a.nodes for a in access] == [
        (DeviceNode(f"/dev/dri/renderD{128 + i}", f"/dev/dri/renderD{128 + i}"),) for i in range(8)
    ]
    assert drm_nodes(MI300X_HOST, f"0000:{MI300X_BUSES[2]}:00.0").card == "/dev/dri/card3"


def test_a_card_sysfs_names_no_render_node_for_gets_none_and_its_container_is_refused():
    card = GpuInfo(
        index=0,
        uuid="GPU-abc",
        name="AMD Instinct MI300X",
        pci_bus_id="0000:99:00.0",
        memory_total_mib=1,
        compute_capability="",
        vendor="amd",
    )
    [access] = host_gpu_access([card], MI300X_HOST)
    assert access.vendor == "amd" and access.nodes == ()
    plan = GpuDevices([access]).plan(["GPU-abc"])
    assert plan.missing == ("GPU-abc",)
    with pytest.raises(RuntimeFailure, match="no /dev/dri render node is known for AMD GPU"):
        plan.require_devices()


def test_nvidia_and_simulated_cards_need_no_device_file():
    simulated = GpuInfo(
        index=0,
        uuid="GPU-sim",
        name="AMD Instinct MI300X",
        pci_bus_id="0000:05:00.0",
        memory_total_mib=1,
        compute_capability="",
        vendor="amd",
        simulated=True,
    )
    access = host_gpu_access([rtx4090(), simulated], MI300X_HOST)
    assert access == [GpuAccess(uuid="GPU-4090", vendor="nvidia"), GpuAccess(uuid="GPU-sim", vendor="amd")]


def test_a_plan_splits_gpus_by_vendor_and_gives_kfd_once_with_the_render_nodes():
    table = amd_host_table()
    plan = table.plan([MI300X_UUIDS[1], MI300X_UUIDS[3], "MIG-unknown"])
    assert plan.amd == (MI300X_UUIDS[1], MI300X_UUIDS[3]) and plan.nvidia == ("MIG-unknown",)
    assert [d.container for d in plan.devices] == [KFD, "/dev/dri/renderD129", "/dev/dri/renderD131"]
    assert table.plan(["GPU-4090"]) == GpuPlan(nvidia=("GPU-4090",))  # unknown uuids are NVIDIA's, as before


def test_the_docker_create_body_for_an_amd_card_passes_kfd_and_its_render_node_with_their_groups():
    job = ContainerSpec(name="train", image="rocm/pytorch", command=["python3"], gpus=[MI300X_UUIDS[0]])
    plan = amd_host_table().plan(job.gpus)
    body = create_body(job, {}, ["CHOWN"], device_requests=True, gpus=plan, groups=[44, 992])
    host = body["HostConfig"]
    assert host["Devices"] == [
        {"PathOnHost": KFD, "PathInContainer": KFD, "CgroupPermissions": "rwm"},
        {"PathOnHost": "/dev/dri/renderD128", "PathInContainer": "/dev/dri/renderD128", "CgroupPermissions": "rwm"},
    ]
    assert host["GroupAdd"] == ["44", "992"]
    assert "DeviceRequests" not in host  # no NVIDIA card asked of the NVIDIA toolkit
    assert not any(e.startswith(("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")) for e in body["Env"])
    assert host["Privileged"] is False and host["CapDrop"] == ["ALL"]  # devices, never privilege


def test_a_mixed_container_asks_nvidias_toolkit_for_its_nvidia_card_and_passes_the_amd_cards_files():
    table = GpuDevices([*host_gpu_access(mi300x_cards(), MI300X_HOST), GpuAccess(uuid="GPU-4090")])
    job = ContainerSpec(name="mixed", image="img", gpus=["GPU-4090", MI300X_UUIDS[7]])
    body = create_body(job, {}, [], device_requests=True, gpus=table.plan(job.gpus))
    assert body["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["GPU-4090"]
    assert [d["PathInContainer"] for d in body["HostConfig"]["Devices"]] == [KFD, "/dev/dri/renderD135"]
    assert "GroupAdd" not in body["HostConfig"]  # none given: none added


def test_podmans_own_body_gives_amd_files_in_its_device_form_and_nvidia_cards_as_cdi_devices():
    table = GpuDevices([*host_gpu_access(mi300x_cards(), MI300X_HOST), GpuAccess(uuid="GPU-4090")])
    job = ContainerSpec(name="mixed", image="img", gpus=["GPU-4090", MI300X_UUIDS[0]])
    body = libpod_create_body(job, {}, [], gpus=table.plan(job.gpus), groups=[992])
    assert body["devices"] == [
        {"path": "nvidia.com/gpu=GPU-4090"},
        {"path": f"{KFD}:{KFD}:rwm"},
        {"path": "/dev/dri/renderD128:/dev/dri/renderD128:rwm"},
    ]
    assert body["groups"] == ["992"]


def test_simulated_amd_cards_are_named_in_rocr_visible_devices_and_nvidias_in_cudas():
    table = GpuDevices([GpuAccess(uuid="GPU-sim-a", vendor="amd"), GpuAccess(uuid="GPU-sim-b", vendor="amd")])
    job = ContainerSpec(name="sim", image="img", gpus=["GPU-sim-a", "GPU-sim-b"], env={"HIP_VISIBLE_DEVICES": "5"})
    body = create_body(job, {}, [], device_requests=False, gpus=table.plan(job.gpus))
    assert "Devices" not in body["HostConfig"] and "DeviceRequests" not in body["HostConfig"]
    assert {"ROCR_VISIBLE_DEVICES=GPU-sim-a,GPU-sim-b", "HIP_VISIBLE_DEVICES=0,1", "CUDA_VISIBLE_DEVICES="} <= set(body["Env"])
    assert "HIP_VISIBLE_DEVICES=5" not in body["Env"]  # the renter's value cannot widen or move the set


def test_the_process_runtime_names_amd_cards_for_rocr_and_hip_and_hides_them_from_other_containers(tmp_path: Path):
    table = amd_host_table()
    amd_job = ContainerSpec(
        name="amd", image="none", command=["true"], gpus=MI300X_UUIDS[:2], env={"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    )
    env = child_env(amd_job, home=tmp_path, gpus=table.plan(amd_job.gpus))
    assert env["ROCR_VISIBLE_DEVICES"] == ",".join(MI300X_UUIDS[:2]) and env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""  # nor any NVIDIA card the host has
    nvidia_job = ContainerSpec(name="nv", image="none", command=["true"], gpus=["GPU-4090"], env={"ROCR_VISIBLE_DEVICES": "0"})
    env = child_env(nvidia_job, home=tmp_path, gpus=table.plan(nvidia_job.gpus))
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-4090" and env["ROCR_VISIBLE_DEVICES"] == ""


def test_a_sandboxed_container_keeps_the_groups_owning_its_amd_cards_files_and_no_other(tmp_path: Path):
    argv = drop_privileges_argv(70000, gpus=True, device_groups=(992, 44))
    assert "--groups=992,44" in argv and "--clear-groups" not in argv
    assert "--clear-groups" in drop_privileges_argv(70000, gpus=False)


def test_the_groups_given_are_those_owning_the_device_files_never_roots(tmp_path: Path):
    mine = tmp_path / "renderD128"
    mine.write_text("")
    gid = mine.stat().st_gid
    nodes = [DeviceNode(str(mine), "/dev/dri/renderD128"), DeviceNode("/dev/null", KFD), DeviceNode(str(tmp_path / "gone"), "/x")]
    assert device_groups(nodes) == (() if gid == 0 else (gid,))  # /dev/null is root's group: never given

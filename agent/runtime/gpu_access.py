"""How a container is given its GPUs, whichever vendor made them: one plan per container, read by every runtime.

A container's spec names its GPUs by uuid (``ContainerSpec.gpus``); ``GpuDevices`` knows, for each GPU the host
offers, its vendor and, for an AMD card, the device files ROCm opens. ``GpuDevices.plan`` splits a spec's GPUs into a
``GpuPlan`` that each runtime turns into what its engine takes:

- NVIDIA: the uuids, which the docker runtime asks the engine for (DeviceRequests on Docker with the NVIDIA Container
  Toolkit, CDI devices ``nvidia.com/gpu=<uuid>`` on Podman) and the process runtime names in ``CUDA_VISIBLE_DEVICES``.
  A uuid ``GpuDevices`` does not know (a MIG instance's, or any from a runtime given no table) is NVIDIA's, as every
  GPU was before AMD's.
- AMD: ``/dev/kfd`` (ROCm's compute interface, one for every card) and each card's render node
  (``/dev/dri/renderD*``, found in sysfs: agent/pci.py ``drm_nodes``; a container given only its own render nodes
  enumerates only those cards, as AMD's container instructions say), passed as devices by the docker runtime, with the
  groups that own them (``video``, ``render``: ROCm's documented ``--group-add``, here by number, since a renter's
  image need not name the host's groups); the process runtime names the cards in ``ROCR_VISIBLE_DEVICES`` (its uuids,
  the form ROCr accepts) and ``HIP_VISIBLE_DEVICES`` (indices of what ROCr shows, so that HIP reads neither a renter's
  value nor ``CUDA_VISIBLE_DEVICES``, which it honours too).

Simulated GPUs have no device: a container is told them by name (``visible_env``), NVIDIA's in
``CUDA_VISIBLE_DEVICES`` and AMD's in ``ROCR_VISIBLE_DEVICES``, which the self-test's simulated probes print.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.pci import drm_nodes
from common.errors import RuntimeFailure
from common.inventory import GpuInfo

KFD = "/dev/kfd"  # the AMD kernel fusion driver's device: every ROCm process opens it, whichever card it uses
NVIDIA = "nvidia"
AMD = "amd"


@dataclass(frozen=True)
class DeviceNode:
    """A device file a container is given: ``host`` on the host, ``container`` inside (the same path on a real host;
    tests map ``/dev/null`` under ROCm's names)."""

    host: str
    container: str


@dataclass(frozen=True)
class GpuAccess:
    """What a container needs to use one GPU: its vendor and, for an AMD card, its device files (its render node)."""

    uuid: str
    vendor: str = NVIDIA
    nodes: tuple[DeviceNode, ...] = ()


@dataclass(frozen=True)
class GpuPlan:
    """A container's GPUs as its runtime gives them (the module docstring)."""

    nvidia: tuple[str, ...] = ()
    amd: tuple[str, ...] = ()
    devices: tuple[DeviceNode, ...] = ()  # /dev/kfd and each AMD card's nodes; () without AMD cards
    missing: tuple[str, ...] = ()  # AMD cards whose device files sysfs does not name (no render node)

    def visible_env(self) -> dict[str, str]:
        """The variables that name the container's GPUs: ``CUDA_VISIBLE_DEVICES`` (NVIDIA's, empty when none, so CUDA
        sees no card) and, where it has AMD cards, ``ROCR_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``."""
        env = {"CUDA_VISIBLE_DEVICES": ",".join(self.nvidia)}
        if self.amd:
            env["ROCR_VISIBLE_DEVICES"] = ",".join(self.amd)
            env["HIP_VISIBLE_DEVICES"] = ",".join(str(index) for index in range(len(self.amd)))
        return env

    def hidden_amd_env(self) -> dict[str, str]:
        """On a host whose processes see every card (the process runtime), a container without AMD cards is shown
        none: ROCr takes a set, empty ``ROCR_VISIBLE_DEVICES`` as no card, as CUDA does an empty
        ``CUDA_VISIBLE_DEVICES``."""
        return {} if self.amd else {"ROCR_VISIBLE_DEVICES": ""}

    def require_devices(self) -> None:
        """Raise when an AMD card's device files are unknown: a container given no render node would run without
        its card, which a renter must never be sold."""
        if self.missing:
            raise RuntimeFailure(
                f"no /dev/dri render node is known for AMD GPU(s) {', '.join(self.missing)} (sysfs names none under "
                "/sys/bus/pci/devices/<address>/drm): check that the amdgpu driver is loaded and `ls /dev/dri` lists "
                "renderD nodes; then restart the agent"
            )


class GpuDevices:
    """The GPUs a host's containers may be given, by uuid: each one's vendor and device files. The agent refreshes it
    from its inventory (``know``); a runtime reads it at each create (``plan``)."""

    def __init__(self, cards: Iterable[GpuAccess] = (), *, kfd: DeviceNode = DeviceNode(KFD, KFD)) -> None:
        self.kfd = kfd
        self._cards: dict[str, GpuAccess] = {}
        self.know(cards)

    def know(self, cards: Iterable[GpuAccess]) -> None:
        """The host's GPUs now (replacing those known before)."""
        self._cards = {card.uuid: card for card in cards}

    def vendor(self, uuid: str) -> str:
        card = self._cards.get(uuid)
        return card.vendor if card is not None else NVIDIA

    def render_node(self, uuid: str) -> str:
        """Where a container finds this AMD card's render node ("" when unknown)."""
        card = self._cards.get(uuid)
        return card.nodes[0].container if card is not None and card.nodes else ""

    def plan(self, gpus: Sequence[str]) -> GpuPlan:
        nvidia: list[str] = []
        amd: list[str] = []
        devices: list[DeviceNode] = []
        missing: list[str] = []
        for uuid in gpus:
            card = self._cards.get(uuid)
            if card is None or card.vendor != AMD:
                nvidia.append(uuid)
                continue
            amd.append(uuid)
            devices.extend(node for node in card.nodes if node not in devices)
            if not card.nodes:
                missing.append(uuid)
        if amd:
            devices.insert(0, self.kfd)
        return GpuPlan(nvidia=tuple(nvidia), amd=tuple(amd), devices=tuple(devices), missing=tuple(missing))


def host_gpu_access(gpus: Sequence[GpuInfo], sysfs_root: Path) -> list[GpuAccess]:
    """Each offered GPU's vendor and, for a real AMD card, its render node from sysfs (a simulated card has none: it
    is given by name). The card node (``/dev/dri/card*``) is not given: it is the display's (mode setting), which ROCm
    does not open and AMD's container instructions leave out."""
    found = []
    for gpu in gpus:
        if gpu.vendor != AMD or gpu.simulated:
            found.append(GpuAccess(uuid=gpu.uuid, vendor=gpu.vendor))
            continue
        render = drm_nodes(sysfs_root, gpu.pci_bus_id).render
        found.append(GpuAccess(uuid=gpu.uuid, vendor=AMD, nodes=(DeviceNode(render, render),) if render else ()))
    return found


def device_groups(nodes: Iterable[DeviceNode]) -> tuple[int, ...]:
    """The groups that own ``nodes`` on the host (``render`` for the render nodes and, on most distributions, for
    ``/dev/kfd``; ``video`` on older ones), which a container's user must hold to open them. Root's group is never
    given: a node only root's group may open is not one a renter should."""
    groups: list[int] = []
    for node in nodes:
        try:
            gid = os.stat(node.host).st_gid
        except OSError:
            continue  # the engine says so when it creates the container
        if gid != 0 and gid not in groups:
            groups.append(gid)
    return tuple(groups)

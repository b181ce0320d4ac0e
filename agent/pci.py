"""The GPUs on the host's PCI bus, read from sysfs: what the agent checks its vendors' libraries against, so that a
card no library sees is reported (agent/detect.py), never silently missing.

Read only, from files any user may read: ``<root>/bus/pci/devices/<address>/{class,vendor,device,boot_vga}``, the
``driver`` link (which kernel driver is bound) and, for amdgpu, ``mem_info_vram_total``. ``root`` is a parameter
(``/sys`` on a host) so tests read fake trees (tests/fixtures/sysfs/).

Which devices are GPUs: classes 0x0300 (VGA), 0x0302 (3D controller: NVIDIA's datacenter cards), 0x0380 (other display
controller: AMD's MI200 Instinct cards) and, for AMD and Habana only, 0x1200 (processing accelerator: AMD's MI300
cards, Habana's Gaudi); of the vendors in ``VENDORS``. Other vendors' display devices (a server's ASPEED or Matrox
management VGA) are no GPU anyone rents and are not listed.

Which are integrated (``integrated_reason``), so never offered:
- an Intel device on PCI bus 0: Intel's iGPU is always 00:02.0, its discrete cards (Arc, Flex, Max) sit behind a PCIe
  port on a bus of their own;
- an AMD device whose id is one of AMD's APUs (``AMD_APU_DEVICE_IDS``), or whose amdgpu driver gives it under
  ``APU_VRAM_MAX_BYTES`` of memory of its own: an APU's carve-out from host memory is 512 MiB by default, and no
  discrete AMD card of the last ten years has under 2 GiB.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SYSFS_ROOT = Path("/sys")
DEV_DRI = "/dev/dri"  # where the kernel puts DRM device files (card0, renderD128)
VENDORS = {0x10DE: "nvidia", 0x1002: "amd", 0x8086: "intel", 0x1DA3: "habana"}
_GPU_CLASSES = frozenset({0x0300, 0x0302, 0x0380})
_ACCELERATOR_CLASS = 0x1200  # "processing accelerator": also Intel's NPUs, which are no GPU
_ACCELERATOR_VENDORS = frozenset({"amd", "habana"})
# AMD APUs' integrated GPUs, by PCI device id (the pci.ids names): Raven/Picasso, Renoir, Cezanne, Lucienne, Barcelo,
# Rembrandt, Raphael (Ryzen 7000 desktops), Granite Ridge (Ryzen 9000), Phoenix 1/2, Hawk Point, Mendocino, Van Gogh
# (Steam Deck), Strix Point, Strix Halo. An APU not listed is still caught by its small carve-out.
AMD_APU_DEVICE_IDS = frozenset(
    {
        0x15DD,
        0x15D8,
        0x1636,
        0x1638,
        0x164C,
        0x15E7,
        0x1681,
        0x164E,
        0x13C0,
        0x15BF,
        0x15C8,
        0x1900,
        0x1506,
        0x163F,
        0x150E,
        0x1586,
    }
)
APU_VRAM_MAX_BYTES = 1024**3  # amdgpu's own memory at or under this: an APU's carve-out


@dataclass(frozen=True)
class PciGpu:
    """One GPU the bus shows. ``driver`` is the bound kernel driver's name ("nvidia", "amdgpu", "vfio-pci"), None when
    none is bound; ``vram_bytes`` is amdgpu's ``mem_info_vram_total``, None where the driver does not say."""

    address: str  # "0000:17:00.0", as sysfs names it (NVML writes "00000000:17:00.0": see ``normal_address``)
    vendor: str  # one of common.inventory.GPU_VENDORS
    device_id: int
    class_code: int  # the 24-bit class, 0x030200
    driver: str | None = None
    boot_vga: bool = False  # the firmware drew its boot screen on this one
    vram_bytes: int | None = None

    @property
    def device_hex(self) -> str:
        return f"0x{self.device_id:04x}"


def list_pci_gpus(root: Path = SYSFS_ROOT) -> list[PciGpu] | None:
    """Every GPU on the bus, by address; None when the bus cannot be read at all (WSL, a container without /sys/bus/pci):
    then nothing can be checked and the vendors' libraries alone say what the host has."""
    devices = root / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(devices))
    except OSError:
        return None
    gpus = []
    for address in entries:
        gpu = _read_device(devices / address, address)
        if gpu is not None:
            gpus.append(gpu)
    return gpus


def integrated_reason(gpu: PciGpu) -> str | None:
    """Why ``gpu`` is an integrated GPU (the module docstring's rule), or None for a card of its own."""
    if gpu.vendor == "intel" and _bus(gpu.address) == 0:
        return "an Intel integrated GPU (PCI bus 0): it shares the host's memory and is not offered"
    if gpu.vendor == "amd" and gpu.device_id in AMD_APU_DEVICE_IDS:
        return f"an AMD APU's integrated GPU (device {gpu.device_hex}): it shares the host's memory and is not offered"
    if gpu.vendor == "amd" and gpu.vram_bytes is not None and gpu.vram_bytes <= APU_VRAM_MAX_BYTES:
        mib = gpu.vram_bytes // 1024**2
        return f"an AMD integrated GPU ({mib} MiB carved out of host memory): it shares the host's memory and is not offered"
    return None


def normal_address(address: str) -> str:
    """A PCI address as sysfs writes it ("0000:17:00.0") from NVML's ("00000000:17:00.0") or amd-smi's ("0000:17:00.0"),
    lower case: what the bus listing and the libraries' cards are matched by."""
    text = address.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or rest.count(":") != 1:
        return text
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def _read_device(path: Path, address: str) -> PciGpu | None:
    vendor_id = _hex(path / "vendor")
    class_code = _hex(path / "class")
    if vendor_id is None or class_code is None or vendor_id not in VENDORS:
        return None
    vendor = VENDORS[vendor_id]
    base = class_code >> 8
    if base not in _GPU_CLASSES and not (base == _ACCELERATOR_CLASS and vendor in _ACCELERATOR_VENDORS):
        return None
    driver_link = path / "driver"
    driver = os.path.basename(os.readlink(driver_link)) if driver_link.is_symlink() else None
    return PciGpu(
        address=normal_address(address),
        vendor=vendor,
        device_id=_hex(path / "device") or 0,
        class_code=class_code,
        driver=driver,
        boot_vga=_text(path / "boot_vga") == "1",
        vram_bytes=_int(path / "mem_info_vram_total"),
    )


def _bus(address: str) -> int | None:
    parts = address.split(":")
    try:
        return int(parts[-2], 16) if len(parts) >= 2 else None
    except ValueError:
        return None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _hex(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text, 16) if text else None
    except ValueError:
        log.debug("%s: not a hexadecimal number: %r", path, text)
        return None


def _int(path: Path) -> int | None:
    text = _text(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


@dataclass(frozen=True)
class DrmNodes:
    """A card's device files under /dev/dri, as its sysfs ``drm`` folder names them: ROCm opens the render node (and
    ``/dev/kfd``) to run work; the card node is the display's, which some tools (amd-smi inside a container) open too."""

    render: str | None = None  # "/dev/dri/renderD128"
    card: str | None = None  # "/dev/dri/card0"


def drm_nodes(root: Path, address: str) -> DrmNodes:
    """The DRM device files of the card at ``address`` (``<root>/bus/pci/devices/<address>/drm/{cardN,renderDN}``):
    what maps an offered GPU to what a container is given. Nothing where the driver made none (or is not bound)."""
    try:
        names = os.listdir(root / "bus" / "pci" / "devices" / normal_address(address) / "drm")
    except OSError:
        return DrmNodes()
    render = sorted(n for n in names if n.startswith("renderD") and n[7:].isdigit())
    card = sorted(n for n in names if n.startswith("card") and n[4:].isdigit())
    return DrmNodes(
        render=f"{DEV_DRI}/{render[0]}" if render else None,
        card=f"{DEV_DRI}/{card[0]}" if card else None,
    )

"""Stand-ins for the GPU libraries and tools that cannot run here, over the fixtures of tests/fixtures/gpus/ (their
README says they are reconstructed, not recorded): what tests of GPU detection (test_detect.py) and of the agent's
hello (test_daemon.py) share.

NVML cannot run here (no NVIDIA GPU): ``FakeNvml`` stands in for agent/gpus.py's NvmlCollector where a test needs
NVIDIA's binding to list a card. The real ``amdsmi`` cannot be imported here: tests/agent/fake_amdsmi.py says why and
stands in for it. ``Commands`` answers for amd-smi and rocm-smi from recorded-shaped outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from common.errors import NvmlUnavailable
from common.inventory import GpuInfo, GpuSample
from common.wire import AgentEvent
from tests.agent.fake_amdsmi import stand_in

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
SYSFS = FIXTURES / "sysfs"
COMMANDS = FIXTURES / "commands"
MI300X_BUSES = ["05", "26", "46", "65", "85", "a5", "c5", "e5"]
MI300X_UUIDS = [f"GPU-{0x4B2C4F5D21B5A3F0 + i:016x}" for i in range(8)]
MI300X_MIB = 196592  # 192 GiB less what the driver keeps


class FakeNvml:
    """Stands in for NvmlCollector (no NVIDIA GPU here): lists the cards it is given."""

    def __init__(self, cards: Sequence[GpuInfo]) -> None:
        self.cards = list(cards)
        self.closed = False

    def inventory(self) -> list[GpuInfo]:
        return list(self.cards)

    def sample(self) -> list[GpuSample]:
        return [GpuSample(uuid=card.uuid, ts=0.0, utilization_pct=50.0) for card in self.cards]

    def reports(self) -> list[AgentEvent]:
        return []

    def close(self) -> None:
        self.closed = True


def rtx4090(bus_id: str = "00000000:01:00.0") -> GpuInfo:
    return GpuInfo(
        index=0,
        uuid="GPU-4090",
        name="NVIDIA GeForce RTX 4090",
        pci_bus_id=bus_id,
        memory_total_mib=24564,
        compute_capability="8.9",
    )


def no_nvml() -> FakeNvml:
    raise NvmlUnavailable("NVML is not available: libnvidia-ml.so.1 not found (the NVIDIA driver is not installed)")


def no_amdsmi(name: str) -> ModuleType:
    raise KeyError("libamd_smi.so")  # what importing the real amdsmi raises without ROCm's library


class Commands:
    """Runs the AMD tools from recorded outputs: argv[0] -> the output file, a missing one not installed."""

    def __init__(self, **outputs: Path) -> None:
        self.outputs = {name.replace("_", "-"): path for name, path in outputs.items()}
        self.ran: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.ran.append(tuple(argv))
        if argv[0] not in self.outputs:
            raise FileNotFoundError(f"{argv[0]} not found on PATH")
        return self.outputs[argv[0]].read_text()


def amdsmi_module(name: str) -> ModuleType:
    assert name == "amdsmi"
    return stand_in(COMMANDS / "amd-smi-static-mi300x-8.json")

"""Built-in catalog of known GPU models and their public figures.

The Master verifies what an agent reports against these figures (a card claiming to be an H100
must look like one) and tiers GPUs by them; the agent's simulator reports them as NVML would.

Figures are the vendors' published spec-sheet numbers, written down by hand:
- ``fp16_tflops`` / ``bf16_tflops`` are DENSE tensor-core figures (no 2:4 sparsity). For GeForce
  cards they are the FP32-accumulate figures (half the FP16-accumulate headline), because that is
  what mixed-precision training and cuBLAS GEMMs run at, and what a throughput probe measures.
  ``bf16_tflops`` is None where the architecture has no BF16 tensor cores (Volta, Turing).
- ``memory_mib`` is what NVML reports as total memory, approximately; cards that reserve memory for
  ECC by default (L40S) are listed with the ECC-on figure.
- ``pcie_gen`` is the generation the card supports (a slot can run it slower).

AMD's cards (``vendor="amd"``) follow the same rules with AMD's own spec sheets: dense FP16/BF16 matrix figures,
``memory_mib`` as amd-smi reports it, no CUDA compute capability ("": a workload's CUDA minimum never matches them) and
the ISA target instead (``gfx_target``). An MI250X is two GPUs to ROCm (two GCDs, each with half the package's memory,
matrix throughput, bandwidth and power): it is listed as one GCD, the unit the agent reports and a renter gets.
Infinity Fabric links are not NVLink: ``nvlink`` is False for every AMD card.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from common.inventory import GpuInfo, NvLink


@dataclass(frozen=True)
class GpuModel:
    key: str  # "h100-sxm", "a100-80gb", "rtx-4090", ...
    name: str  # marketing name, "NVIDIA H100 SXM"
    nvml_names: tuple[str, ...]  # names the vendor's library (NVML, amd-smi) reports; matched by match_model, simulated
    memory_mib: int
    compute_capability: str
    fp16_tflops: float
    bf16_tflops: float | None
    memory_bandwidth_gbs: float
    form_factor: str  # "sxm" | "pcie"
    nvlink: bool  # NVLink capable (SXM fabric or a PCIe bridge)
    pcie_gen: int
    tdp_w: float
    sm_clock_max_mhz: int
    memory_bus_width_bits: int
    nvlink_links: int = 0  # links per GPU where NVLink is built in (SXM); bridges are optional, so 0 for PCIe
    vendor: str = "nvidia"  # one of common.inventory.GPU_VENDORS; a card reporting another vendor is flagged
    gfx_target: str = ""  # AMD's ISA target ("gfx942"): what ROCm builds for, as compute capability is for CUDA
    int8_tops: float = 0.0  # dense INT8 tensor throughput (no sparsity); 0.0 where the card has no INT8 tensor cores


class UnknownGpuModel(KeyError):
    """A GPU model name that is neither a catalog key nor an alias."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else "unknown GPU model"


_NVIDIA_MODELS = (
    # Hopper
    GpuModel(
        "h200",
        "NVIDIA H200 SXM",
        ("NVIDIA H200",),
        143771,
        "9.0",
        989.4,
        989.4,
        4800.0,
        "sxm",
        True,
        5,
        700.0,
        1980,
        6144,
        nvlink_links=18,
        int8_tops=1979.0,
    ),
    GpuModel(
        "h100-sxm",
        "NVIDIA H100 SXM",
        ("NVIDIA H100 80GB HBM3",),
        81559,
        "9.0",
        989.4,
        989.4,
        3350.0,
        "sxm",
        True,
        5,
        700.0,
        1980,
        5120,
        nvlink_links=18,
        int8_tops=1979.0,
    ),
    GpuModel(
        "h100-pcie",
        "NVIDIA H100 PCIe",
        ("NVIDIA H100 PCIe",),
        81559,
        "9.0",
        756.0,
        756.0,
        2000.0,
        "pcie",
        True,
        5,
        350.0,
        1755,
        5120,
        int8_tops=1513.0,
    ),
    # Ampere datacenter
    GpuModel(
        "a100-80gb",
        "NVIDIA A100 80GB SXM",
        ("NVIDIA A100-SXM4-80GB",),
        81920,
        "8.0",
        312.0,
        312.0,
        2039.0,
        "sxm",
        True,
        4,
        400.0,
        1410,
        5120,
        nvlink_links=12,
        int8_tops=624.0,
    ),
    GpuModel(
        "a100-80gb-pcie",
        "NVIDIA A100 80GB PCIe",
        ("NVIDIA A100 80GB PCIe",),
        81920,
        "8.0",
        312.0,
        312.0,
        1935.0,
        "pcie",
        True,
        4,
        300.0,
        1410,
        5120,
        int8_tops=624.0,
    ),
    GpuModel(
        "a100-40gb",
        "NVIDIA A100 40GB SXM",
        ("NVIDIA A100-SXM4-40GB",),
        40960,
        "8.0",
        312.0,
        312.0,
        1555.0,
        "sxm",
        True,
        4,
        400.0,
        1410,
        5120,
        nvlink_links=12,
        int8_tops=624.0,
    ),
    GpuModel(
        "a100-40gb-pcie",
        "NVIDIA A100 40GB PCIe",
        ("NVIDIA A100-PCIE-40GB",),
        40960,
        "8.0",
        312.0,
        312.0,
        1555.0,
        "pcie",
        True,
        4,
        250.0,
        1410,
        5120,
        int8_tops=624.0,
    ),
    GpuModel(
        "a10",
        "NVIDIA A10",
        ("NVIDIA A10",),
        23028,
        "8.6",
        125.0,
        125.0,
        600.0,
        "pcie",
        False,
        4,
        150.0,
        1695,
        384,
        int8_tops=250.0,
    ),
    # Ada datacenter and workstation
    GpuModel(
        "l40s",
        "NVIDIA L40S",
        ("NVIDIA L40S",),
        46068,
        "8.9",
        362.1,
        362.1,
        864.0,
        "pcie",
        False,
        4,
        350.0,
        2520,
        384,
        int8_tops=733.0,
    ),
    GpuModel(
        "l4", "NVIDIA L4", ("NVIDIA L4",), 23034, "8.9", 121.0, 121.0, 300.0, "pcie", False, 4, 72.0, 2040, 192, int8_tops=242.0
    ),
    GpuModel(
        "rtx-6000-ada",
        "NVIDIA RTX 6000 Ada Generation",
        ("NVIDIA RTX 6000 Ada Generation",),
        49140,
        "8.9",
        364.2,
        364.2,
        960.0,
        "pcie",
        False,
        4,
        300.0,
        2505,
        384,
        int8_tops=728.5,
    ),
    GpuModel(
        "rtx-a6000",
        "NVIDIA RTX A6000",
        ("NVIDIA RTX A6000",),
        49140,
        "8.6",
        154.8,
        154.8,
        768.0,
        "pcie",
        True,
        4,
        300.0,
        1800,
        384,
        int8_tops=309.7,
    ),
    # Volta and Turing: no BF16. V100 is listed as the SXM2 32GB module, the common cloud/HGX variant.
    GpuModel(
        "v100-32gb",
        "NVIDIA Tesla V100 SXM2 32GB",
        ("Tesla V100-SXM2-32GB",),
        32768,
        "7.0",
        125.0,
        None,
        900.0,
        "sxm",
        True,
        3,
        300.0,
        1530,
        4096,
        nvlink_links=6,
    ),
    GpuModel(
        "t4", "NVIDIA T4", ("Tesla T4",), 15360, "7.5", 65.0, None, 320.0, "pcie", False, 3, 70.0, 1590, 256, int8_tops=130.0
    ),
    # GeForce (FP32-accumulate tensor figures, see the module docstring)
    GpuModel(
        "rtx-4090",
        "NVIDIA GeForce RTX 4090",
        ("NVIDIA GeForce RTX 4090",),
        24564,
        "8.9",
        165.2,
        165.2,
        1008.0,
        "pcie",
        False,
        4,
        450.0,
        2520,
        384,
        int8_tops=660.6,
    ),
    GpuModel(
        "rtx-4080",
        "NVIDIA GeForce RTX 4080",
        ("NVIDIA GeForce RTX 4080",),
        16376,
        "8.9",
        97.5,
        97.5,
        716.8,
        "pcie",
        False,
        4,
        320.0,
        2505,
        256,
        int8_tops=389.9,
    ),
    GpuModel(
        "rtx-3090",
        "NVIDIA GeForce RTX 3090",
        ("NVIDIA GeForce RTX 3090",),
        24576,
        "8.6",
        35.6,
        35.6,
        936.0,
        "pcie",
        True,
        4,
        350.0,
        1695,
        384,
        int8_tops=284.7,
    ),
    # The RTX 3080 shipped with 10 GB and 12 GB under the same NVML name: memory tells them apart.
    GpuModel(
        "rtx-3080",
        "NVIDIA GeForce RTX 3080",
        ("NVIDIA GeForce RTX 3080",),
        10240,
        "8.6",
        29.8,
        29.8,
        760.0,
        "pcie",
        False,
        4,
        320.0,
        1710,
        320,
        int8_tops=238.0,
    ),
    GpuModel(
        "rtx-3080-12gb",
        "NVIDIA GeForce RTX 3080 12GB",
        ("NVIDIA GeForce RTX 3080",),
        12288,
        "8.6",
        30.6,
        30.6,
        912.0,
        "pcie",
        False,
        4,
        350.0,
        1710,
        384,
        int8_tops=243.6,
    ),
)

# AMD Instinct and Radeon: AMD's spec-sheet dense matrix figures (FP16 = BF16 on these), names as amd-smi reports them.
_AMD_MODELS = (
    GpuModel(
        "mi325x",
        "AMD Instinct MI325X",
        ("AMD Instinct MI325X",),
        262128,
        "",
        1307.4,
        1307.4,
        6000.0,
        "oam",
        False,
        5,
        1000.0,
        2100,
        8192,
        vendor="amd",
        gfx_target="gfx942",
    ),
    GpuModel(
        "mi300x",
        "AMD Instinct MI300X",
        ("AMD Instinct MI300X",),
        196592,
        "",
        1307.4,
        1307.4,
        5300.0,
        "oam",
        False,
        5,
        750.0,
        2100,
        8192,
        vendor="amd",
        gfx_target="gfx942",
    ),
    # One GCD of the two an MI250X package has (the module docstring): 383 TFLOPS, 3.2 TB/s and 560 W halved.
    GpuModel(
        "mi250x",
        "AMD Instinct MI250X (one GCD)",
        ("AMD Instinct MI250X", "AMD Instinct MI250X/MI250"),
        65520,
        "",
        191.5,
        191.5,
        1638.4,
        "oam",
        False,
        4,
        280.0,
        1700,
        4096,
        vendor="amd",
        gfx_target="gfx90a",
    ),
    GpuModel(
        "mi210",
        "AMD Instinct MI210",
        ("AMD Instinct MI210",),
        65520,
        "",
        181.0,
        181.0,
        1638.4,
        "pcie",
        False,
        4,
        300.0,
        1700,
        4096,
        vendor="amd",
        gfx_target="gfx90a",
    ),
    GpuModel(
        "w7900",
        "AMD Radeon PRO W7900",
        ("AMD Radeon PRO W7900",),
        49136,
        "",
        122.6,
        122.6,
        864.0,
        "pcie",
        False,
        4,
        295.0,
        2495,
        384,
        vendor="amd",
        gfx_target="gfx1100",
    ),
    GpuModel(
        "rx-7900-xtx",
        "AMD Radeon RX 7900 XTX",
        ("AMD Radeon RX 7900 XTX",),
        24560,
        "",
        122.8,
        122.8,
        960.0,
        "pcie",
        False,
        4,
        355.0,
        2500,
        384,
        vendor="amd",
        gfx_target="gfx1100",
    ),
)
_MODELS = _NVIDIA_MODELS + _AMD_MODELS

CATALOG: Mapping[str, GpuModel] = MappingProxyType({m.key: m for m in _MODELS})

ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "h200-sxm": "h200",
        "h100": "h100-sxm",
        "a100": "a100-80gb",
        "a100-sxm": "a100-80gb",
        "a100-pcie": "a100-80gb-pcie",
        "a6000": "rtx-a6000",
        "6000-ada": "rtx-6000-ada",
        "v100": "v100-32gb",
        "4090": "rtx-4090",
        "4080": "rtx-4080",
        "3090": "rtx-3090",
        "3080": "rtx-3080",
        "3080-12gb": "rtx-3080-12gb",
        "7900xtx": "rx-7900-xtx",
        "radeon-pro-w7900": "w7900",
    }
)


def _squash(name: str) -> str:
    """ "RTX 4090", "rtx_4090" and "rtx-4090" are the same thing to a person typing."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_TYPED_NAMES: Mapping[str, str] = {_squash(k): k for k in CATALOG} | {_squash(a): k for a, k in ALIASES.items()}


def resolve_alias(name: str) -> GpuModel:
    """The catalog model for a key or a short name a person types ("h100", "RTX 4090"); case-insensitive."""
    key = _TYPED_NAMES.get(_squash(name))
    if key is None:
        known = ", ".join(sorted(set(CATALOG) | set(ALIASES)))
        raise UnknownGpuModel(f"unknown GPU model {name!r}; known models and aliases: {known}")
    return CATALOG[key]


# Vendor words carry no model information and come and go between driver versions ("Tesla T4").
_NOISE_TOKENS = frozenset({"nvidia", "geforce", "tesla", "amd", "ati", "instinct", "radeon"})


def _tokens(name: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z0-9]+", name.lower())) - _NOISE_TOKENS


_MODEL_TOKENS: tuple[tuple[GpuModel, frozenset[str]], ...] = tuple(
    (model, _tokens(n)) for model in _MODELS for n in model.nvml_names
)


def _candidates(reported: frozenset[str]) -> list[GpuModel]:
    """Models the reported name can mean, most specific evidence first.

    Tokens, not substrings: "rtx4070" contains "t4", but {"rtx", "4070"} does not contain {"t4"}.
    """
    exact = [m for m, toks in _MODEL_TOKENS if toks == reported]
    if exact:
        return exact
    # The reported name says more than a catalog name ("RTX 4090 D"): prefer the longest catalog name it contains.
    longer = [(len(toks), m) for m, toks in _MODEL_TOKENS if toks and toks < reported]
    if longer:
        best = max(n for n, _ in longer)
        return [m for n, m in longer if n == best]
    # The reported name says less ("NVIDIA A100"): every variant it could be; memory decides below.
    if any(ch.isdigit() for tok in reported for ch in tok):
        return [m for m, toks in _MODEL_TOKENS if reported < toks]
    return []


def match_model(info: GpuInfo) -> GpuModel | None:
    """The catalog model a GPU claims to be, by its NVML name; variants sharing a name are told apart by memory."""
    candidates = list(dict.fromkeys(_candidates(_tokens(info.name))))
    if not candidates:
        return None
    reported = max(info.memory_total_mib, 0)
    # Closest memory wins; on a tie the slower variant, so an ambiguous name is never tiered up.
    return min(candidates, key=lambda m: (abs(m.memory_mib - reported) / m.memory_mib, m.fp16_tflops))


def reference_gpu_info(model: GpuModel, *, index: int = 0, uuid: str = "", pci_bus_id: str = "") -> GpuInfo:
    """What a healthy card of ``model`` reports through NVML: the simulator's output, the tier examples' input."""
    return GpuInfo(
        index=index,
        uuid=uuid,
        name=model.nvml_names[0],
        pci_bus_id=pci_bus_id,
        memory_total_mib=model.memory_mib,
        compute_capability=model.compute_capability,
        pcie_gen=model.pcie_gen,
        pcie_width=16,
        nvlinks=tuple(NvLink(link=i, active=True) for i in range(model.nvlink_links)),
        clock_sm_max_mhz=model.sm_clock_max_mhz,
        power_limit_w=model.tdp_w,
        memory_bus_width_bits=model.memory_bus_width_bits,
        vendor=model.vendor,
    )


# -- what a benchmark should measure on a healthy card --------------------------------------------------------------


@dataclass(frozen=True)
class ExpectedFigures:
    """What a healthy card of a model measures (not its spec sheet): what the tier policy's fractions multiply.

    Calibrated from real runs where a GPU machine was lent (CALIBRATED); otherwise the spec-sheet figure times what a
    good GEMM and a copy kernel typically reach (TENSOR_EFFICIENCY, COPY_EFFICIENCY)."""

    tensor_tflops: float  # dense FP16 or BF16 matrix products, the better of the two
    memory_bandwidth_gbs: float  # device copy, read + write
    h2d_gbs: float  # pinned host-to-device over the card's PCIe generation (x16)
    # The verification challenge's rounds form (common/challenge.py) on the agent's own kernel: what its deadline is
    # sized by. 0.0 in CALIBRATED means "not measured yet": challenge_peak(model) * CHALLENGE_EFFICIENCY stands in.
    challenge_tflops: float = 0.0


TENSOR_EFFICIENCY = 0.8  # a good GEMM reaches 70-85% of dense peak
# AMD's cards, where no benchmark of this project has run yet: public hipBLASLt BF16 GEMM figures on an MI300X reach
# about 55-65% of its dense peak, so the spec sheet times NVIDIA's efficiency would expect too much of a healthy card.
TENSOR_EFFICIENCY_BY_VENDOR: Mapping[str, float] = MappingProxyType({"amd": 0.6})
# The challenge's rounds-form kernel (agent/benchmark/cuda.py: mma.sync products of 8-bit inputs it generates, and a
# weighted sum of each product) against the dense peak of the path it takes (challenge_peak). NOT MEASURED: no GPU
# was lent since the kernel was written. A guess of what a simple tensor-core GEMM fed from L2, without shared-memory
# staging, reaches (10-35 % of peak): too high fails honest cards, too low lets a lesser card through;
# scripts/gpu-smoke --benchmark-only prints the measured rate to calibrate it (docs/verification.md).
CHALLENGE_EFFICIENCY = 0.2
COPY_EFFICIENCY = 0.85  # a copy kernel reaches 80-90% of peak bandwidth
_PCIE_X16_GBS = {3: 12.0, 4: 25.0, 5: 50.0, 6: 100.0}  # what pinned copies reach per generation, about
# What the agent's own benchmark (agent/benchmark/cuda.py: an mma.sync BF16/FP16 loop, a float4 copy kernel, pinned
# driver copies) measured on lent machines, 2026-11-27, the median of its runs: an H100 80GB HBM3 (driver 580.159.04,
# four runs) 622-639 TFLOP/s BF16, 2,707-2,821 GB/s device copy, 54-55 GB/s pinned H2D (one run at 43.5 during a
# grid's start-up); an H200 (three runs) 626-636 TFLOP/s BF16, 3,825-3,897 GB/s, 55 GB/s. PyTorch's cuBLAS reaches
# ~800 TFLOP/s BF16 on both (wgmma), which this benchmark's kernel does not use: the figures are what a healthy
# card gives *this* benchmark, which is what the fractions must be applied to.
CALIBRATED: Mapping[str, ExpectedFigures] = MappingProxyType(
    {
        "h100-sxm": ExpectedFigures(tensor_tflops=630.0, memory_bandwidth_gbs=2770.0, h2d_gbs=54.5),
        "h200": ExpectedFigures(tensor_tflops=635.0, memory_bandwidth_gbs=3890.0, h2d_gbs=55.0),
    }
)


def compute_capability(model: GpuModel) -> tuple[int, int]:
    """(major, minor) of an NVIDIA model; (0, 0) for a card without one (AMD's)."""
    major, _, minor = model.compute_capability.partition(".")
    return (int(major), int(minor or 0)) if major.isdigit() else (0, 0)


def challenge_peak(model: GpuModel) -> float:
    """The dense peak (TOPS or TFLOP/s) of the tensor path the rounds form's kernel takes on ``model``: INT8 on compute
    capability 8.0 and later (its 8-bit inputs are exact there, and no exact path of the card is faster), FP16 before
    (Turing's kernel), the better tensor figure where the model has no INT8 figure (AMD's: never challenged yet)."""
    if compute_capability(model) >= (8, 0) and model.int8_tops > 0:
        return model.int8_tops
    return max(model.fp16_tflops, model.bf16_tflops or 0.0)


def expected_figures(model: GpuModel) -> ExpectedFigures:
    """What a healthy ``model`` measures: calibrated where a real card was run, else derived from its spec sheet."""
    figures = CALIBRATED.get(model.key)
    if figures is None:
        tensor = max(model.fp16_tflops, model.bf16_tflops or 0.0)
        figures = ExpectedFigures(
            tensor_tflops=round(tensor * TENSOR_EFFICIENCY_BY_VENDOR.get(model.vendor, TENSOR_EFFICIENCY), 1),
            memory_bandwidth_gbs=round(model.memory_bandwidth_gbs * COPY_EFFICIENCY, 1),
            h2d_gbs=_PCIE_X16_GBS.get(model.pcie_gen, 12.0),
        )
    if figures.challenge_tflops <= 0:
        figures = replace(figures, challenge_tflops=round(challenge_peak(model) * CHALLENGE_EFFICIENCY, 1))
    return figures

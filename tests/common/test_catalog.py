"""The GPU model catalog: identification by NVML name, variants told apart, names a person types."""

import msgspec
import pytest

from common.catalog import (
    ALIASES,
    CATALOG,
    GpuModel,
    UnknownGpuModel,
    expected_figures,
    match_model,
    reference_gpu_info,
    resolve_alias,
)
from common.inventory import GpuInfo

REQUIRED = (
    "h200",
    "h100-sxm",
    "h100-pcie",
    "a100-80gb",
    "a100-40gb",
    "l40s",
    "rtx-6000-ada",
    "rtx-a6000",
    "a10",
    "l4",
    "v100-32gb",
    "t4",
    "rtx-4090",
    "rtx-4080",
    "rtx-3090",
    "rtx-3080",
)


def matched(info: GpuInfo) -> GpuModel:
    model = match_model(info)
    assert model is not None, f"{info.name} matched no model"
    return model


def gpu(name: str, memory_mib: int) -> GpuInfo:
    return GpuInfo(
        index=0, uuid="GPU-test", name=name, pci_bus_id="00000000:10:00.0", memory_total_mib=memory_mib, compute_capability="8.0"
    )


def test_catalog_lists_the_models_the_marketplace_sells():
    assert set(REQUIRED) <= set(CATALOG)


@pytest.mark.parametrize("model", CATALOG.values(), ids=lambda m: m.key)
def test_every_catalog_model_is_matched_from_its_own_nvml_name(model: GpuModel):
    for name in model.nvml_names:
        assert match_model(gpu(name, model.memory_mib)) is model


@pytest.mark.parametrize("model", CATALOG.values(), ids=lambda m: m.key)
def test_catalog_figures_are_consistent(model: GpuModel):
    assert model.memory_mib > 0 and model.fp16_tflops > 0 and model.memory_bandwidth_gbs > 0
    assert model.bf16_tflops is None or model.bf16_tflops > 0
    assert model.nvlink or model.nvlink_links == 0
    if model.vendor == "amd":
        # No CUDA compute capability (a CUDA minimum never matches), the ISA target instead; BF16 on every one listed.
        assert model.form_factor in {"oam", "pcie"} and not model.nvlink
        assert model.compute_capability == "" and model.gfx_target.startswith("gfx") and model.bf16_tflops
        return
    assert model.vendor == "nvidia" and model.gfx_target == ""
    assert model.form_factor in {"sxm", "pcie"}
    major, minor = (int(part) for part in model.compute_capability.split("."))
    # Volta and Turing have no BF16 tensor cores; everything from Ampere on has.
    assert (model.bf16_tflops is None) == ((major, minor) < (8, 0))


def test_a100_40gb_and_80gb_are_told_apart_by_name_and_by_memory():
    assert matched(gpu("NVIDIA A100-SXM4-80GB", 81920)).key == "a100-80gb"
    assert matched(gpu("NVIDIA A100-SXM4-40GB", 40536)).key == "a100-40gb"
    # A name without the memory size leaves memory to decide.
    assert matched(gpu("NVIDIA A100", 40960)).key.startswith("a100-40gb")
    assert matched(gpu("NVIDIA A100", 81920)).key.startswith("a100-80gb")


def test_h100_sxm_and_pcie_are_told_apart_by_pcie_in_the_name():
    assert matched(gpu("NVIDIA H100 80GB HBM3", 81559)).key == "h100-sxm"
    assert matched(gpu("NVIDIA H100 PCIe", 81559)).key == "h100-pcie"


def test_an_ambiguous_name_matches_the_slower_variant_so_it_is_never_tiered_up():
    assert matched(gpu("NVIDIA H100", 81559)).key == "h100-pcie"


def test_variants_sharing_one_nvml_name_are_told_apart_by_memory():
    assert matched(gpu("NVIDIA GeForce RTX 3080", 10240)).key == "rtx-3080"
    assert matched(gpu("NVIDIA GeForce RTX 3080", 12288)).key == "rtx-3080-12gb"


def test_matching_ignores_case_and_vendor_words():
    assert matched(gpu("nvidia geforce rtx 4090", 24564)).key == "rtx-4090"
    assert matched(gpu("NVIDIA T4", 15360)).key == "t4"  # NVML says "Tesla T4"


def test_a_name_that_says_more_than_the_catalog_matches_the_model_it_contains():
    assert matched(gpu("NVIDIA GeForce RTX 4090 D", 24564)).key == "rtx-4090"


def test_names_match_by_whole_words_not_substrings():
    # "rtx4070" contains "t4", "a100" starts with "a10": neither is that model.
    assert match_model(gpu("NVIDIA GeForce RTX 4070", 12282)) is None
    assert match_model(gpu("NVIDIA A10G", 23028)) is None


@pytest.mark.parametrize(
    "name", ["Tesla V100-PCIE-16GB", "AMD Instinct MI100", "AMD Radeon Graphics", "NVIDIA", "", "GeForce RTX"]
)
def test_unknown_names_match_nothing(name: str):
    assert match_model(gpu(name, 16384)) is None


@pytest.mark.parametrize(
    ("typed", "key"),
    [
        ("h100", "h100-sxm"),
        ("H200", "h200"),
        ("a100", "a100-80gb"),
        ("4090", "rtx-4090"),
        ("rtx4090", "rtx-4090"),
        ("RTX 4090", "rtx-4090"),
        ("rtx_3080", "rtx-3080"),
        ("v100", "v100-32gb"),
        ("T4", "t4"),
        ("h100-pcie", "h100-pcie"),
        ("A100 40GB", "a100-40gb"),
        ("a6000", "rtx-a6000"),
        ("L40S", "l40s"),
    ],
)
def test_aliases_resolve_case_insensitively(typed: str, key: str):
    assert resolve_alias(typed).key == key


def test_every_alias_points_at_a_catalog_model():
    assert set(ALIASES.values()) <= set(CATALOG)
    for key in CATALOG:
        assert resolve_alias(key).key == key


def test_an_unknown_alias_is_a_key_error_that_lists_known_names():
    with pytest.raises(KeyError) as caught:
        resolve_alias("h300")
    assert isinstance(caught.value, UnknownGpuModel)
    message = str(caught.value)
    assert "'h300'" in message and "h100" in message and "rtx-4090" in message and not message.startswith('"')


def test_reference_info_reports_what_a_healthy_card_reports():
    h100 = reference_gpu_info(CATALOG["h100-sxm"], index=3, uuid="GPU-x", pci_bus_id="00000000:13:00.0")
    assert (h100.index, h100.uuid, h100.name, h100.memory_total_mib) == (3, "GPU-x", "NVIDIA H100 80GB HBM3", 81559)
    assert h100.pcie_gen == 5 and len(h100.nvlinks) == 18 and all(link.active for link in h100.nvlinks)
    assert reference_gpu_info(CATALOG["rtx-4090"]).nvlinks == ()
    msgspec.json.decode(msgspec.json.encode(h100), type=GpuInfo)  # travels on the wire as is


@pytest.mark.parametrize(
    ("reported", "key"),
    [
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI325X", "mi325x"),
        ("AMD Instinct MI250X/MI250", "mi250x"),  # amd-smi's name for one GCD of an MI250X
        ("AMD INSTINCT MI250X", "mi250x"),
        ("AMD Instinct MI210", "mi210"),
        ("AMD Radeon PRO W7900", "w7900"),
        ("Radeon RX 7900 XTX", "rx-7900-xtx"),  # rocm-smi without the vendor's word
    ],
)
def test_amd_cards_match_by_the_names_amd_smi_and_rocm_smi_report(reported: str, key: str):
    model = CATALOG[key]
    assert matched(gpu(reported, model.memory_mib)).key == key and model.vendor == "amd"


def test_amd_cards_expect_less_of_their_spec_sheet_until_a_benchmark_measures_them():
    mi300x = expected_figures(CATALOG["mi300x"])
    assert mi300x.tensor_tflops == round(1307.4 * 0.6, 1)  # public hipBLASLt GEMMs reach ~55-65% of dense peak
    assert expected_figures(CATALOG["a100-80gb"]).tensor_tflops == round(312.0 * 0.8, 1)

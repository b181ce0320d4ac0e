"""Tier classification by the policy file: identify, verify against the catalog, then tier."""

from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.catalog import CATALOG, reference_gpu_info
from common.errors import ConfigError
from common.inventory import GpuInfo, HostInfo, NvLink
from master import tiers
from master.tiers import Classification, TierPolicy, TierRule, classify, describe_tiers

POLICY = TierPolicy.load()


def card(key: str, **changes) -> GpuInfo:
    """What a healthy card of catalog model ``key`` reports, with ``changes`` applied."""
    return msgspec.structs.replace(reference_gpu_info(CATALOG[key], uuid=f"GPU-{key}"), **changes)


def host(down: float | None = None, up: float | None = None) -> HostInfo:
    return HostInfo(
        hostname="h",
        cpu_model="x",
        cpu_cores=8,
        ram_mib=65536,
        disk_total_gib=100,
        disk_free_gib=50,
        os="linux",
        kernel="6.1",
        bandwidth_mbps_down=down,
        bandwidth_mbps_up=up,
    )


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tiers.toml"
    path.write_text(text)
    return path


# -- the default policy's intent ----------------------------------------------------------------


def test_default_policy_orders_tiers_best_first():
    assert [t.name for t in POLICY.tiers] == [
        "flagship",
        "datacenter",
        "inference",
        "consumer",
        "entry",
        "amd-flagship",
        "amd-datacenter",
        "amd-workstation",
    ]


@pytest.mark.parametrize("key", ["h200", "h100-sxm", "h100-pcie"])
def test_hopper_gpus_are_in_the_top_tier(key: str):
    result = classify(card(key), POLICY)
    assert result == Classification(key, "flagship", (), result.reasons) and result.tier == POLICY.tiers[0].name


@pytest.mark.parametrize(
    ("key", "tier"),
    [
        ("mi300x", "amd-flagship"),
        ("mi325x", "amd-flagship"),
        ("mi250x", "amd-datacenter"),
        ("mi210", "amd-datacenter"),
        ("w7900", "amd-workstation"),
        ("rx-7900-xtx", "amd-workstation"),
    ],
)
def test_amd_cards_are_sold_in_amd_tiers_never_in_a_cuda_one(key: str, tier: str):
    result = classify(card(key), POLICY)
    assert result.tier == tier and result.flags == ()
    assert any("vendor amd is not nvidia" in reason for reason in result.reasons)  # the NVIDIA tiers say why not


def test_a_policy_naming_no_vendor_still_keeps_a_card_without_cuda_out_of_a_cuda_tier(tmp_path):
    policy = TierPolicy.load(write(tmp_path, '[[tier]]\nname = "cuda"\nmin_vram_gib = 70\nmin_compute_capability = "8.0"\n'))
    result = classify(card("mi300x"), policy)
    assert result.tier is None and "no CUDA compute capability" in result.reasons[0]
    assert classify(card("h100-sxm"), policy).tier == "cuda"


def test_a_tier_may_name_its_vendor_and_only_a_known_one(tmp_path):
    either = TierPolicy.load(write(tmp_path, '[[tier]]\nname = "big"\nmin_vram_gib = 70\n'))
    assert classify(card("mi300x"), either).tier == "big" and classify(card("h100-sxm"), either).tier == "big"
    amd = TierPolicy.load(write(tmp_path, '[[tier]]\nname = "big"\nvendor = "amd"\nmin_vram_gib = 70\n'))
    assert classify(card("mi300x"), amd).tier == "big" and classify(card("h100-sxm"), amd).tier is None
    with pytest.raises(ConfigError, match="vendor must be one of nvidia, amd"):
        TierPolicy.load(write(tmp_path, '[[tier]]\nname = "big"\nvendor = "3dfx"\n'))


def test_a_card_claiming_another_vendors_model_is_flagged():
    result = classify(card("mi300x", vendor="nvidia"), POLICY)
    assert result.tier is None and result.flags == ("vendor_mismatch",)


@pytest.mark.parametrize("key", ["a100-80gb", "a100-40gb", "l40s", "rtx-6000-ada", "rtx-a6000"])
def test_40_to_80_gib_training_gpus_are_datacenter(key: str):
    assert classify(card(key), POLICY).tier == "datacenter"


@pytest.mark.parametrize("key", ["a10", "l4", "v100-32gb", "rtx-4090"])
def test_24_gib_class_gpus_with_100_tflops_are_inference(key: str):
    assert classify(card(key), POLICY).tier == "inference"


@pytest.mark.parametrize("key", ["rtx-3080", "rtx-3090", "rtx-4080"])
def test_high_end_consumer_cards_are_consumer(key: str):
    assert classify(card(key), POLICY).tier == "consumer"


def test_a_t4_is_entry():
    assert classify(card("t4"), POLICY).tier == "entry"


def test_every_catalog_model_gets_a_tier_under_the_default_policy():
    for key in CATALOG:
        result = classify(card(key), POLICY)
        assert result.tier is not None and result.flags == (), (key, result)


def test_reasons_explain_why_higher_tiers_were_missed():
    result = classify(card("rtx-3080"), POLICY)
    assert any("not tier 'flagship'" in r and "VRAM" in r for r in result.reasons)
    assert "consumer" in result.reasons[-1]


# -- verification: flagged, not tiered up -------------------------------------------------------


def test_an_h100_name_with_24_gib_of_memory_is_flagged_vram_mismatch_and_not_tiered():
    result = classify(card("h100-sxm", memory_total_mib=24 * 1024), POLICY)
    assert result.model == "h100-sxm" and result.tier is None
    assert result.flags == ("vram_mismatch",)
    assert "24576 MiB" in result.reasons[0]


def test_memory_within_tolerance_is_not_flagged():
    # L40S-like GDDR6 cards with ECC on reserve 1/16 of their memory.
    a6000 = CATALOG["rtx-a6000"].memory_mib
    assert classify(card("rtx-a6000", memory_total_mib=a6000 * 15 // 16), POLICY).flags == ()


def test_a_compute_capability_different_from_the_claimed_model_is_flagged():
    result = classify(card("h100-sxm", compute_capability="8.6"), POLICY)
    assert result.flags == ("compute_capability_mismatch",) and result.tier is None


def test_a_malformed_compute_capability_is_flagged():
    assert classify(card("t4", compute_capability="seven"), POLICY).flags == ("compute_capability_mismatch",)


def test_active_nvlinks_on_a_model_without_nvlink_are_flagged():
    result = classify(card("rtx-4090", nvlinks=(NvLink(link=0, active=True),)), POLICY)
    assert result.flags == ("nvlink_mismatch",) and result.tier is None


def test_measured_throughput_far_below_catalog_is_flagged():
    result = classify(card("h100-sxm"), POLICY, measured={"fp16_tflops": 300.0})
    assert result.flags == ("throughput_below_catalog",) and result.tier is None
    assert "30%" in result.reasons[0]


def test_measured_bandwidth_far_below_catalog_is_flagged():
    result = classify(card("a100-80gb"), POLICY, measured={"memory_bandwidth_gbs": 900.0})
    assert result.flags == ("bandwidth_below_catalog",) and result.tier is None


def test_healthy_measurements_keep_the_tier():
    # A good GEMM reaches ~75% of dense peak, a copy kernel ~90% of bandwidth.
    measured = {"fp16_tflops": 0.75 * 989.4, "memory_bandwidth_gbs": 0.9 * 3350}
    assert classify(card("h100-sxm"), POLICY, measured=measured).tier == "flagship"


def test_nonsense_measurements_are_flagged():
    for value in (float("nan"), float("inf"), -1.0):
        assert classify(card("t4"), POLICY, measured={"fp16_tflops": value}).flags == ("invalid_measurement",)


def test_several_contradictions_are_all_reported():
    result = classify(card("h100-sxm", memory_total_mib=8192, compute_capability="7.5"), POLICY, measured={"fp16_tflops": 10.0})
    assert set(result.flags) == {"vram_mismatch", "compute_capability_mismatch", "throughput_below_catalog"}
    assert len(result.reasons) == 3 and result.tier is None


def test_an_unknown_name_is_flagged_and_not_tiered():
    result = classify(card("h100-sxm", name="ACME Hyper 9000"), POLICY)
    assert result == Classification("", None, ("unknown_model",), result.reasons)
    assert "ACME Hyper 9000" in result.reasons[0]


# -- host facts ---------------------------------------------------------------------------------


def test_network_criterion_applies_once_bandwidth_is_measured():
    policy = TierPolicy(tiers=(TierRule(name="fast", min_network_mbps=1000), TierRule(name="any")))
    assert classify(card("t4"), policy).tier == "fast"  # not measured yet
    assert classify(card("t4"), policy, host=host()).tier == "fast"
    assert classify(card("t4"), policy, host=host(down=5000, up=2000)).tier == "fast"
    assert classify(card("t4"), policy, host=host(down=5000, up=100)).tier == "any"  # the slower direction counts


def test_pcie_and_nvlink_criteria_use_the_reported_link():
    policy = TierPolicy(
        tiers=(TierRule(name="fabric", require_nvlink=True, min_pcie_gen=5, min_pcie_width=16), TierRule(name="any"))
    )
    assert classify(card("h100-sxm"), policy).tier == "fabric"
    assert classify(card("h100-sxm", pcie_gen=4), policy).tier == "any"  # an H100 in a Gen4 slot
    assert classify(card("h100-sxm", pcie_width=8), policy).tier == "any"
    assert classify(card("h100-sxm", nvlinks=()), policy).tier == "any"
    assert classify(card("h100-sxm", pcie_gen=None), policy).tier == "fabric"  # unreported: the catalog's gen


def test_bf16_criterion_is_never_met_by_models_without_bf16():
    policy = TierPolicy(tiers=(TierRule(name="bf16", min_bf16_tflops=1), TierRule(name="any")))
    assert classify(card("v100-32gb"), policy).tier == "any"
    assert classify(card("a10"), policy).tier == "bf16"


def test_a_gpu_meeting_no_tier_gets_none_without_flags():
    policy = TierPolicy(tiers=(TierRule(name="big", min_vram_gib=100),))
    result = classify(card("t4"), policy)
    assert result.tier is None and result.flags == () and "no tier" in result.reasons[-1]


# -- the policy file ----------------------------------------------------------------------------


def test_a_custom_policy_file_changes_the_result(tmp_path):
    path = write(
        tmp_path,
        """
[[tier]]
name = "gold"
description = "anything with 12 GiB"
min_vram_gib = 12

[[tier]]
name = "tin"
""",
    )
    policy = TierPolicy.load(path)
    assert classify(card("t4"), policy).tier == "gold"
    assert classify(card("rtx-3080"), policy).tier == "tin"
    assert policy.vram_tolerance == TierPolicy(tiers=policy.tiers).vram_tolerance  # defaults without [verification]


def test_a_custom_vram_tolerance_is_applied(tmp_path):
    path = write(tmp_path, '[[tier]]\nname = "any"\n[verification]\nvram_tolerance = 0.5\n')
    assert classify(card("h100-sxm", memory_total_mib=50000), TierPolicy.load(path)).tier == "any"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[[tier]]\nname = "x"\nmin_vramgib = 3\n', "min_vramgib"),
        ('[[tier]]\nname = "x"\nmin_vram_gib = "lots"\n', "min_vram_gib"),
        ('[[tier]]\nname = "x"\nmin_vram_gib = -1\n', "min_vram_gib"),
        ('[[tier]]\nname = "x"\nmin_compute_capability = 8\n', "min_compute_capability"),
        ('[[tier]]\nname = "x"\nmin_compute_capability = "eight"\n', "'eight'"),
        ('[[tier]]\nname = "x"\nmin_pcie_gen = 4.5\n', "min_pcie_gen"),
        ('[[tier]]\nname = "x"\nrequire_nvlink = "yes"\n', "require_nvlink"),
        ("[[tier]]\nmin_vram_gib = 1\n", "name"),
        ('[[tier]]\nname = "x"\n[[tier]]\nname = "x"\n', "repeated: x"),
        ("[verification]\nvram_tolerance = 0.1\n", "[[tier]]"),
        ('[[tier]]\nname = "x"\n[verification]\nvram_tolerance = 2\n', "vram_tolerance"),
        ('[[tier]]\nname = "x"\n[verification]\ntolerance = 0.1\n', "tolerance"),
        ('[[tier]]\nname = "x"\n[extras]\n', "extras"),
        ('tier = "x"\n', "[[tier]]"),
    ],
)
def test_an_invalid_policy_is_a_config_error_naming_the_problem(tmp_path, text: str, named: str):
    with pytest.raises(ConfigError) as caught:
        TierPolicy.load(write(tmp_path, text))
    assert named in str(caught.value) and str(tmp_path) in str(caught.value)


def test_a_policy_that_is_not_toml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        TierPolicy.load(write(tmp_path, "[[tier]\nname = \n"))


def test_a_missing_policy_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        TierPolicy.load(tmp_path / "absent.toml")


def test_unknown_tier_key_error_names_the_tier(tmp_path):
    with pytest.raises(ConfigError, match="tier 'gold': unknown key 'speed'"):
        TierPolicy.load(write(tmp_path, '[[tier]]\nname = "gold"\nspeed = 3\n'))


# -- describing tiers ---------------------------------------------------------------------------


def test_describe_tiers_lists_criteria_and_example_models_in_policy_order():
    described = describe_tiers(POLICY)
    assert [d["name"] for d in described] == [t.name for t in POLICY.tiers]
    flagship = described[0]
    assert flagship["criteria"]["min_vram_gib"] == 70 and "require_nvlink" not in flagship["criteria"]
    assert set(flagship["examples"]) == {"h200", "h100-sxm", "h100-pcie"}
    entry = next(d for d in described if d["name"] == "entry")
    assert "t4" in entry["examples"] and all(d["description"] for d in described)
    every_example = [key for d in described for key in d["examples"]]
    assert sorted(every_example) == sorted(CATALOG)  # each model appears in exactly one tier


# -- properties ---------------------------------------------------------------------------------

_any_float = st.floats(allow_nan=True, allow_infinity=True)
_names = st.one_of(st.text(max_size=40), st.sampled_from([n for m in CATALOG.values() for n in m.nvml_names]))
_ccs = st.one_of(st.text(max_size=12), st.sampled_from(["7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]))
_gpu_infos = st.builds(
    GpuInfo,
    index=st.integers(),
    uuid=st.text(max_size=10),
    name=_names,
    pci_bus_id=st.text(max_size=10),
    memory_total_mib=st.one_of(st.integers(), st.sampled_from([m.memory_mib for m in CATALOG.values()])),
    compute_capability=_ccs,
    pcie_gen=st.none() | st.integers(),
    pcie_width=st.none() | st.integers(),
    nvlinks=st.lists(st.builds(NvLink, link=st.integers(), active=st.booleans()), max_size=4).map(tuple),
    clock_sm_max_mhz=st.none() | st.integers(),
    power_limit_w=st.none() | _any_float,
    memory_bus_width_bits=st.none() | st.integers(),
    simulated=st.booleans(),
)
_hosts = st.none() | st.builds(host, down=st.none() | _any_float, up=st.none() | _any_float)
_measured = st.none() | st.dictionaries(st.sampled_from(["fp16_tflops", "bf16_tflops", "memory_bandwidth_gbs", "x"]), _any_float)


@settings(max_examples=300, deadline=None)
@given(info=_gpu_infos, host_info=_hosts, measured=_measured)
def test_classify_never_raises_and_flagged_gpus_never_get_a_tier(info, host_info, measured):
    result = classify(info, POLICY, host=host_info, measured=measured)
    assert result.tier is None or result.tier in {t.name for t in POLICY.tiers}
    if result.flags:
        assert result.tier is None
    assert result.reasons  # every outcome is explained
    assert result.model == "" or result.model in CATALOG


# -- classify's kept answers --------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(info=_gpu_infos, host_info=_hosts, measured=_measured, uuid=st.text(max_size=20))
def test_a_kept_answer_is_the_one_classifying_afresh_gives_whatever_the_gpus_identity(info, host_info, measured, uuid):
    first = classify(info, POLICY, host=host_info, measured=measured)
    other_card = msgspec.structs.replace(info, uuid=uuid, index=info.index + 1, pci_bus_id=uuid)
    again = classify(other_card, POLICY, host=host_info, measured=measured)
    fresh = tiers._classify(other_card, POLICY, host_info, measured)
    assert again == fresh == first


def test_an_answer_kept_under_one_policy_is_not_given_under_another(tmp_path):
    a100 = card("a100-80gb")
    assert classify(a100, POLICY).tier is not None
    only_h100s = TierPolicy.load(write(tmp_path, '[[tier]]\nname = "hopper"\nmin_compute_capability = "9.0"\n'))
    assert classify(a100, only_h100s).tier is None
    assert classify(a100, POLICY).tier is not None


def test_the_kept_answers_stay_bounded(monkeypatch):
    monkeypatch.setattr(tiers, "CLASSIFY_CACHE_SIZE", 8)
    monkeypatch.setattr(tiers, "_classified", {})
    for mib in range(81_000, 81_050):
        classify(card("a100-80gb", memory_total_mib=mib), POLICY)
        assert len(tiers._classified) <= 8

"""Simulated GPUs: the spec a person types, an NVML-like inventory, stable identities, plausible telemetry."""

import re

import pytest

from agent.simulate import MAX_SIMULATED_GPUS, SimulatedCollector, parse_simulate_spec
from common.catalog import CATALOG, match_model
from common.inventory import GpuInfo
from master.tiers import TierPolicy, classify


def keys(spec: str) -> list[tuple[str, int]]:
    return [(model.key, count) for model, count in parse_simulate_spec(spec)]


def test_spec_names_models_and_counts():
    assert keys("h100:8") == [("h100-sxm", 8)]
    assert keys("h100:4,a10:2") == [("h100-sxm", 4), ("a10", 2)]
    assert keys(" RTX4090 ") == [("rtx-4090", 1)]
    assert keys("a100-80gb:2, t4 : 3") == [("a100-80gb", 2), ("t4", 3)]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("", "empty"),
        ("h300:2", "unknown GPU model 'h300'"),
        ("h100:two", "'two' is not a whole number"),
        ("h100:0", "at least 1"),
        ("h100:-3", "at least 1"),
        ("h100:2,", "names no GPU model"),
        (":4", "names no GPU model"),
        (f"h100:{MAX_SIMULATED_GPUS},t4:1", f"at most {MAX_SIMULATED_GPUS}"),
    ],
)
def test_a_bad_spec_is_a_value_error_saying_what_is_wrong(spec: str, says: str):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_simulate_spec(spec)


def model_key(gpu: GpuInfo) -> str:
    model = match_model(gpu)
    assert model is not None, f"{gpu.name} matched no model"
    return model.key


def test_inventory_has_the_asked_models_and_counts_in_order():
    gpus = SimulatedCollector("h100:4,a10:2", seed=1).inventory()
    assert [g.index for g in gpus] == list(range(6))
    assert [model_key(g) for g in gpus] == ["h100-sxm"] * 4 + ["a10"] * 2


def test_inventory_looks_like_nvml_and_says_it_is_simulated():
    gpus = SimulatedCollector("h100:2,t4:1", seed=1).inventory()
    h100, t4 = gpus[0], gpus[2]
    assert all(g.simulated for g in gpus)
    assert all(re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", g.uuid) for g in gpus)
    assert [g.pci_bus_id for g in gpus] == ["00000000:10:00.0", "00000000:11:00.0", "00000000:12:00.0"]
    assert (h100.name, h100.memory_total_mib, h100.compute_capability) == ("NVIDIA H100 80GB HBM3", 81559, "9.0")
    assert len(h100.nvlinks) == 18 and t4.nvlinks == () and (h100.pcie_gen, t4.pcie_gen) == (5, 3)
    assert h100.driver_version and h100.cuda_version and h100.power_limit_w == 700.0


def test_uuids_are_unique_and_stable_for_the_same_host_key():
    first = SimulatedCollector("h100:8", host_key="/var/lib/idlegrid/agent").inventory()
    again = SimulatedCollector("h100:8", host_key="/var/lib/idlegrid/agent").inventory()
    other = SimulatedCollector("h100:8", host_key="/srv/other-agent").inventory()
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert len({g.uuid for g in first} | {g.uuid for g in other}) == 16


def test_uuids_differ_between_collectors_without_host_key_or_seed():
    assert SimulatedCollector("t4").inventory()[0].uuid != SimulatedCollector("t4").inventory()[0].uuid


def test_simulated_gpus_are_classified_like_real_ones():
    policy = TierPolicy.load()
    for key in CATALOG:
        for gpu in SimulatedCollector(key, seed=0).inventory():
            result = classify(gpu, policy)
            assert result.model == key and result.flags == () and result.tier is not None


def test_samples_stay_within_the_models_limits_and_vary():
    collector = SimulatedCollector("h100:2,t4:2", seed=7)
    gpus = {g.uuid: CATALOG[model_key(g)] for g in collector.inventory()}
    seen = set()
    for n in range(200):
        if n % 50 == 0:  # containers come and go: half the cards held, then the other half
            collector.hold(list(gpus)[n // 50 % 2 :: 2])
        samples = collector.sample()
        assert [s.uuid for s in samples] == list(gpus)
        for s in samples:
            model = gpus[s.uuid]
            assert 0 <= s.utilization_pct <= 100
            assert 0 <= s.memory_used_mib <= model.memory_mib
            assert s.power_w is not None and 0 < s.power_w <= model.tdp_w
            assert s.temperature_c is not None and 20 <= s.temperature_c <= 90
            assert s.clock_sm_mhz is not None and 0 < s.clock_sm_mhz <= model.sm_clock_max_mhz
            assert s.ecc_uncorrected == 0
            seen.add(round(s.utilization_pct))
    assert len(seen) > 20  # load actually changes
    collector.close()


def test_an_idle_card_reads_about_zero_and_a_held_one_is_busy():
    collector = SimulatedCollector("a10:2,a100:1:mig=3g.40gb*2", seed=5)
    idle, held, partitioned = collector.inventory()
    collector.hold([held.uuid, partitioned.mig_instances[1].uuid])  # a MIG instance held: its card works
    for _ in range(100):
        by_card = {s.uuid: s for s in collector.sample()}
        assert by_card[idle.uuid].utilization_pct <= 1.0
        assert by_card[idle.uuid].throttle_reasons == ("gpu_idle",)
        assert by_card[held.uuid].utilization_pct >= 60.0
        assert by_card[partitioned.uuid].utilization_pct >= 60.0
    collector.hold([])  # the container ended
    assert all(s.utilization_pct <= 1.0 for s in collector.sample())


def test_the_same_seed_gives_the_same_telemetry():
    a, b = SimulatedCollector("l4:2", seed=3, host_key="h"), SimulatedCollector("l4:2", seed=3, host_key="h")
    for _ in range(5):
        readings = [[(s.utilization_pct, s.power_w) for s in c.sample()] for c in (a, b)]
        assert readings[0] == readings[1]


# --- MIG partitions ------------------------------------------------------------------------------------------


def test_a_group_can_be_split_into_mig_instances_each_gpu_alike():
    gpus = SimulatedCollector("a100:2:mig=3g.40gb+2g.20gb+1g.10gb*2,h100:1", seed=1).inventory()

    first, second, whole = gpus
    for gpu in (first, second):
        assert gpu.mig_enabled is True
        assert [m.profile for m in gpu.mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
        assert [m.memory_mib for m in gpu.mig_instances] == [40960, 20480, 10240, 10240]  # slices/8 of 80 GiB
        assert [m.index for m in gpu.mig_instances] == [0, 1, 2, 3]
        assert all(m.uuid.startswith("MIG-") for m in gpu.mig_instances)
    assert len({m.uuid for g in (first, second) for m in g.mig_instances}) == 8  # every instance its own uuid
    assert (whole.mig_enabled, whole.mig_instances) == (False, ())


def test_mig_uuids_are_as_stable_as_the_gpus_they_split():
    spec = "h100:1:mig=1g.10gb*7"
    first = SimulatedCollector(spec, host_key="/var/lib/idlegrid/agent").inventory()[0]
    again = SimulatedCollector(spec, host_key="/var/lib/idlegrid/agent").inventory()[0]
    assert [m.uuid for m in first.mig_instances] == [m.uuid for m in again.mig_instances]
    assert len(first.mig_instances) == 7


def test_mig_mode_without_instances_is_an_empty_layout():
    (gpu,) = SimulatedCollector("a100-40gb:1:mig=", seed=1).inventory()
    assert (gpu.mig_enabled, gpu.mig_instances) == (True, ())


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("l4:1:mig=1g.10gb", "GPU model 'l4' has no MIG"),
        ("a100:1:mig=1g.5gb", "a100-80gb has no MIG profile '1g.5gb'"),  # the 40 GB card's name
        ("a100:1:mig=1g.10gb*8", "at most 7 × 1g.10gb"),
        ("h100:1:mig=1g.10gb+me*2", "at most 1 × 1g.10gb+me"),
        ("a100:1:mig=7g.80gb+1g.10gb", "needs 8 compute slices"),
        ("a100:1:mig=1g.20gb*4+1g.10gb", "no placement of its memory slices"),
        ("a100:1:mig=1g.10gb*x", "'x' is not a whole number"),
    ],
)
def test_a_mig_layout_the_model_cannot_take_is_refused_saying_why(spec: str, says: str):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_simulate_spec(spec)


@pytest.mark.parametrize(
    "layout",
    [
        "1g.10gb*7",
        "7g.80gb",
        "4g.40gb+3g.40gb",
        "3g.40gb*2",
        "2g.20gb*3+1g.10gb",
        "1g.20gb*4",
        "3g.40gb+2g.20gb+1g.10gb*2",
        "1g.10gb*6+1g.10gb+me",
    ],
)
def test_layouts_from_nvidia_s_tables_fit_an_80gb_card(layout: str):
    for model in ("a100-80gb", "h100-sxm", "h100-pcie", "a100-80gb-pcie"):
        assert len(SimulatedCollector(f"{model}:1:mig={layout}", seed=1).inventory()[0].mig_instances) >= 1


def test_an_mi300x_host_is_simulated_as_the_agent_reads_a_real_one():
    """Issue 41: ``--simulate mi300x:8`` reports what agent/amd_gpus.py reads of a real MI300X host, marked simulated."""
    collector = SimulatedCollector("mi300x:8", seed=3)
    gpus = collector.inventory()
    assert len(gpus) == 8 and {g.vendor for g in gpus} == {"amd"}
    assert {(g.name, g.memory_total_mib, g.cuda_version, g.compute_capability) for g in gpus} == {
        ("AMD Instinct MI300X", CATALOG["mi300x"].memory_mib, "", "")
    }
    assert all(re.fullmatch(r"GPU-[0-9a-f]{16}", g.uuid) for g in gpus)  # ROCR_VISIBLE_DEVICES' form
    assert len({g.uuid for g in gpus}) == 8
    policy = TierPolicy.load()
    assert {classify(g, policy).tier for g in gpus} == {"amd-flagship"}
    assert len(collector.sample()) == 8 and collector.unoffered() == []


def test_a_mixed_host_has_each_vendors_cards():
    gpus = SimulatedCollector("mi300x:2,h100:2", seed=3).inventory()
    assert [(g.vendor, match_model(g).key) for g in gpus] == [  # type: ignore[union-attr]
        ("amd", "mi300x"),
        ("amd", "mi300x"),
        ("nvidia", "h100-sxm"),
        ("nvidia", "h100-sxm"),
    ]


def test_an_amd_card_cannot_be_split_into_mig_instances():
    with pytest.raises(ValueError, match="mi300x"):
        SimulatedCollector("mi300x:1:mig=1g.10gb")

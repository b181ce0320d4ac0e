"""Offers derived from plain Master records, and the index's search: filters, ranking, pages, the emptying condition."""

from __future__ import annotations

import pytest

from common.errors import BadQuery
from common.inventory import GpuInfo, HostInfo, MigInstance, NvLink
from common.wire import BenchmarkFigures
from management.market.offers import Offer, OfferIndex, offer_of, score_of
from management.market.prices import HostPrice
from management.views.market import offer_view, search_view
from master.records import AgentRecord, GpuFault, GpuRecord, GpuVerification

VRAM = {"h100-sxm": 81_559, "rtx-4090": 24_564, "a100-80gb": 81_920}
TIER = {"h100-sxm": "flagship", "rtx-4090": "consumer", "a100-80gb": "datacenter"}
PRICE = HostPrice(on_demand=2_000_000, min_bid=500_000, reserved_discount=0.25, max_duration_s=86_400.0)


def host(agent_id: str, *, state: str = "ready", region: str = "eu-west", isolation: str = "container", **fields) -> AgentRecord:
    info = HostInfo(
        hostname=f"{agent_id}.lan",
        cpu_model="EPYC",
        cpu_cores=64,
        ram_mib=512 * 1024,
        disk_total_gib=2000,
        disk_free_gib=1600,
        os="linux",
        kernel="6.1",
        bandwidth_mbps_down=1000.0,
        bandwidth_mbps_up=400.0,
    )
    return AgentRecord(
        id=agent_id, provider="acme", state=state, region=region, host=info, runtime="docker", isolation=isolation, **fields
    )


def cards(agent_id: str, n: int, model: str = "h100-sxm", *, nvlink: bool = False, cuda: str = "12.4") -> list[GpuRecord]:
    out = []
    for i in range(n):
        peers = [j for j in range(n) if j != i] if nvlink else []
        links = tuple(NvLink(link=j, active=True, remote_pci_bus_id=f"0000:{j:02x}:00.0") for j in peers)
        info = GpuInfo(
            index=i,
            uuid=f"GPU-{agent_id}-{i}",
            name=model,
            pci_bus_id=f"0000:{i:02x}:00.0",
            memory_total_mib=VRAM[model],
            compute_capability="9.0",
            cuda_version=cuda,
            nvlinks=links,
        )
        out.append(
            GpuRecord(uuid=info.uuid, agent_id=agent_id, index=i, model=model, info=info, state="available", tier=TIER[model])
        )
    return out


def measured(gpus: list[GpuRecord], bf16: float = 800.0, simulated: bool = False) -> list[GpuRecord]:
    """``gpus`` with a passed verification run (a record: no GPU here)."""
    figures = BenchmarkFigures(bf16_tflops=bf16, fp16_tflops=bf16, memory_bandwidth_gbs=3000.0, simulated=simulated)
    for gpu in gpus:
        gpu.verification = GpuVerification(status="verified", at=1.0, figures=figures, simulated=simulated)
    return gpus


def test_an_offer_describes_the_free_healthy_units_of_a_host_and_its_price():
    gpus = measured(cards("h1", 8, nvlink=True))
    gpus[7].fault = GpuFault(kind="xid", reason="Xid 79", since=0.0)
    offer = offer_of(host("h1"), gpus, held={gpus[0].uuid, gpus[1].uuid}, price=PRICE, reliability=0.97)
    assert offer is not None
    assert (offer.id, offer.host, offer.provider, offer.region, offer.model, offer.tier) == (
        "h1",
        "h1.lan",
        "acme",
        "eu-west",
        "h100-sxm",
        "flagship",
    )
    assert (offer.num_gpus, offer.total_gpus, offer.gpu_ram, offer.cuda, offer.compute_capability) == (5, 8, 79.65, "12.4", "9.0")
    assert (offer.price, offer.min_bid, offer.reserved_price, offer.max_duration_s) == (2_000_000, 500_000, 1_500_000, 86_400.0)
    assert (offer.cpu_cores, offer.ram_gib, offer.disk_gib, offer.inet_down, offer.inet_up) == (8.0, 64.0, 200.0, 1000.0, 400.0)
    assert offer.verified and offer.nvlink and offer.interruptible and offer.runtime == "docker"
    assert offer.score == score_of(0.97, 2_000_000)
    assert (offer.tflops, offer.memory_bandwidth_gbs, offer.tflops_per_price) == (800.0, 3000.0, 400.0)
    view = offer_view(offer)
    assert (view.price, view.min_bid, view.reserved_price) == ("2.00", "0.50", "1.50")


@pytest.mark.parametrize(
    ("agent", "why"),
    [
        (host("h1", state="offline"), "offline"),
        (host("h1", state="maintenance", drained=True), "drained"),
        (host("h1", drained=True), "drained, still ready"),
        (host("h1", state="quarantined"), "quarantined"),
        (host("h1", isolation="none"), "runs renters' work without isolation"),
        (host("h1", isolation="sandbox"), "sandbox, not allowed by the operator"),
    ],
)
def test_a_host_that_may_not_take_work_offers_nothing(agent, why):
    assert offer_of(agent, cards("h1", 2), held=set(), price=PRICE, reliability=1.0) is None, why


def test_a_host_whose_every_unit_is_held_or_faulty_offers_nothing_and_a_busy_host_with_a_free_one_does():
    gpus = cards("h1", 2)
    gpus[1].state, gpus[1].fault = "faulty", GpuFault(kind="ecc", reason="ECC", since=0.0)
    assert offer_of(host("h1", state="busy"), gpus, held={gpus[0].uuid}, price=PRICE, reliability=1.0) is None
    offer = offer_of(host("h1", state="busy"), gpus, held=set(), price=PRICE, reliability=1.0)
    assert offer is not None and offer.num_gpus == 1
    assert offer_of(host("h1", isolation="sandbox"), gpus, held=set(), price=PRICE, reliability=1.0, allow_sandboxed=True)


def test_units_an_interruptible_rental_holds_are_offered_on_demand_only():
    gpus = cards("h1", 3)
    gpus[2].state, gpus[2].fault = "faulty", GpuFault(kind="xid", reason="Xid 79", since=0.0)
    held = {gpus[0].uuid, gpus[1].uuid, gpus[2].uuid}
    busy = host("h1", state="busy")
    assert offer_of(busy, gpus, held=held, price=PRICE, reliability=1.0) is None  # held by on-demand work: nothing
    offer = offer_of(busy, gpus, held=held, price=PRICE, reliability=1.0, outbid={gpus[0].uuid, gpus[2].uuid})
    assert offer is not None and (offer.num_gpus, offer.num_gpus_on_demand) == (0, 1)  # the faulty one never counts
    mixed = offer_of(busy, gpus, held={gpus[0].uuid}, price=PRICE, reliability=1.0, outbid={gpus[0].uuid})
    assert mixed is not None and (mixed.num_gpus, mixed.num_gpus_on_demand) == (1, 2)


def test_a_flagged_gpu_makes_the_offer_unverified_and_mig_instances_are_units_held_by_their_gpu():
    gpus = cards("h1", 2, "a100-80gb")
    gpus[0].flags = ("vram_mismatch",)
    assert offer_of(host("h1"), gpus, held=set(), price=PRICE, reliability=1.0).verified is False  # type: ignore[union-attr]
    split = GpuInfo(
        index=0,
        uuid="GPU-m",
        name="a100",
        pci_bus_id="0000:00:00.0",
        memory_total_mib=81_920,
        compute_capability="8.0",
        mig_enabled=True,
        mig_instances=tuple(MigInstance(uuid=f"MIG-{i}", profile="3g.40gb", memory_mib=40_960) for i in range(2)),
    )
    mig = [GpuRecord(uuid="GPU-m", agent_id="h2", index=0, model="a100-80gb", info=split, state="available", tier="datacenter")]
    offer = offer_of(host("h2"), mig, held={"MIG-0"}, price=PRICE, reliability=1.0)
    assert offer is not None and (offer.num_gpus, offer.gpu_ram) == (1, 40.0)
    assert offer_of(host("h2"), mig, held={"GPU-m"}, price=PRICE, reliability=1.0) is None  # held whole: every instance


def test_a_free_host_ranks_finitely_and_reliability_counts_more_than_a_small_price_gap():
    assert score_of(1.0, 0) == 10.0
    assert score_of(1.0, 2_000_000) > score_of(0.8, 1_800_000)
    assert score_of(0.99, 1_000_000) > score_of(0.99, 2_000_000)


def market() -> OfferIndex:
    """h0..h5: models, regions, prices and reliabilities picked so each filter below keeps a known set."""
    index = OfferIndex()
    rows = [  # id, model, gpus, held, region, price, reliability, cuda
        ("h0", "h100-sxm", 8, 0, "eu-west", 2_400_000, 0.99, "12.4"),
        ("h1", "h100-sxm", 8, 6, "eu-west", 1_900_000, 0.90, "12.2"),
        ("h2", "rtx-4090", 4, 0, "us-east", 400_000, 0.97, "12.10"),
        ("h3", "rtx-4090", 2, 1, "eu-west", 300_000, 0.60, "11.8"),
        ("h4", "a100-80gb", 8, 4, "us-east", 1_400_000, 0.95, ""),
        ("h5", "a100-80gb", 4, 0, "ap-south", 0, 0.80, "12.2"),
    ]
    for agent_id, model, n, held, region, price, reliability, cuda in rows:
        gpus = cards(agent_id, n, model, cuda=cuda)
        index.update_host(
            host(agent_id, region=region), gpus, {g.uuid for g in gpus[:held]}, HostPrice(on_demand=price), reliability
        )
    return index


def ids(offers: list[Offer]) -> list[str]:
    return [o.id for o in offers]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("region=eu-west", {"h0", "h1", "h3"}),
        ("model in [h100-sxm,a100-80gb] num_gpus>=4", {"h0", "h4", "h5"}),
        ("model notin [h100-sxm]", {"h2", "h3", "h4", "h5"}),
        ("price<=1.9", {"h1", "h2", "h3", "h4", "h5"}),
        ("price=0", {"h5"}),
        ("cuda>=12.4", {"h0", "h2"}),  # 12.10 > 12.4; h4 reports no CUDA version and matches no comparison
        ("cuda!=12.2", {"h0", "h2", "h3", "h4"}),
        ("cuda=12.2.0 compute_capability>=9", {"h1", "h5"}),
        ("gpu_ram>=79 reliability>0.9", {"h0", "h4"}),  # an H100 SXM: 79.65 GiB
        ("region!=eu-west tier=consumer", {"h2"}),
        ("interruptible=false", {"h0", "h1", "h2", "h3", "h4", "h5"}),
        ("max_duration_s>=1000000", {"h0", "h1", "h2", "h3", "h4", "h5"}),  # no limit is above any limit
    ],
)
def test_search_keeps_the_offers_every_condition_holds_for(query, expected):
    result = market().search(query, limit=100)
    assert set(ids(result.offers)) == expected and result.total == len(expected) and result.emptied_by is None


def test_default_order_is_score_descending_and_sort_orders_by_any_field_with_ties_broken_by_id():
    index = market()
    by_score = index.search().offers
    assert [o.score for o in by_score] == sorted((o.score for o in by_score), reverse=True)
    assert ids(by_score)[0] == "h5"  # free and reliable enough
    assert search_view(index.search()).offers[0].price == "0.00"
    assert ids(index.search("", sort="price").offers) == ["h5", "h3", "h2", "h4", "h1", "h0"]
    assert ids(index.search("sort=-num_gpus", sort="price").offers)[:2] == ["h0", "h2"]  # the query's own sort wins
    assert ids(index.search("", sort="-region").offers) == ["h2", "h4", "h0", "h1", "h3", "h5"]
    assert ids(index.search("", sort="cuda").offers) == ["h3", "h1", "h5", "h0", "h2", "h4"]  # unreported last
    assert index.search("", sort="-cuda").offers[-1].id == "h4"


def test_an_empty_result_names_the_condition_that_emptied_it_and_how_many_matched_before():
    result = market().search("region=eu-west model=h100-sxm price<1 num_gpus>=1")
    assert (result.offers, result.total, result.next_cursor) == ([], 0, None)
    assert result.emptied_by is not None
    assert (result.emptied_by.condition, result.emptied_by.position, result.emptied_by.matched_before) == ("price<1", 30, 2)
    assert result.emptied_by.sentence == "no offer has price<1 (2 matched the conditions before it)"
    view = search_view(market().search("model=h200"))
    assert view.emptied_by is not None
    assert view.emptied_by.sentence == "no offer has model=h200 (it is the first condition; 6 offers in all)"
    assert (view.offers, view.total, view.next_cursor) == ([], 0, None)


def test_pages_follow_each_other_without_gap_or_repeat_even_when_offers_change_between_them():
    index = market()
    first = index.search("", sort="price", limit=2)
    assert ids(first.offers) == ["h5", "h3"] and first.total == 6 and first.next_cursor
    # Between pages: a cheap host appears (before the cursor: not shown), a later one leaves, one already seen changes.
    gpus = cards("h9", 1, "rtx-4090")
    index.update_host(host("h9"), gpus, set(), HostPrice(on_demand=100_000), 0.9)
    index.remove_host("h4")
    second = index.search("", sort="price", limit=2, cursor=first.next_cursor)
    assert ids(second.offers) == ["h2", "h1"]
    third = index.search("", sort="price", limit=2, cursor=second.next_cursor)
    assert ids(third.offers) == ["h0"] and third.next_cursor is None


def test_a_cursor_is_refused_for_another_sort_or_when_it_is_not_one():
    index = market()
    cursor = index.search("", sort="price", limit=1).next_cursor
    assert cursor is not None
    with pytest.raises(BadQuery, match="cursor was made for sort=price, and this search sorts by -score"):
        index.search("", limit=1, cursor=cursor)
    for bad in ("not-a-cursor!", "W1tdXQ", "WyItc2NvcmUiLFsxLCJ4Il1d"):
        with pytest.raises(BadQuery, match="is not a cursor"):
            index.search("", limit=1, cursor=bad)
    with pytest.raises(BadQuery, match="limit must be between 1 and 1000"):
        index.search("", limit=0)


def test_an_update_moves_a_host_in_every_kept_order_and_a_removal_drops_it():
    index = market()
    assert ids(index.search("", sort="price").offers)[-1] == "h0"
    index.search("", sort="-price")  # keep that order too
    gpus = cards("h0", 8)
    index.update_host(host("h0"), gpus, set(), HostPrice(on_demand=100_000), 0.99)
    assert ids(index.search("", sort="price").offers)[:2] == ["h5", "h0"]
    assert ids(index.search("", sort="-price").offers)[-2:] == ["h0", "h5"]
    index.update_host(host("h0", state="offline"), gpus, set(), HostPrice(on_demand=100_000), 0.99)
    assert "h0" not in ids(index.search("", sort="price").offers) and "h0" not in index and len(index) == 5


def test_an_offer_names_the_images_its_host_already_has_so_renters_can_prefer_a_warm_host():
    warm = host("h1", images=["ghcr.io/acme/train:1", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"])
    offer = offer_of(warm, cards("h1", 2), held=set(), price=PRICE, reliability=1.0)
    assert offer is not None and offer.images == ["ghcr.io/acme/train:1", "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"]
    assert offer_view(offer).images == offer.images
    cold = offer_of(host("h2"), cards("h2", 2), held=set(), price=PRICE, reliability=1.0)
    assert cold is not None and cold.images == []


def test_an_offer_is_verified_only_by_measurement_and_never_when_simulated():
    catalog_only = offer_of(host("h1"), cards("h1", 2), held=set(), price=PRICE, reliability=1.0)
    assert catalog_only is not None and not catalog_only.verified and catalog_only.tflops is None
    simulated = offer_of(host("h1"), measured(cards("h1", 2), simulated=True), held=set(), price=PRICE, reliability=1.0)
    assert simulated is not None and not simulated.verified and simulated.tflops == 800.0  # figures shown, not verified


def test_an_offer_shows_its_slowest_measured_unit_and_none_while_one_is_unmeasured():
    gpus = measured(cards("h1", 2))
    gpus[1].verification = GpuVerification(status="verified", at=1.0, figures=BenchmarkFigures(bf16_tflops=700.0))
    offer = offer_of(host("h1"), gpus, held=set(), price=PRICE, reliability=1.0)
    assert offer is not None and offer.tflops == 700.0 and offer.tflops_per_price == 350.0
    gpus[1].verification = None
    offer = offer_of(host("h1"), gpus, held=set(), price=PRICE, reliability=1.0)
    assert offer is not None and offer.tflops is None and offer.tflops_per_price is None

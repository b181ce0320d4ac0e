"""The offer feed on a real Master (SQLite in tmp_path), its agents driven through the relay-link handlers without
sockets (tests/master/linked.py): every change a search must show (a hold, a fault, a drain, a disconnect, a new
inventory, a price) shows in the very next search, with no refresh called in between. No GPU is needed: the agents
report simulated H100s."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.errors import NotFound
from management.market.offer_feed import OfferFeed
from management.market.offers import Offer
from management.market.prices import HostPrice, PriceBook, PriceSetting, PriceTable, grid_default_of
from management.store import price_repo
from master.config import MasterConfig
from master.link import AccessLink
from master.master import Master
from master.records import GpuFault, PriceRecord
from tests.master.linked import connect, disconnect, gpus, relay_link


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    m = Master(MasterConfig(state_dir=str(tmp_path / "master"), link_port=0))
    await m.start()
    yield m
    await m.stop()


@pytest.fixture
def link() -> AccessLink:
    return relay_link()


@pytest.fixture
def prices() -> PriceTable:
    return PriceTable([], HostPrice(on_demand=1_000_000))


async def host(master: Master, link: AccessLink, agent_id: str, count: int = 2, *, isolation: str = "container") -> list[str]:
    gpu_list = gpus(count, prefix=f"GPU-{agent_id}")
    await connect(master, link, agent_id, gpu_list, runtime="docker", isolation=isolation)
    return [g.uuid for g in gpu_list]


def offered(feed: OfferFeed) -> dict[str, Offer]:
    return {o.id: o for o in feed.search(limit=1000).offers}


async def test_hosts_that_connect_are_offered_with_their_free_gpus(master, link, prices):
    feed = OfferFeed(master, prices.price)
    await host(master, link, "h1", 2)
    await host(master, link, "h2", 4)
    await host(master, link, "bare", 1, isolation="none")  # runs renters' work unisolated: never offered
    offers = offered(feed)
    assert {k: (o.num_gpus, o.model, o.provider, o.price) for k, o in offers.items()} == {
        "h1": (2, "h100-sxm", "prov", 1_000_000),
        "h2": (4, "h100-sxm", "prov", 1_000_000),
    }
    await host(master, link, "h3", 1)  # after the first search: marked by its hello, not by a rebuild
    assert set(offered(feed)) == {"h1", "h2", "h3"}


async def test_a_hold_taken_or_given_back_shows_in_the_next_search(master, link, prices):
    feed = OfferFeed(master, prices.price)
    uuids = await host(master, link, "h1", 2)
    assert offered(feed)["h1"].num_gpus == 2
    master.allocations.claim("h1", "c1", "cmd-1", [uuids[0]])
    assert offered(feed)["h1"].num_gpus == 1
    master.allocations.claim("h1", "c2", "cmd-2", [uuids[1]])
    assert "h1" not in offered(feed)
    master.allocations.abandon("cmd-2")  # the create failed: its GPU is free again
    assert offered(feed)["h1"].num_gpus == 1
    master.allocations.release("h1", "c1")
    assert offered(feed)["h1"].num_gpus == 2


async def test_a_faulty_gpu_leaves_the_offer_and_a_repaired_one_comes_back(master, link, prices):
    feed = OfferFeed(master, prices.price)
    uuids = await host(master, link, "h1", 2)
    assert offered(feed)["h1"].num_gpus == 2
    gpu = master.registry.gpus[uuids[1]]
    await master.registry.mark_faulty(gpu, GpuFault(kind="xid", reason="Xid 79: fell off the bus", since=0.0, code=79))
    assert offered(feed)["h1"].num_gpus == 1
    await master.repair_gpu(uuids[1])
    assert offered(feed)["h1"].num_gpus == 2


async def test_a_drained_or_disconnected_host_is_not_offered_until_it_is_back(master, link, prices):
    feed = OfferFeed(master, prices.price)
    await host(master, link, "h1")
    await host(master, link, "h2")
    await master.drain("h1")
    assert set(offered(feed)) == {"h2"}
    await master.undrain("h1")
    assert set(offered(feed)) == {"h1", "h2"}
    await disconnect(master, link, "h2", "relay lost it")
    assert set(offered(feed)) == {"h1"}
    await host(master, link, "h2", 3)
    assert offered(feed)["h2"].num_gpus == 3


async def test_a_new_inventory_from_a_host_that_stays_ready_shows_in_the_next_search(master, link, prices):
    feed = OfferFeed(master, prices.price)
    await host(master, link, "h1", 4)
    assert offered(feed)["h1"].num_gpus == 4
    await host(master, link, "h1", 2)  # a second hello while ready: no state change, the record is written
    assert offered(feed)["h1"].num_gpus == 2


async def test_a_price_shows_once_the_feed_is_told_it_changed_for_the_host_or_its_provider(master, link, prices):
    feed = OfferFeed(master, prices.price)
    await host(master, link, "h1")
    await host(master, link, "h2")
    assert offered(feed)["h1"].price == 1_000_000
    prices.put(PriceRecord(provider="prov", agent_id="h1", on_demand=2_500_000, min_bid=1_000_000))
    feed.prices_changed("prov", "h1")
    offers = offered(feed)
    assert (offers["h1"].price, offers["h1"].min_bid, offers["h2"].price) == (2_500_000, 1_000_000, 1_000_000)
    prices.put(PriceRecord(provider="prov", on_demand=500_000))  # the provider's default: every host without its own
    feed.prices_changed("prov", None)
    offers = offered(feed)
    assert (offers["h1"].price, offers["h2"].price) == (2_500_000, 500_000)
    assert feed.search("price<=0.5").total == 1


async def test_a_price_set_in_the_price_book_shows_in_the_next_search(master, link):
    book = PriceBook(price_repo(master.store), grid_default_of(master.config))
    feed = OfferFeed(master, book.price)
    book.subscribe(feed.prices_changed)
    await host(master, link, "h1")
    await host(master, link, "h2")
    assert {o.price for o in offered(feed).values()} == {0}  # the grid's default: free, as on a shared cluster
    await book.set_default("prov", PriceSetting(on_demand="1.20", min_bid="0.40"))
    await book.set_host("prov", "h2", PriceSetting(on_demand="3.00"))
    offers = offered(feed)
    assert (offers["h1"].price, offers["h1"].min_bid, offers["h2"].price, offers["h2"].min_bid) == (
        1_200_000,
        400_000,
        3_000_000,
        None,
    )
    await book.clear_host("prov", "h2")
    assert offered(feed)["h2"].price == 1_200_000


async def test_changes_lost_to_a_full_queue_rebuild_every_offer(master, link, prices):
    feed = OfferFeed(master, prices.price, changes_capacity=1)
    await host(master, link, "h1", 2)
    await host(master, link, "h2", 2)
    assert set(offered(feed)) == {"h1", "h2"}
    # Only the feed's queue can tell of these now (the feed's synchronous listener is taken away): two GPU faults
    # overflow its queue of one, and the Resync that replaces them makes the next search re-derive every offer.
    for stop in feed._unlisten:
        stop()
    for agent_id in ("h1", "h2"):
        gpu = master.registry.gpus[f"GPU-{agent_id}-0"]
        await master.registry.mark_faulty(gpu, GpuFault(kind="ecc", reason="uncorrectable ECC", since=0.0, code=3))
    assert {k: o.num_gpus for k, o in offered(feed).items()} == {"h1": 1, "h2": 1}


async def test_reputation_is_re_read_once_an_offer_is_older_than_max_age(master, link, prices):
    now = [1000.0]
    feed = OfferFeed(master, prices.price, max_age_s=30.0, clock=lambda: now[0])
    await host(master, link, "h1")
    before = offered(feed)["h1"].reliability
    master.registry.agents["h1"].uptime_s += 7 * 86_400.0  # a week of heartbeats: no change is published for those
    now[0] += 10.0
    assert offered(feed)["h1"].reliability == before
    now[0] += 25.0
    assert offered(feed)["h1"].reliability > before


async def test_a_search_after_a_quiet_spell_re_derives_only_a_few_aged_offers_at_a_time(master, link, prices):
    now = [1000.0]
    feed = OfferFeed(master, prices.price, max_age_s=30.0, clock=lambda: now[0], max_aged_per_refresh=2)
    for agent_id in ("h1", "h2", "h3"):
        await host(master, link, agent_id)
    assert feed.refresh() == 3  # the first: every host
    now[0] += 60.0
    assert feed.refresh() == 2  # the two oldest
    assert feed.refresh() == 1  # the third; the two before are fresh again
    assert feed.refresh() == 0


async def test_one_offer_is_looked_up_by_host_and_its_absence_is_explained(master, link, prices):
    feed = OfferFeed(master, prices.price)
    uuids = await host(master, link, "h1", 1)
    await host(master, link, "h2", 1)
    assert feed.offer("h1").num_gpus == 1
    master.allocations.claim("h1", "c1", "cmd-1", uuids)
    with pytest.raises(NotFound, match="no offer 'h1': the host has no free healthy GPU"):
        feed.offer("h1")
    await master.drain("h2")
    with pytest.raises(NotFound, match="no offer 'h2': the host is drained"):
        feed.offer("h2")
    with pytest.raises(NotFound, match="no such host"):
        feed.offer("h9")


async def test_a_started_feed_takes_changes_in_without_a_search(master, link, prices):
    feed = OfferFeed(master, prices.price)
    uuids = await host(master, link, "h1", 2)
    feed.refresh()
    feed.start(refresh_every_s=0.01)
    try:
        master.allocations.claim("h1", "c1", "cmd-1", [uuids[0]])
        deadline = asyncio.get_running_loop().time() + 5.0
        while feed.index.get("h1").num_gpus != 1:  # type: ignore[union-attr]
            assert asyncio.get_running_loop().time() < deadline, "the background refresh never took the hold in"
            await asyncio.sleep(0.01)
    finally:
        feed.close()
    assert feed._task is None


async def test_a_host_whose_offer_cannot_be_derived_is_left_out_and_the_rest_are_served(master, link):
    def price_of(provider: str, agent_id: str) -> HostPrice:
        if agent_id == "h2":
            raise ValueError("a price record that does not decode")  # stands in for any odd record of one host
        return HostPrice(on_demand=1_000_000)

    feed = OfferFeed(master, price_of)
    await host(master, link, "h1")
    await host(master, link, "h2")
    assert set(offered(feed)) == {"h1"}


async def test_a_closed_feed_stops_listening(master, link, prices):
    feed = OfferFeed(master, prices.price)
    uuids = await host(master, link, "h1", 2)
    offered(feed)
    feed.close()
    assert not master.changes.listening
    master.allocations.claim("h1", "c1", "cmd-1", [uuids[0]])
    assert feed.refresh() == 0


async def test_a_refresh_in_slices_leaves_the_rest_for_later_and_a_search_still_sees_every_change(master, link, prices):
    feed = OfferFeed(master, prices.price)
    for n in range(5):
        await host(master, link, f"h{n}", 1)
    assert feed.refresh(limit=2) == 2  # the first two of the five (every host is due: the first build)
    assert feed.refresh(limit=2) == 2
    uuid = master.registry.gpus_of("h0")[0].uuid
    master.allocations.claim("h0", "c1", "cmd-1", [uuid])  # a change while one host still waits for its slice
    assert set(offered(feed)) == {"h1", "h2", "h3", "h4"}  # the search takes in all that is left, and the change


async def test_units_an_interruptible_container_holds_are_offered_on_demand(master, link, prices):
    feed = OfferFeed(master, prices.price, interruptible=lambda container: container.startswith("cheap"))
    uuids = await host(master, link, "h1", 2)
    master.allocations.claim("h1", "cheap-1", "cmd-1", [uuids[0]])
    master.allocations.claim("h1", "dear-1", "cmd-2", [uuids[1]])
    offer = offered(feed)["h1"]
    assert (offer.num_gpus, offer.num_gpus_on_demand) == (0, 1)


async def test_a_hosts_gpus_changed_by_another_hosts_hello_or_withdrawn_show_in_the_next_search(master, link, prices):
    """D20: GPU records written for a host without its own hello or save (another host naming its uuids, a withdrawal)
    mark its offer dirty: the next search offers what a fresh derivation offers, never the withdrawn GPUs."""
    feed = OfferFeed(master, prices.price)
    victim = await host(master, link, "h1", 4)
    assert offered(feed)["h1"].num_gpus == 4
    hostile = gpus(2, prefix="GPU-h1")  # names two of h1's uuids, as a renter of those cards could
    await connect(master, link, "h2", hostile, runtime="docker", isolation="container")
    fresh = OfferFeed(master, prices.price)
    want = {k: o.num_gpus for k, o in offered(fresh).items()}
    assert {k: o.num_gpus for k, o in offered(feed).items()} == want
    fresh.close()
    await master.registry.withdraw_gpus("h1", [g for g in master.registry.gpus_of("h1") if g.uuid == victim[3]], "test")
    fresh = OfferFeed(master, prices.price)
    assert offered(feed)["h1"].num_gpus == offered(fresh)["h1"].num_gpus == want["h1"] - 1
    fresh.close()
    feed.close()

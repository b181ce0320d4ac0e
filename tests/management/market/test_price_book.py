"""The price book: a host's own price, else its provider's default, else the grid's; validated, stored in the real
SQLite store, read from memory, and every change told to its listeners."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from common.errors import InvalidPrice, NotFound
from management.market.prices import HostPrice, PriceBook, PriceSetting, grid_default_of
from management.store import price_repo
from master.config import MasterConfig
from master.store import open_store
from master.store.base import Store

GRID = HostPrice(on_demand=0, min_bid=0, source="grid")
HOSTS = {"agt-a1": "acme", "agt-a2": "acme", "agt-b1": "bolt"}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'master.db'}")
    await opened.open()
    yield opened
    await opened.close()


@pytest.fixture
async def book(store: Store) -> PriceBook:
    prices = PriceBook(price_repo(store), GRID, lambda: 1000.0, owner_of=HOSTS.get)
    await prices.load()
    return prices


async def test_a_host_without_prices_costs_the_grid_default(book):
    assert book.price("acme", "agt-a1") == GRID


async def test_a_providers_default_covers_its_hosts_and_a_hosts_own_price_wins(book):
    await book.set_default("acme", PriceSetting(on_demand="1.20", min_bid="0.40"))
    await book.set_host("acme", "agt-a1", PriceSetting(on_demand="2.50", reserved_discount=0.2, max_duration_s=7 * 86400))
    own, default = book.price("acme", "agt-a1"), book.price("acme", "agt-a2")
    assert (own.source, own.on_demand, own.min_bid, own.reserved, own.max_duration_s) == (
        "host",
        2_500_000,
        None,
        2_000_000,
        604_800,
    )
    assert (default.source, default.on_demand, default.min_bid) == ("provider", 1_200_000, 400_000)
    assert book.price("bolt", "agt-b1") == GRID


async def test_clearing_a_hosts_price_falls_back_to_its_providers_default(book):
    await book.set_default("acme", PriceSetting(on_demand="1"))
    await book.set_host("acme", "agt-a1", PriceSetting(on_demand="3"))
    assert await book.clear_host("acme", "agt-a1") is True
    assert book.price("acme", "agt-a1").source == "provider"
    assert await book.clear_host("acme", "agt-a1") is False


async def test_prices_survive_a_restart_of_the_book(store, book):
    await book.set_default("acme", PriceSetting(on_demand="1.5"))
    await book.set_host("acme", "agt-a2", PriceSetting(on_demand="0.000125", min_bid="0.0001"))
    again = PriceBook(price_repo(store), GRID)
    await again.load()
    assert again.price("acme", "agt-a2").on_demand == 125
    assert again.price("acme", "agt-a1").on_demand == 1_500_000
    assert [(r.provider, r.agent_id) for r in again.records()] == [("acme", ""), ("acme", "agt-a2")]


async def test_listeners_hear_every_change_with_the_host_or_none_for_a_default(book):
    heard: list[tuple[str, str | None]] = []
    unsubscribe = book.subscribe(lambda provider, agent_id: heard.append((provider, agent_id)))
    await book.set_host("acme", "agt-a1", PriceSetting(on_demand="2"))
    await book.set_default("acme", PriceSetting(on_demand="1"))
    await book.clear_host("acme", "agt-a1")
    await book.clear_host("acme", "agt-a1")  # nothing to clear: nothing changed, nobody told
    unsubscribe()
    await book.set_default("acme", PriceSetting(on_demand="4"))
    assert heard == [("acme", "agt-a1"), ("acme", None), ("acme", "agt-a1")]


async def test_a_broken_listener_does_not_stop_the_change_or_the_other_listeners(book):
    heard: list[str | None] = []

    def broken(provider: str, agent_id: str | None) -> None:
        raise RuntimeError("listener bug")

    book.subscribe(broken)
    book.subscribe(lambda provider, agent_id: heard.append(agent_id))
    await book.set_host("acme", "agt-a1", PriceSetting(on_demand="2"))
    assert heard == ["agt-a1"] and book.price("acme", "agt-a1").on_demand == 2_000_000


async def test_a_provider_may_price_only_its_own_hosts(book):
    with pytest.raises(NotFound, match="no agent 'agt-b1'"):
        await book.set_host("acme", "agt-b1", PriceSetting(on_demand="1"))
    with pytest.raises(NotFound, match="no agent 'agt-zzz'"):
        await book.set_host("acme", "agt-zzz", PriceSetting(on_demand="1"))
    with pytest.raises(NotFound):
        await book.clear_host("acme", "agt-b1")
    assert book.records() == []


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        (PriceSetting(on_demand="-1"), "on_demand"),
        (PriceSetting(on_demand="2.5.0"), "on_demand"),
        (PriceSetting(on_demand="0.0000001"), "on_demand"),
        (PriceSetting(on_demand="1", min_bid="cheap"), "min_bid"),
        (PriceSetting(on_demand="1", reserved_discount=0.95), "reserved_discount"),
        (PriceSetting(on_demand="1", reserved_discount=-0.1), "reserved_discount"),
        (PriceSetting(on_demand="1", reserved_discount=float("nan")), "reserved_discount"),
        (PriceSetting(on_demand="1", max_duration_s=600), "max_duration_s"),
        (PriceSetting(on_demand="1", max_duration_s=float("inf")), "max_duration_s"),
    ],
)
async def test_a_bad_price_is_refused_naming_its_field_and_nothing_is_stored(book, store, setting, field):
    with pytest.raises(InvalidPrice, match=f"^{field}: "):
        await book.set_host("acme", "agt-a1", setting)
    assert await price_repo(store).list() == []
    assert book.price("acme", "agt-a1") == GRID


async def test_free_and_the_edges_of_the_rules_are_accepted(book):
    rec = await book.set_host("acme", "agt-a1", PriceSetting(on_demand="0", reserved_discount=0.9, max_duration_s=3600))
    assert (rec.on_demand, rec.reserved_discount, rec.max_duration_s, rec.updated_at) == (0, 0.9, 3600, 1000.0)


def test_the_grid_default_comes_from_the_masters_settings(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), default_price="0.75", default_min_bid="0.25")
    assert grid_default_of(config) == HostPrice(on_demand=750_000, min_bid=250_000, source="grid")
    on_demand_only = MasterConfig(state_dir=str(tmp_path), default_price="0.75", default_min_bid="")
    assert grid_default_of(on_demand_only).min_bid is None


async def test_the_reserved_price_is_exact_integer_arithmetic_and_never_above_on_demand(book):
    """D17: 0.086740 at 30% off is 0.060718 (86740 * 0.7 = 60718 exactly); the float product gave 0.060717."""
    await book.set_host("acme", "agt-a1", PriceSetting(on_demand="0.08674", reserved_discount=0.3))
    assert book.price("acme", "agt-a1").reserved == 60718
    for on_demand in (1, 7, 86740, 66800, 999_999_999_999_999):
        for discount in (0.0, 0.07, 0.3, 0.9):
            reserved = HostPrice(on_demand=on_demand, reserved_discount=discount).reserved
            off_ppm = round(discount * 1_000_000)
            assert reserved == on_demand * (1_000_000 - off_ppm) // 1_000_000 <= on_demand, (on_demand, discount)

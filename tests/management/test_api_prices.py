"""Providers' prices through the real API on a real Master (SQLite in the test's tmp_path).

A provider sets its default and its own hosts' prices and reads them back; the operator does so for anyone; the price
in force on a host (its own, else its provider's default, else the grid's) is public; money goes in and out as
decimal strings with the currency; every write is audited; bad input is a 400 naming the field.
"""

from __future__ import annotations

import pytest

from management.store import price_repo
from tests.management.hosts import add_agent, api_key


async def error_of(response) -> tuple[int, str, str]:
    error = (await response.json())["error"]
    return response.status, error["code"], error["message"]


@pytest.fixture
async def market(api):
    """Two providers with a host each (acme also a second), a provider key each and a renter key."""
    await add_agent(api.master, "agt-a1", "a10:1", provider="acme")
    await add_agent(api.master, "agt-a2", "a10:2", provider="acme")
    await add_agent(api.master, "agt-b1", "a10:1", provider="bolt")
    api.acme = await api_key(api.master, "provider", "acme")
    api.bolt = await api_key(api.master, "provider", "bolt")
    api.renter = await api_key(api.master, "renter", "lab")
    return api


async def test_a_provider_prices_its_host_and_everyone_reads_the_price_in_force(market):
    body = {"on_demand": "2.50", "min_bid": "0.80", "reserved_discount": 0.2, "max_duration_s": 604800}
    response = await market.put("/api/v1/agents/agt-a1/price", json=body, headers=market.acme)
    assert response.status == 200, await response.text()
    expected = {
        "agent_id": "agt-a1",
        "provider": "acme",
        "source": "host",
        "currency": "USD",
        "on_demand": "2.50",
        "min_bid": "0.80",
        "reserved_discount": 0.2,
        "reserved": "2.00",
        "max_duration_s": 604800,
    }
    assert await response.json() == expected
    for who in (market.renter, market.bolt, market.auth):
        read = await market.get("/api/v1/agents/agt-a1/price", headers=who)
        assert (read.status, await read.json()) == (200, expected)


async def test_a_host_without_a_price_shows_its_providers_default_then_the_grids(market):
    grid = await (await market.get("/api/v1/agents/agt-a2/price", headers=market.renter)).json()
    assert (grid["source"], grid["on_demand"], grid["min_bid"]) == ("grid", "0.00", "0.00")
    set_default = await market.put("/api/v1/prices/default", json={"on_demand": "1.2"}, headers=market.acme)
    assert set_default.status == 200, await set_default.text()
    assert (await set_default.json())["scope"] == "provider"
    default = await (await market.get("/api/v1/agents/agt-a2/price", headers=market.renter)).json()
    assert (default["source"], default["on_demand"], default["min_bid"]) == ("provider", "1.20", None)


async def test_clearing_a_hosts_price_answers_the_price_now_in_force(market):
    await market.put("/api/v1/prices/default", json={"on_demand": "1"}, headers=market.acme)
    await market.put("/api/v1/agents/agt-a1/price", json={"on_demand": "3"}, headers=market.acme)
    cleared = await market.delete("/api/v1/agents/agt-a1/price", headers=market.acme)
    assert cleared.status == 200
    assert ((await cleared.json())["source"], (await cleared.json())["on_demand"]) == ("provider", "1.00")


async def test_a_provider_lists_only_its_own_prices_and_the_operator_lists_all_or_one(market):
    await market.put("/api/v1/prices/default", json={"on_demand": "1"}, headers=market.acme)
    await market.put("/api/v1/agents/agt-a2/price", json={"on_demand": "2"}, headers=market.acme)
    await market.put("/api/v1/agents/agt-b1/price", json={"on_demand": "5"}, headers=market.bolt)
    own = await (await market.get("/api/v1/prices", headers=market.acme)).json()
    assert own["currency"] == "USD" and own["grid_default"]["on_demand"] == "0.00"
    assert [(i["provider"], i["agent_id"], i["on_demand"]) for i in own["items"]] == [
        ("acme", None, "1.00"),
        ("acme", "agt-a2", "2.00"),
    ]
    everyone = await (await market.get("/api/v1/prices", headers=market.auth)).json()
    assert [i["provider"] for i in everyone["items"]] == ["acme", "acme", "bolt"]
    bolt = await (await market.get("/api/v1/prices?provider=bolt", headers=market.auth)).json()
    assert [i["agent_id"] for i in bolt["items"]] == ["agt-b1"]
    peeking = await market.get("/api/v1/prices?provider=bolt", headers=market.acme)
    assert (await error_of(peeking))[:2] == (404, "not_found")


async def test_a_provider_may_not_price_another_providers_host_which_answers_as_missing(market):
    for method in (market.put, market.delete):
        kwargs = {"json": {"on_demand": "9"}} if method == market.put else {}
        other = await method("/api/v1/agents/agt-b1/price", headers=market.acme, **kwargs)
        missing = await method("/api/v1/agents/agt-zzz/price", headers=market.acme, **kwargs)
        assert (await error_of(other))[:2] == (await error_of(missing))[:2] == (404, "not_found")
    assert (await (await market.get("/api/v1/agents/agt-b1/price", headers=market.bolt)).json())["source"] == "grid"


async def test_a_provider_sets_only_its_own_default_and_the_operator_names_the_provider(market):
    others = await market.put("/api/v1/prices/default", json={"on_demand": "1", "provider": "bolt"}, headers=market.acme)
    assert (await error_of(others))[:2] == (403, "forbidden")
    unnamed = await market.put("/api/v1/prices/default", json={"on_demand": "1"}, headers=market.auth)
    status, code, message = await error_of(unnamed)
    assert (status, code) == (400, "bad_request") and message.startswith("provider:")
    not_a_provider = await market.put("/api/v1/prices/default", json={"on_demand": "1", "provider": "lab"}, headers=market.auth)
    assert (await error_of(not_a_provider))[0] == 400
    named = await market.put("/api/v1/prices/default", json={"on_demand": "0.5", "provider": "bolt"}, headers=market.auth)
    assert named.status == 200 and (await named.json())["provider"] == "bolt"


async def test_a_renter_reads_a_hosts_price_but_writes_and_lists_none(market):
    put = await market.put("/api/v1/agents/agt-a1/price", json={"on_demand": "0"}, headers=market.renter)
    delete = await market.delete("/api/v1/agents/agt-a1/price", headers=market.renter)
    default = await market.put("/api/v1/prices/default", json={"on_demand": "0"}, headers=market.renter)
    listing = await market.get("/api/v1/prices", headers=market.renter)
    assert [r.status for r in (put, delete, default, listing)] == [403, 403, 403, 403]
    assert (await market.get("/api/v1/agents/agt-zzz/price", headers=market.renter)).status == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"on_demand": "-1"}, "on_demand"),
        ({"on_demand": 2.5}, "on_demand"),
        ({"on_demand": "2,50"}, "on_demand"),
        ({"on_demand": "12\n"}, "on_demand"),  # "$" matched before the newline: it was priced 12.00
        ({"on_demand": "1", "min_bid": "0.40\n"}, "min_bid"),
        ({"on_demand": "1", "min_bid": "lots"}, "min_bid"),
        ({"on_demand": "1", "reserved_discount": 0.95}, "reserved_discount"),
        ({"on_demand": "1", "max_duration_s": 60}, "max_duration_s"),
        ({"min_bid": "1"}, "body"),  # on_demand missing
        ({"on_demand": "1", "colour": "red"}, "body"),  # an unknown field
    ],
)
async def test_a_bad_price_is_a_400_naming_the_field_and_changes_nothing(market, body, field):
    status, code, message = await error_of(await market.put("/api/v1/agents/agt-a1/price", json=body, headers=market.acme))
    assert (status, code) == (400, "bad_request"), message
    assert message.startswith(f"{field}:"), message
    assert (await (await market.get("/api/v1/agents/agt-a1/price", headers=market.acme)).json())["source"] == "grid"


async def test_every_price_write_is_audited_and_reads_are_not(market):
    await market.put("/api/v1/prices/default", json={"on_demand": "1"}, headers=market.acme)
    await market.put("/api/v1/agents/agt-a1/price", json={"on_demand": "2"}, headers=market.acme)
    await market.delete("/api/v1/agents/agt-a1/price", headers=market.acme)
    await market.get("/api/v1/agents/agt-a1/price", headers=market.acme)
    await market.get("/api/v1/prices", headers=market.acme)
    audit = await market.master.store.events.list(kind_prefix="audit", subject="acme", limit=100)
    assert [(e.data["method"], e.data["route"], e.data["target"]) for e in audit] == [
        ("PUT", "/api/v1/prices/default", "acme"),
        ("PUT", "/api/v1/agents/{agent_id}/price", "agt-a1"),
        ("DELETE", "/api/v1/agents/{agent_id}/price", "agt-a1"),
    ]


async def test_a_price_set_through_the_api_is_stored_in_micro_units(market):
    await market.put("/api/v1/agents/agt-a1/price", json={"on_demand": "4.25"}, headers=market.acme)
    stored = await price_repo(market.master.store).list(provider="acme")
    assert [(r.agent_id, r.on_demand) for r in stored] == [("agt-a1", 4_250_000)]

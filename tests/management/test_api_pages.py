"""Every list is paged by an opaque cursor: each item exactly once, in a stable order, filters kept across pages.

The fleet is generated (bench/api_pages.py), written to a real SQLite store and loaded by a real Master at
start, as after a restart; the API is the real aiohttp app. Timing is not asserted here: ``python -m bench
api-pages`` measures it.
"""

from __future__ import annotations

import base64

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web import Application, Request

from bench.api_pages import Fleet, generated_fleet, seed_store
from management.api import ApiSettings
from management.app import api_app
from management.http.paging import fingerprint
from management.http.schemas import AgentQuery, CommandQuery, EventQuery, GpuQuery, PageQuery
from master.config import MasterConfig
from master.master import Master
from tests.management.hosts import add_agent

AGENTS, GPUS_PER_AGENT = 625, 8  # 5,000 GPUs


class FleetClient(TestClient[Request, Application]):
    """A test client that also holds what the test pages through: the Master, the fleet it was seeded with, a key."""

    master: Master
    fleet: Fleet
    auth: dict[str, str]


@pytest.fixture
async def fleet_api(tmp_path):
    fleet = generated_fleet(AGENTS, GPUS_PER_AGENT)
    await seed_store(tmp_path, fleet)
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    # Paging as fast as the test can: far over the per-key rate limit a client gets by default.
    client = FleetClient(TestServer(api_app(master, ApiSettings(key_rate_per_s=1e6, key_burst=10**6))))
    await client.start_server()
    client.master = master
    client.fleet = fleet
    client.auth = {"Authorization": f"Bearer {await master.create_api_key('pager')}"}
    yield client
    await client.close()
    await master.stop()


async def page(api, path: str, **params) -> dict:
    response = await api.get(path, params=params, headers=api.auth)
    assert response.status == 200, await response.text()
    return await response.json()


async def every_page(api, path: str, **params) -> list[list[dict]]:
    """Following next_cursor to the end; a ``cursor`` given starts there."""
    pages, cursor = [], params.pop("cursor", None)
    while True:
        body = await page(api, path, **params, **({"cursor": cursor} if cursor else {}))
        pages.append(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


async def test_five_thousand_gpus_come_back_page_by_page_each_exactly_once_in_a_stable_order(fleet_api):
    pages = await every_page(fleet_api, "/api/v1/gpus", limit=100)
    assert len(pages) == 50 and all(len(p) == 100 for p in pages)
    served = [(g["agent_id"], g["index"]) for p in pages for g in p]
    assert served == sorted((g.agent_id, g.index) for g in fleet_api.fleet.gpus)


async def test_a_list_without_limit_answers_a_hundred_and_a_cursor(fleet_api):
    first = await page(fleet_api, "/api/v1/gpus")
    assert len(first["items"]) == 100 and isinstance(first["next_cursor"], str)


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "ten"])
async def test_a_limit_outside_one_to_a_thousand_is_refused(fleet_api, limit):
    response = await fleet_api.get(f"/api/v1/gpus?limit={limit}", headers=fleet_api.auth)
    assert response.status == 400
    assert (await response.json())["error"]["message"].startswith("limit:")


async def test_filters_combine_with_the_cursor(fleet_api):
    wanted = sorted((g.agent_id, g.index) for g in fleet_api.fleet.gpus if g.model == "l4" and g.state == "available")
    pages = await every_page(fleet_api, "/api/v1/gpus", limit=37, model="l4", state="available")
    served = [(g["agent_id"], g["index"]) for p in pages for g in p]
    assert served == wanted and len(pages) == -(-len(wanted) // 37)
    offline_agents = await every_page(fleet_api, "/api/v1/agents", limit=9, state="offline", provider="prov-009")
    expected = sorted(a.id for a in fleet_api.fleet.agents if a.state == "offline" and a.provider == "prov-009")
    assert [a["id"] for p in offline_agents for a in p] == expected


async def test_a_cursor_reused_with_other_filters_or_for_another_list_is_refused(fleet_api):
    cursor = (await page(fleet_api, "/api/v1/gpus", limit=10, model="l4"))["next_cursor"]
    for path, params in (("/api/v1/gpus", {"model": "h100-sxm"}), ("/api/v1/gpus", {}), ("/api/v1/agents", {"model": "l4"})):
        response = await fleet_api.get(path, params={**params, "cursor": cursor}, headers=fleet_api.auth)
        assert response.status == 400, path
    for forged in ("not-a-cursor", "W10", "eyJ" * 20):
        response = await fleet_api.get("/api/v1/gpus", params={"cursor": forged}, headers=fleet_api.auth)
        assert response.status == 400
        assert (await response.json())["error"]["code"] == "bad_cursor"


async def test_hosts_added_while_paging_never_shift_or_repeat_a_page(fleet_api):
    first = await page(fleet_api, "/api/v1/agents", limit=100)
    await add_agent(fleet_api.master, "agt-00000000-late", "a10:1")  # sorts right after the first agent: behind the cursor
    rest = await every_page(fleet_api, "/api/v1/agents", limit=100, cursor=first["next_cursor"])
    seen = [a["id"] for a in first["items"]] + [a["id"] for p in rest for a in p]
    assert len(seen) == len(set(seen)) == AGENTS
    assert "agt-00000000-late" not in seen


async def test_commands_page_newest_first_and_new_ones_do_not_disturb_a_paging_under_way(fleet_api):
    made = []
    for i in range(25):
        spec = {"name": f"c{i}"}
        response = await fleet_api.post(
            "/api/v1/commands",
            json={"agent_id": "agt-00000001", "kind": "delete_container", "spec": spec},
            headers=fleet_api.auth,
        )
        made.append((await response.json())["id"])
    first = await page(fleet_api, "/api/v1/commands", limit=7)
    await fleet_api.post(
        "/api/v1/commands",
        json={"agent_id": "agt-00000001", "kind": "delete_container", "spec": {"name": "late"}},
        headers=fleet_api.auth,
    )
    rest = await every_page(fleet_api, "/api/v1/commands", limit=7, cursor=first["next_cursor"])
    served = [c["id"] for c in first["items"]] + [c["id"] for p in rest for c in p]
    assert served == list(reversed(made))


async def test_events_page_in_sequence_order_and_after_still_gives_the_start(fleet_api):
    for i in range(30):
        await fleet_api.master.events.record("test.marker", f"subject-{i}")
    pages = await every_page(fleet_api, "/api/v1/events", limit=8, kind="test.")
    seqs = [e["seq"] for p in pages for e in p]
    assert len(seqs) == 30 and seqs == sorted(seqs) and len(pages) == 4
    later = (await page(fleet_api, "/api/v1/events", kind="test.", after=seqs[9]))["items"]
    assert [e["seq"] for e in later] == seqs[10:]
    both = await fleet_api.get("/api/v1/events", params={"kind": "test.", "after": "1", "cursor": "x"}, headers=fleet_api.auth)
    assert both.status == 400


async def test_tiers_and_signing_keys_page_too(fleet_api):
    await fleet_api.post("/api/v1/signing-keys/rotate", headers=fleet_api.auth)
    keys = await every_page(fleet_api, "/api/v1/signing-keys", limit=1)
    assert [len(p) for p in keys] == [1, 1]
    assert len({p[0]["key_id"] for p in keys}) == 2
    tiers = await every_page(fleet_api, "/api/v1/tiers", limit=1)
    everything = (await page(fleet_api, "/api/v1/tiers"))["items"]
    assert [p[0]["name"] for p in tiers] == [t["name"] for t in everything] and len(tiers) > 1


@pytest.mark.parametrize(
    ("path", "query", "key"),
    [
        ("/api/v1/events", EventQuery(), [10**30]),
        ("/api/v1/commands", CommandQuery(), [1.0, "cmd-x", 10**30]),
        ("/api/v1/commands", CommandQuery(), [float("1e300"), "cmd-x", 0]),
        ("/api/v1/gpus", GpuQuery(), ["agt-1", "zero", "GPU-1"]),
        ("/api/v1/agents", AgentQuery(), ["a" * 129]),
        ("/api/v1/tiers", PageQuery(), [-5]),
    ],
)
async def test_a_forged_cursor_with_the_right_fingerprint_but_an_out_of_range_key_is_a_400_not_a_500(fleet_api, path, query, key):
    resource = path.rsplit("/", 1)[1]
    raw = msgspec.json.encode([resource, fingerprint(query), key])
    cursor = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    response = await fleet_api.get(path, params={"cursor": cursor}, headers=fleet_api.auth)
    assert response.status == 400
    assert (await response.json())["error"]["code"] == "bad_cursor"

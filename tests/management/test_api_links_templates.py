"""Links and templates through the real API on a real Master (SQLite), before any relay or agent is involved: who may
list and mint, what bad input is told, what the link answers while the workload waits. The whole path (relay, agent,
container, browser) is tests/e2e/test_links.py and tests/console/test_journey_links.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from management.http.keys import SERVICES_KEY
from management.links.proxy import links_app
from tests.management.hosts import api_key
from tests.management.test_api_workloads import submit

LINKED = {"ports": [8888, 22], "links": [{"port": 8888}, {"port": 22, "kind": "tcp"}]}


@pytest.fixture
async def links(api) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The links' own listener beside the API's (as the Master serves them), over the same services."""
    services = api.app[SERVICES_KEY]
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(links_app(services)))
    await client.start_server()
    services.links.listening_at(str(client.make_url("")).rstrip("/"))
    yield client
    await client.close()


@pytest.fixture
async def keys(api):
    return {
        "alice": await api_key(api.master, "renter", "alice"),
        "bob": await api_key(api.master, "renter", "bob"),
        "provider": await api_key(api.master, "provider", "acme"),
    }


async def test_the_owner_lists_its_links_another_renter_gets_404_and_a_provider_403(api, keys):
    workload = await submit(api, keys["alice"], **LINKED)
    path = f"/api/v1/workloads/{workload['id']}/links"
    answer = await api.get(path, headers=keys["alice"])
    [link] = (await answer.json())["items"]  # the tcp port has no link
    assert link["port"] == 8888 and link["url"].endswith(f"/w/{workload['id']}-8888/") and link["public"] is False
    assert (await api.get(path, headers=keys["bob"])).status == 404
    assert (await api.get(path, headers=keys["provider"])).status == 403
    minted = await api.post(f"{path}/8888/tokens", json={}, headers=keys["bob"])
    assert minted.status == 404


@pytest.mark.parametrize(
    ("port", "body", "said"),
    [
        ("abc", {}, "port: 'abc' is not a port number"),
        ("22", {}, "no http link on port 22 (its links: 8888)"),
        ("9999", {}, "no http link on port 9999"),
        ("8888", {"ttl_s": 5}, "ttl_s: a link token lasts 60 to"),
        ("8888", {"ttl_s": 10**9}, "ttl_s"),
        ("8888", {"surprise": 1}, "surprise"),
    ],
)
async def test_a_bad_token_request_is_refused_naming_what_is_wrong(api, keys, port, body, said):
    workload = await submit(api, keys["alice"], **LINKED)
    answer = await api.post(f"/api/v1/workloads/{workload['id']}/links/{port}/tokens", json=body, headers=keys["alice"])
    assert answer.status == 400 and said in (await answer.json())["error"]["message"]


async def test_a_link_opens_only_once_the_workload_runs_and_only_for_its_owner(api, links, keys):
    workload = await submit(api, keys["alice"], **LINKED)
    link = f"/w/{workload['id']}-8888/"
    minted = await api.post(f"/api/v1/workloads/{workload['id']}/links/8888/tokens", json={"ttl_s": 600}, headers=keys["alice"])
    assert minted.status == 201
    token = (await minted.json())["token"]
    assert (await minted.json())["url"] == str(links.make_url(link))  # on the links' own listener
    queued = await links.get(link, headers={"Authorization": f"Bearer {token}"})
    assert queued.status == 503 and "queued" in (await queued.json())["error"]["message"]
    assert (await links.get(link)).status == 401
    alice_key = keys["alice"]["Authorization"].removeprefix("Bearer ")
    in_url = await links.get(f"{link}?idlegrid_token={alice_key}", allow_redirects=False)
    assert in_url.status == 401 and "never an API key" in (await in_url.json())["error"]["message"]
    assert (await links.get(link, headers=keys["bob"])).status == 404
    other_port = await links.get(f"/w/{workload['id']}-22/", headers={"Authorization": f"Bearer {token}"})
    assert other_port.status == 404  # a tcp port has no link, whoever asks
    elsewhere = await links.get(f"/w/{workload['id']}-8888", headers=keys["alice"], allow_redirects=False)
    assert elsewhere.status == 308 and elsewhere.headers["Location"] == link


async def test_the_api_listener_serves_no_link_it_redirects_to_the_links_own_origin(api, links, keys):
    workload = await submit(api, keys["alice"], **LINKED)
    link = f"/w/{workload['id']}-8888/"
    for path in (link + "tree?x=1", f"/w/{workload['id']}-8888"):
        moved = await api.get(path, headers=keys["alice"], allow_redirects=False)
        assert moved.status == 308 and moved.headers["Cache-Control"] == "no-store"
        assert moved.headers["Location"] == str(links.make_url(link)) + ("tree?x=1" if path.endswith("x=1") else "")
    # Computed from the path alone: a workload that is not there is redirected the same way, nothing is said of it.
    absent = await api.get("/w/wl-ffff-8888/", allow_redirects=False)
    assert absent.status == 308 and absent.headers["Location"] == str(links.make_url("/w/wl-ffff-8888/"))
    junk = await api.get("/w/not-a-link/", allow_redirects=False)
    assert junk.status == 404 and "/w/<workload>-<port>/" in (await junk.json())["error"]["message"]
    # ... and the links listener serves nothing but links: no API, no console, no health.
    for path in ("/api/v1/workloads", "/console/", "/healthz", "/"):
        answer = await links.get(path, headers=keys["alice"], allow_redirects=False)
        assert answer.status == 404 and "serves only links" in (await answer.json())["error"]["message"], path


async def test_a_spec_linking_an_undeclared_port_is_refused(api, keys):
    answer = await api.post(
        "/api/v1/workloads",
        json={"name": "x", "image": "busybox", "ports": [80], "links": [{"port": 81}]},
        headers=keys["alice"],
    )
    assert answer.status == 400 and "ports does not declare" in (await answer.json())["error"]["message"]


async def test_every_role_reads_the_templates_and_an_unknown_one_is_404(api, keys):
    for who in ("alice", "provider"):
        listed = await api.get("/api/v1/templates", headers=keys[who])
        names = [t["name"] for t in (await listed.json())["items"]]
        assert names == ["comfyui", "cuda-shell", "jupyter", "vllm"]
    jupyter = await (await api.get("/api/v1/templates/jupyter", headers=keys["alice"])).json()
    assert jupyter["spec"]["links"] == [{"port": 8888, "kind": "http", "public": False}]
    missing = await api.get("/api/v1/templates/nope", headers=keys["alice"])
    assert missing.status == 404 and "no template 'nope'" in (await missing.json())["error"]["message"]
    assert (await api.get("/api/v1/templates")).status == 401

"""Tenants kept apart, through the real API on a real Master (SQLite): the cross-tenant matrix in one place.

- Renter bob cannot see (get, list), explain or cancel renter alice's workload: each answers 404 with the body a
  missing workload gets, and alice's workload is untouched.
- A provider uses no workload route (403); it sees what runs on its own hosts in the agent view, without the
  renter's secrets (env, command, labels, account); another provider's host answers 404 as a missing one.
- A revoked key is refused on the very next call, and the workloads it submitted live on.

Related, not repeated here: the list filters and drain rights of providers (test_api_auth.py), accounts' and
keys' cross-account 404s and the revocation of a key's cache entry (test_api_accounts.py). The hosts are simulated
H100s (no GPU here); the scheduling loop is run by hand, one cycle, to place the workload.
"""

from __future__ import annotations

from typing import Any

import pytest

from management.http.keys import SERVICES_KEY
from management.store import workload_repo
from tests.management.hosts import add_agent, api_key
from tests.support.stored import stored_workload

SECRET = "hf_secret_value"
SPEC: dict[str, Any] = {
    "name": "train-llm",
    "image": "ghcr.io/acme/train:1.4",
    "command": ["python", "train.py", "--token-file", "/run/secret-path"],
    "env": {"HF_TOKEN": SECRET},
    "labels": {"team": "alice-research"},
    "replica": {"gpus": 2, "models": ["h100-sxm"]},
}
MISSING = "wl-0000000000000000"


@pytest.fixture
async def tenants(api):
    """Two providers (acme: one host of 2 H100s; other: one host of 2 A10s), two renters, and alice's workload
    placed on acme's host by one scheduling cycle."""
    await add_agent(api.master, "agt-acme", "h100:2", provider="acme", runtime="docker", isolation="container")
    await add_agent(api.master, "agt-other", "a10:2", provider="other", runtime="docker", isolation="container")
    keys = {
        "alice": await api_key(api.master, "renter", "alice"),
        "bob": await api_key(api.master, "renter", "bob"),
        "acme": await api_key(api.master, "provider", "acme"),
        "other": await api_key(api.master, "provider", "other"),
    }
    response = await api.post("/api/v1/workloads", json=SPEC, headers=keys["alice"])
    assert response.status == 201, await response.text()
    keys["workload"] = (await response.json())["id"]
    return keys


async def place(api) -> None:
    await api.app[SERVICES_KEY].workloads.scheduler.cycle()


WORKLOAD_CALLS = [
    ("GET", "/api/v1/workloads/{}"),
    ("GET", "/api/v1/workloads/{}/explain"),
    ("POST", "/api/v1/workloads/{}/cancel"),
]


@pytest.mark.parametrize(("method", "path"), WORKLOAD_CALLS)
async def test_a_renter_cannot_see_explain_or_cancel_another_renters_workload(api, tenants, method, path):
    theirs = tenants["workload"]
    other = await api.request(method, path.format(theirs), headers=tenants["bob"])
    missing = await api.request(method, path.format(MISSING), headers=tenants["bob"])
    assert (other.status, missing.status) == (404, 404)
    assert (await other.json()) == _with_id(await missing.json(), MISSING, theirs)  # the same answer: nothing leaks
    readable = path.format(theirs) if method == "GET" else f"/api/v1/workloads/{theirs}"
    assert (await api.get(readable, headers=tenants["alice"])).status == 200  # alice still reads (and explains) it
    assert (await stored_workload(api.master.store, theirs)).state == "queued"  # bob's cancel did nothing


async def test_a_renter_lists_none_of_another_renters_workloads_whatever_it_filters_on(api, tenants):
    for query in ("", "?account=alice", "?state=queued", "?account=alice&state=queued"):
        listed = await api.get(f"/api/v1/workloads{query}", headers=tenants["bob"])
        assert (listed.status, (await listed.json())["items"]) == (200, []), query
    mine = await (await api.get("/api/v1/workloads", headers=tenants["alice"])).json()
    assert [w["id"] for w in mine["items"]] == [tenants["workload"]]


@pytest.mark.parametrize(("method", "path"), [*WORKLOAD_CALLS, ("GET", "/api/v1/workloads"), ("POST", "/api/v1/workloads")])
async def test_a_provider_uses_no_workload_route(api, tenants, method, path):
    body = SPEC if (method, path) == ("POST", "/api/v1/workloads") else None
    response = await api.request(method, path.format(tenants["workload"]), json=body, headers=tenants["acme"])
    assert response.status == 403
    assert "provider key may not" in (await response.json())["error"]["message"]


async def test_a_provider_sees_what_runs_on_its_hosts_without_the_renters_secrets(api, tenants):
    await place(api)
    placed = await stored_workload(api.master.store, tenants["workload"])
    assert placed.state == "scheduled" and [a.agent_id for a in placed.assignments] == ["agt-acme"]
    (assignment,) = placed.assignments

    response = await api.get("/api/v1/agents/agt-acme", headers=tenants["acme"])
    assert response.status == 200
    raw = await response.text()
    (hosted,) = (await response.json())["workloads"]
    assert hosted == {
        "workload_id": tenants["workload"],
        "name": "train-llm",
        "image": "ghcr.io/acme/train:1.4",
        "replica": 0,
        "gpus": assignment.units,
        "container": f"{tenants['workload']}-r0-a1",
        "state": "scheduled",
        "container_state": "pending",
        "started_at": None,
    }
    for private in (SECRET, "HF_TOKEN", "train.py", "/run/secret-path", "alice-research", "alice"):
        assert private not in raw, private  # env names and values, command, labels, the renter's account
    listed = await (await api.get("/api/v1/agents", headers=tenants["acme"])).json()
    assert [a["workloads"] for a in listed["items"]] == [[hosted]]  # the list shows the same
    operator = await (await api.get("/api/v1/agents/agt-acme", headers=api.auth)).json()
    assert operator["workloads"] == [hosted]
    assert (await (await api.get("/api/v1/agents/agt-other", headers=tenants["other"])).json())["workloads"] == []


async def test_another_providers_host_with_a_workload_answers_404_like_a_missing_one(api, tenants):
    await place(api)
    theirs = await api.get("/api/v1/agents/agt-acme", headers=tenants["other"])
    missing = await api.get("/api/v1/agents/agt-nobody", headers=tenants["other"])
    assert (theirs.status, missing.status) == (404, 404)
    assert (await theirs.json()) == _with_id(await missing.json(), "agt-nobody", "agt-acme")
    listed = await (await api.get("/api/v1/agents", headers=tenants["other"])).json()
    assert [a["id"] for a in listed["items"]] == ["agt-other"]
    gpus = await (await api.get("/api/v1/gpus", headers=tenants["other"])).json()
    assert {g["agent_id"] for g in gpus["items"]} == {"agt-other"}


async def test_a_revoked_renter_key_is_refused_on_the_very_next_call_and_its_workload_lives_on(api, tenants):
    alice = tenants["alice"]
    path = f"/api/v1/workloads/{tenants['workload']}"
    assert (await api.get(path, headers=alice)).status == 200  # the key is checked, and remembered for 10 s
    key_id = (await (await api.get("/api/v1/whoami", headers=alice)).json())["key_id"]
    assert (await api.post(f"/api/v1/keys/{key_id}/revoke", headers=api.auth)).status == 200

    for method, call in (("GET", path), ("GET", f"{path}/explain"), ("POST", f"{path}/cancel"), ("POST", "/api/v1/workloads")):
        refused = await api.request(method, call, json=SPEC if call.endswith("workloads") else None, headers=alice)
        assert refused.status == 401, call
        assert key_id in (await refused.json())["error"]["message"]
    assert (await stored_workload(api.master.store, tenants["workload"])).state == "queued"  # nothing was done with it
    assert len(await workload_repo(api.master.store).list()) == 1
    assert (await api.get(path, headers=api.auth)).status == 200  # the operator still reads it
    assert (await api.get("/api/v1/workloads", headers=tenants["bob"])).status == 200  # other keys are untouched


def _with_id(body: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    error = body["error"]
    return {"error": error | {"message": error["message"].replace(old, new)}}


async def test_a_hosts_verifications_are_its_provider_and_the_operator_alone_and_only_the_operator_starts_a_run(api, tenants):
    path = "/api/v1/agents/agt-acme/verifications"
    own = await api.get(path, headers=tenants["acme"])
    assert own.status == 200 and {g["uuid"] for g in (await own.json())["gpus"]}  # acme reads its own host's GPUs
    theirs = await api.get(path, headers=tenants["other"])
    missing = await api.get("/api/v1/agents/agt-nobody/verifications", headers=tenants["other"])
    assert (theirs.status, missing.status) == (404, 404)  # another provider's host: as a missing one
    assert (await api.get(path, headers=tenants["alice"])).status == 403  # renters read no host
    for who in ("acme", "other", "alice"):  # starting a run is the operator's call, even on one's own host
        assert (await api.post("/api/v1/agents/agt-acme/verify", json={}, headers=tenants[who])).status == 403
    assert (await api.get(path, headers=api.auth)).status == 200

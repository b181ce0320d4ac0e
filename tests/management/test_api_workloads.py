"""Workloads through the real API on a real Master (SQLite): a renter submits, lists, reads and cancels its own;
each bad field of a spec is refused with a 400 that names it, and a gang its grid cannot network (no gang overlay) with
one that names the fix; the operator sees every account's. Another renter's
workload answering 404 as a missing one, and providers' 403s: test_api_tenancy.py."""

from __future__ import annotations

from typing import Any

import pytest

from management.store import workload_repo
from master.config import MasterConfig
from master.overlay import LighthouseSetting, OverlaySettings
from tests.management.hosts import api_key
from tests.support.operator_api import operator_api
from tests.support.stored import stored_workload

SPEC: dict[str, Any] = {
    "name": "train-llm",
    "image": "ghcr.io/acme/train:1.4",
    "command": ["python", "train.py"],
    "env": {"HF_TOKEN": "hf_secret_value"},
    "ports": [8080],
    "replicas": 2,
    "network": "none",  # its replicas need not reach each other: this Master runs no gang overlay
    "replica": {"gpus": 2, "models": ["h100-sxm"], "min_vram_mib": 40000},
}


@pytest.fixture
async def keys(api):
    return {
        "alice": await api_key(api.master, "renter", "alice"),
        "bob": await api_key(api.master, "renter", "bob"),
        "provider": await api_key(api.master, "provider", "acme"),
    }


async def submit(api, headers, **overrides: Any) -> dict:
    response = await api.post("/api/v1/workloads", json=SPEC | overrides, headers=headers)
    assert response.status == 201, await response.text()
    return await response.json()


async def test_a_renter_submits_a_workload_that_waits_in_the_queue(api, keys):
    body = await submit(api, keys["alice"])
    assert body["id"].startswith("wl-") and body["account"] == "alice"
    assert (body["state"], body["name"], body["version"]) == ("queued", "train-llm", 1)
    assert body["spec"]["replica"]["gpus"] == 2 and body["spec"]["priority"] == "normal"
    assert body["created_at"] == body["queued_at"]
    # The env's values are the renter's secrets: stored for the containers, never shown again.
    assert body["spec"]["env"] == ["HF_TOKEN"]
    got = await api.get(f"/api/v1/workloads/{body['id']}", headers=keys["alice"])
    assert "hf_secret_value" not in await got.text()
    waiting = (await got.json())["waiting"]  # a queued workload's view says why it waits
    assert waiting["job_id"] == body["id"] and waiting["cannot_fit"] == "no GPU on this grid is a h100-sxm"
    assert [f["name"] for f in waiting["filters"]][:2] == ["unhealthy or offline", "host takes no work"]
    assert waiting["summary"].startswith("Cannot be placed on this grid as it is now: no GPU on this grid is a h100-sxm")
    assert (await stored_workload(api.master.store, body["id"])).spec.env == {"HF_TOKEN": "hf_secret_value"}
    events = await api.master.store.events.list(subject=body["id"])
    assert [(e.kind, e.data["to"], e.data["account"]) for e in events] == [("workload.transition", "queued", "alice")]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replica": {"gpus": 0}}, "replica.gpus"),
        ({"replica": {"gpus": 17}}, "replica.gpus"),
        ({"replicas": 65}, "replicas"),
        ({"replicas": 0}, "replicas"),
        ({"ports": [8080, 8080]}, "ports"),
        ({"ports": [70000]}, "ports"),
        ({"replica": {"models": ["h900-imaginary"]}}, "replica.models"),
        ({"replica": {"tiers": ["platinum-plus"]}}, "replica.tiers"),
        ({"replica": {"vendors": ["3dfx"]}}, "replica.vendors"),
        ({"replica": {"vendors": ["amd", "amd"]}}, "replica.vendors"),
        ({"replica": {"min_compute_capability": "eight"}}, "replica.min_compute_capability"),
        ({"replica": {"mig_profile": "big"}}, "replica.mig_profile"),
        ({"replica": {"cpu_cores": 0}}, "replica.cpu_cores"),
        ({"priority": "urgent"}, "priority"),
        ({"constraints": {"min_reputation": 1.5}}, "constraints.min_reputation"),
        ({"constraints": {"min_bandwidth_mbps": -1}}, "constraints.min_bandwidth_mbps"),
        ({"max_duration_s": 0}, "max_duration_s"),
        ({"restart_policy": "sometimes"}, "restart_policy"),
        ({"placement": "anywhere"}, "placement"),
        ({"name": "Not A Name"}, "name"),
        ({"image": ""}, "image"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"gpu_count": 4}, "gpu_count"),  # an unknown field is refused by name, not ignored
    ],
)
async def test_each_bad_field_is_refused_with_a_400_that_names_it(api, keys, change, field):
    response = await api.post("/api/v1/workloads", json=SPEC | change, headers=keys["alice"])
    assert response.status == 400, await response.text()
    assert field in (await response.json())["error"]["message"]
    assert await workload_repo(api.master.store).list() == []


async def test_a_gang_on_a_master_without_lighthouses_is_refused_with_what_its_operator_must_run(api, keys):
    gang = SPEC | {"network": "overlay"}  # what a gang asks for unless it says otherwise
    response = await api.post("/api/v1/workloads", json=gang, headers=keys["alice"])

    assert response.status == 400, await response.text()
    error = (await response.json())["error"]
    assert error["code"] == "invalid_workload_spec"
    assert error["message"].startswith("replicas: this grid runs no gang overlay")
    assert "idlegrid ca issue-lighthouse" in error["message"] and "[[overlay.lighthouses]]" in error["message"]
    assert 'network = "none"' in error["message"]  # the renter's way for replicas that need not reach each other
    assert await workload_repo(api.master.store).list() == []
    one = await submit(api, keys["alice"], replicas=1, network="overlay")  # one replica needs no network
    assert one["spec"]["network"] == "overlay"


async def test_a_master_with_a_lighthouse_takes_a_gang_and_one_that_asks_for_no_network(tmp_path):
    overlay = OverlaySettings(lighthouses=[LighthouseSetting(address="100.64.0.1", endpoints=["198.18.0.2:4242"])])
    async with operator_api(MasterConfig(state_dir=str(tmp_path), link_port=0, overlay=overlay)) as api:
        alice = await api_key(api.master, "renter", "alice")
        gang = await submit(api, alice, network="overlay")
        apart = await submit(api, alice, name="apart")  # SPEC's network = "none"

    assert (gang["spec"]["replicas"], gang["spec"]["network"]) == (2, "overlay")
    assert (apart["spec"]["replicas"], apart["spec"]["network"]) == (2, "none")


async def test_nan_and_infinity_are_refused(api, keys):
    for raw in (b'{"name": "x", "image": "y", "max_duration_s": NaN}', b'{"name": "x", "image": "y", "max_duration_s": 1e999}'):
        response = await api.post("/api/v1/workloads", data=raw, headers=keys["alice"] | {"Content-Type": "application/json"})
        assert response.status == 400, raw


async def test_a_renter_may_not_submit_for_another_account(api, keys):
    response = await api.post("/api/v1/workloads", json=SPEC | {"account": "bob"}, headers=keys["alice"])
    assert response.status == 403
    assert "own account" in (await response.json())["error"]["message"]


async def test_the_operator_names_the_account_and_sees_everyones(api, keys):
    refused = await api.post("/api/v1/workloads", json=SPEC, headers=api.auth)
    assert refused.status == 400 and "account" in (await refused.json())["error"]["message"]
    carol = await submit(api, api.auth, account="carol")
    alice = await submit(api, keys["alice"])
    everyone = await api.get("/api/v1/workloads", headers=api.auth)
    assert [w["id"] for w in (await everyone.json())["items"]] == [alice["id"], carol["id"]]  # newest first
    only_carol = await api.get("/api/v1/workloads?account=carol", headers=api.auth)
    assert [w["id"] for w in (await only_carol.json())["items"]] == [carol["id"]]


async def test_a_workload_that_is_not_queued_shows_no_wait(api, keys):
    body = await submit(api, keys["alice"])
    await api.post(f"/api/v1/workloads/{body['id']}/cancel", headers=keys["alice"])
    got = await (await api.get(f"/api/v1/workloads/{body['id']}", headers=keys["alice"])).json()
    assert (got["state"], got["waiting"]) == ("cancelled", None)


async def test_a_renter_cancels_its_workload_once(api, keys):
    wl = await submit(api, keys["alice"])
    cancelled = await api.post(f"/api/v1/workloads/{wl['id']}/cancel", headers=keys["alice"])
    assert cancelled.status == 200
    body = await cancelled.json()
    assert (body["state"], body["state_reason"], body["version"]) == ("cancelled", "cancelled by its owner", 2)
    assert body["finished_at"] is not None
    again = await api.post(f"/api/v1/workloads/{wl['id']}/cancel", headers=keys["alice"])
    assert again.status == 409
    assert "already cancelled" in (await again.json())["error"]["message"]


async def test_lists_page_by_cursor_and_filter_by_state(api, keys):
    ids = [(await submit(api, keys["alice"], name=f"job-{i}"))["id"] for i in range(5)]
    await api.post(f"/api/v1/workloads/{ids[1]}/cancel", headers=keys["alice"])
    seen: list[str] = []
    cursor = None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await (await api.get(f"/api/v1/workloads{query}", headers=keys["alice"])).json()
        seen += [w["id"] for w in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    queued = await (await api.get("/api/v1/workloads?state=queued", headers=keys["alice"])).json()
    assert [w["id"] for w in queued["items"]] == [i for i in ids[::-1] if i != ids[1]]
    bad = await api.get("/api/v1/workloads?state=sleeping", headers=keys["alice"])
    assert bad.status == 400 and "state" in (await bad.json())["error"]["message"]

"""Endpoints through the real API on a real Master (SQLite): a renter creates, lists, reads, updates and deletes its
own, the operator any account's; a worker spec is refused for the reasons a workload's is, each bad field with a 4xx
that names it; the env's values and the registry password are never shown again (docs/endpoints.md)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from management.endpoints.queue import QueueLimits
from management.endpoints.spec import EndpointSpec
from management.http.keys import SERVICES_KEY
from management.services.endpoints import EndpointsService, InvocationForbidden, InvocationRefused
from management.store import endpoint_key_repo, endpoint_repo
from master.config import MasterConfig
from master.port import WorkloadSpec
from tests.management.hosts import add_agent, api_key
from tests.support.operator_api import operator_api

SPEC: dict[str, Any] = {
    "name": "echo",
    "image": "ghcr.io/acme/echo:1",
    "command": ["python", "-m", "echo"],
    "env": {"HF_TOKEN": "hf_secret_value"},
    "replica": {"gpus": 1, "models": ["h100-sxm"]},
    "scaling": {"min_workers": 0, "max_workers": 4, "concurrency": 2},
    "execution_timeout_s": 120,
    "ttl_s": 3600,
    "max_retries": 2,
}


LB_FIELDS = ("mode", "http_port", "readiness_path", "max_held", "max_hold_s")


@pytest.fixture
async def keys(api):
    return {
        "ana": await api_key(api.master, "renter", "ana"),
        "bo": await api_key(api.master, "renter", "bo"),
        "provider": await api_key(api.master, "provider", "acme"),
    }


async def create(api, headers, **overrides: Any) -> dict:
    response = await api.post("/api/v1/endpoints", json=SPEC | overrides, headers=headers)
    assert response.status == 201, await response.text()
    return await response.json()


async def test_a_renter_creates_lists_reads_updates_and_deletes_its_own_endpoint(api, keys):
    made = await create(api, keys["ana"], registry_auth={"username": "ci", "password": "registry-pass"})
    assert made["id"].startswith("ep-") and made["account"] == "ana" and made["name"] == "echo"
    assert made["spec"]["env"] == ["HF_TOKEN"]  # names only: the values are never shown again
    assert made["spec"]["registry_auth"] == {"username": "ci"}
    assert made["spec"]["scaling"] == {
        "min_workers": 0,
        "max_workers": 4,
        "idle_timeout_s": 60.0,
        "target_queue_delay_s": 4.0,
        "concurrency": 2,
    }
    stored = await endpoint_repo(api.master.store).get(made["id"])
    assert stored is not None and stored.spec.env == {"HF_TOKEN": "hf_secret_value"}
    assert stored.spec.registry_auth is not None and "registry-pass" not in stored.spec.registry_auth.password
    assert api.master.secrets.unseal(stored.sealed_registry_password) == "registry-pass"

    listed = await (await api.get("/api/v1/endpoints", headers=keys["ana"])).json()
    assert [e["id"] for e in listed["items"]] == [made["id"]]
    assert (await (await api.get(f"/api/v1/endpoints/{made['id']}", headers=keys["ana"])).json()) == made

    changed = await api.patch(
        f"/api/v1/endpoints/{made['id']}", json={"scaling": {"max_workers": 8}, "ttl_s": 600}, headers=keys["ana"]
    )
    assert changed.status == 200, await changed.text()
    updated = await changed.json()
    assert updated["spec"]["scaling"]["max_workers"] == 8 and updated["spec"]["scaling"]["concurrency"] == 2
    assert updated["spec"]["ttl_s"] == 600 and updated["spec"]["command"] == SPEC["command"]
    stored = await endpoint_repo(api.master.store).get(made["id"])
    assert stored is not None and stored.spec.env == {"HF_TOKEN": "hf_secret_value"}  # kept: not given again
    assert api.master.secrets.unseal(stored.sealed_registry_password) == "registry-pass"

    deleted = await api.delete(f"/api/v1/endpoints/{made['id']}", headers=keys["ana"])
    assert deleted.status == 200 and (await deleted.json()) == {"id": made["id"], "deleted": True}
    assert (await api.get(f"/api/v1/endpoints/{made['id']}", headers=keys["ana"])).status == 404
    assert await endpoint_repo(api.master.store).list() == []


async def test_a_renter_sees_only_its_own_and_the_operator_everyones(api, keys):
    anas = await create(api, keys["ana"])
    bos = await create(api, keys["bo"])
    for method, path in [
        ("GET", f"/api/v1/endpoints/{anas['id']}"),
        ("PATCH", f"/api/v1/endpoints/{anas['id']}"),
        ("DELETE", f"/api/v1/endpoints/{anas['id']}"),
        ("GET", f"/api/v1/endpoints/{anas['id']}/keys"),
        ("POST", f"/api/v1/endpoints/{anas['id']}/keys"),
    ]:
        answer = await api.request(method, path, json={} if method in ("PATCH", "POST") else None, headers=keys["bo"])
        assert answer.status == 404, (method, path)  # as if absent: existence is not leaked
    assert [e["id"] for e in (await (await api.get("/api/v1/endpoints", headers=keys["bo"])).json())["items"]] == [bos["id"]]
    assert (await (await api.get("/api/v1/endpoints?account=ana", headers=keys["bo"])).json())["items"] == []
    everyone = (await (await api.get("/api/v1/endpoints", headers=api.auth)).json())["items"]
    assert [e["id"] for e in everyone] == [anas["id"], bos["id"]]
    only_ana = (await (await api.get("/api/v1/endpoints?account=ana", headers=api.auth)).json())["items"]
    assert [e["id"] for e in only_ana] == [anas["id"]]
    assert (await api.get("/api/v1/endpoints", headers=keys["provider"])).status == 403
    theirs = await api.post("/api/v1/endpoints", json=SPEC | {"account": "bo"}, headers=keys["ana"])
    assert theirs.status == 403
    unnamed = await api.post("/api/v1/endpoints", json=SPEC, headers=api.auth)
    assert unnamed.status == 400 and "account" in (await unnamed.json())["error"]["message"]
    for_ana = await api.post("/api/v1/endpoints", json=SPEC | {"account": "ana", "name": "other"}, headers=api.auth)
    assert for_ana.status == 201 and (await for_ana.json())["account"] == "ana"
    same_name = await api.post("/api/v1/endpoints", json=SPEC, headers=keys["ana"])
    assert same_name.status == 409 and "already has an endpoint named 'echo'" in (await same_name.json())["error"]["message"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"scaling": {"min_workers": 3, "max_workers": 2}}, "min_workers (3) must not exceed max_workers (2)"),
        ({"scaling": {"concurrency": 0}}, "concurrency"),
        ({"scaling": {"max_workers": 1000}}, "max_workers"),
        ({"scaling": {"max_worker": 2}}, "max_worker"),  # a typo is refused by name, not ignored
        ({"execution_timeout_s": 7200, "ttl_s": 60}, "execution_timeout_s (7200) must not exceed ttl_s (60)"),
        ({"max_retries": -1}, "max_retries"),
        ({"ttl_s": 0}, "ttl_s"),
        ({"name": "Not A Name"}, "name"),
        ({"image": ""}, "image"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"replicas": 2}, "replicas"),  # an endpoint's workers are one replica each: the autoscaler counts them
        ({"replica": {"models": ["no-such-gpu"]}}, "replica.models: unknown GPU model 'no-such-gpu'"),
        ({"replica": {"tiers": ["gold"]}}, "replica.tiers: unknown tier 'gold'"),
        ({"priority": "urgent"}, "priority: unknown priority class 'urgent'"),
        ({"env": {"TOKEN": "${secret:missing}"}}, "no secret named 'missing' in this account"),
        ({"mode": "round_robin"}, "mode"),
        ({"mode": "load_balanced", "http_port": 0}, "http_port"),
        ({"mode": "load_balanced", "http_port": 70000}, "http_port"),
        ({"mode": "load_balanced", "http_port": "8000"}, "http_port"),
        ({"mode": "load_balanced", "readiness_path": "health"}, "readiness_path must be an absolute path"),
        ({"mode": "load_balanced", "readiness_path": "/he alth"}, "readiness_path must be an absolute path"),
        ({"mode": "load_balanced", "readiness_path": "/health#x"}, "readiness_path must be an absolute path"),
        ({"mode": "load_balanced", "readiness_path": "/" + "x" * 600}, "readiness_path"),
        ({"mode": "load_balanced", "max_held": -1}, "max_held"),
        ({"mode": "load_balanced", "max_hold_s": 4000}, "max_hold_s"),
    ],
)
async def test_each_bad_field_is_refused_with_a_400_that_names_it(api, keys, change, field):
    response = await api.post("/api/v1/endpoints", json=SPEC | change, headers=keys["ana"])
    assert response.status == 400, await response.text()
    assert field in (await response.json())["error"]["message"]
    assert await endpoint_repo(api.master.store).list() == []


async def test_a_load_balanced_endpoint_has_a_url_and_declares_its_port_and_old_records_read_as_queue_mode(api, keys):
    made = await create(api, keys["ana"], mode="load_balanced", http_port=8080, readiness_path="/ready?deep=1")
    spec = made["spec"]
    assert (spec["mode"], spec["http_port"], spec["readiness_path"]) == ("load_balanced", 8080, "/ready?deep=1")
    assert (spec["max_held"], spec["max_hold_s"]) == (256, 120.0)
    links = api.app[SERVICES_KEY].links
    assert made["url"] == f"{links.public_url.rstrip('/')}/e/{made['id']}/"
    record = await endpoint_repo(api.master.store).get(made["id"])
    assert record is not None and record.spec.worker_spec().ports == [8080]  # the only port its tunnels may reach
    queued = await create(api, keys["ana"], name="queued")
    assert queued["spec"]["mode"] == "queue" and queued["url"] is None
    queued_record = await endpoint_repo(api.master.store).get(queued["id"])
    assert queued_record is not None and queued_record.spec.worker_spec().ports == []
    # A record stored before the mode existed (no such fields in its JSON) reads as queue mode.
    old = msgspec.json.decode(
        msgspec.json.encode({k: v for k, v in msgspec.to_builtins(queued_record.spec).items() if k not in LB_FIELDS}),
        type=EndpointSpec,
    )
    assert old.mode == "queue" and not old.load_balanced
    refused = await api.post(f"/api/v1/endpoints/{made['id']}/run", json={"input": {}}, headers=keys["ana"])
    assert refused.status == 409 and made["url"] in (await refused.json())["error"]["message"]  # no worker would take it
    changed = await api.patch(f"/api/v1/endpoints/{queued['id']}", json={"mode": "load_balanced"}, headers=keys["ana"])
    assert changed.status == 200 and (await changed.json())["url"].endswith(f"/e/{queued['id']}/")
    listed = (await (await api.get("/api/v1/endpoints", headers=keys["ana"])).json())["items"]
    assert {e["id"]: e["url"] is not None for e in listed} == {made["id"]: True, queued["id"]: True}


async def test_an_update_is_checked_as_a_create_is_and_a_refused_one_changes_nothing(api, keys):
    made = await create(api, keys["ana"])
    path = f"/api/v1/endpoints/{made['id']}"
    for body, says in [
        ({"scaling": {"min_workers": 9}}, "min_workers (9) must not exceed max_workers (4)"),
        ({"replica": {"models": ["no-such-gpu"]}}, "unknown GPU model"),
        ({"scaling": {"bogus": 1}}, "bogus"),
        ({"ttl_s": "soon"}, "ttl_s"),
    ]:
        answer = await api.patch(path, json=body, headers=keys["ana"])
        assert answer.status == 400, (body, await answer.text())
        assert says in (await answer.json())["error"]["message"]
    assert (await (await api.get(path, headers=keys["ana"])).json()) == made
    other = await create(api, keys["ana"], name="other")
    clash = await api.patch(f"/api/v1/endpoints/{other['id']}", json={"name": "echo"}, headers=keys["ana"])
    assert clash.status == 409


async def test_a_worker_that_could_never_run_here_is_refused_as_a_workload_is(tmp_path):
    """On a grid whose 4-GPU host runs the process runtime only, a 4-GPU worker with an image could never be placed:
    the endpoint is refused at once with the workload's 409 and its words; with image "none" and the flag, taken."""
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, offer_sandboxed_hosts=True)
    async with operator_api(config) as api:
        await add_agent(api.master, "agt-box", "a10:2", runtime="docker", isolation="container")
        await add_agent(api.master, "agt-proc", "h100:4", runtime="process", isolation="sandbox")
        lab = await api_key(api.master, "renter", "lab")
        worker = {"name": "job", "image": "busybox", "command": ["true"], "replica": {"gpus": 4}}
        workload = await api.post("/api/v1/workloads", json=worker, headers=lab)
        endpoint = await api.post("/api/v1/endpoints", json=worker, headers=lab)
        assert workload.status == endpoint.status == 409, await endpoint.text()
        message = (await endpoint.json())["error"]["message"]
        said = (await workload.json())["error"]["message"]
        assert message.startswith("this endpoint's workers can never run on this grid: ")
        assert message.split(": ", 1)[1] == said.split(": ", 1)[1]  # the workload's reason, word for word
        assert "constraints.allow_process_runtime" in message, message
        allowed = worker | {"image": "none", "constraints": {"allow_process_runtime": True}}
        made = await api.post("/api/v1/endpoints", json=allowed, headers=lab)
        assert made.status == 201, await made.text()
        assert (await made.json())["spec"]["image"] == "none"


async def test_invocation_keys_are_shown_once_scoped_to_one_endpoint_and_open_no_other_route(api, keys):
    a = await create(api, keys["ana"], name="a")
    b = await create(api, keys["ana"], name="b")
    issued = await api.post(f"/api/v1/endpoints/{a['id']}/keys", json={"name": "ci"}, headers=keys["ana"])
    assert issued.status == 201, await issued.text()
    key = await issued.json()
    assert key["key"].startswith("igek_") and key["endpoint"] == a["id"] and key["name"] == "ci"
    listed = (await (await api.get(f"/api/v1/endpoints/{a['id']}/keys", headers=keys["ana"])).json())["items"]
    assert listed == [{k: v for k, v in key.items() if k != "key"}]  # never shown again
    assert (await (await api.get(f"/api/v1/endpoints/{b['id']}/keys", headers=keys["ana"])).json())["items"] == []

    endpoints = api.app[SERVICES_KEY].endpoints
    invocation = await endpoints.authorize_invocation(a["id"], key["key"])
    assert invocation.endpoint.id == a["id"] and invocation.key.id == key["id"]
    with pytest.raises(InvocationForbidden, match=f"invokes endpoint {a['id']} only"):
        await endpoints.authorize_invocation(b["id"], key["key"])

    bearer = {"Authorization": f"Bearer {key['key']}"}
    for method, path in [
        ("GET", "/api/v1/endpoints"),
        ("GET", f"/api/v1/endpoints/{a['id']}"),
        ("GET", f"/api/v1/endpoints/{a['id']}/keys"),
        ("POST", f"/api/v1/endpoints/{a['id']}/keys"),
        ("GET", "/api/v1/whoami"),
        ("GET", "/api/v1/workloads"),
        ("POST", "/api/v1/workloads"),
        ("GET", "/api/v1/balance"),
    ]:
        answer = await api.request(method, path, json={} if method == "POST" else None, headers=bearer)
        assert answer.status == 401, (method, path, await answer.text())  # no API key: no route, no spending

    revoked = await api.post(f"/api/v1/endpoints/{a['id']}/keys/{key['id']}/revoke", headers=keys["ana"])
    assert revoked.status == 200 and (await revoked.json())["revoked_at"] is not None
    with pytest.raises(InvocationRefused, match="was revoked"):
        await endpoints.authorize_invocation(a["id"], key["key"])
    missing = await api.post(f"/api/v1/endpoints/{b['id']}/keys/{key['id']}/revoke", headers=keys["ana"])
    assert missing.status == 404  # a key is revoked through its own endpoint

    second = await (await api.post(f"/api/v1/endpoints/{a['id']}/keys", json={}, headers=keys["ana"])).json()
    assert (await endpoints.authorize_invocation(a["id"], second["key"])).key.name == "invocation key"
    assert (await api.delete(f"/api/v1/endpoints/{a['id']}", headers=keys["ana"])).status == 200
    with pytest.raises(InvocationRefused, match="not recognised"):
        await endpoints.authorize_invocation(a["id"], second["key"])
    for wrong in ("", "igak_not-an-invocation-key", "igek_never-issued"):
        with pytest.raises(InvocationRefused):
            await endpoints.authorize_invocation(b["id"], wrong)


async def test_the_request_queue_reads_each_endpoints_bounds_as_created_changed_deleted_and_loaded(api, keys):
    service = api.app[SERVICES_KEY].endpoints
    made = await create(api, keys["ana"])
    limits = service.limits_of(made["id"])
    assert (limits.concurrency, limits.max_retries, limits.ttl_s, limits.execution_timeout_s) == (2, 2, 3600, 120)
    changed = await api.patch(f"/api/v1/endpoints/{made['id']}", json={"scaling": {"concurrency": 5}}, headers=keys["ana"])
    assert changed.status == 200, await changed.text()
    assert service.limits_of(made["id"]).concurrency == 5
    other = await create(api, keys["ana"], name="other", max_retries=0)
    fresh = EndpointsService(
        api.master.secrets, endpoint_repo(api.master.store), endpoint_key_repo(api.master.store), check_worker=_no_check
    )
    assert fresh.limits_of(other["id"]) == QueueLimits()  # nothing read yet
    await fresh.load()  # a restarted Master, or the one that takes over, reads them all
    assert (fresh.limits_of(made["id"]).concurrency, fresh.limits_of(other["id"]).max_retries) == (5, 0)
    assert (await api.delete(f"/api/v1/endpoints/{made['id']}", headers=keys["ana"])).status == 200
    assert service.limits_of(made["id"]) == QueueLimits()  # a deleted endpoint's last requests end under the defaults


async def test_keys_checked_from_memory_follow_a_revoke_made_by_the_master_that_took_over(api, keys):
    """Two services over one store, as a deposed leader and the one that took over: the first remembers a key it let
    through; the second, elected, revokes it; the first, elected again, loads and refuses it (the cache is emptied at
    each load, never trusted across a takeover), and no key of an endpoint the second deleted gets through."""
    made = await create(api, keys["ana"])
    key = await (await api.post(f"/api/v1/endpoints/{made['id']}/keys", json={}, headers=keys["ana"])).json()
    first = api.app[SERVICES_KEY].endpoints
    assert (await first.authorize_invocation(made["id"], key["key"])).key.id == key["id"]  # now remembered
    second = EndpointsService(
        api.master.secrets, endpoint_repo(api.master.store), endpoint_key_repo(api.master.store), check_worker=_no_check
    )
    await second.load()  # elected
    await second.revoke_key(made["id"], key["id"])
    with pytest.raises(InvocationRefused, match="was revoked"):
        await second.authorize_invocation(made["id"], key["key"])
    # From memory: a deposed Master answers no call (StandbyGate), and loads before it serves again.
    assert (await first.authorize_invocation(made["id"], key["key"])).key.id == key["id"]
    await first.load()  # elected again: reads the store afresh
    with pytest.raises(InvocationRefused, match="was revoked"):
        await first.authorize_invocation(made["id"], key["key"])
    other = await second.create_key(made["id"], "other")
    assert (await first.authorize_invocation(made["id"], other.key)).key.id == other.record.id  # a miss reads the store
    await second.delete(made["id"])
    await first.load()
    with pytest.raises(InvocationRefused, match="not recognised"):
        await first.authorize_invocation(made["id"], other.key)


async def _no_check(account: str, spec: WorkloadSpec) -> None:
    return None


async def test_the_daily_spend_cap_is_set_changed_and_removed_like_any_field_and_a_bad_amount_is_400(api, keys):
    await add_agent(api.master, "agt-1", "h100:1", runtime="docker", isolation="container")
    made = await create(api, keys["ana"], daily_spend_cap="25.00")
    assert made["spec"]["daily_spend_cap"] == "25.00" and made["scale"] is None  # no tick yet on this Master
    path = f"/api/v1/endpoints/{made['id']}"
    for cap, shown in (("5", "5"), (None, None)):
        changed = await api.patch(path, json={"daily_spend_cap": cap}, headers=keys["ana"])
        assert changed.status == 200 and (await changed.json())["spec"]["daily_spend_cap"] == shown
    refused = await api.patch(path, json={"daily_spend_cap": "-1"}, headers=keys["ana"])
    assert refused.status == 400 and "daily_spend_cap" in await refused.text()

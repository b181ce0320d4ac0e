"""The alerts API on a real Master (SQLite): the operator changes rules and silences; every account reads the rules
and its own alerts and manages its own webhooks (the secret shown once); bad input is a 400 naming the field."""

from __future__ import annotations

import time

import pytest

from common.wire import AgentEvent, AgentEventKind
from management.http.keys import SERVICES_KEY
from management.store import alert_rule_repo, webhook_repo
from tests.management.hosts import add_agent, api_key


async def test_the_operator_puts_a_rule_that_replaces_the_files_and_deleting_it_brings_the_files_back(api):
    rules = (await (await api.get("/api/v1/alert-rules", headers=api.auth)).json())["items"]
    shipped = {r["name"]: r for r in rules}
    assert shipped["gpu_overheating"]["threshold"] == 85 and shipped["gpu_overheating"]["source"] == "file"
    assert {"gpu_hardware_error", "rented_gpu_idle", "host_offline"} <= set(shipped)

    body = {"metric": "gpu.temperature_c", "op": ">", "threshold": 80, "for_s": 60, "clear_threshold": 75, "fault": True}
    put = await api.put("/api/v1/alert-rules/gpu_overheating", json=body, headers=api.auth)
    assert put.status == 200, await put.text()
    assert (await put.json())["source"] == "api"
    rules = {r["name"]: r for r in (await (await api.get("/api/v1/alert-rules", headers=api.auth)).json())["items"]}
    assert (rules["gpu_overheating"]["threshold"], rules["gpu_overheating"]["source"]) == (80, "api")
    operations = api.app[SERVICES_KEY]
    assert [r.threshold for r in operations.alerts.loop.rules if r.name == "gpu_overheating"] == [80]
    assert [r.name for r in await alert_rule_repo(api.master.store).list()] == ["gpu_overheating"]

    deleted = await api.delete("/api/v1/alert-rules/gpu_overheating", headers=api.auth)
    assert deleted.status == 200 and (await deleted.json())["applies_now"]["threshold"] == 85
    again = await api.delete("/api/v1/alert-rules/gpu_overheating", headers=api.auth)
    assert again.status == 409 and "rules file" in (await again.json())["error"]["message"]
    missing = await api.delete("/api/v1/alert-rules/no_such_rule", headers=api.auth)
    assert missing.status == 404


async def test_a_bad_rule_is_a_400_naming_the_field_and_only_the_operator_changes_rules(api):
    cases = [
        ({"metric": "gpu.temperature_c", "op": "~", "threshold": 1}, "op"),
        ({"metric": "gpu.fan_speed", "op": ">", "threshold": 1}, "gpu.fan_speed"),  # not a metric the Master watches
        ({"metric": "host.offline", "op": ">", "threshold": 0, "fault": True, "scope": "host"}, "fault"),
        ({"metric": "gpu.temperature_c", "op": ">", "threshold": 1, "for_s": -5}, "for_s"),
        ({"metric": "gpu.temperature_c", "op": ">"}, "threshold"),
    ]
    for body, field in cases:
        response = await api.put("/api/v1/alert-rules/hot", json=body, headers=api.auth)
        assert response.status == 400, body
        assert field in (await response.json())["error"]["message"], body
    bad_name = await api.put(
        "/api/v1/alert-rules/Hot-Name", json={"metric": "host.offline", "op": ">", "threshold": 0}, headers=api.auth
    )
    assert bad_name.status == 400 and "name" in (await bad_name.json())["error"]["message"]

    acme = await api_key(api.master, "provider", "acme")
    assert (await api.get("/api/v1/alert-rules", headers=acme)).status == 200
    body = {"metric": "host.offline", "op": ">", "threshold": 0}
    assert (await api.put("/api/v1/alert-rules/mine", json=body, headers=acme)).status == 403
    assert (await api.post("/api/v1/silences", json={"duration_s": 60, "rule": "host_offline"}, headers=acme)).status == 403


async def test_webhooks_are_each_accounts_own_and_the_secret_is_shown_once(api):
    acme = await api_key(api.master, "provider", "acme")
    zeta = await api_key(api.master, "provider", "zeta")
    created = await api.post("/api/v1/webhooks", json={"url": "https://hooks.acme.example/idlegrid"}, headers=acme)
    assert created.status == 201, await created.text()
    hook = await created.json()
    assert hook["owner"] == "acme" and hook["role"] == "provider" and len(hook["secret"]) >= 32
    listed = (await (await api.get("/api/v1/webhooks", headers=acme)).json())["items"]
    assert [w["id"] for w in listed] == [hook["id"]] and "secret" not in listed[0]
    assert (await (await api.get("/api/v1/webhooks", headers=zeta)).json())["items"] == []
    assert [w["id"] for w in (await (await api.get("/api/v1/webhooks", headers=api.auth)).json())["items"]] == [hook["id"]]
    assert (await api.delete(f"/api/v1/webhooks/{hook['id']}", headers=zeta)).status == 404  # not zeta's: as if absent
    assert api.app[SERVICES_KEY].alerts.loop.notifier.webhooks[hook["id"]].secret == hook["secret"]

    bad = await api.post("/api/v1/webhooks", json={"url": "ftp://example.org/x"}, headers=acme)
    assert bad.status == 400 and "url" in (await bad.json())["error"]["message"]

    assert (await api.delete(f"/api/v1/webhooks/{hook['id']}", headers=acme)).status == 204
    assert hook["id"] not in api.app[SERVICES_KEY].alerts.loop.notifier.webhooks
    assert await webhook_repo(api.master.store).list() == []


async def test_the_operator_silences_with_an_expiry_and_ends_a_silence_early(api):
    created = await api.post(
        "/api/v1/silences",
        json={"duration_s": 3600, "rule": "gpu_overheating", "labels": {"provider": "acme"}, "comment": "fans swapped"},
        headers=api.auth,
    )
    assert created.status == 201, await created.text()
    silence = await created.json()
    assert silence["created_by"] == "operator" and silence["expires_at"] > silence["created_at"]
    listed = (await (await api.get("/api/v1/silences", headers=api.auth)).json())["items"]
    assert [s["id"] for s in listed] == [silence["id"]]

    expired = await api.post(f"/api/v1/silences/{silence['id']}/expire", headers=api.auth)
    assert expired.status == 200
    assert (await (await api.get("/api/v1/silences", headers=api.auth)).json())["items"] == []
    everything = await api.get("/api/v1/silences", params={"include_expired": "true"}, headers=api.auth)
    assert [s["id"] for s in (await everything.json())["items"]] == [silence["id"]]
    assert (await api.post(f"/api/v1/silences/{silence['id']}/expire", headers=api.auth)).status == 404

    for body, field in [({"duration_s": 60}, "matcher"), ({"duration_s": 0, "rule": "x"}, "duration_s")]:
        response = await api.post("/api/v1/silences", json=body, headers=api.auth)
        assert response.status == 400 and field in (await response.json())["error"]["message"], body


async def test_each_provider_sees_only_its_own_hosts_alerts_and_the_operator_all(api):
    await add_agent(api.master, "agt-acme", "a10:1", provider="acme", runtime="simulated", isolation="container")
    await add_agent(api.master, "agt-zeta", "a10:1", provider="zeta", runtime="simulated", isolation="container")
    gpu = api.master.gpus("agt-acme")[0]
    report = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=gpu.uuid, code=79)
    await api.master.registry.mark_faulty(gpu, api.master.health.on_report(gpu, report, time.time()))
    await api.app[SERVICES_KEY].alerts.loop.step()  # one evaluation, as the loop makes every period

    acme = await api_key(api.master, "provider", "acme")
    zeta = await api_key(api.master, "provider", "zeta")
    seen = await (await api.get("/api/v1/alerts", headers=acme)).json()
    assert [(a["rule"], a["subject"], a["phase"]) for a in seen["items"]] == [("gpu_hardware_error", gpu.uuid, "firing")]
    assert [(t["rule"], t["phase"]) for t in seen["recent"]] == [("gpu_hardware_error", "firing")]
    assert (await (await api.get("/api/v1/alerts", headers=zeta)).json()) == {"items": [], "recent": []}
    everything = await (await api.get("/api/v1/alerts", params={"phase": "firing"}, headers=api.auth)).json()
    assert [a["subject"] for a in everything["items"]] == [gpu.uuid]
    filtered = await (await api.get("/api/v1/alerts", params={"severity": "info"}, headers=api.auth)).json()
    assert filtered["items"] == []
    bad = await api.get("/api/v1/alerts", params={"phase": "sleeping"}, headers=api.auth)
    assert bad.status == 400 and "phase" in (await bad.json())["error"]["message"]


@pytest.mark.parametrize("role", ["provider", "renter"])
async def test_silences_and_rules_are_the_operators_alone(api, role):
    """A provider or renter reads the rules, never changes them, and may neither see, make nor end a silence; the
    operator's silence stands after their tries."""
    made = await api.post("/api/v1/silences", json={"duration_s": 600, "rule": "host_offline"}, headers=api.auth)
    assert made.status == 201
    silence_id = (await made.json())["id"]
    other = await api_key(api.master, role, f"someone-{role}")
    rule = {"metric": "host.offline", "op": ">", "threshold": 0, "scope": "host"}
    tries = [
        ("PUT", "/api/v1/alert-rules/host_offline", rule),
        ("PUT", "/api/v1/alert-rules/mine", rule),
        ("DELETE", "/api/v1/alert-rules/host_offline", None),
        ("POST", "/api/v1/silences", {"duration_s": 60, "rule": "gpu_overheating"}),
        ("GET", "/api/v1/silences", None),
        ("POST", f"/api/v1/silences/{silence_id}/expire", None),
    ]
    for method, path, body in tries:
        response = await api.request(method, path, json=body, headers=other)
        assert response.status == 403, (method, path)
    assert (await api.get("/api/v1/alert-rules", headers=other)).status == 200
    listed = (await (await api.get("/api/v1/silences", headers=api.auth)).json())["items"]
    assert [s["id"] for s in listed] == [silence_id]
    assert [r.name for r in await alert_rule_repo(api.master.store).list()] == []

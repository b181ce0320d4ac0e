"""The audit trail: every successful change through the API leaves one ``audit`` event naming the account and
the key, recorded by one middleware (management/api/audit.py); reads and refused changes leave none."""

from __future__ import annotations

from tests.management.hosts import add_agent, api_key


async def audit_events(api) -> list[dict]:
    response = await api.get("/api/v1/events?kind=audit&limit=1000", headers=api.auth)
    assert response.status == 200
    return [e for e in (await response.json())["items"] if e["kind"] == "audit"]


async def key_id_of(api, headers) -> str:
    return (await (await api.get("/api/v1/whoami", headers=headers)).json())["key_id"]


async def test_account_creation_token_creation_drain_and_key_and_host_revocation_each_leave_an_audit_event(api):
    created = await api.post("/api/v1/accounts", json={"id": "acme", "role": "provider"}, headers=api.auth)
    assert created.status == 201
    assert (await api.post("/api/v1/tokens", json={"provider": "acme"}, headers=api.auth)).status == 201
    await add_agent(api.master, "agt-acme-1", "a10:1", provider="acme")
    acme = await api_key(api.master, "provider", "acme")
    assert (await api.post("/api/v1/agents/agt-acme-1/drain", headers=acme)).status == 200
    issued = await (await api.post("/api/v1/accounts/acme/keys", json={"name": "spare"}, headers=acme)).json()
    assert (await api.post(f"/api/v1/keys/{issued['key_id']}/revoke", headers=acme)).status == 200
    assert (await api.post("/api/v1/agents/agt-acme-1/revoke", headers=api.auth)).status == 200

    acme_key = await key_id_of(api, acme)
    seen = [
        (e["subject"], e["data"]["key_id"], e["data"]["method"], e["data"]["route"], e["data"]["target"])
        for e in await audit_events(api)
    ]
    assert seen == [
        ("operator", "", "POST", "/api/v1/accounts", "acme"),
        ("operator", "", "POST", "/api/v1/tokens", "acme"),
        ("acme", acme_key, "POST", "/api/v1/agents/{agent_id}/drain", "agt-acme-1"),
        ("acme", acme_key, "POST", "/api/v1/accounts/{account_id}/keys", issued["key_id"]),
        ("acme", acme_key, "POST", "/api/v1/keys/{key_id}/revoke", issued["key_id"]),
        ("operator", "", "POST", "/api/v1/agents/{agent_id}/revoke", "agt-acme-1"),
    ]
    [drain] = [e for e in await audit_events(api) if e["data"]["route"].endswith("/drain")]
    assert (drain["data"]["role"], drain["data"]["status"]) == ("provider", 200)


async def test_reads_and_refused_changes_leave_no_audit_event(api):
    await api.get("/api/v1/accounts", headers=api.auth)
    assert (await api.post("/api/v1/accounts", json={"id": "BAD", "role": "renter"}, headers=api.auth)).status == 400
    assert (await api.post("/api/v1/tokens", json={"provider": "nobody"}, headers=api.auth)).status == 400
    renter = await api_key(api.master, "renter", "bob")
    assert (await api.post("/api/v1/accounts", json={"id": "x", "role": "renter"}, headers=renter)).status == 403
    assert (await api.post("/api/v1/agents/agt-none/drain", headers=api.auth)).status == 404
    assert await audit_events(api) == []

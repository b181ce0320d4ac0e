"""The secrets API: a value is shown never again, each account sees, uses and deletes only its own."""

from __future__ import annotations

from tests.management.hosts import api_key


async def test_a_secret_is_created_once_listed_by_name_and_never_shown_again(api):
    ann = await api_key(api.master, "renter", "ann")
    created = await api.post("/api/v1/secrets", json={"name": "s3-creds", "value": "AKIA:supersecret"}, headers=ann)
    assert created.status == 201, await created.text()
    body = await created.json()
    assert body["name"] == "s3-creds" and body["size"] == len("AKIA:supersecret") and "value" not in body
    listed = await (await api.get("/api/v1/secrets", headers=ann)).text()
    assert "s3-creds" in listed and "supersecret" not in listed
    again = await api.post("/api/v1/secrets", json={"name": "s3-creds", "value": "other"}, headers=ann)
    assert again.status == 409 and "delete it first" in (await again.json())["error"]["message"]
    bad = await api.post("/api/v1/secrets", json={"name": "no spaces", "value": "v"}, headers=ann)
    assert bad.status == 400 and "name" in (await bad.json())["error"]["message"]
    assert (await api.delete("/api/v1/secrets/s3-creds", headers=ann)).status == 200
    assert (await (await api.get("/api/v1/secrets", headers=ann)).json())["items"] == []


async def test_nothing_of_another_accounts_secrets_is_readable_or_deletable(api):
    ann = await api_key(api.master, "renter", "ann")
    bob = await api_key(api.master, "renter", "bob")
    acme = await api_key(api.master, "provider", "acme")
    assert (await api.post("/api/v1/secrets", json={"name": "tok", "value": "ann-only"}, headers=ann)).status == 201
    assert (await (await api.get("/api/v1/secrets", headers=bob)).json())["items"] == []
    assert (await (await api.get("/api/v1/secrets", headers=api.auth)).json())["items"] == []  # the operator's own: none
    assert (await api.delete("/api/v1/secrets/tok", headers=bob)).status == 404
    assert (await api.get("/api/v1/secrets", headers=acme)).status == 403  # providers keep no secrets here
    # bob may make his own of the same name; ann's is unchanged
    assert (await api.post("/api/v1/secrets", json={"name": "tok", "value": "bob-only"}, headers=bob)).status == 201
    assert await api.master.secrets.resolve("ann", ["tok"]) == {"tok": "ann-only"}
    assert await api.master.secrets.resolve("bob", ["tok"]) == {"tok": "bob-only"}

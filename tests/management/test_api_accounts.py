"""Accounts, API keys and whoami through the real API on a real Master (SQLite in the test's tmp_path).

The operator creates and changes accounts; every account manages its own keys; a key takes its role from
its account at every call, so a revocation, a disabled account or a change of role counts on the very next
call, although the Master remembers checked keys for 10 s.
"""

from __future__ import annotations

import pytest

from management.app import MasterServer
from master.config import MasterConfig
from master.enrollment import hash_secret
from tests.management.hosts import add_agent, api_key


async def create(api, body: dict, headers=None) -> dict:
    response = await api.post("/api/v1/accounts", json=body, headers=headers or api.auth)
    assert response.status == 201, await response.text()
    return await response.json()


async def new_key(api, account: str, headers=None, name: str = "ci") -> tuple[dict, dict[str, str]]:
    """The created key's view and its Authorization header."""
    response = await api.post(f"/api/v1/accounts/{account}/keys", json={"name": name}, headers=headers or api.auth)
    assert response.status == 201, await response.text()
    body = await response.json()
    return body, {"Authorization": f"Bearer {body['key']}"}


async def error_of(response) -> tuple[int, str, str]:
    error = (await response.json())["error"]
    return response.status, error["code"], error["message"]


# --- accounts ----------------------------------------------------------------------------------------------


async def test_an_operator_creates_an_account_with_its_scheduling_settings(api):
    body = await create(
        api,
        {"id": "lab-7", "role": "renter", "name": "Lab 7", "share": 2.5, "gpu_quota": 8, "tier_quotas": {"h100": 4}},
    )
    assert body | {"created_at": None} == {
        "id": "lab-7",
        "role": "renter",
        "name": "Lab 7",
        "disabled": False,
        "created_at": None,
        "updated_at": None,
        "share": 2.5,
        "project_shares": {},
        "gpu_quota": 8,
        "tier_quotas": {"h100": 4},
    }
    assert (await (await api.get("/api/v1/accounts/lab-7", headers=api.auth)).json()) == body
    again = await api.post("/api/v1/accounts", json={"id": "lab-7", "role": "provider"}, headers=api.auth)
    assert (await error_of(again))[:2] == (409, "conflict")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"id": "Acme", "role": "provider"}, "id"),
        ({"id": "-acme", "role": "provider"}, "id"),
        ({"id": "a" * 64, "role": "provider"}, "id"),
        ({"id": "acme", "role": "admin"}, "role"),
        ({"id": "acme", "role": "renter", "share": 0}, "share"),
        ({"id": "acme", "role": "renter", "share": "NaN"}, "share"),
        ({"id": "acme", "role": "renter", "gpu_quota": -1}, "gpu_quota"),
        ({"id": "acme", "role": "renter", "tier_quotas": {"h100": 1.5}}, "tier_quotas[...]"),
        ({"id": "acme", "role": "renter", "project_shares": {"x": -2}}, "project_shares[...]"),
        ({"id": "acme", "role": "renter", "colour": "red"}, "body"),
    ],
)
async def test_a_bad_account_is_refused_with_a_400_naming_the_field(api, body, field):
    status, code, message = await error_of(await api.post("/api/v1/accounts", json=body, headers=api.auth))
    assert (status, code) == (400, "bad_request")
    assert message.startswith(f"{field}:"), message


async def test_accounts_are_listed_in_id_order_by_page_and_filtered_by_role(api):
    for account_id, role in (("zed", "renter"), ("acme", "provider"), ("bob", "renter")):
        await create(api, {"id": account_id, "role": role})
    first = await (await api.get("/api/v1/accounts?limit=2", headers=api.auth)).json()
    assert [a["id"] for a in first["items"]] == ["acme", "bob"]
    rest = await (await api.get(f"/api/v1/accounts?limit=2&cursor={first['next_cursor']}", headers=api.auth)).json()
    assert [a["id"] for a in rest["items"]] == ["operator", "zed"]  # "operator": the bootstrap account
    assert rest["next_cursor"] is None
    renters = await (await api.get("/api/v1/accounts?role=renter", headers=api.auth)).json()
    assert [a["id"] for a in renters["items"]] == ["bob", "zed"]
    assert (await api.get("/api/v1/accounts?role=admin", headers=api.auth)).status == 400
    assert (await api.get("/api/v1/accounts/nobody", headers=api.auth)).status == 404


async def test_an_operator_changes_share_quotas_name_and_removes_a_quota_with_null(api):
    await create(api, {"id": "bob", "role": "renter", "gpu_quota": 4})
    response = await api.patch(
        "/api/v1/accounts/bob",
        json={"share": 3.0, "tier_quotas": {"a10": 2}, "project_shares": {"vision": 2.0}, "name": "Bob"},
        headers=api.auth,
    )
    body = await response.json()
    assert response.status == 200
    assert (body["share"], body["tier_quotas"], body["project_shares"], body["name"]) == (3.0, {"a10": 2}, {"vision": 2.0}, "Bob")
    assert body["gpu_quota"] == 4 and body["updated_at"] is not None  # untouched fields keep their value
    cleared = await (await api.patch("/api/v1/accounts/bob", json={"gpu_quota": None}, headers=api.auth)).json()
    assert cleared["gpu_quota"] is None and cleared["share"] == 3.0
    for bad, field in (({"share": -1}, "share"), ({"id": "robert"}, "body"), ({"disabled": "yes"}, "disabled")):
        status, _, message = await error_of(await api.patch("/api/v1/accounts/bob", json=bad, headers=api.auth))
        assert status == 400 and field in message, message
    assert (await api.patch("/api/v1/accounts/nobody", json={"share": 2}, headers=api.auth)).status == 404


# --- keys ---------------------------------------------------------------------------------------------------


async def test_a_key_is_shown_once_then_listed_by_key_id_without_the_key_or_its_hash(api):
    await create(api, {"id": "bob", "role": "renter"})
    issued, bob = await new_key(api, "bob", name="laptop")
    assert issued["key"].startswith("igak_") and issued["key_id"].startswith("key-")
    assert (issued["account"], issued["name"], issued["revoked_at"]) == ("bob", "laptop", None)
    listing = await api.get("/api/v1/accounts/bob/keys", headers=api.auth)
    text = await listing.text()
    assert issued["key"] not in text and hash_secret(issued["key"]) not in text
    [listed] = (await listing.json())["items"]
    assert set(listed) == {"key_id", "account", "name", "created_at", "last_used", "revoked_at"}
    assert listed["key_id"] == issued["key_id"] and listed["last_used"] is None
    me = await (await api.get("/api/v1/whoami", headers=bob)).json()
    assert me == {"account": "bob", "role": "renter", "key_id": issued["key_id"], "key_name": "laptop", "name": ""}
    [used] = (await (await api.get("/api/v1/accounts/bob/keys", headers=api.auth)).json())["items"]
    assert used["last_used"] is not None


async def test_a_revoked_key_is_refused_on_the_very_next_call(api):
    await create(api, {"id": "bob", "role": "renter"})
    issued, bob = await new_key(api, "bob")
    assert (await api.get("/api/v1/whoami", headers=bob)).status == 200  # checked, and now remembered for 10 s
    revoked = await api.post(f"/api/v1/keys/{issued['key_id']}/revoke", headers=api.auth)
    assert revoked.status == 200 and (await revoked.json())["revoked_at"] is not None
    status, code, message = await error_of(await api.get("/api/v1/whoami", headers=bob))
    assert (status, code) == (401, "unauthorized") and issued["key_id"] in message and "revoked" in message
    again = await api.post(f"/api/v1/keys/{issued['key_id']}/revoke", headers=api.auth)
    assert (await again.json())["revoked_at"] == (await revoked.json())["revoked_at"]  # revoking twice changes nothing
    assert (await api.post("/api/v1/keys/key-nope/revoke", headers=api.auth)).status == 404


async def test_disabling_an_account_refuses_its_keys_at_once_and_enabling_it_lets_them_back(api):
    await create(api, {"id": "bob", "role": "renter"})
    _, bob = await new_key(api, "bob")
    assert (await api.get("/api/v1/whoami", headers=bob)).status == 200
    await api.patch("/api/v1/accounts/bob", json={"disabled": True}, headers=api.auth)
    status, code, message = await error_of(await api.get("/api/v1/whoami", headers=bob))
    assert (status, code) == (403, "forbidden") and "'bob' is disabled" in message
    refused = await api.post("/api/v1/accounts/bob/keys", json={"name": "x"}, headers=api.auth)
    assert refused.status == 409  # a disabled account is issued no new keys either
    await api.patch("/api/v1/accounts/bob", json={"disabled": False}, headers=api.auth)
    assert (await api.get("/api/v1/whoami", headers=bob)).status == 200


async def test_a_key_takes_its_role_from_its_account_so_it_cannot_outlive_a_role_change(api):
    await add_agent(api.master, "agt-acme-1", "a10:1", provider="acme")
    acme = await api_key(api.master, "provider", "acme")
    assert (await api.get("/api/v1/agents", headers=acme)).status == 200
    changed = await api.patch("/api/v1/accounts/acme", json={"role": "renter"}, headers=api.auth)
    assert (await changed.json())["role"] == "renter"
    assert (await api.get("/api/v1/agents", headers=acme)).status == 403  # on the very next call
    assert (await (await api.get("/api/v1/whoami", headers=acme)).json())["role"] == "renter"


# --- what a non-operator may do -------------------------------------------------------------------------------


@pytest.fixture
async def two_accounts(api):
    await create(api, {"id": "acme", "role": "provider"})
    await create(api, {"id": "bob", "role": "renter"})
    acme_key, acme = await new_key(api, "acme")
    bob_key, bob = await new_key(api, "bob")
    return {"acme": acme, "bob": bob, "acme_key": acme_key["key_id"], "bob_key": bob_key["key_id"]}


@pytest.mark.parametrize("who", ["acme", "bob"])
async def test_an_account_manages_its_own_keys(api, two_accounts, who):
    me = two_accounts[who]
    issued, second = await new_key(api, who, headers=me, name="second")
    listed = (await (await api.get(f"/api/v1/accounts/{who}/keys", headers=me)).json())["items"]
    assert [k["key_id"] for k in listed] == [two_accounts[f"{who}_key"], issued["key_id"]]
    assert (await api.post(f"/api/v1/keys/{issued['key_id']}/revoke", headers=me)).status == 200
    assert (await api.get("/api/v1/whoami", headers=second)).status == 401
    own = await (await api.get(f"/api/v1/accounts/{who}", headers=me)).json()
    assert own["id"] == who
    assert [a["id"] for a in (await (await api.get("/api/v1/accounts", headers=me)).json())["items"]] == [who]


@pytest.mark.parametrize(("who", "other"), [("acme", "bob"), ("bob", "acme")])
async def test_another_accounts_account_and_keys_answer_404_like_missing_ones(api, two_accounts, who, other):
    me = two_accounts[who]
    for method, path in (
        ("GET", f"/api/v1/accounts/{other}"),
        ("GET", f"/api/v1/accounts/{other}/keys"),
        ("POST", f"/api/v1/accounts/{other}/keys"),
        ("POST", f"/api/v1/keys/{two_accounts[f'{other}_key']}/revoke"),
    ):
        theirs = await api.request(method, path, json={"name": "x"} if method == "POST" else None, headers=me)
        missing = await api.request(
            method,
            path.replace(other, "nobody").replace(two_accounts[f"{other}_key"], "key-nobody"),
            json={"name": "x"} if method == "POST" else None,
            headers=me,
        )
        assert (theirs.status, missing.status) == (404, 404), path
    assert (await api.get("/api/v1/whoami", headers=two_accounts[other])).status == 200  # the other key still works


@pytest.mark.parametrize("who", ["acme", "bob"])
async def test_only_an_operator_creates_or_changes_accounts(api, two_accounts, who):
    me = two_accounts[who]
    for response in (
        await api.post("/api/v1/accounts", json={"id": "mine", "role": "operator"}, headers=me),
        await api.patch(f"/api/v1/accounts/{who}", json={"share": 100}, headers=me),
    ):
        status, code, _ = await error_of(response)
        assert (status, code) == (403, "forbidden")
    assert (await api.master.accounts.get(who)).share == 1.0


# --- join tokens name a provider account ----------------------------------------------------------------------


async def test_a_join_token_must_name_an_existing_enabled_provider_account(api, two_accounts):
    assert (await api.post("/api/v1/tokens", json={"provider": "acme"}, headers=api.auth)).status == 201
    await create(api, {"id": "gone", "role": "provider"})
    await api.patch("/api/v1/accounts/gone", json={"disabled": True}, headers=api.auth)
    for provider, says in (("nobody", "no account 'nobody'"), ("bob", "renter account"), ("gone", "disabled")):
        status, _, message = await error_of(await api.post("/api/v1/tokens", json={"provider": provider}, headers=api.auth))
        assert status == 400 and message.startswith("provider:") and says in message, message


# --- the bootstrap operator ---------------------------------------------------------------------------------


async def test_the_bootstrap_operator_key_belongs_to_the_operator_account_and_legacy_keys_still_work(tmp_path):
    server = MasterServer(MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0))
    await server.start()
    try:
        operator = (await server.master.accounts.get("operator")).role
        [key] = await server.master.accounts.keys("operator")
        assert (operator, key.name) == ("operator", "bootstrap operator")
        assert key.key_hash == hash_secret(server.operator_token_file.read_text().strip())
    finally:
        await server.stop()


async def test_a_legacy_key_naming_no_account_is_the_operator(api):
    me = await (await api.get("/api/v1/whoami", headers=api.auth)).json()  # api.auth: a key naming no account
    assert me == {"account": "operator", "role": "operator", "key_id": "", "key_name": "test operator", "name": "Operator"}


async def test_an_operator_key_from_before_accounts_is_adopted_by_the_operator_account_at_the_next_start(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, api_port=0)
    first = MasterServer(config)
    await first.start()
    legacy = await first.master.create_api_key("old ops key")  # as a Master before accounts wrote it: no account
    await first.stop()
    server = MasterServer(config)
    await server.start()
    try:
        adopted = [k for k in await server.master.accounts.keys("operator") if k.name == "old ops key"]
        assert len(adopted) == 1 and adopted[0].key_id.startswith("key-")
        credential = await server.master.accounts.credential(legacy)
        assert credential is not None and credential.account is not None
        assert credential.account.role == "operator"  # still the operator
        await server.master.accounts.revoke_key(adopted[0].key_id)  # and now it can be revoked like any other
        assert (await server.master.accounts.credential(legacy)).key.revoked_at is not None
    finally:
        await server.stop()

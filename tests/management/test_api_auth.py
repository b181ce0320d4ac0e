"""Roles and ownership, decided in one place (management/access_control.py, read by management/api/auth.py), seen
through the real API on a real Master.

The operator may do everything; a provider sees only its own hosts and their GPUs, takes its own hosts in and
out of maintenance, and may not issue raw commands, tokens or keys; a renter gets 403 on these resources; another
account's host answers 404, exactly as a missing one does.
"""

from __future__ import annotations

import pytest

from management.access_control import PERMISSIONS, AccountRole, Action, Resource
from management.api.routing import DECLARED
from tests.management.hosts import add_agent, api_key


@pytest.fixture
async def two_providers(api):
    await add_agent(api.master, "agt-acme-1", "a10:2", provider="acme")
    await add_agent(api.master, "agt-acme-2", "l4:1", provider="acme")
    await add_agent(api.master, "agt-other", "h100:4", provider="other")
    return {
        "acme": await api_key(api.master, "provider", "acme"),
        "renter": await api_key(api.master, "renter", "bob"),
    }


async def items(api, path, headers) -> list[dict]:
    response = await api.get(path, headers=headers)
    assert response.status == 200, await response.text()
    return (await response.json())["items"]


async def test_a_provider_lists_only_its_own_hosts_and_their_gpus(api, two_providers):
    acme = two_providers["acme"]
    assert [a["id"] for a in await items(api, "/api/v1/agents", acme)] == ["agt-acme-1", "agt-acme-2"]
    assert {g["agent_id"] for g in await items(api, "/api/v1/gpus", acme)} == {"agt-acme-1", "agt-acme-2"}
    assert len(await items(api, "/api/v1/gpus", acme)) == 3
    # Naming the other account's host in a filter finds nothing rather than leaking it.
    assert await items(api, "/api/v1/gpus?agent_id=agt-other", acme) == []
    assert await items(api, "/api/v1/agents?provider=other", acme) == []


async def test_another_accounts_host_answers_404_like_a_missing_one(api, two_providers):
    acme = two_providers["acme"]
    for path, method in (
        ("/api/v1/agents/agt-other", "GET"),
        ("/api/v1/agents/agt-other/drain", "POST"),
        ("/api/v1/agents/agt-other/undrain", "POST"),
    ):
        theirs = await api.request(method, path, headers=acme)
        missing = await api.request(method, path.replace("agt-other", "agt-nobody"), headers=acme)
        assert (theirs.status, missing.status) == (404, 404), path
        assert (await theirs.json())["error"]["message"] == (await missing.json())["error"]["message"].replace(
            "agt-nobody", "agt-other"
        )
    assert (await api.get("/api/v1/agents/agt-other", headers=api.auth)).status == 200  # the operator sees it
    assert api.master.registry.get("agt-other").state == "ready"  # and nothing happened to it


async def test_a_provider_drains_its_own_host(api, two_providers):
    response = await api.post("/api/v1/agents/agt-acme-1/drain", headers=two_providers["acme"])
    assert response.status == 200
    assert (await response.json())["state"] == "maintenance"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/api/v1/commands", {"agent_id": "agt-acme-1", "kind": "delete_container", "spec": {"name": "x"}}),
        ("GET", "/api/v1/commands", None),
        ("POST", "/api/v1/tokens", {"provider": "acme"}),
        ("GET", "/api/v1/signing-keys", None),
        ("POST", "/api/v1/signing-keys/rotate", None),
        ("GET", "/api/v1/events", None),
        ("POST", "/api/v1/agents/agt-acme-1/revoke", None),
    ],
)
async def test_a_provider_may_not_issue_raw_commands_tokens_or_keys(api, two_providers, method, path, body):
    response = await api.request(method, path, json=body, headers=two_providers["acme"])
    assert response.status == 403
    error = (await response.json())["error"]
    assert error["code"] == "forbidden" and "provider key may not" in error["message"]
    assert api.master.registry.get("agt-acme-1").state == "ready"


@pytest.mark.parametrize(
    "path", ["/api/v1/agents", "/api/v1/agents/agt-acme-1", "/api/v1/gpus", "/api/v1/commands", "/api/v1/events"]
)
async def test_a_renter_gets_403_on_operator_and_provider_resources(api, two_providers, path):
    response = await api.get(path, headers=two_providers["renter"])
    assert response.status == 403
    assert "renter key may not" in (await response.json())["error"]["message"]


async def test_every_account_may_read_the_tiers(api, two_providers):
    for headers in (api.auth, two_providers["acme"], two_providers["renter"]):
        assert await items(api, "/api/v1/tiers", headers)


async def test_a_key_with_an_unknown_role_or_a_provider_key_naming_no_account_is_refused(api):
    for headers in (await api_key(api.master, "superuser"), await api_key(api.master, "provider", "")):
        response = await api.get("/api/v1/tiers", headers=headers)
        assert response.status == 403


def test_every_route_of_the_app_is_declared_with_what_authorizes_it(api):
    app_routes = {
        (route.method, route.resource.canonical)
        for route in api.app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/api/") and route.method != "HEAD"
    }
    assert app_routes == set(DECLARED)
    public = {key for key, route in DECLARED.items() if route.public}
    # the API's own description, keyless; the payment provider's webhook, whose signature is its credential
    assert public == {("GET", "/api/v1/openapi.json"), ("GET", "/api/v1/docs"), ("POST", "/api/v1/billing/webhook")}
    assert all(route.resource is not None and route.action is not None for key, route in DECLARED.items() if key not in public)


def test_the_operator_may_do_everything_and_a_renter_reads_tiers_runs_its_workloads_and_manages_its_own_keys():
    assert all(PERMISSIONS[AccountRole.OPERATOR][r] == frozenset(Action) for r in Resource)
    assert PERMISSIONS[AccountRole.RENTER] == {
        Resource.TIERS: frozenset({Action.READ}),
        Resource.WORKLOADS: frozenset({Action.READ, Action.WRITE}),
        Resource.ACCOUNTS: frozenset({Action.READ}),
        Resource.KEYS: frozenset({Action.READ, Action.WRITE}),
        Resource.HOST_PRICES: frozenset({Action.READ}),  # the price in force on a host is public, as in offers
        Resource.OFFERS: frozenset({Action.READ}),
        Resource.LEDGER: frozenset({Action.READ}),  # its own balance, ledger and spend; never a credit
        Resource.RENTALS: frozenset({Action.READ, Action.WRITE}),  # its own rentals, and rating them
        Resource.PASSWORD: frozenset({Action.WRITE}),  # its own console password
        Resource.REPORTS: frozenset({Action.READ}),  # reports of its own rentals
        Resource.ALERT_RULES: frozenset({Action.READ}),  # the rules, to know what it is alerted of
        Resource.ALERTS: frozenset({Action.READ}),  # its own workloads' alerts
        Resource.WEBHOOKS: frozenset({Action.READ, Action.WRITE}),  # its own webhooks
        Resource.TEMPLATES: frozenset({Action.READ}),  # the launch templates, the same for everyone
        Resource.SSH_KEYS: frozenset({Action.READ, Action.WRITE}),  # its own SSH public keys
        Resource.SECRETS: frozenset({Action.READ, Action.WRITE}),  # its own secrets, for its workloads
        Resource.ENDPOINTS: frozenset({Action.READ, Action.WRITE}),  # its own serverless endpoints and their keys
        Resource.TOPUPS: frozenset({Action.READ, Action.WRITE}),  # its own top-ups through the payment provider
        Resource.DISPUTES: frozenset({Action.READ, Action.WRITE}),  # disputes of its own rentals (never resolving one)
    }
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.DISPUTES] == frozenset({Action.READ})  # those about its hosts
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.DISPUTE_ANSWERS] == frozenset({Action.WRITE})
    assert all(Resource.DISPUTE_RESOLUTIONS not in PERMISSIONS[role] for role in (AccountRole.PROVIDER, AccountRole.RENTER))
    assert Resource.WORKLOADS not in PERMISSIONS[AccountRole.PROVIDER]
    assert Resource.TOPUPS not in PERMISSIONS[AccountRole.PROVIDER]
    assert Resource.ENDPOINTS not in PERMISSIONS[AccountRole.PROVIDER]
    assert Resource.SECRETS not in PERMISSIONS[AccountRole.PROVIDER]
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.PRICES] == frozenset({Action.READ, Action.WRITE})
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.LEDGER] == frozenset({Action.READ})  # its earnings and payouts
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.RENTALS] == frozenset({Action.READ})  # the rentals on its hosts
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.PASSWORD] == frozenset({Action.WRITE})  # its own console password
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.REPORTS] == frozenset({Action.READ})  # reports of its own hosts
    assert PERMISSIONS[AccountRole.PROVIDER][Resource.TEMPLATES] == frozenset({Action.READ})


async def test_head_is_authorized_as_the_get_it_mirrors(api, two_providers):
    assert (await api.head("/api/v1/agents", headers=two_providers["acme"])).status == 200
    assert (await api.head("/api/v1/commands", headers=two_providers["acme"])).status == 403


# --- accounts and keys: the matrix ---------------------------------------------------------------------------
# (method, path, body) -> the status each role gets, calling as account "acme" (provider) or "bob" (renter) with
# the operator's own account "operator". "own" paths name the caller's account; "other" paths name "zed".

ACCOUNT_ROUTES = [
    ("GET", "/api/v1/whoami", None, {"operator": 200, "provider": 200, "renter": 200}),
    ("POST", "/api/v1/accounts", {"id": "new-one", "role": "renter"}, {"operator": 201, "provider": 403, "renter": 403}),
    ("GET", "/api/v1/accounts", None, {"operator": 200, "provider": 200, "renter": 200}),
    ("GET", "/api/v1/accounts/{own}", None, {"operator": 200, "provider": 200, "renter": 200}),
    ("GET", "/api/v1/accounts/zed", None, {"operator": 200, "provider": 404, "renter": 404}),
    ("PATCH", "/api/v1/accounts/{own}", {"share": 2}, {"operator": 200, "provider": 403, "renter": 403}),
    ("POST", "/api/v1/accounts/{own}/keys", {"name": "x"}, {"operator": 201, "provider": 201, "renter": 201}),
    ("GET", "/api/v1/accounts/{own}/keys", None, {"operator": 200, "provider": 200, "renter": 200}),
    ("POST", "/api/v1/accounts/zed/keys", {"name": "x"}, {"operator": 201, "provider": 404, "renter": 404}),
    ("GET", "/api/v1/accounts/zed/keys", None, {"operator": 200, "provider": 404, "renter": 404}),
    ("POST", "/api/v1/keys/{zed_key}/revoke", None, {"operator": 200, "provider": 404, "renter": 404}),
]


@pytest.mark.parametrize("role", ["operator", "provider", "renter"])
@pytest.mark.parametrize(("method", "path", "body", "expected"), ACCOUNT_ROUTES, ids=lambda v: v if isinstance(v, str) else "")
async def test_who_may_call_each_account_and_key_route(api, role, method, path, body, expected):
    from master.accounts import AccountRole
    from master.records import AccountRecord

    await api.master.accounts.create(AccountRecord(id="zed", role="renter"))
    zed_key = (await api.master.accounts.create_key("zed", "zed's")).record.key_id
    own = {"operator": "operator", "provider": "acme", "renter": "bob"}[role]
    if role == "operator":
        issued = await api.master.accounts.create_key("operator", "matrix")
        headers = {"Authorization": f"Bearer {issued.key}"}
    else:
        await api.master.accounts.ensure(own, AccountRole(role))
        headers = await api_key(api.master, role, own)
    response = await api.request(method, path.format(own=own, zed_key=zed_key), json=body, headers=headers)
    assert response.status == expected[role], await response.text()

"""Opening a tunnel through the real API on a real Master (SQLite): who may, and what is refused before any relay or
agent is involved. The whole path (relay, agent, container) is tests/e2e/test_renter_access.py."""

from __future__ import annotations

import pytest

from tests.management.hosts import api_key
from tests.management.test_api_workloads import submit


@pytest.fixture
async def keys(api):
    return {
        "alice": await api_key(api.master, "renter", "alice"),
        "bob": await api_key(api.master, "renter", "bob"),
        "provider": await api_key(api.master, "provider", "acme"),
    }


async def tunnel(api, headers, workload_id: str, **body) -> tuple[int, dict]:
    response = await api.post(f"/api/v1/workloads/{workload_id}/tunnels", json=body, headers=headers)
    return response.status, await response.json()


async def test_another_renters_workload_answers_404_and_a_provider_is_forbidden(api, keys):
    workload = await submit(api, keys["alice"])
    status, body = await tunnel(api, keys["bob"], workload["id"], kind="exec")
    assert (status, body["error"]["code"]) == (404, "not_found")
    status, body = await tunnel(api, keys["provider"], workload["id"], kind="exec")
    assert (status, body["error"]["code"]) == (403, "forbidden")
    logs = await api.get(f"/api/v1/workloads/{workload['id']}/logs", headers=keys["bob"])
    assert logs.status == 404


async def test_a_queued_workload_has_nothing_to_reach_yet(api, keys):
    workload = await submit(api, keys["alice"])
    status, body = await tunnel(api, keys["alice"], workload["id"], kind="exec", command=["bash"], tty=True)
    assert status == 409
    assert body["error"]["message"] == f"workload {workload['id']} is queued: it runs nowhere yet, so there is nothing to reach"
    logs = await api.get(f"/api/v1/workloads/{workload['id']}/logs?tail=10", headers=keys["alice"])
    assert logs.status == 409 and logs.content_type == "application/json"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "shell"}, "kind"),
        ({"kind": "port", "port": 70000}, "port"),
        ({"kind": "exec", "command": [""]}, "command"),
        ({"kind": "logs", "tail": -2}, "tail"),
        ({"kind": "exec", "surprise": 1}, "surprise"),
    ],
)
async def test_a_bad_tunnel_request_is_refused_naming_the_field(api, keys, body, field):
    workload = await submit(api, keys["alice"])
    status, answer = await tunnel(api, keys["alice"], workload["id"], **body)
    assert status == 400 and field in answer["error"]["message"]


async def test_bad_logs_queries_are_refused_naming_the_parameter(api, keys):
    workload = await submit(api, keys["alice"])
    for query, name in (("tail=lots", "tail"), ("follow=maybe", "follow"), ("replica=-1", "replica"), ("x=1", "x")):
        response = await api.get(f"/api/v1/workloads/{workload['id']}/logs?{query}", headers=keys["alice"])
        assert response.status == 400 and name in (await response.json())["error"]["message"], query

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
        ({"kind": "port"}, "port"),
        ({"kind": "exec", "command": ["x" * 2000, "y" * 100]}, "command"),
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


@pytest.mark.parametrize(("ports", "declared"), [([8080, 8888], "declares ports 8080, 8888"), ([], "declares no ports")])
async def test_a_port_tunnel_to_a_port_the_workload_did_not_declare_is_refused_naming_the_declared_ones(
    api, keys, ports, declared
):
    """Issue 22 D9: a port tunnel went to any port (another renter's server on the host's loopback, the Master's
    /metrics). The API refuses a port the workload's spec does not declare, before any ticket is signed."""
    workload = await submit(api, keys["alice"], ports=ports)
    for port in (9090, 22):
        status, body = await tunnel(api, keys["alice"], workload["id"], kind="port", port=port)
        assert (status, body["error"]["code"]) == (400, "invalid_tunnel")
        assert body["error"]["message"] == (
            f"port: workload {workload['id']} {declared}; a port tunnel reaches only those, not {port} "
            "(declare a port in the workload's spec to reach it)"
        )
    if ports:  # a declared port passes this check: the queued workload is then refused for running nowhere
        status, body = await tunnel(api, keys["alice"], workload["id"], kind="port", port=8888)
        assert status == 409 and "runs nowhere yet" in body["error"]["message"]


async def test_an_exec_argument_with_a_nul_is_refused_not_cut_short(api, keys):
    """Issue 22: a NUL byte in an exec argument silently truncated it. It is a 400 naming the argument."""
    workload = await submit(api, keys["alice"])
    status, body = await tunnel(api, keys["alice"], workload["id"], kind="exec", command=["echo", "safe\u0000; rm -rf /"])
    assert (status, body["error"]["code"]) == (400, "invalid_tunnel")
    assert body["error"]["message"] == "command[1]: an argument may not hold a NUL byte (\\u0000); remove it"

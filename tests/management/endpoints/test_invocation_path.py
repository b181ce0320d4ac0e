"""The invocation path (management/api/invocation.py): an endpoint's request routes called with an invocation key are
served past the rest of the API's middleware chain, with the chain's answers kept: its metrics, its JSON errors, the
key's 401 and 403, the endpoint's rate limit, the Master's gate; an API key on the same routes still goes down the
chain."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest

from management.api import ApiSettings
from management.api.invocation import API_GATE_KEY
from management.app import ApiGate, api_app
from master.config import MasterConfig
from master.master import Master
from tests.management.hosts import api_key

SPEC: dict[str, Any] = {
    "name": "echo",
    "image": "none",
    "command": ["python", "handler.py"],
    "constraints": {"allow_process_runtime": True},
    "scaling": {"max_workers": 1, "concurrency": 1},
}


@dataclass
class Api:
    client: TestClient
    master: Master
    gate: ApiGate
    down_the_chain: list[str]  # the Authorization of each call the chain's innermost middleware saw
    owner: dict[str, str]

    async def endpoint(self, name: str = "echo") -> tuple[str, dict[str, str]]:
        made = await (await self.client.post("/api/v1/endpoints", json=SPEC | {"name": name}, headers=self.owner)).json()
        key = await (
            await self.client.post(f"/api/v1/endpoints/{made['id']}/keys", json={"name": "k"}, headers=self.owner)
        ).json()
        return made["id"], {"Authorization": f"Bearer {key['key']}"}

    def metric(self, route: str, status: int) -> str:
        text = generate_latest(self.master.metrics.registry).decode()
        wanted = f'idlegrid_api_requests_total{{method="GET",route="{route}",status="{status}"}} '
        return next((line.removeprefix(wanted) for line in text.splitlines() if line.startswith(wanted)), "")


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    app = api_app(master, ApiSettings(endpoint_rate_per_s=0.01, endpoint_burst=4))
    seen: list[str] = []

    @web.middleware
    async def innermost(request: web.Request, handler: Any) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        return await handler(request)

    gate = ApiGate()
    app.middlewares.append(gate.middleware())  # as the Master's server has it
    app.middlewares.append(innermost)
    app[API_GATE_KEY] = gate
    client = TestClient(TestServer(app))
    await client.start_server()
    owner = await api_key(master, "renter", "ana")
    yield Api(client, master, gate, seen, owner)
    await client.close()
    await master.stop()


async def test_an_invocation_key_s_call_goes_past_the_chain_and_the_owner_s_api_key_s_through_it(api: Api) -> None:
    endpoint, key = await api.endpoint()
    route = "/api/v1/endpoints/{endpoint_id}/status/{request_id}"
    api.down_the_chain.clear()
    for headers in (key, api.owner):
        answer = await api.client.get(f"/api/v1/endpoints/{endpoint}/status/req-none", headers=headers)
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "not_found"  # the errors' JSON shape, both ways
    assert api.down_the_chain == [api.owner["Authorization"]]
    assert api.metric(route, 404) == "2.0"  # both counted in the API's metrics


async def test_an_invocation_key_is_refused_on_the_invocation_path_as_the_chain_refuses_it(api: Api) -> None:
    endpoint, key = await api.endpoint()
    other, other_key = await api.endpoint("other")
    status_of = f"/api/v1/endpoints/{endpoint}/status/req-none"
    unknown = await api.client.get(status_of, headers={"Authorization": "Bearer igek_nothing"})
    assert unknown.status == 401 and (await unknown.json())["error"]["code"] == "unauthorized"
    elsewhere = await api.client.get(status_of, headers=other_key)
    assert elsewhere.status == 403 and (await elsewhere.json())["error"]["code"] == "forbidden"
    assert api.metric("/api/v1/endpoints/{endpoint_id}/status/{request_id}", 401) == "1.0"
    # The endpoint's burst (4), then 429; the owner's API key keeps its own limit.
    statuses = [
        (await api.client.post(f"/api/v1/endpoints/{endpoint}/run", json={"input": 1}, headers=key)).status for _ in range(5)
    ]
    assert statuses == [200, 200, 200, 200, 429]
    held = await api.client.get(status_of, headers=key)
    assert held.status == 429 and held.headers["Retry-After"] and (await held.json())["error"]["code"] == "rate_limited"
    assert (await api.client.get(status_of, headers=api.owner)).status == 404
    # A stopping Master's gate: authenticated first (a bad key is still 401), then 503.
    await api.gate.close(1.0)
    closed = await api.client.get(f"/api/v1/endpoints/{other}/status/req-none", headers=other_key)
    assert closed.status == 503 and (await closed.json())["error"]["code"] == "shutting_down"
    assert (await api.client.get(status_of, headers={"Authorization": "Bearer igek_nothing"})).status == 401
    assert api.down_the_chain.count(other_key["Authorization"]) == 0

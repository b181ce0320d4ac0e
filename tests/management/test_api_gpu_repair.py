"""POST /api/v1/gpus/{uuid}/repair on the real API and a real Master: the operator puts a faulty GPU back in service;
a provider may not (even for its own host), a GPU that is not faulty is a 409 and an unknown one a 404."""

from __future__ import annotations

import time

from common.wire import AgentEvent, AgentEventKind
from tests.management.hosts import add_agent, api_key


async def faulty_gpu(api) -> str:
    await add_agent(api.master, "agt-acme", "a10:2", provider="acme", runtime="simulated", isolation="container")
    gpu = api.master.gpus("agt-acme")[0]
    report = AgentEvent(kind=AgentEventKind.GPU_XID, ts=time.time(), gpu_uuid=gpu.uuid, code=79)
    await api.master.registry.mark_faulty(gpu, api.master.health.on_report(gpu, report, time.time()))
    return gpu.uuid


async def test_the_operator_repairs_a_faulty_gpu_and_it_is_offered_again(api):
    uuid = await faulty_gpu(api)
    listed = (await (await api.get("/api/v1/gpus?state=faulty", headers=api.auth)).json())["items"]
    assert [(g["uuid"], g["fault"]["kind"], g["fault"]["code"]) for g in listed] == [(uuid, "xid", 79)]

    response = await api.post(f"/api/v1/gpus/{uuid}/repair", headers=api.auth)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert (body["uuid"], body["state"], body["fault"], body["offered"]) == (uuid, "available", None, True)


async def test_a_provider_may_not_repair_even_its_own_gpu(api):
    uuid = await faulty_gpu(api)
    acme = await api_key(api.master, "provider", "acme")
    response = await api.post(f"/api/v1/gpus/{uuid}/repair", headers=acme)
    assert response.status == 403
    assert "may not write gpus" in (await response.json())["error"]["message"]
    assert api.master.registry.gpus[uuid].state == "faulty"


async def test_repairing_a_healthy_or_unknown_gpu_says_why_not(api):
    uuid = await faulty_gpu(api)
    await api.post(f"/api/v1/gpus/{uuid}/repair", headers=api.auth)
    again = await api.post(f"/api/v1/gpus/{uuid}/repair", headers=api.auth)
    assert again.status == 409 and "not faulty" in (await again.json())["error"]["message"]
    unknown = await api.post("/api/v1/gpus/GPU-nowhere/repair", headers=api.auth)
    assert unknown.status == 404 and "GPU-nowhere" in (await unknown.json())["error"]["message"]

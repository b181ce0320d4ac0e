"""Money before work, and work that can never run: rent and submit refuse at once (issue 23, item 6) on a real Master
and its API (SQLite in tmp_path), naming the field or flag that fixes it, instead of queueing work to wait for ever.
The hosts are simulated (no GPU here): add_agent registers them as a hello would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from management.app import api_app
from master.config import MasterConfig
from master.master import Master
from tests.management.hosts import add_agent, api_key


@pytest.fixture
async def grid(tmp_path: Path) -> AsyncIterator[TestClient]:
    """A grid whose operator offers sandboxed hosts: a 2-GPU container host (a10) and a 4-GPU process-runtime host
    (h100, sandboxed); renter lab with a key."""
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, offer_sandboxed_hosts=True))
    await master.start()
    await add_agent(master, "agt-box", "a10:2", runtime="docker", isolation="container")
    await add_agent(master, "agt-proc", "h100:4", runtime="process", isolation="sandbox")
    client = TestClient(TestServer(api_app(master)))
    await client.start_server()
    client.lab = await api_key(master, "renter", "lab")  # type: ignore[attr-defined]
    yield client
    await client.close()
    await master.stop()


def spec(gpus: int = 1, **more: object) -> dict[str, object]:
    return {"name": "job", "image": "busybox", "command": ["true"], "replica": {"gpus": gpus, **more}}


async def refused(response) -> str:
    body = await response.json()
    assert response.status == 409, body
    return body["error"]["message"]


async def test_work_only_the_process_runtime_could_run_is_refused_naming_the_flag_and_runs_with_it(grid):
    message = await refused(await grid.post("/api/v1/workloads", json=spec(4), headers=grid.lab))
    assert "can never run on this grid" in message and "constraints.allow_process_runtime" in message, message
    assert "--allow-process-runtime" in message, message
    assert 'image "none"' in message, message  # the process runtime runs a command on the host, not an image
    allowed = spec(4) | {"image": "none", "constraints": {"allow_process_runtime": True}}
    accepted = await grid.post("/api/v1/workloads", json=allowed, headers=grid.lab)
    assert accepted.status == 201, await accepted.text()
    rent = await grid.post("/api/v1/offers/agt-proc/rent", json={"spec": spec(1)}, headers=grid.lab)
    message = await refused(rent)
    assert "process runtime" in message and "--allow-process-runtime" in message, message


async def test_a_model_the_grid_lacks_is_refused_naming_the_field_and_the_models_there(grid):
    message = await refused(await grid.post("/api/v1/workloads", json=spec(1, models=["b200"]), headers=grid.lab))
    assert "no GPU on this grid is a b200" in message and "replica.models" in message, message
    assert "a10" in message and "h100" in message, message


async def test_more_gpus_per_replica_than_any_host_has_is_refused_and_what_fits_is_queued(grid):
    too_big = spec(8) | {"image": "none", "constraints": {"allow_process_runtime": True}}
    message = await refused(await grid.post("/api/v1/workloads", json=too_big, headers=grid.lab))
    assert "the most any host has that match is 4" in message, message
    fits = await grid.post("/api/v1/workloads", json=spec(2), headers=grid.lab)
    assert fits.status == 201 and (await fits.json())["state"] == "queued"
    assert (await (await grid.get("/api/v1/workloads", headers=grid.lab)).json())["items"][0]["id"] == (await fits.json())["id"]


async def test_a_grid_whose_only_fitting_host_isolates_nothing_says_so(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        await add_agent(master, "agt-bare", "h100:8", runtime="process", isolation="none")
        await add_agent(master, "agt-box", "a10:1", runtime="docker", isolation="container")
        client = TestClient(TestServer(api_app(master)))
        await client.start_server()
        try:
            lab = await api_key(master, "renter", "lab")
            message = await refused(await client.post("/api/v1/workloads", json=spec(4), headers=lab))
            assert "the most any host has that match is 1" in message, message
            assert "1 host here isolates nothing (isolation none) and takes no renter's work" in message, message
        finally:
            await client.close()
    finally:
        await master.stop()

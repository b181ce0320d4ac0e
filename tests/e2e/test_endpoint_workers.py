"""Endpoint workers' calls end to end: real processes (the Master, a relay, agents with the process runtime), the real
handler library in each worker container, the worker API on a unix socket the agent serves, the calls carried over
the host link to the Master.

The Master's request queue is a fake (tests/support/endpoint_master.py, registered through the port): the real queue
is another part of issue 39, merged separately."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from common.endpoint_worker.client import TokenRefused, WorkerAPI
from common.inventory import HostInfo
from common.wire import WorkerCall, WorkerOp, encode
from tests.e2e.test_hostile_agent import enroll_hostile, hostile_link
from tests.support.grid import REPO, Grid, wait_for

HOST = HostInfo(
    hostname="second", cpu_model="x", cpu_cores=1, ram_mib=1024, disk_total_gib=1, disk_free_gib=1, os="linux", kernel="6"
)
HANDLER = "from common.endpoint_worker import serve; serve(lambda request: {'echo': request.input})"
# A sandboxed worker sees none of the host's /tmp (a fresh tmpfs there), where a CI's clone may lie: it carries the
# library as an image would, here a zip in its environment written to its working directory and imported from there.
LIBRARY_ENV = "IDLEGRID_TEST_WORKER_LIBRARY"
CARRIED_HANDLER = (
    "import base64, os, sys; path = os.path.join(os.getcwd(), 'idlegrid_worker.zip'); "
    f"open(path, 'wb').write(base64.b64decode(os.environ['{LIBRARY_ENV}'])); sys.path.insert(0, path); "
    "from idlegrid_worker import serve; serve(lambda request: {'echo': request.input})"
)


def _library_zip() -> str:
    """common/endpoint_worker/ as the package ``idlegrid_worker`` in a zip, base64 (its imports are relative)."""
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted((REPO / "common" / "endpoint_worker").glob("*.py")):
            archive.write(source, f"idlegrid_worker/{source.name}")
    return base64.b64encode(packed.getvalue()).decode()


@pytest.fixture
def endpoint_grid(tmp_path: Path) -> Iterator[tuple[Grid, Path]]:
    queue = tmp_path / "queue"
    g = Grid(tmp_path / "grid")
    try:
        g.start_master(program=("tests.support.endpoint_master", str(queue)))
        g.start_relay("relay-1", "eu-west")
        yield g, queue
    finally:
        g.stop()


def _worker_spec(name: str, endpoint_id: str, worker_id: str, token: str, python: str = sys.executable) -> dict[str, Any]:
    return {
        "name": name,
        "image": "none",
        "command": [python, "-c", HANDLER],
        "env": {"PYTHONPATH": str(REPO)},
        "endpoint_worker": {"endpoint_id": endpoint_id, "worker_id": worker_id, "token": token},
    }


def _reports(queue: Path, request_id: str) -> list[dict[str, Any]]:
    path = queue / "done" / f"{request_id}.json"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_requests_flow_worker_agent_relay_master_and_back_each_endpoint_to_its_own_workers(endpoint_grid):
    grid, queue = endpoint_grid
    agent_id, daemon = grid.run_agent("ep-host", simulate="a10:1")
    for endpoint, worker in (("ep-a", "w-a"), ("ep-b", "w-b")):
        spec = _worker_spec(f"{endpoint}-{worker}", endpoint, worker, f"token-of-{worker}-0123456789")
        created = grid.wait_command(grid.command(agent_id, "create_container", spec))
        assert created["state"] == "succeeded", created
    (queue / "waiting" / "ep-a--r1.json").write_text(json.dumps({"prompt": "for a"}))
    (queue / "waiting" / "ep-b--r2.json").write_text(json.dumps({"prompt": "for b"}))
    for request_id, endpoint, worker, prompt in (("r1", "ep-a", "w-a", "for a"), ("r2", "ep-b", "w-b", "for b")):
        [report] = wait_for(lambda r=request_id: _reports(queue, r), 30, f"{request_id}'s result\n{daemon.tail()}")
        # Each request was worked by its own endpoint's worker, named by the Master from where its container is.
        assert report == {"op": "result", "worker": [endpoint, worker, agent_id], "value": {"echo": {"prompt": prompt}}}

    socket = grid.agent_dir("ep-host")
    [api] = [p for p in socket.rglob("api.sock") if p.parent.name == "ep-a-w-a"]
    with pytest.raises(TokenRefused):  # a wrong token is refused by the agent (401)
        WorkerAPI(f"unix://{api}", "token-of-w-b-0123456789").heartbeat([])
    assert WorkerAPI(f"unix://{api}", "token-of-w-a-0123456789").heartbeat([]) == []

    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "ep-a-w-a"}))
    assert deleted["state"] == "succeeded", deleted
    wait_for(lambda: (queue / "gone" / "ep-a--w-a").exists(), 20, "the deleted worker to be told gone")
    assert not api.exists()


SYSTEM_PYTHON = "/usr/bin/python3"  # a sandboxed uid cannot run the test's own interpreter, under root's home


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="the sandbox needs root and a system Python")
def test_a_sandboxed_worker_reaches_its_socket_bound_into_its_mount_namespace(endpoint_grid):
    """As root, the process runtime runs a worker as a uid of its own in namespaces of its own (isolation sandbox):
    it sees its socket's directory bound at /idlegrid/mnt/idlegrid/worker, owned by its uid, and nothing else of the
    agent's state."""
    grid, queue = endpoint_grid
    agent_id, daemon = grid.run_agent("sandbox-host", simulate="a10:1", env={"IDLEGRID_AGENT_PROCESS_USER": "dynamic"})
    spec = _worker_spec("ep-a-w-a", "ep-a", "w-a", "token-of-w-a-0123456789", python=SYSTEM_PYTHON)
    spec["command"] = [SYSTEM_PYTHON, "-c", CARRIED_HANDLER]
    spec["env"] = {LIBRARY_ENV: _library_zip()}
    created = grid.wait_command(grid.command(agent_id, "create_container", spec))
    assert created["state"] == "succeeded", created
    (queue / "waiting" / "ep-a--r1.json").write_text(json.dumps({"prompt": "sandboxed"}))
    [report] = wait_for(lambda: _reports(queue, "r1"), 30, f"r1's result\n{daemon.tail()}")
    assert report == {"op": "result", "worker": ["ep-a", "w-a", agent_id], "value": {"echo": {"prompt": "sandboxed"}}}


async def test_a_second_host_cannot_answer_for_the_first_hosts_worker(endpoint_grid, tmp_path):
    """A host speaks for its own containers only: a second host (played by this test, with a real enrolled
    certificate) sending calls that name the first host's worker is refused 403 by the Master, and the queue never
    sees them; the first host's worker goes on working."""
    grid, queue = endpoint_grid
    first, daemon = grid.run_agent("first-host", simulate="a10:1")
    spec = _worker_spec("ep-a-w-1", "ep-a", "w-1", "token-of-w-1-0123456789")
    assert grid.wait_command(grid.command(first, "create_container", spec))["state"] == "succeeded"
    (queue / "waiting" / "ep-a--r0.json").write_text(json.dumps("warm"))
    await asyncio.to_thread(wait_for, lambda: _reports(queue, "r0"), 30, f"r0's result\n{daemon.tail()}")

    _, pair = enroll_hostile(grid, tmp_path)

    def forged(call_id: str, op: WorkerOp, **fields: Any) -> str:
        call = WorkerCall(call_id=call_id, container="ep-a-w-1", endpoint_id="ep-a", worker_id="w-1", op=op, **fields)
        return encode(call).decode()

    async with hostile_link(grid, pair, [], HOST, "eu-west") as ws:
        await ws.send(forged("forged-1", WorkerOp.RESULT, request_id="r0", payload="forged"))
        await ws.send(forged("forged-2", WorkerOp.TAKE, wait_s=1.0))
        answers: dict[str, int] = {}
        while len(answers) < 2:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=15))
            if frame["type"] == "worker_answer":
                answers[frame["call_id"]] = frame["status"]
    assert answers == {"forged-1": 403, "forged-2": 403}
    (queue / "waiting" / "ep-a--r1.json").write_text(json.dumps("still mine"))
    [report] = await asyncio.to_thread(wait_for, lambda: _reports(queue, "r1"), 30, f"r1's result\n{daemon.tail()}")
    assert report["worker"] == ["ep-a", "w-1", first]
    assert [r["value"] for r in _reports(queue, "r0")] == [{"echo": "warm"}]  # the forged result never arrived

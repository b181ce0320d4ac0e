"""An endpoint scales from zero on a real local grid: the Master whole (its request book and autoscaler inside, with a
file drop to submit requests, tests/support/book_master.py, since the request routes are another part of issue 39), a
relay and two sandboxed process-runtime hosts with simulated GPUs, each its own process (tests/support/grid.py).

Requests submitted to an endpoint with no worker bring workers up (ordinary workloads of the renter, placed by the
scheduler), the real handler library in each worker takes them through its agent, and every request completes; with
nothing left to do, the workers go back to zero after the idle timeout."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_endpoint_workers import CARRIED_HANDLER, LIBRARY_ENV, SYSTEM_PYTHON, _library_zip
from tests.support.grid import Grid, wait_for, write_toml

MASTER_SETTINGS: dict[str, str | int | float | bool] = {
    "scheduler_period_s": 1.0,
    "preemption_grace_s": 3.0,
    "offer_sandboxed_hosts": True,
}
SANDBOXED = {"IDLEGRID_AGENT_PROCESS_USER": "dynamic"}

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON), reason="sandboxed hosts need root and a system Python"
)


@pytest.fixture
def scaling_grid(tmp_path: Path) -> Iterator[tuple[Grid, Path]]:
    drop = tmp_path / "drop"
    g = Grid(tmp_path / "grid")
    try:
        config = write_toml(tmp_path / "master.toml", MASTER_SETTINGS)
        g.start_master("--config", str(config), program=("tests.support.book_master", str(drop)))
        g.start_relay("relay-1", "eu-west")
        yield g, drop
    finally:
        g.stop()


def status(drop: Path, name: str) -> dict[str, Any] | None:
    path = drop / "status" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_requests_at_an_endpoint_with_no_worker_bring_workers_up_from_zero_and_complete(scaling_grid):
    grid, drop = scaling_grid
    for n in range(2):
        grid.run_agent(f"host-{n}", simulate="a10:1", env=SANDBOXED)
    grid.client.create_account("alice", "renter")
    code, made = grid.call(
        "POST",
        "/api/v1/endpoints",
        {
            "account": "alice",
            "name": "echo",
            "image": "none",
            "command": [SYSTEM_PYTHON, "-c", CARRIED_HANDLER],
            "env": {LIBRARY_ENV: _library_zip()},
            "replica": {"gpus": 1},
            "constraints": {"allow_process_runtime": True},
            "scaling": {"max_workers": 2, "idle_timeout_s": 3, "concurrency": 1},
        },
    )
    assert code == 201, made
    endpoint_id = made["id"]
    (drop / "submit").mkdir(parents=True, exist_ok=True)
    for i in range(4):
        (drop / "submit" / f"{endpoint_id}--r{i}.json").write_text(json.dumps({"n": i}))

    def done() -> list[dict[str, Any]] | None:
        found = [s for i in range(4) if (s := status(drop, f"r{i}")) is not None and s["state"] == "completed"]
        return found if len(found) == 4 else None

    finished = wait_for(done, 90, f"every request to complete\n{grid.master.tail() if grid.master else ''}")
    assert [s["output"] for s in finished] == [{"echo": {"n": i}} for i in range(4)]
    workers = [w for w in grid.get("/api/v1/workloads?account=alice")["items"] if w["spec"]["name"] == "echo"]
    assert len(workers) == 2  # ceil(4 / 1) capped at max_workers 2: each ran on a host of its own
    shown = wait_for(
        lambda: (e := grid.get(f"/api/v1/endpoints/{endpoint_id}"))["scale"] and not sum(e["scale"]["workers"].values()) and e,
        60,
        "the workers to go back to zero after the idle timeout",
    )
    assert shown["scale"]["workers"] == {"starting": 0, "ready": 0}
    ended = [grid.get(f"/api/v1/workloads/{w['id']}") for w in workers]
    assert {w["state"] for w in ended} == {"cancelled"}, ended

"""An endpoint on a Podman host, end to end: a real local grid (the Master with its request book and autoscaler, a relay,
an agent on the docker runtime against the tests' private Podman service, each a process) and the local grid's
offline worker image (management/devgrid/podman_host.py ``WORKER``: busybox, the host's Python, the handler library and
the echo worker), built on the test's Podman, never pulled: the host is configured as the demo's container host is
(no pulls, the ``localhost`` registry allowed by name).

Requests sent over HTTP with the endpoint's invocation key bring a worker up from zero in a Podman container; a
streamed request (the echo worker streams each word of its ``prompt``) and a plain one complete; with nothing left to
do, the worker goes back to zero and its container is gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from management.devgrid.podman_host import WORKER
from tests.e2e.test_endpoint_workers import Endpoint
from tests.support.grid import Grid, running_grid, wait_for
from tests.support.podman import LOCAL_IMAGES_ALLOWED, PodmanService

pytestmark = [pytest.mark.podman, pytest.mark.e2e]
MASTER_SETTINGS: dict[str, str | int | float | bool] = {"scheduler_period_s": 1.0}
# As the demo's container host (management/devgrid/demo.py CONTAINER_HOST_ENV): no registry is reachable, so only the
# images built here run, and their registry name, "localhost", is allowed by name.
CONTAINER_HOST_ENV = {"IDLEGRID_AGENT_IMAGE_PULL": "false", "IDLEGRID_AGENT_EGRESS_ALLOW": ",".join(LOCAL_IMAGES_ALLOWED)}


@pytest.fixture
def podman_grid(tmp_path: Path, podman: PodmanService) -> Iterator[tuple[Grid, PodmanService]]:
    podman.ensure_image(WORKER)  # seconds, offline; kept for the session's other tests
    with running_grid(tmp_path / "grid", MASTER_SETTINGS, egress_allow=LOCAL_IMAGES_ALLOWED) as grid:
        assert grid.enroll("podman-host", grid.relays["relay-1"]).returncode == 0
        socket = ("--runtime", "docker", "--docker-socket", str(podman.socket_path))
        env = {"IDLEGRID_AGENT_GPU_SELFTEST_IMAGE": podman.image, **CONTAINER_HOST_ENV}
        grid.start_agent("podman-host", *socket, simulate="a10:1", env=env)
        grid.wait_state(grid.agent_id("podman-host"), "ready", timeout=60)  # after the GPU self-test's container
        assert grid.client.create_account("ana", "renter")["id"] == "ana"  # Endpoint makes ana's endpoints
        yield grid, podman


def worker_containers(podman: PodmanService) -> list[dict[str, Any]]:
    status, listed = podman.api("GET", "/containers/json?all=true")
    assert status == 200, listed
    return [c for c in listed if c["Image"] == WORKER.reference]


def test_an_endpoint_on_a_podman_host_scales_from_zero_streams_and_answers_over_the_routes(podman_grid):
    grid, podman = podman_grid
    echo = Endpoint(
        grid,
        "echo",
        image=WORKER.reference,  # its own CMD runs the echo worker
        command=[],
        constraints={},
        replica={"gpus": 1},
        scaling={"max_workers": 1, "idle_timeout_s": 3},
    )
    assert worker_containers(podman) == []

    # From zero: the request waits while the autoscaler's worker is placed and its container starts on Podman.
    streamed = echo.run({"prompt": "three small words"})
    words: list[Any] = []
    while True:
        status, page = echo.call("GET", f"stream/{streamed}?wait=5000")
        assert status == 200, page
        words += [item["output"] for item in page["stream"]]
        if page["status"] not in ("IN_QUEUE", "IN_PROGRESS"):
            break
        assert len(words) <= 3, words
    assert (page["status"], words) == ("COMPLETED", ["three", "small", "words"]), (
        f"{page}\n{grid.master.tail() if grid.master else ''}"
    )
    assert echo.status(streamed)["output"] == {"echo": {"prompt": "three small words"}, "words": 3, "attempt": 1}
    [running] = worker_containers(podman)
    assert running["State"] == "running", running

    status, synced = echo.call("POST", "runsync?wait=60000", {"input": {"n": 1}})
    assert status == 200 and (synced["status"], synced["output"]) == (
        "COMPLETED",
        {"echo": {"n": 1}, "words": 0, "attempt": 1},
    ), synced
    status, health = echo.call("GET", "health")
    assert status == 200 and health["jobs"]["completed"] == 2 and health["workers"]["ready"] == 1, health

    # Nothing left to do: back to zero after the idle timeout, the container removed.
    wait_for(
        lambda: (e := grid.get(f"/api/v1/endpoints/{echo.id}"))["scale"] and not sum(e["scale"]["workers"].values()),
        60,
        "the worker to go back to zero after the idle timeout",
    )
    wait_for(lambda: worker_containers(podman) == [], 30, "the worker's container to be removed")

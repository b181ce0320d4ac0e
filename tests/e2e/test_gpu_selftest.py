"""Issue 23, acceptance 4: a host whose GPUs do not reach containers is not offered, and the provider sees why.

Real parts: a Master, a relay and agents as processes, the agent's docker runtime against the real Podman Docker API.
The GPUs are the agent's simulated ones (no GPU here). The broken host is simulated the way a Docker without the
NVIDIA Container Toolkit behaves: its runtime asks the engine for GPU devices (``docker_gpu_devices =
"device_requests"``), which Podman's Docker API drops; its agent's self-test sees that before the host is offered. The
healthy host gives its simulated GPUs by name (the default for simulated GPUs), and its self-test sees them inside a
container."""

from __future__ import annotations

import pytest

from tests.support.grid import Grid, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.podman]


def start(grid: Grid, name: str, podman, simulate: str = "a10:2", **env: str) -> str:
    assert grid.enroll(name, grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id(name)
    extra = ("--runtime", "docker", "--docker-socket", str(podman.socket_path))
    grid.start_agent(name, *extra, simulate=simulate, env={"IDLEGRID_AGENT_GPU_SELFTEST_IMAGE": podman.image, **env})
    grid.wait_state(agent_id, "ready")
    return agent_id


def offered_hosts(grid: Grid) -> dict[str, int]:
    """Host -> GPUs it offers now, as a renter's search sees the market."""
    return {offer["id"]: offer["num_gpus"] for offer in grid.get("/api/v1/offers")["offers"]}


def test_a_host_whose_gpus_do_not_reach_containers_is_not_offered_and_says_why(grid, podman):
    broken = start(grid, "refusing-host", podman, IDLEGRID_AGENT_DOCKER_GPU_DEVICES="device_requests")
    healthy = start(grid, "healthy-host", podman)

    host = grid.agent(broken)
    gpus = [g["uuid"] for g in host["gpus"]]
    assert [(r["uuid"], r["reachable"]) for r in host["gpu_selftest"]] == [(uuid, False) for uuid in gpus]
    for reach in host["gpu_selftest"]:
        assert f"dropped the request for GPUs {reach['uuid']}" in reach["detail"]
        assert "NVIDIA Container Toolkit" in reach["fix"]
    assert all(g["offered"] is False and "unreachable_from_runtime" in g["flags"] for g in host["gpus"]), host["gpus"]

    fine = grid.agent(healthy)
    assert [r["reachable"] for r in fine["gpu_selftest"]] == [True, True]
    assert all(g["offered"] for g in fine["gpus"])
    offers = offered_hosts(grid)
    assert offers.get(healthy) == 2 and broken not in offers, offers  # the broken host is in no offer

    # Not even an operator's raw command puts a container on them: the Master refuses before the agent is asked.
    status, body = grid.call(
        "POST",
        "/api/v1/commands",
        {"agent_id": broken, "kind": "create_container", "spec": {"name": "x", "image": podman.image, "gpus": gpus[:1]}},
    )
    assert status == 409 and "self-test" in body["error"]["message"], body
    assert not podman.inspect("x")


def test_a_simulated_amd_hosts_cards_reach_containers_by_their_rocm_names(grid, podman):
    """Issue 41: the agent knows which vendor made each card and gives a container AMD's by ROCm's variables: its
    self-test probes AMD's (``$ROCR_VISIBLE_DEVICES``), and a container on an MI300X is told its card there, not in
    CUDA's."""
    amd = start(grid, "amd-host", podman, simulate="mi300x:2")
    host = grid.agent(amd)
    assert {g["model"] for g in host["gpus"]} == {"mi300x"}
    assert [r["reachable"] for r in host["gpu_selftest"]] == [True, True], host["gpu_selftest"]
    assert all(g["offered"] and g["partition"]["compute"] == "SPX" for g in host["gpus"]), host["gpus"]

    card = host["gpus"][1]["uuid"]
    spec = {"name": "on-mi300x", "image": podman.image, "command": ["sleep", "300"], "gpus": [card]}
    status, body = grid.call("POST", "/api/v1/commands", {"agent_id": amd, "kind": "create_container", "spec": spec})
    assert status in (200, 201, 202), body
    try:
        wait_for(lambda: podman.inspect("on-mi300x") is not None, 20, "the container on the MI300X")
        env = podman.inspect("on-mi300x")["Config"]["Env"]
        assert f"ROCR_VISIBLE_DEVICES={card}" in env and "HIP_VISIBLE_DEVICES=0" in env and "CUDA_VISIBLE_DEVICES=" in env
    finally:
        # The session's Podman serves the later tests: a container left running there (its network namespace lost
        # when a later sandbox's mount namespace hid it) made every later listing answer 500.
        podman.api("DELETE", "/containers/on-mi300x?force=true&v=true")

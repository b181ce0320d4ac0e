"""The Master's guards against double-booked GPUs, oversized or stale inventories and silent departures,
checked through the real API against real Master, relay and agent processes."""

from __future__ import annotations

import signal
import time

from tests.support.grid import wait_for


def create(grid, agent_id: str, name: str, gpus: list[str]) -> tuple[int, dict]:
    spec = {"name": name, "image": "none", "command": ["sleep", "300"], "gpus": gpus}
    return grid.call("POST", "/api/v1/commands", {"agent_id": agent_id, "kind": "create_container", "spec": spec})


def gpu_states(grid, agent_id: str) -> dict[str, str]:
    return {g["uuid"]: g["state"] for g in grid.agent(agent_id)["gpus"]}


def test_a_second_container_on_a_held_gpu_is_refused_with_409_and_a_delete_frees_only_its_own(grid):
    agent_id, _ = grid.run_agent("host-a", simulate="h100:2")
    first, second = sorted(gpu_states(grid, agent_id))

    status, body = create(grid, agent_id, "job-1", [first])
    assert status == 202, body
    status, refused = create(grid, agent_id, "job-2", [first])
    assert status == 409, refused
    assert "held by container 'job-1'" in str(refused)
    status, refused = create(grid, agent_id, "job-3", ["GPU-not-on-this-host"])
    assert status == 409 and "not on host" in str(refused), refused

    assert grid.wait_command(body["id"])["state"] == "succeeded"
    status, other = create(grid, agent_id, "job-4", [second])
    assert status == 202 and grid.wait_command(other["id"])["state"] == "succeeded"
    assert gpu_states(grid, agent_id) == {first: "busy", second: "busy"}

    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "job-1"}))
    assert deleted["state"] == "succeeded", deleted
    assert gpu_states(grid, agent_id) == {first: "available", second: "busy"}


def test_a_host_reporting_more_gpus_than_allowed_is_refused_and_nothing_registered(grid):
    assert grid.enroll("big-host", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("big-host")
    daemon = grid.start_agent("big-host", simulate="h100:20")
    refused = wait_for(
        lambda: grid.get(f"/api/v1/events?kind=agent.hello_refused&subject={agent_id}")["items"],
        30,
        f"the hello to be refused\n{daemon.tail()}",
    )
    assert refused[0]["data"]["code"] == "inventory_too_large"
    agent = grid.agent(agent_id)
    assert agent["state"] == "enrolled" and agent["gpus"] == []
    assert [g for g in grid.get("/api/v1/gpus")["items"] if g["agent_id"] == agent_id] == []


def test_a_clean_stop_shows_at_once_and_a_restart_with_other_gpus_replaces_the_inventory(grid):
    agent_id, daemon = grid.run_agent("host-b", simulate="h100:2")
    old = set(gpu_states(grid, agent_id))
    daemon.kill(signal.SIGTERM)
    stopped = time.monotonic()
    agent = wait_for(lambda: (a := grid.agent(agent_id))["state"] == "offline" and a, 10, "the agent to show offline")
    # Heartbeats here are 1 s and three may be missed: a reason naming the disconnect is what shows it was not the sweep.
    assert agent["state_reason"].startswith("disconnected from relay relay-1"), agent["state_reason"]
    assert time.monotonic() - stopped < 10

    grid.run_agent("host-b", simulate="a10:1")  # the same host back with another card
    new = gpu_states(grid, agent_id)
    assert len(new) == 1 and not (set(new) & old) and list(new.values()) == ["available"]
    assert not any(g["uuid"] in old for g in grid.get("/api/v1/gpus")["items"])


def test_agents_behind_a_relay_that_dies_show_offline_at_once_naming_the_relay(grid):
    agent_id, _ = grid.run_agent("host-c", simulate="a10:1")
    grid.relays["relay-1"].daemon.kill(signal.SIGKILL)
    agent = wait_for(lambda: (a := grid.agent(agent_id))["state"] == "offline" and a, 10, "the agent to show offline")
    assert agent["state_reason"] == "relay relay-1 lost", agent["state_reason"]  # not the sweep's "no heartbeat"
    assert [g["state"] for g in agent["gpus"]] == ["offline"]

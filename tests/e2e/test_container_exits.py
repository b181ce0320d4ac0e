"""A container that ends on its own shows in the API with its exit status, keeps its GPU until deleted, and is gone
from the agent's exits after the delete. Real processes: Master, relay, agent with the process runtime."""

from __future__ import annotations

from tests.support.grid import wait_for


def test_an_exit_shows_on_the_agent_within_seconds_and_the_gpu_stays_held_until_the_delete(grid):
    agent_id, daemon = grid.run_agent("exit-host", simulate="a10:1")
    [gpu] = [g["uuid"] for g in grid.agent(agent_id)["gpus"]]
    spec = {"name": "short-job", "image": "none", "command": ["sh", "-c", "sleep 0.5; exit 3"], "gpus": [gpu]}
    created = grid.wait_command(grid.command(agent_id, "create_container", spec))
    assert created["state"] == "succeeded", created

    agent = wait_for(lambda: (a := grid.agent(agent_id))["exited"] and a, 10, f"the exit to be reported\n{daemon.tail()}")
    assert agent["exited"] == {"short-job": 3}
    assert [g["state"] for g in agent["gpus"]] == ["busy"]  # the ended container still holds it

    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "short-job"}))
    assert deleted["state"] == "succeeded", deleted
    agent = grid.agent(agent_id)
    assert agent["exited"] == {} and [g["state"] for g in agent["gpus"]] == ["available"]

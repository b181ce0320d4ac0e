"""Acceptance 3, 4 and 5: container commands end to end, at most once across a SIGKILL, and forged ones refused."""

import time

import pytest

from tests.support.grid import wait_for
from tests.support.tamper import tampering_relay


def start(grid, name, *extra, simulate="a10:2", env=None):
    assert grid.enroll(name, grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id(name)
    daemon = grid.start_agent(name, *extra, simulate=simulate, env=env)
    grid.wait_state(agent_id, "ready")
    return agent_id, daemon


def test_create_then_delete_with_the_process_runtime(grid, tmp_path):
    agent_id, _ = start(grid, "proc-host")
    marker = tmp_path / "env.txt"
    gpus = [g["uuid"] for g in grid.agent(agent_id)["gpus"]][:1]
    spec = {
        "name": "job-1",
        "image": "none",
        "command": ["sh", "-c", f"env > {marker}; sleep 60"],
        "gpus": gpus,
        "memory_mib": 256,
        "labels": {"team": "vision"},
    }
    created = grid.wait_command(grid.command(agent_id, "create_container", spec))
    assert created["state"] == "succeeded", created
    container = created["result"]["container"]
    assert container["labels"]["io.idlegrid.command-id"] == created["id"]
    assert container["labels"]["team"] == "vision"
    env = wait_for(lambda: marker.exists() and marker.read_text(), 10, "the container to start")
    assert f"CUDA_VISIBLE_DEVICES={gpus[0]}" in env
    agent = grid.wait_state(agent_id, "busy")
    states = {g["uuid"]: g["state"] for g in agent["gpus"]}
    assert states[gpus[0]] == "busy", grid.get(f"/api/v1/events?subject={gpus[0]}")

    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "job-1"}))
    assert deleted["state"] == "succeeded", deleted
    agent = grid.wait_state(agent_id, "ready")
    assert all(g["state"] == "available" for g in agent["gpus"])


@pytest.mark.podman
def test_create_then_delete_against_a_real_podman_service(grid, podman):
    agent_id, _ = start(
        grid,
        "podman-host",
        "--runtime",
        "docker",
        "--docker-socket",
        str(podman.socket_path),
        env={"IDLEGRID_AGENT_GPU_SELFTEST_IMAGE": podman.image},  # the GPU self-test's probe runs in the local busybox
    )
    spec = {
        "name": "pod-job",
        "image": podman.image,
        "command": ["sleep", "300"],
        "cpus": 0.5,
        "memory_mib": 64,
        "labels": {"team": "nlp"},
        "rental_id": "rent-42",
    }
    created = grid.wait_command(grid.command(agent_id, "create_container", spec), timeout=60)
    assert created["state"] == "succeeded", created
    inspected = podman.inspect("pod-job")
    assert inspected["HostConfig"]["NanoCpus"] == 500_000_000
    assert inspected["HostConfig"]["Memory"] == 64 * 1024 * 1024
    assert inspected["HostConfig"]["Privileged"] is False
    labels = inspected["Config"]["Labels"]
    assert labels["io.idlegrid.command-id"] == created["id"]
    assert labels["io.idlegrid.rental-id"] == "rent-42"
    assert labels["team"] == "nlp"
    assert inspected["State"]["Running"] is True

    deleted = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "pod-job"}), timeout=60)
    assert deleted["state"] == "succeeded", deleted
    assert podman.inspect("pod-job") is None


def test_an_agent_killed_during_a_command_goes_offline_comes_back_and_ran_it_once(grid, tmp_path):
    agent_id, daemon = start(grid, "crashy")
    runs = tmp_path / "runs.txt"
    spec = {"name": "once", "image": "none", "command": ["sh", "-c", f"echo run >> {runs}; sleep 120"]}
    command_id = grid.command(agent_id, "create_container", spec)
    wait_for(lambda: runs.exists(), 10, "the command to start running")
    daemon.kill()  # SIGKILL, maybe before the result reached the Master
    killed_at = time.monotonic()

    grid.wait_state(agent_id, "offline", timeout=3 * grid.heartbeat_s + 3)
    assert time.monotonic() - killed_at <= 3 * grid.heartbeat_s + 1.5  # 3 intervals, plus the sweep period and polling

    grid.start_agent("crashy", simulate="a10:2")
    wait_for(lambda: grid.agent(agent_id)["state"] in ("ready", "busy"), 20, "the agent to come back")
    result = grid.wait_command(command_id)
    assert result["state"] == "succeeded", result
    time.sleep(1)
    assert runs.read_text().count("run") == 1


def reconnect_through(grid, rogue, name, agent_id, daemon):
    """Kill the agent and start it again behind ``rogue``; returns once the Master registered its new hello."""
    before = grid.agent(agent_id)["connected_since"]
    daemon.kill()
    grid.start_agent(name, "--access", rogue.agent_url, simulate="a10:2")
    wait_for(
        lambda: (
            rogue.connections >= 1 and (agent := grid.agent(agent_id))["state"] == "ready" and agent["connected_since"] != before
        ),
        20,
        "the agent to reconnect through the rogue relay",
    )


def test_a_command_whose_signature_does_not_verify_is_refused_and_reported_failed(grid, tmp_path):
    agent_id, daemon = start(grid, "victim")
    with tampering_relay(grid, "victim") as rogue:
        reconnect_through(grid, rogue, "victim", agent_id, daemon)
        rogue.tamper_next_command()
        witness = tmp_path / "ran"
        spec = {"name": "honest", "image": "none", "command": ["sh", "-c", f"touch {witness}; sleep 5"]}
        command_id = grid.command(agent_id, "create_container", spec)
        result = grid.wait_command(command_id)
        # Every copy the agent was sent (the hello's resend, were there one) was received and answered...
        wait_for(lambda: rogue.acks.count(command_id) >= rogue.commands.count(command_id), 10, "every copy acked")
        time.sleep(1)  # ... and none of them runs, now or a moment later
    assert rogue.tampered == [command_id]
    assert result["state"] == "failed"
    assert "signature" in result["error"]
    assert not witness.exists()
    refusals = grid.get(f"/api/v1/events?subject={command_id}&kind=command.refused")["items"]
    assert refusals and "signature" in refusals[0]["data"]["reason"]


def test_an_intact_copy_of_a_command_whose_copy_was_refused_is_answered_with_the_refusal_not_run(grid, tmp_path):
    """The race behind a flake of the test above: the Master sends a command again after one copy of it was refused
    (a resend at the agent's next hello), and the rogue relay tampered only the first. The Master ends the command on
    the refusal, so the host must not run the intact copy: its answer is the refusal it kept."""
    agent_id, daemon = start(grid, "victim")
    with tampering_relay(grid, "victim") as rogue:
        reconnect_through(grid, rogue, "victim", agent_id, daemon)
        rogue.tamper_next_command(then_ask_hello=True)  # the refusal waits: the Master resends at the agent's hello
        witness = tmp_path / "ran"
        spec = {"name": "honest", "image": "none", "command": ["sh", "-c", f"touch {witness}; sleep 5"]}
        command_id = grid.command(agent_id, "create_container", spec)
        result = grid.wait_command(command_id)
        wait_for(lambda: rogue.acks.count(command_id) >= rogue.commands.count(command_id), 10, "every copy acked")
        time.sleep(1)
    assert rogue.tampered == [command_id]
    assert rogue.commands.count(command_id) == 2  # an intact copy reached the agent after the tampered one
    assert result["state"] == "failed" and "signature" in result["error"], result
    assert not witness.exists()

"""Issue 3, graceful shutdown: SIGTERM to any daemon drains it, and nothing it had accepted is lost."""

import contextlib
import json
import signal
import sqlite3
import time

import aiohttp
import pytest

from management.app import MasterServer
from master.config import MasterConfig
from tests.support.grid import QUICK_RECONNECT, Grid, counted_spec, pid_alive, run_pids, wait_for, write_toml


@pytest.fixture
def grid(tmp_path):
    """A Master and a relay that redials quickly and, when stopped, keeps redialling the Master for up to 20 s
    to hand over what it buffered."""
    g = Grid(tmp_path)
    try:
        g.start_master()
        relay_config = write_toml(tmp_path / "relay.toml", {**QUICK_RECONNECT, "drain_timeout_s": 20})
        g.start_relay("relay-1", "eu-west", extra=["--config", str(relay_config)])
        yield g
    finally:
        g.stop()


def create_slow_containers(grid: Grid, agent_id: str, runs, names: list[str]) -> None:
    """Containers that ignore SIGTERM: deleting one takes the delete's whole timeout_s."""
    for name in names:
        created = grid.wait_command(grid.command(agent_id, "create_container", counted_spec(runs, name, ignores_sigterm=True)))
        assert created["state"] == "succeeded", created


def delete_slowly(grid: Grid, agent_id: str, names: list[str], timeout_s: float) -> list[str]:
    """Issue the deletes and wait until the agent runs them (acked); their ids."""
    deletes = [grid.command(agent_id, "delete_container", {"name": name, "timeout_s": timeout_s}) for name in names]
    wait_for(
        lambda: all(grid.get(f"/api/v1/commands/{c}")["state"] == "acked" for c in deletes), 10, "the agent to take the deletes"
    )
    return deletes


def stored_agent(grid: Grid, agent_id: str) -> dict:
    with contextlib.closing(sqlite3.connect(grid.master_dir / "master.db")) as db:
        return json.loads(db.execute("SELECT doc FROM agents WHERE id = ?", (agent_id,)).fetchone()[0])


def test_a_master_stopped_with_sigterm_exits_cleanly_and_every_command_it_accepted_ends_after_restart(grid, tmp_path):
    runs = tmp_path / "runs"
    busy_id, _ = grid.run_agent("busy")
    calm_id, calm = grid.run_agent("calm")
    slow = ["slow-0", "slow-1"]
    create_slow_containers(grid, busy_id, runs, slow)
    time.sleep(2)  # heartbeats since the last write of the agents: only the Master's memory has them now

    creates = {f"job-{n}": (busy_id if n % 2 else calm_id) for n in range(6)}
    accepted = [grid.command(agent, "create_container", counted_spec(runs, name)) for name, agent in creates.items()]
    accepted += [grid.command(busy_id, "delete_container", {"name": name, "timeout_s": 2}) for name in slow]
    stopped_at = time.time()
    assert grid.master.terminate() == 0, grid.master.tail()
    assert grid.master.logged("master stopped")
    assert stored_agent(grid, calm_id)["last_seen"] > stopped_at - 2 * grid.heartbeat_s  # flushed on the way out

    grid.restart_master()
    results = {c: grid.wait_command(c, timeout=40) for c in accepted}
    assert {c: r["state"] for c, r in results.items()} == {c: "succeeded" for c in accepted}
    time.sleep(1)
    assert {name: len(run_pids(runs, name)) for name in creates} == {name: 1 for name in creates}
    assert not any(pid_alive(pid) for name in slow for pid in run_pids(runs, name))
    assert calm.alive()


async def test_a_stopping_master_answers_api_calls_with_503_and_retry_after(tmp_path):
    server = MasterServer(MasterConfig(state_dir=str(tmp_path), api_port=0, link_port=0))
    await server.start()
    try:
        auth = {"Authorization": f"Bearer {server.operator_token_file.read_text().strip()}"}
        async with aiohttp.ClientSession(server.api_url) as http:
            async with http.post("/api/v1/accounts", json={"id": "p", "role": "provider"}, headers=auth) as response:
                assert response.status == 201
            async with http.post("/api/v1/tokens", json={"provider": "p"}, headers=auth) as response:
                assert response.status == 201
            await server.gate.close(timeout_s=5)  # the first step of server.stop()
            async with http.post("/api/v1/tokens", json={"provider": "p"}, headers=auth) as response:
                assert response.status == 503
                assert response.headers["Retry-After"]
                assert (await response.json())["error"]["code"] == "shutting_down"
            async with http.get("/healthz") as response:
                assert response.status == 200
    finally:
        await server.stop()


def test_a_relay_stopped_with_sigterm_hands_its_buffer_to_the_master_before_it_exits(grid, tmp_path):
    runs = tmp_path / "runs"
    agent_id, agent = grid.run_agent("host")
    names = ["slow-0", "slow-1"]
    create_slow_containers(grid, agent_id, runs, names)
    deletes = delete_slowly(grid, agent_id, names, timeout_s=2)
    grid.master.kill(signal.SIGKILL)
    relay = grid.relays["relay-1"]
    wait_for(lambda: not any(pid_alive(pid) for name in names for pid in run_pids(runs, name)), 15, "the deletes to finish")
    wait_for(lambda: grid.relay_health(relay)["buffered"] >= len(deletes), 10, "their results in the relay's buffer")

    # SIGTERM while the Master is still down: the relay keeps redialling it to hand the buffer over.
    relay.daemon.process.send_signal(signal.SIGTERM)
    grid.restart_master()
    assert relay.daemon.process.wait(timeout=30) == 0, relay.daemon.tail()
    # Only the relay held these results (the agent has had no way to the Master since): they arrived.
    for command_id in deletes:
        assert grid.wait_command(command_id, timeout=10)["state"] == "succeeded"

    grid.start_relay("relay-1", "eu-west")
    wait_for(
        lambda: grid.agent(agent_id)["relay"] == "relay-1" and grid.agent(agent_id)["state"] == "ready",
        20,
        "the agent back through the new relay",
    )
    assert agent.alive()


def test_an_agent_stopped_with_sigterm_finishes_its_running_command_and_reports_it(grid, tmp_path):
    runs = tmp_path / "runs"
    agent_id, agent = grid.run_agent("host")
    create_slow_containers(grid, agent_id, runs, ["slow"])
    [delete] = delete_slowly(grid, agent_id, ["slow"], timeout_s=2)

    asked = time.monotonic()
    assert agent.terminate() == 0, agent.tail()
    assert time.monotonic() - asked >= 1  # it waited for the delete rather than abandoning it
    assert grid.wait_command(delete, timeout=5)["state"] == "succeeded"  # reported before it went
    assert not pid_alive(run_pids(runs, "slow")[0])

    grid.run_agent("host")
    assert grid.get(f"/api/v1/commands/{delete}")["state"] == "succeeded"
    assert len(run_pids(runs, "slow")) == 1

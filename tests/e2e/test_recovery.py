"""Issue 3, failover and recovery: a Master killed with SIGKILL comes back with its state, relays keep and
replay what agents said meanwhile (and tell them so), and every command still runs exactly once."""

import contextlib
import signal
import sqlite3
import time
from datetime import datetime

import pytest

from tests.support.grid import QUICK_RECONNECT, Grid, counted_spec, pid_alive, run_pids, wait_for, write_toml

FINAL = {"succeeded", "failed", "timed_out", "cancelled"}
DEGRADED = "relay reports the master unreachable"
RECOVERED = "relay reports the master reachable again"


@pytest.fixture
def grid(tmp_path):
    """A Master and a relay that redials it within a second, so a restarted Master is found at once."""
    g = Grid(tmp_path)
    try:
        g.start_master()
        relay_config = write_toml(tmp_path / "relay.toml", QUICK_RECONNECT)
        g.start_relay("relay-1", "eu-west", extra=["--config", str(relay_config)])
        yield g
    finally:
        g.stop()


def command_state(grid: Grid, command_id: str) -> str:
    return grid.get(f"/api/v1/commands/{command_id}")["state"]


def refusals(metrics: str, reason: str) -> float:
    """How many agent connections a relay refused for ``reason``, from its /metrics text."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("idlegrid_access_connections_refused_total{") and f'reason="{reason}"' in line
    )


def kill_master(grid: Grid) -> float:
    """SIGKILL the Master; the wall-clock time it died."""
    assert grid.master is not None
    grid.master.kill(signal.SIGKILL)
    return time.time()


def test_results_produced_while_the_master_is_down_wait_on_the_relay_and_reach_it_after_restart(grid, tmp_path):
    # The agent resends unacknowledged results only every 120 s: within this test only the relay's copy can arrive.
    agent_id, agent = grid.run_agent("patient", result_resend_s=120)
    latecomer_id, latecomer = grid.run_agent("latecomer")
    latecomer.kill(signal.SIGKILL)
    runs = tmp_path / "runs"
    names = [f"slow-{n}" for n in range(3)]
    for name in names:
        created = grid.wait_command(grid.command(agent_id, "create_container", counted_spec(runs, name, ignores_sigterm=True)))
        assert created["state"] == "succeeded", created
    # Each delete takes its whole timeout (the container ignores SIGTERM): its result comes while the Master is dead.
    deletes = [grid.command(agent_id, "delete_container", {"name": name, "timeout_s": 3}) for name in names]
    wait_for(lambda: all(command_state(grid, c) == "acked" for c in deletes), 10, "the agent to take the deletes")
    kill_master(grid)

    relay = grid.relays["relay-1"]
    wait_for(lambda: agent.logged(DEGRADED), 10, f"the relay to tell the agent\n{agent.tail()}")
    wait_for(lambda: not any(pid_alive(pid) for name in names for pid in run_pids(runs, name)), 15, "the deletes to finish")
    health = wait_for(lambda: (h := grid.relay_health(relay))["buffered"] >= len(deletes) and h, 10, "results in the buffer")
    assert health["master_link"] == "down"
    # An agent that connects while the Master is away is told so at once.
    latecomer = grid.start_agent("latecomer", "--config", str(grid.root / "config" / "latecomer.toml"), simulate="a10:2")
    wait_for(lambda: latecomer.logged(DEGRADED), 15, f"the relay to tell the latecomer\n{latecomer.tail()}")

    grid.restart_master()
    for command_id in deletes:
        result = grid.wait_command(command_id, timeout=20)
        assert result["state"] == "succeeded", result
    wait_for(lambda: agent.logged(RECOVERED), 10, f"the relay to tell the agent it is over\n{agent.tail()}")
    assert agent.alive()  # nothing was done to the agent: it never even reconnected
    grid.wait_state(agent_id, "ready")  # its next heartbeat says no container runs any more
    assert [len(run_pids(runs, name)) for name in names] == [1, 1, 1]
    grid.wait_state(latecomer_id, "ready")


def test_sigkill_of_the_master_with_commands_in_flight_every_command_ends_once_with_no_manual_step(grid, tmp_path):
    """Acceptance 3: after the restart every command reaches a final state and none ran twice."""
    runs = tmp_path / "runs"
    busy_id, busy = grid.run_agent("busy")
    calm_id, calm = grid.run_agent("calm")
    away_id, away = grid.run_agent("away")
    slow = [f"slow-{n}" for n in range(2)]
    for name in slow:
        assert (
            grid.wait_command(grid.command(busy_id, "create_container", counted_spec(runs, name, ignores_sigterm=True)))["state"]
            == "succeeded"
        )
    # An agent away when the commands are issued: they stay pending across the Master's restart.
    away.kill(signal.SIGKILL)
    wait_for(lambda: grid.relay_health(grid.relays["relay-1"])["agents"] == 2, 10, "the relay to see it go")

    creates = {f"job-{agent[:12]}-{n}": agent for agent in (busy_id, calm_id, away_id) for n in range(3)}
    issued = [grid.command(agent, "create_container", counted_spec(runs, name)) for name, agent in creates.items()]
    issued += [grid.command(busy_id, "delete_container", {"name": name, "timeout_s": 2}) for name in slow]
    died_at = kill_master(grid)
    in_flight = {c: command_state_in_store(grid, c) for c in issued}
    # Down long enough that every heartbeat the store holds is older than the heartbeat timeout (3 s) and the
    # deletes finish meanwhile: their results wait on the relay.
    time.sleep(4)

    grid.restart_master()
    restarted_at = time.time()
    grid.run_agent("away")
    results = {c: grid.wait_command(c, timeout=40) for c in issued}
    assert {c: r["state"] for c, r in results.items()} == {c: "succeeded" for c in issued}, in_flight

    time.sleep(1.5)  # a command run twice would have written its second line by now
    assert {name: len(run_pids(runs, name)) for name in creates} == {name: 1 for name in creates}
    assert all(pid_alive(run_pids(runs, name)[0]) for name in creates)
    assert not any(pid_alive(pid) for name in slow for pid in run_pids(runs, name))
    # The agents that stayed up came back on their own, and the restarted Master did not take them for dead.
    assert busy.alive() and calm.alive()
    # Each is busy once a heartbeat naming its new containers reached the Master: up to a heartbeat (1 s here) plus
    # the relay's fold interval (1 s) after the container started, later on a loaded machine.
    for agent_id in (busy_id, calm_id, away_id):
        grid.wait_state(agent_id, "busy")
    for agent_id in (busy_id, calm_id):
        lost = [
            e
            for e in grid.get(f"/api/v1/events?subject={agent_id}&kind=agent.transition&limit=1000")["items"]
            if e["data"]["event"] == "heartbeat_lost" and datetime.fromisoformat(e["ts"]).timestamp() > died_at
        ]
        assert not lost, (lost, restarted_at)


def command_state_in_store(grid: Grid, command_id: str) -> str:
    """The state a command had when the Master died, read from its SQLite file (the Master is down)."""
    with contextlib.closing(sqlite3.connect(grid.master_dir / "master.db")) as db:
        row = db.execute("SELECT state FROM commands WHERE id = ?", (command_id,)).fetchone()
    return row[0] if row else "missing"


def test_a_restarted_master_keeps_tokens_revocations_and_brings_offline_agents_back_ready(grid, tmp_path):
    relay = grid.relays["relay-1"]
    token = grid.join_token()
    revoked_id, revoked = grid.run_agent("revoked")
    assert grid.call("POST", f"/api/v1/agents/{revoked_id}/revoke")[0] == 200
    revoked.kill(signal.SIGKILL)
    lost_id, lost = grid.run_agent("lost")
    lost.kill(signal.SIGKILL)
    grid.wait_state(lost_id, "offline")
    kill_master(grid)

    grid.restart_master()
    # A relay forgets revocations with its process: a fresh one can only learn them from the recovered Master.
    relay.daemon.kill(signal.SIGKILL)
    grid.start_relay("relay-1", "eu-west")
    grid.start_agent("revoked", simulate="a10:2")
    wait_for(lambda: refusals(grid.relay_metrics(relay), "revoked"), 15, "the relay to refuse the revoked certificate")
    assert grid.agent(revoked_id)["state"] == "retired"

    assert grid.enroll("newcomer", relay, token=token).returncode == 0  # the token made before the crash
    grid.start_agent("newcomer", simulate="a10:2")
    grid.wait_state(grid.agent_id("newcomer"), "ready")
    grid.run_agent("lost")
    assert grid.agent(lost_id)["state"] == "ready"

"""A shared host's tunnel slots on a real local grid (issue 22 D10): a Master, a relay and an agent, each its own
process, renters using the CLI as processes. 16 idle follow-logs tunnels of one renter once locked its co-tenants out
of logs, exec and the console's terminal. Now a workload and an account each hold at most their share of the host's
slots (the one refused is told which limit), and a tunnel that carries nothing for the idle timeout is closed.

The host runs the process runtime sandboxed as ``nobody``; its GPUs are simulated (none exists here).
"""

from __future__ import annotations

import select
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_renter_access import CLI, cli
from tests.e2e.test_scheduler import MASTER_SETTINGS, SANDBOXED, renter, wait_workload, workload
from tests.support.grid import Grid, running_grid

IDLE_S = 3.0  # the host's tunnel_idle_timeout_s here
LINE_S = 20.0  # how long a follow-logs process may take to print its first line


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS) as g:
        yield g


def first_line(process: subprocess.Popen[str]) -> str:
    """The first line ``process`` prints, within LINE_S (a bounded wait, not a timing assertion)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], LINE_S)
    assert ready, f"no output within {LINE_S:g} s"
    return process.stdout.readline()


def test_one_renter_cannot_take_every_tunnel_slot_and_idle_tunnels_are_closed(grid):
    agent_id, _ = grid.run_agent(
        "shared",
        simulate="a10:3",
        env=SANDBOXED,
        max_tunnels=4,
        max_tunnels_per_account=3,
        max_tunnels_per_workload=2,
        tunnel_idle_timeout_s=IDLE_S,
    )
    alice, bob = renter(grid, "alice"), renter(grid, "bob")
    chatty = "while true; do echo tick; sleep 0.5; done"  # follow-logs on it is never idle
    alice_one = alice.submit_workload(workload("one", chatty))["id"]
    alice_two = alice.submit_workload(workload("two", chatty))["id"]
    bobs = bob.submit_workload(workload("quiet", "echo started; exec sleep 600"))["id"]
    for client, workload_id in ((alice, alice_one), (alice, alice_two), (bob, bobs)):
        running = wait_workload(client, workload_id, "running", lambda w: w["state"] == "running", timeout=30)
        assert running["assignments"][0]["agent_id"] == agent_id  # one shared host

    held: list[subprocess.Popen[str]] = []

    def follow(workload_id: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*CLI, "workload", "logs", workload_id, "--follow", "--tail", "0", "--api", grid.api_url, "--api-key", alice.api_key],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        held.append(process)
        assert first_line(process) == "tick\n"  # served: it holds one of the host's slots
        return process

    try:
        follow(alice_one)
        follow(alice_one)
        refused = cli(grid, alice.api_key, "workload", "logs", alice_one, "--follow")
        assert refused.returncode != 0
        assert f"workload {alice_one} has 2 tunnels open on this host, the most one workload may" in refused.stderr
        follow(alice_two)
        refused = cli(grid, alice.api_key, "workload", "logs", alice_two, "--follow")
        assert refused.returncode != 0
        assert "account alice has 3 tunnels open on this host, the most one account may" in refused.stderr

        # The co-tenant still gets in: a command in its container, and its logs.
        done = cli(grid, bob.api_key, "workload", "exec", bobs, "--no-tty", "--", "sh", "-c", "echo bob-is-in")
        assert (done.returncode, done.stdout) == (0, "bob-is-in\n"), done.stderr
        # Bob's follow-logs on a quiet container carries nothing: after the idle timeout it is closed, saying why.
        idle = cli(grid, bob.api_key, "workload", "logs", bobs, "--follow", "--tail", "0", timeout=IDLE_S + 30)
        assert idle.returncode != 0
        assert f"idle for {IDLE_S:g} s" in idle.stderr, idle.stderr
        assert all(process.poll() is None for process in held)  # alice's busy tunnels go on
    finally:
        for process in held:
            process.terminate()
            process.communicate(timeout=10)

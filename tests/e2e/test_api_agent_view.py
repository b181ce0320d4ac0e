"""The agent view as an operator sees it on a real grid (Master, relay and agent as processes): reachability."""

from __future__ import annotations

import signal

import pytest

from tests.support.grid import wait_for

pytestmark = pytest.mark.e2e


def test_an_agent_connected_through_a_relay_is_shown_reachable_and_stops_being_so_when_it_goes(grid):
    agent_id, daemon = grid.run_agent("reach")
    shown = grid.agent(agent_id)
    assert (shown["reachable"], shown["relay"]) == (True, "relay-1")
    assert {"runtime", "isolation"} <= shown.keys()
    daemon.kill(signal.SIGKILL)
    wait_for(lambda: grid.agent(agent_id)["reachable"] is False, 20, f"{agent_id} to be shown unreachable")

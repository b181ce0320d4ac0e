"""A fault injected into a simulated GPU of a running agent process turns the GPU faulty in the API within seconds;
overheating clears by itself once the card cools, an Xid waits for the operator's repair. Real processes: Master,
relay, agent (tests/support/grid.py)."""

from __future__ import annotations

import json

from agent.fault_injection import FAULTS_FILE
from tests.support.grid import Grid, wait_for

FAST_TELEMETRY = {
    "IDLEGRID_MASTER_TELEMETRY_S": "0.5",
    "IDLEGRID_MASTER_OVERHEAT_SAMPLES": "2",
    "IDLEGRID_MASTER_COOL_SAMPLES": "2",
}


def gpu_of(grid: Grid, agent_id: str, uuid: str) -> dict:
    return next(g for g in grid.agent(agent_id)["gpus"] if g["uuid"] == uuid)


def test_injected_faults_turn_gpus_faulty_in_the_api_and_back(tmp_path):
    grid = Grid(tmp_path)
    try:
        grid.start_master(env=FAST_TELEMETRY)
        grid.start_relay("relay-1", "eu-west")
        agent_id, daemon = grid.run_agent("faulty-host", simulate="a10:2")
        hot, broken = [g["uuid"] for g in grid.agent(agent_id)["gpus"]]
        faults = grid.agent_dir("faulty-host") / FAULTS_FILE
        faults.write_text(json.dumps({hot: {"temperature_c": 97}, broken: {"xid": 79}}))

        for uuid, kind in ((hot, "overheat"), (broken, "xid")):
            gpu = wait_for(
                lambda u=uuid: (g := gpu_of(grid, agent_id, u))["state"] == "faulty" and g, 10, f"{uuid} faulty\n{daemon.tail()}"
            )
            assert gpu["fault"]["kind"] == kind and gpu["offered"] is False

        faults.write_text("{}")  # the card cools down; the Xid stays until the operator repairs it
        wait_for(lambda: gpu_of(grid, agent_id, hot)["state"] == "available", 10, f"{hot} to cool down")
        assert gpu_of(grid, agent_id, broken)["state"] == "faulty"
        repaired = grid.client.repair_gpu(broken)
        assert repaired["state"] == "available" and repaired["fault"] is None
    finally:
        grid.stop()

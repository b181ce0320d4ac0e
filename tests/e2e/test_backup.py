"""Acceptance 5 with processes: the Master's machine is lost; a backup taken while it ran (agents connected, their
heartbeats and telemetry written) is restored into a new state directory, a Master started there, and the relay
and agent that were running all along reconnect to it by themselves: the restored CA and Master certificate are
the ones they trust. GPUs are simulated (no GPU here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.grid import QUICK_RECONNECT, Grid, wait_for, write_toml


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    g = Grid(tmp_path / "grid")
    try:
        g.start_master()
        g.start_relay("relay-1", "eu-west", extra=["--config", str(write_toml(tmp_path / "relay.toml", QUICK_RECONNECT))])
        yield g
    finally:
        g.stop()


def idlegrid(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "management.cli", *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


def fleet(grid: Grid) -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    agents = sorted((a["id"], a["provider"]) for a in grid.get("/api/v1/agents")["items"])
    gpus = sorted((g["uuid"], g["agent_id"], g["model"]) for g in grid.get("/api/v1/gpus")["items"])
    return agents, gpus


def test_a_master_restored_from_a_live_backup_gets_its_agents_back(grid: Grid, tmp_path: Path) -> None:
    first, _ = grid.run_agent("a1", simulate="h100:2")
    second, _ = grid.run_agent("a2", simulate="a10:1")
    before = fleet(grid)
    archive = tmp_path / "master-backup.tar.gz"

    made = idlegrid("master", "backup", "--state-dir", grid.master_dir, "--out", archive)
    assert made.returncode == 0, made.stderr

    # Not over the Master that runs there, even forced: its store is open in its process.
    refused = idlegrid("master", "restore", "--from", archive, "--state-dir", grid.master_dir, "--force")
    assert refused.returncode == 2 and "a Master is running on" in refused.stderr, refused.stderr

    # The Master's machine is lost: its process and its state directory.
    assert grid.master is not None
    grid.master.terminate()
    shutil.move(grid.master_dir, tmp_path / "lost")
    restored = idlegrid("master", "restore", "--from", archive, "--state-dir", grid.master_dir)
    assert restored.returncode == 0, restored.stderr
    grid.restart_master()

    assert fleet(grid) == before
    # Same CA and signing keys: the relay's link is accepted, and a command signed by the restored Master reaches
    # each agent and is answered (the store says "ready" from the backup alone; only an answer proves they are back).
    for agent_id in (first, second):
        done = grid.wait_command(grid.command(agent_id, "delete_container", {"name": "none-such"}), timeout=30)
        assert done["state"] in ("succeeded", "failed") and done.get("result") is not None, done
        wait_for(lambda a=agent_id: grid.agent(a)["state"] == "ready", 10, f"{agent_id} ready on the restored Master")
    assert (grid.master_dir / "pki/ca.crt").read_bytes() == (tmp_path / "lost/pki/ca.crt").read_bytes()

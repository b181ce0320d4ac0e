"""A create command's secret values at rest, with processes (docs/storage.md, "Sealed at rest"): created while its host
is away, the command waits in the Master's store with its env values sealed; when the agent comes back, the Master
opens them and resends it, and the container gets the value in its environment. No byte of the value is in the
Master's state directory, and the API shows it hidden. The agent's process runtime keeps the running container's spec
(its env included) in a private file of its own state directory, as a container engine keeps a container's config;
it is gone with the container."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.support.grid import Grid, wait_for

TOKEN = "hf_e2e_sealed_4d1c9a77"


def holds_token(directory: Path) -> list[str]:
    """The files under ``directory`` that hold the token in clear."""
    return [str(p) for p in directory.rglob("*") if p.is_file() and not p.is_symlink() and TOKEN.encode() in p.read_bytes()]


def test_a_create_resent_to_a_returning_agent_carries_its_env_value_which_no_state_directory_holds(
    grid: Grid, tmp_path: Path
) -> None:
    assert grid.enroll("away-host", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("away-host")
    daemon = grid.start_agent("away-host", simulate="a10:1")
    grid.wait_state(agent_id, "ready")
    daemon.terminate()
    grid.wait_state(agent_id, "offline", timeout=3 * grid.heartbeat_s + 5)

    marker = tmp_path / "token.txt"
    spec = {"name": "sealed-job", "image": "none", "command": ["sh", "-c", f'printf %s "$TOKEN" > {marker}; sleep 60']}
    command_id = grid.command(agent_id, "create_container", {**spec, "env": {"TOKEN": TOKEN}})
    assert grid.get(f"/api/v1/commands/{command_id}")["state"] == "pending"  # its host is away: stored, not sent
    assert holds_token(grid.master_dir) == []

    grid.start_agent("away-host", simulate="a10:1")  # back: the Master resends what it had not delivered
    assert grid.wait_command(command_id)["state"] == "succeeded"
    assert wait_for(lambda: marker.exists() and marker.read_text(), 10, "the container to write its env") == TOKEN

    shown = grid.get(f"/api/v1/commands/{command_id}")
    assert shown["spec"]["env"] == {"TOKEN": "<hidden>"} and TOKEN not in str(grid.get("/api/v1/commands"))
    assert holds_token(grid.master_dir) == []
    agent_dir = grid.agent_dir("away-host")
    for held in map(Path, holds_token(agent_dir)):  # only the agent's user may read it, while the container lives
        assert stat.S_IMODE(held.stat().st_mode) == 0o600
        assert all(stat.S_IMODE(d.stat().st_mode) & 0o077 == 0 for d in held.parents if agent_dir in (d, *d.parents))

    assert grid.wait_command(grid.command(agent_id, "delete_container", {"name": "sealed-job"}))["state"] == "succeeded"
    assert holds_token(agent_dir) == [] and holds_token(grid.master_dir) == []

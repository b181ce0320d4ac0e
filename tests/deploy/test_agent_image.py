"""The agent's image (deploy/agent/Containerfile), built with Podman from the locally built Debian base, installed on
a "provider's host" by deploy/agent/install.sh: it enrolls against a real grid (a Master and a relay from the test
launcher), runs as an unprivileged user with its state in a volume, and the Master lists its GPUs.

What cannot exist here: a GPU (the agent simulates two H100s, and reports them as simulated) and an engine socket
inside the test's container (the installer's ``--socket none``: the agent says it has no engine and offers nothing
to run, but still enrolls and reports its GPUs). The container shares the host's network to reach the grid on
127.0.0.1, as the installer runs it on a provider's host."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.images import AGENT_IMAGE, AGENT_UID, ImagePodman, container_and_volume, install
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path / "grid") as g:
        yield g


@pytest.fixture
def installed(engine: ImagePodman) -> Iterator[tuple[str, str]]:
    with container_and_volume(engine, "idlegrid-agent-test") as names:
        yield names


def test_the_image_runs_as_an_unprivileged_user_by_default(engine: ImagePodman) -> None:
    config = json.loads(engine.run("image", "inspect", AGENT_IMAGE).stdout)[0]["Config"]
    assert config["User"] == f"{AGENT_UID}:{AGENT_UID}"
    assert config["Entrypoint"] == ["idlegrid", "agent"]
    assert "/var/lib/idlegrid" in config["Volumes"]
    # With no --user at all, the process inside is not root, and owns the state volume's mount point.
    ran = engine.run(
        "run", "--rm", "--network", "none", "--entrypoint", "sh", AGENT_IMAGE, "-c", "id -u; stat -c %u /var/lib/idlegrid"
    )
    assert ran.stdout.split() == [AGENT_UID, AGENT_UID]


def test_installer_enrolls_the_host_and_the_master_lists_its_gpus(
    engine: ImagePodman, grid: Grid, installed: tuple[str, str], tmp_path: Path
) -> None:
    name, volume = installed
    relay = grid.relays["relay-1"]
    ca_file = tmp_path / "ca.crt"  # what the operator hands the provider
    ca_file.write_bytes(grid.ca_file.read_bytes())

    done = install(
        engine,
        "--token", grid.join_token(TEST_PROVIDER),
        "--access", relay.http_url,
        "--ca-file", str(ca_file),
        "--socket", "none",
        "--no-gpus",
        "--name", name,
        "--volume", volume,
        "--", "--simulate", "h100:2", "--no-bandwidth",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    enrolled = re.search(r"enrolled as (agt-[0-9a-f]+)", done.stderr)
    assert enrolled, done.stderr
    agent_id = enrolled.group(1)

    try:
        agent = wait_for(lambda: (a := grid.agent(agent_id)).get("gpus") and a, 60, f"the Master to list {agent_id}'s GPUs")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe agent's log:\n{engine.run('logs', name, check=False).stderr[-3000:]}") from None
    assert agent["provider"] == TEST_PROVIDER
    assert [(gpu["model"], gpu["simulated"]) for gpu in agent["gpus"]] == [("h100-sxm", True)] * 2, agent["gpus"]

    # It runs as the image's unprivileged user, and its key and certificate are in the volume, not the container.
    assert engine.run("exec", name, "id", "-u").stdout.strip() == AGENT_UID
    state = engine.run("exec", name, "ls", "/var/lib/idlegrid/agent").stdout.split()
    assert {"agent.key", "agent.crt", "ca.crt", "identity.json"} <= set(state), state
    mounts = json.loads(engine.run("container", "inspect", name).stdout)[0]["Mounts"]
    assert [(m["Type"], m["Name"], m["Destination"]) for m in mounts] == [("volume", volume, "/var/lib/idlegrid")]

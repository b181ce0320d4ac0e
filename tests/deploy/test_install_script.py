"""deploy/agent/install.sh refuses what it cannot do with a message naming the option, before it touches an engine.
(What it does when the options are right: tests/deploy/test_agent_image.py.)"""

from __future__ import annotations

import subprocess

import pytest

from tests.deploy.manifests import DEPLOY

INSTALL = DEPLOY / "agent" / "install.sh"


def install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(INSTALL), *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(
    "args,named",
    [
        (["--token", "igjt_x", "--ca-file", "/etc/hostname"], "--access"),
        (["--token", "igjt_x", "--access", "https://relay.example:7201"], "--ca-file"),
        (["--token", "igjt_x", "--access", "https://relay.example:7201", "--ca-file", "/nonexistent/ca.crt"], "--ca-file"),
        (["--engine", "rocket"], "--engine"),
        (["--frobnicate"], "--frobnicate"),
    ],
)
def test_bad_options_are_named(args: list[str], named: str) -> None:
    done = install(*args)
    assert done.returncode == 1
    assert named in done.stderr and done.stderr.startswith("install.sh: "), done.stderr


def test_help_lists_every_option() -> None:
    done = install("--help")
    assert done.returncode == 0
    script = INSTALL.read_text()
    parsed = {line.strip().split(")")[0] for line in script.splitlines() if line.strip().startswith("--") and ")" in line}
    assert parsed - {"--"} <= {word for word in done.stdout.split() if word.startswith("--")}, parsed


def test_a_checkouts_copy_needs_the_grid_for_the_host_way() -> None:
    """Only a copy served by a Master names the grid and the agent's package: the checkout's copy asks for --grid
    (or --image) before it touches anything."""
    done = install("--engine", "none")
    assert done.returncode == 1
    assert "--grid" in done.stderr and "--image" in done.stderr, done.stderr

"""The agent's package and the installer as the Master serves them (management/onboarding/): pure parts and the build,
with the real pip and setuptools of this Python (no index: nothing is fetched)."""

from __future__ import annotations

import asyncio
import zipfile
from pathlib import Path

import pytest

from management.onboarding import AgentPackage, PackageUnavailable, install_commands, served_script
from management.onboarding.script import installer_template

REPO = Path(__file__).resolve().parents[2]


def test_the_installer_is_filled_in_and_nothing_else_changes() -> None:
    template = installer_template(REPO)
    served = served_script(template, grid_url="https://grid.example/", access_url="https://relay.example:7201", wheel="w.whl")
    assert "served_grid=https://grid.example\n" in served and "served_access=https://relay.example:7201\n" in served
    assert "served_wheel=w.whl\n" in served
    assert len(served.splitlines()) == len(template.splitlines())
    odd = served_script(template, grid_url="https://g.example/$(reboot)", access_url="", wheel="w.whl")
    assert "served_grid='https://g.example/$(reboot)'\n" in odd  # quoted for sh: a URL is never run


def test_an_installer_without_its_blanks_is_refused_not_served_half_filled() -> None:
    with pytest.raises(PackageUnavailable, match="served_wheel"):
        served_script('served_grid=""\nserved_access=""\n', grid_url="https://g", access_url="", wheel="w.whl")


def test_the_ready_commands_carry_the_token_and_the_engine() -> None:
    commands = install_commands("https://grid.example", "igjt_abc")
    assert [c.engine for c in commands] == ["docker", "podman", "none"]
    assert commands[0].command == "curl -fsSL https://grid.example/install.sh | sudo sh -s -- --token igjt_abc --engine docker"


async def test_the_package_is_built_once_from_a_copy_of_the_source(tmp_path: Path) -> None:
    package = AgentPackage(tmp_path / "dist", source=REPO)
    first, again = await asyncio.gather(package.path(), package.path())
    assert first == again == tmp_path / "dist" / package.filename
    names = zipfile.ZipFile(first).namelist()
    assert "agent/daemon.py" in names and not any(n.startswith(("tests/", "bench/")) for n in names)


async def test_a_master_that_is_not_a_checkout_says_what_to_set(tmp_path: Path) -> None:
    package = AgentPackage(tmp_path / "dist", source=tmp_path)
    with pytest.raises(PackageUnavailable, match="agent_wheel"):
        await package.path()
    with pytest.raises(PackageUnavailable, match="agent_wheel"):  # the same answer again, no second build
        await package.path()

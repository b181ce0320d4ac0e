"""The systemd units (deploy/systemd/): ``systemd-analyze verify`` accepts each with no warning at all, and each
daemon's unit is hardened the way docs/run-a-grid.md says.

``verify`` fails a unit whose ExecStart names a program that is not there; the units name the install path
(/opt/idlegrid/bin/idlegrid), which this machine does not have, so the test verifies copies in which that one path
is this checkout's own ``idlegrid`` (and checks that nothing else differs)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.manifests import DEPLOY

UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
INSTALLED = "/opt/idlegrid/bin/idlegrid"
DAEMON_UNITS = ["idlegrid-master.service", "idlegrid-access.service", "idlegrid-agent.service"]


def verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: apt-get install systemd", pytrace=False)
    return subprocess.run(["systemd-analyze", "verify", *map(str, units)], capture_output=True, text=True, timeout=60)


def with_this_checkouts_program(units: list[Path], into: Path) -> list[Path]:
    here = str(Path(sys.executable).with_name("idlegrid"))
    assert Path(here).exists(), f"{here}: scripts/setup-env installs it"
    copies = []
    for unit in units:
        text = unit.read_text()
        copy = into / unit.name
        copy.write_text(text.replace(INSTALLED, here))
        assert copy.read_text().replace(here, INSTALLED) == text
        copies.append(copy)
    return copies


def service_section(unit: Path) -> dict[str, list[str]]:
    """The [Service] settings, each with every value it is given (systemd allows a key more than once)."""
    settings: dict[str, list[str]] = {}
    key = None
    section = None
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
            continue
        if section != "[Service]":
            continue
        if key is not None and raw.startswith((" ", "\t")):
            settings[key][-1] += " " + line  # a continued line
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key, []).append(value)
    return settings


def test_every_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    assert {u.name for u in UNITS} >= set(DAEMON_UNITS)
    done = verify(with_this_checkouts_program(UNITS, tmp_path))
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr


def test_verify_catches_a_misspelled_setting(tmp_path: Path) -> None:
    """What the test above relies on: a hardening setting systemd does not know is reported, not silently dropped."""
    [unit] = with_this_checkouts_program([DEPLOY / "systemd" / "idlegrid-master.service"], tmp_path)
    unit.write_text(unit.read_text().replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))
    done = verify([unit])
    assert "Unknown key" in done.stderr and "NoNewPrivilege" in done.stderr, done.stderr


@pytest.mark.parametrize("name", DAEMON_UNITS)
def test_each_daemon_is_hardened(name: str) -> None:
    settings = service_section(DEPLOY / "systemd" / name)
    one = {key: values[-1] for key, values in settings.items()}
    assert one["User"] == "idlegrid" and one["Group"] == "idlegrid"
    assert one["NoNewPrivileges"] == "yes"
    assert one["ProtectSystem"] == "strict"  # the whole file system read-only but for the state directory
    assert one["PrivateTmp"] == "yes"
    assert one["ProtectHome"] == "yes"
    assert one["CapabilityBoundingSet"] == ""
    assert one["ExecStart"].startswith(INSTALLED + " ")
    if name != "idlegrid-access.service":  # the relay keeps no state
        daemon = name.removeprefix("idlegrid-").removesuffix(".service")
        assert one["StateDirectory"] == f"idlegrid/{daemon}"
        assert f"--state-dir /var/lib/idlegrid/{daemon}" in one["ExecStart"]
        assert one["StateDirectoryMode"] == "0700"


def test_the_agent_is_not_restarted_when_its_certificate_was_revoked() -> None:
    from agent.errors import EXIT_CERTIFICATE_REVOKED

    for name in ("idlegrid-agent.service", "idlegrid-agent-container.service"):
        settings = service_section(DEPLOY / "systemd" / name)
        assert str(EXIT_CERTIFICATE_REVOKED) in settings["RestartPreventExitStatus"][-1].split(), name


def test_units_parse_as_ini() -> None:
    for unit in UNITS:
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.read_string(unit.read_text())
        assert {"Unit", "Service", "Install"} <= set(parser.sections()), unit.name


def test_the_installer_carries_the_container_unit_as_it_is_here() -> None:
    """``curl ... | sh`` has no checkout beside it: install.sh writes the unit from its own copy, kept equal."""
    script = (DEPLOY / "agent" / "install.sh").read_text()
    carried = script.split("cat <<'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0] + "\n"
    assert carried == (DEPLOY / "systemd" / "idlegrid-agent-container.service").read_text()

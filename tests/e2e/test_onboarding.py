"""Providers onboard from the grid itself (issue 23, acceptance 5): install.sh fetched from a running Master installs
the agent's package that Master serves into a fresh virtual environment, enrolls the host with a join token, and the
host shows ready in the API. The variant for a host with no container engine (the process runtime).

Real parts: the Master and a relay as processes, their HTTP, pip, venv and sh. No package index is reachable here, so
pip gets idlegrid's dependencies from a directory of wheels packed from what this Python has (tests/support/wheelhouse.py),
as a provider with an offline mirror passes ``--pip-args``; the agent's own package comes from the Master. The GPUs are
the agent's simulated ones (no GPU here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agent.identity import CERT_FILE, KEY_FILE
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for
from tests.support.wheelhouse import build_wheelhouse

pytestmark = pytest.mark.e2e

INSTALL_TIMEOUT_S = 240  # a venv, ~30 wheels and the agent's package on two slow cores


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def host_env() -> dict[str, str]:
    """The provider's shell: nothing of this checkout leaks into what install.sh installs and starts."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV", "IDLEGRID_"))}


def providers_agents(grid: Grid) -> list[dict]:
    return [a for a in grid.get("/api/v1/agents?limit=100")["items"] if a.get("provider") == TEST_PROVIDER]


def test_install_sh_from_the_master_installs_enrolls_and_the_host_is_ready(tmp_path: Path) -> None:
    with running_grid(tmp_path / "grid") as grid:
        status, body = fetch(f"{grid.api_url}/install.sh")
        assert status == 200, body
        script = body.decode()
        # Filled in by the Master: where it was reached, the relay to enroll through, the package to fetch.
        assert f"served_grid={grid.api_url}\n" in script
        assert f"served_access={grid.relays['relay-1'].http_url}\n" in script
        wheel = script.split("served_wheel=", 1)[1].split("\n", 1)[0]
        assert wheel.startswith("idlegrid-") and wheel.endswith("-py3-none-any.whl")
        assert fetch(f"{grid.api_url}/ca.crt")[1] == grid.ca_file.read_bytes()
        assert fetch(f"{grid.api_url}/dist/idlegrid-0.0.0-py3-none-any.whl")[0] == 404

        installer = tmp_path / "install.sh"
        installer.write_text(script)
        prefix, state = tmp_path / "opt-idlegrid", tmp_path / "agent-state"
        wheels = build_wheelhouse(tmp_path / "wheels")
        # As the docs write it (curl ... | sh -s -- --token T --engine none), with the offline wheels, a prefix and a
        # state directory of the test's own, and the agent kept in the foreground so the test can stop it.
        command = ["sh", str(installer), "--token", grid.join_token(), "--engine", "none"]
        command += ["--prefix", str(prefix), "--state-dir", str(state), "--python", sys.executable]
        command += ["--pip-args", f"--no-index --find-links {wheels}", "--foreground", "--", "--simulate", "a10:1"]
        command += ["--no-bandwidth"]
        log = tmp_path / "install.log"
        with open(log, "wb") as out:
            host = subprocess.Popen(
                command, env=host_env(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        try:
            agents = wait_for(
                lambda: [a for a in providers_agents(grid) if a["state"] == "ready"] or host.poll() is not None,
                INSTALL_TIMEOUT_S,
                "the installed host to be ready",
                interval=1.0,
            )
            assert isinstance(agents, list), f"install.sh ended ({host.returncode}):\n{log.read_text()[-4000:]}"
            (agent,) = agents
            assert agent["runtime"] == "process", agent
            # The agent runs from the package the Master served, in the environment install.sh made.
            installed = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
            assert (installed / "agent" / "daemon.py").is_file() and (prefix / "bin" / "idlegrid").is_file()
            assert (state / CERT_FILE).is_file() and (state / KEY_FILE).stat().st_mode & 0o077 == 0
        finally:
            if host.poll() is None:
                os.killpg(host.pid, signal.SIGTERM)
                try:
                    host.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(host.pid, signal.SIGKILL)
                    host.wait()

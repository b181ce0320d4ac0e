"""Providers onboard from the grid itself (issue 23, acceptance 5): install.sh fetched from a running Master installs
the agent's package that Master serves into a fresh virtual environment, enrolls the host with a join token, and the
host shows ready in the API: the variant for a host with no container engine (the process runtime), and one for Podman.

Real parts: the Master and a relay as processes, their HTTP, pip, venv and sh. No package index is reachable here, so
pip gets idlegrid's dependencies from a directory of wheels packed from what this Python has (tests/support/wheelhouse.py),
as a provider with an offline mirror passes ``--pip-args``; the agent's own package comes from the Master. The GPUs are
the agent's simulated ones (no GPU here)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.identity import CERT_FILE, KEY_FILE
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for, write_toml
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


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheelhouse(tmp_path_factory.mktemp("wheels"))


def served_script(grid: Grid) -> str:
    status, body = fetch(f"{grid.api_url}/install.sh")
    assert status == 200, body
    return body.decode()


@contextlib.contextmanager
def installed_host(
    grid: Grid, tmp_path: Path, wheels: Path, engine: list[str], agent_args: list[str]
) -> Iterator[tuple[dict, Path, Path]]:
    """install.sh as the docs write it (curl ... | sh -s -- --token T --engine E), with the offline wheels, a prefix and a
    state directory of the test's own, and the agent kept in the foreground so the test can stop it: (the host as
    the API shows it once ready, the venv, the state directory)."""
    installer = tmp_path / "install.sh"
    installer.write_text(served_script(grid))
    prefix, state = tmp_path / "opt-idlegrid", tmp_path / "agent-state"
    command = ["sh", str(installer), "--token", grid.join_token(), *engine]
    command += ["--prefix", str(prefix), "--state-dir", str(state), "--python", sys.executable]
    command += ["--pip-args", f"--no-index --find-links {wheels}", "--foreground", "--", *agent_args]
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
        yield agent, prefix, state
    finally:
        if host.poll() is None:
            os.killpg(host.pid, signal.SIGTERM)
            try:
                host.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(host.pid, signal.SIGKILL)
                host.wait()


def test_the_master_serves_the_installer_filled_in_its_ca_and_its_package(tmp_path: Path) -> None:
    with running_grid(tmp_path / "grid") as grid:
        script = served_script(grid)
        # Filled in by the Master: where it was reached, the relay to enroll through, the package to fetch.
        assert f"served_grid={grid.api_url}\n" in script
        assert f"served_access={grid.relays['relay-1'].http_url}\n" in script
        wheel = script.split("served_wheel=", 1)[1].split("\n", 1)[0]
        assert wheel.startswith("idlegrid-") and wheel.endswith("-py3-none-any.whl")
        status, body = fetch(f"{grid.api_url}/dist/{wheel}")
        assert status == 200 and zipfile.ZipFile(io.BytesIO(body)).getinfo("agent/daemon.py").file_size > 0
        assert fetch(f"{grid.api_url}/ca.crt") == (200, grid.ca_file.read_bytes())
        status, body = fetch(f"{grid.api_url}/dist/idlegrid-0.0.0-py3-none-any.whl")
        assert status == 404 and wheel in json.loads(body)["error"]["message"]


def test_install_sh_from_the_master_installs_enrolls_and_the_host_is_ready(tmp_path: Path, wheels: Path) -> None:
    """The variant for a host with no container engine: the process runtime."""
    with running_grid(tmp_path / "grid") as grid:
        engine, agent_args = ["--engine", "none"], ["--simulate", "a10:1", "--no-bandwidth"]
        with installed_host(grid, tmp_path, wheels, engine, agent_args) as (agent, prefix, state):
            assert agent["runtime"] == "process", agent
            # The agent runs from the package the Master served, in the environment install.sh made.
            installed = prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
            assert (installed / "agent" / "daemon.py").is_file() and (prefix / "bin" / "idlegrid").is_file()
            assert (state / CERT_FILE).is_file() and (state / KEY_FILE).stat().st_mode & 0o077 == 0


@pytest.mark.podman
def test_install_sh_for_a_podman_host_runs_its_containers_through_podman(tmp_path: Path, wheels: Path, podman) -> None:
    """The Podman variant, on the real Podman Docker API (--socket: the test's own service); the GPU self-test runs in
    a Podman container before the host is offered (its image: the local busybox, by the agent's config file)."""
    config = write_toml(tmp_path / "agent.toml", {"gpu_selftest_image": podman.image})
    with running_grid(tmp_path / "grid") as grid:
        engine = ["--engine", "podman", "--socket", str(podman.socket_path)]
        agent_args = ["--simulate", "a10:1", "--no-bandwidth", "--config", str(config)]
        with installed_host(grid, tmp_path, wheels, engine, agent_args) as (agent, _, _):
            assert (agent["runtime"], agent["isolation"]) == ("docker", "container"), agent
            assert [r["reachable"] for r in agent["gpu_selftest"]] == [True], agent["gpu_selftest"]
            assert all(g["offered"] for g in agent["gpus"])

"""docs/localgrid.md's recipe for adding a container host to a local grid by hand is what the demo's code does (issue
37, acceptance 1): its shell lines that need no engine are run by bash as a reader pastes them and write the same
Podman configuration and the same image root filesystem as management/devgrid/podman_host.py; its image, service,
enroll and agent lines name the self-test image's changes, the service's socket, the demo container host's agent
settings and flags the command line takes. A setting renamed or a file changed in one place and not the other fails
here. Podman itself is not run (tests/e2e/test_demo.py runs the demo's container host)."""

from __future__ import annotations

import re
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest

from agent.config import load_agent_config
from management.cli.main import build_parser
from management.devgrid.demo import CONTAINER_HOST_ENV, CONTAINER_HOST_GPUS, CONTAINER_NETNS
from management.devgrid.podman_host import SELFTEST, SOCKET_NAME, busybox_rootfs_archive, write_podman_config
from tests.support.grid import REPO

HEADING = "### Adding a container host to a local grid by hand"
ENGINE_LINES = ("podman ", "idlegrid ", "IDLEGRID_")  # what needs Podman or a grid: read here, not run
ENV_ASSIGNMENT = re.compile(r"^([A-Z_]+)=(\S+)$")


def recipe() -> list[str]:
    """The recipe's shell lines, continuations joined, comments and blank lines left out."""
    after = (REPO / "docs" / "localgrid.md").read_text().split(HEADING, 1)[1]
    block = after.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line.split("   #", 1)[0].rstrip() for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def line_starting(prefix: str) -> list[str]:
    [line] = [line for line in recipe() if line.startswith(prefix)]
    return shlex.split(line)


def agent_line() -> tuple[dict[str, str], list[str]]:
    """The recipe's ``IDLEGRID_AGENT_...=... idlegrid agent ...`` line: its environment and its arguments."""
    [line] = [line for line in recipe() if line.startswith("IDLEGRID_")]
    words = shlex.split(line)
    env = {m.group(1): m.group(2) for w in words if (m := ENV_ASSIGNMENT.match(w))}
    return env, [w for w in words if not ENV_ASSIGNMENT.match(w)]


def test_the_recipe_is_found_with_its_engine_and_grid_lines():
    lines = recipe()
    assert any(line.startswith("podman import ") for line in lines), lines
    assert any(line.startswith("idlegrid agent enroll ") for line in lines), lines
    assert any(line.startswith("IDLEGRID_AGENT_") for line in lines), lines


def test_its_shell_lines_write_the_podman_configuration_and_the_image_rootfs_the_code_makes(tmp_path: Path) -> None:
    if not Path("/bin/busybox").exists():
        pytest.skip("busybox-static is not installed (scripts/setup-env installs it)")
    pasted = "set -e\n" + "\n".join(line for line in recipe() if not line.startswith(ENGINE_LINES))
    done = subprocess.run(["bash", "-c", pasted], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{pasted}\n{done.stdout}{done.stderr}"
    by_hand = tmp_path / ".idlegrid" / "podman-host"

    by_code = tmp_path / "code"
    env = write_podman_config(by_code, netns=CONTAINER_NETNS)
    for name in ("containers.conf", "storage.conf"):
        written = (by_hand / name).read_text().replace(str(by_hand), "DIR")
        assert written == (by_code / name).read_text().replace(str(by_code), "DIR"), name
    exported = next(line for line in recipe() if line.startswith("export "))
    assert all(f"{variable}=$H/{Path(path).name}" in exported for variable, path in env.items()), exported

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with tarfile.open(busybox_rootfs_archive(scratch)) as built, tarfile.open(by_hand / "rootfs.tar") as pasted_tar:
        members = {m.name: (m.type, m.linkname) for m in built.getmembers()}
        assert {m.name: (m.type, m.linkname) for m in pasted_tar.getmembers()} == members


def test_its_image_is_the_self_test_image_and_its_service_listens_where_the_agent_is_told(tmp_path: Path) -> None:
    words = line_starting("podman import ")
    changes = [words[i + 1] for i, word in enumerate(words) if word == "--change"]
    assert (changes, words[-1]) == (list(SELFTEST.changes), SELFTEST.reference)
    assert words[-2] == "$H/rootfs.tar"

    service = line_starting("podman system service ")
    assert service[:4] == ["podman", "system", "service", "--time=0"] and service[4] == f"unix://$H/{SOCKET_NAME}"
    _, agent = agent_line()
    assert agent[agent.index("--docker-socket") + 1] == f"$H/{SOCKET_NAME}"


def test_its_agent_has_the_demo_container_hosts_settings_and_the_command_line_takes_every_flag() -> None:
    env, words = agent_line()
    demos_own = {"IDLEGRID_AGENT_GPU_SELFTEST_TIMEOUT_S", "IDLEGRID_AGENT_GPU_SELFTEST_RETEST_S"}
    wanted = {k: v for k, v in CONTAINER_HOST_ENV.items() if k not in demos_own}
    assert env == wanted  # the timeout and retest pace fit the demo's deadline; a person's host keeps the defaults
    config = load_agent_config(env=env)
    assert (config.gpu_selftest_image, config.image_pull, config.docker_network) == (
        SELFTEST.reference, False, CONTAINER_NETNS
    )  # fmt: skip

    args = build_parser("agent").parse_args(words[1:])
    assert (args.runtime, args.simulate, args.no_bandwidth) == ("docker", CONTAINER_HOST_GPUS, True)

    enroll = line_starting("idlegrid agent enroll ")
    token = enroll.index("--token")
    enroll[token + 1] = "TOKEN"  # the $(idlegrid token create ...) a shell runs first
    parsed = build_parser("agent").parse_args(enroll[1:])
    assert (parsed.agent_command, parsed.token, parsed.ca_file) == ("enroll", "TOKEN", Path("CA_FILE"))

    [created] = re.findall(r"\$\((idlegrid token create [^)]*)\)", " ".join(recipe()))
    made = build_parser("token").parse_args(shlex.split(created)[1:])
    assert (made.command, made.token_command, made.provider) == ("token", "create", "PROVIDER")

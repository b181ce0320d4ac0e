"""The agent's SSH end without a grid (docs/ssh.md): per-workload host keys, which forwards ``ssh -L`` may open, what a
session runs, and that SFTP never falls back to the host's own filesystem. The whole path (OpenSSH's clients through a
relay, real Podman and process containers) is tests/e2e/test_ssh.py."""

from __future__ import annotations

import stat

import asyncssh
import pytest

from agent.runtime.simulated import SimulatedRuntime
from agent.ssh_host_keys import SEED_FILE, HostKeys
from agent.ssh_server import SHELL, ContainerFiles, ContainerTarget, forward_refusal, session_command


def test_a_workloads_host_key_is_the_same_every_time_and_differs_between_workloads_and_hosts(tmp_path):
    keys = HostKeys.at(tmp_path)
    assert stat.S_IMODE((tmp_path / SEED_FILE).stat().st_mode) == 0o600
    again = HostKeys.at(tmp_path)  # a restarted agent: the same seed, the same keys
    assert keys.public_line("wl-1") == again.public_line("wl-1") != keys.public_line("wl-2")
    other_host = tmp_path / "other"
    other_host.mkdir()
    assert HostKeys.at(other_host).public_line("wl-1") != keys.public_line("wl-1")
    loaded = asyncssh.import_private_key(keys.openssh_private("wl-1"))
    assert loaded.export_public_key("openssh").decode().split()[:2] == keys.public_line("wl-1").split()
    assert keys.public_line("wl-1").startswith("ssh-ed25519 ")


def test_a_seed_cut_short_is_replaced_rather_than_used(tmp_path):
    (tmp_path / SEED_FILE).write_bytes(b"short")
    HostKeys.at(tmp_path)
    assert len((tmp_path / SEED_FILE).read_bytes()) == 32


def target(*, any_port: bool, declared: tuple[int, ...] = (8888,)) -> ContainerTarget:
    return ContainerTarget(SimulatedRuntime(), "c-1", "wl-1", declared_ports=declared, any_port=any_port)


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "::1", "LOCALHOST"])
def test_a_forward_reaches_the_containers_own_ports(host):
    assert forward_refusal(target(any_port=False), host, 8888) is None
    assert forward_refusal(target(any_port=True), host, 5432) is None  # a network of its own: every port is the renter's


def test_a_forward_elsewhere_or_to_an_undeclared_port_where_the_network_is_shared_is_refused_naming_why():
    assert "only the container itself" in (forward_refusal(target(any_port=True), "10.0.0.1", 80) or "")
    assert "only the container itself" in (forward_refusal(target(any_port=True), "master.example", 443) or "")
    why = forward_refusal(target(any_port=False), "localhost", 5432)
    assert why is not None and "not a port workload wl-1 declared (declared: 8888)" in why
    assert "not a TCP port" in (forward_refusal(target(any_port=True), "localhost", 0) or "")


def test_a_session_runs_the_clients_command_through_sh_or_a_login_shell_with_its_terminal_type():
    assert session_command("echo hi", None) == ["/bin/sh", "-c", "echo hi"]
    assert session_command(None, None) == SHELL
    assert session_command("top", "xterm-256color") == ["/bin/sh", "-c", "export TERM=xterm-256color; top"]
    assert session_command("top", "x; rm -rf /")[2] == "top"  # a terminal type that is no name is not pasted in


def test_every_sftp_operation_that_would_touch_the_hosts_filesystem_is_the_containers():
    """asyncssh's SFTPServer serves the local filesystem by default: each of its operations must be overridden, or a
    renter's sftp would read the provider's host."""
    inherited = {n for n, v in vars(asyncssh.SFTPServer).items() if callable(v) and not n.startswith("__")}
    pure = {"_to_sftpname", "convert_attrs", "format_longname", "reverse_map_path"}  # no filesystem access
    assert inherited - pure - set(vars(ContainerFiles)) == set()

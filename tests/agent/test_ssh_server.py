"""The agent's SSH end without a grid (docs/ssh.md): per-workload host keys, which forwards ``ssh -L`` may open, what a
session runs, and that SFTP never falls back to the host's own filesystem. The whole path (OpenSSH's clients through a
relay, real Podman and process containers) is tests/e2e/test_ssh.py."""

from __future__ import annotations

import asyncio
import socket
import stat

import asyncssh
import pytest

from agent.runtime.simulated import SimulatedRuntime
from agent.ssh_files import ContainerFiles
from agent.ssh_host_keys import SEED_FILE, HostKeys
from agent.ssh_server import (
    MAX_CHANNELS,
    SHELL,
    ContainerTarget,
    forward_refusal,
    serve_ssh,
    session_command,
)
from common.containers import ContainerSpec


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


# --- one SSH connection in process: serve_ssh on a socket pair, asyncssh's client on the other end ---------------------


class Served:
    def __init__(self, tmp_path) -> None:
        self.keys = HostKeys.at(tmp_path)
        self.runtime = SimulatedRuntime()
        self.user_key = asyncssh.generate_private_key("ssh-ed25519")
        self.known = asyncssh.import_known_hosts(f"wl-1 {self.keys.public_line('wl-1')}\n")

    async def start(self, allowed: list[str]) -> tuple[asyncio.Task[None], socket.socket]:
        await self.runtime.create(ContainerSpec(name="c-1", image="none"), labels={})
        ours, theirs = socket.socketpair()
        container = ContainerTarget(self.runtime, "c-1", "wl-1", any_port=True)
        served = asyncio.ensure_future(serve_ssh(theirs, container, self.keys.openssh_private("wl-1"), allowed))
        return served, ours

    async def connect(self, sock: socket.socket, key: asyncssh.SSHKey | None = None) -> asyncssh.SSHClientConnection:
        return await asyncssh.connect(
            "wl-1", sock=sock, username="anyone", client_keys=[key or self.user_key], known_hosts=self.known, agent_path=None
        )


async def test_a_session_runs_in_the_container_with_the_registered_key_and_the_workloads_host_key(tmp_path):
    served = Served(tmp_path)
    task, sock = await served.start([served.user_key.get_fingerprint()])
    async with await served.connect(sock) as conn:
        done = await conn.run("anything", input="echoed by the simulated exec\n", encoding="utf-8")
        assert done.exit_status == 0 and done.stdout == "echoed by the simulated exec\n"
    await asyncio.wait_for(task, 10)


async def test_a_key_the_ticket_does_not_name_is_refused(tmp_path):
    served = Served(tmp_path)
    task, sock = await served.start([asyncssh.generate_private_key("ssh-ed25519").get_fingerprint()])
    with pytest.raises(asyncssh.PermissionDenied):
        await served.connect(sock)
    sock.close()
    await asyncio.wait_for(task, 10)


async def test_a_host_key_other_than_the_published_one_is_refused_by_the_client(tmp_path):
    served = Served(tmp_path)
    served.known = asyncssh.import_known_hosts(f"wl-1 {served.keys.public_line('wl-2')}\n")  # another workload's
    task, sock = await served.start([served.user_key.get_fingerprint()])
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await served.connect(sock)
    sock.close()
    await asyncio.wait_for(task, 10)


async def test_one_connection_holds_at_most_max_channels_sessions_at_once(tmp_path):
    served = Served(tmp_path)
    task, sock = await served.start([served.user_key.get_fingerprint()])
    async with await served.connect(sock) as conn:
        held = [await conn.create_process("sleep", encoding="utf-8") for _ in range(MAX_CHANNELS)]
        refused = await conn.run("one more", encoding="utf-8")
        assert refused.exit_status == 1 and isinstance(refused.stderr, str) and "the most one may" in refused.stderr
        held[0].stdin.write_eof()  # a simulated exec ends at the end of its input: a slot is free again
        assert (await held[0].wait()).exit_status == 0
        again = await conn.run("now", input="a slot again\n", encoding="utf-8")
        assert again.exit_status == 0 and again.stdout == "a slot again\n"
        for process in held[1:]:
            process.close()
    await asyncio.wait_for(task, 10)


async def test_on_a_terminal_the_clients_end_of_input_is_not_typed_into_the_command(tmp_path):
    """As sshd: a terminal's input cannot be closed, so ``ssh -tt host cmd </dev/null`` leaves ``cmd`` to run to its
    end (no EOF character typed into it, which also raced Podman into dropping the command's last output)."""
    served = Served(tmp_path)
    task, sock = await served.start([served.user_key.get_fingerprint()])
    async with await served.connect(sock) as conn:
        process = await conn.create_process("anything", term_type="xterm", encoding="utf-8")
        process.stdin.write("typed\n")
        process.stdin.write_eof()
        assert await asyncio.wait_for(process.stdout.readline(), 10) == "typed\n"  # the input before the end arrived
        with pytest.raises(TimeoutError):  # a simulated exec ends at end of input: it did not get one
            await asyncio.wait_for(asyncio.shield(process.wait()), 0.5)
        process.close()
        await asyncio.wait_for(process.wait_closed(), 10)
    await asyncio.wait_for(task, 10)

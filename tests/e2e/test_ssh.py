"""SSH to a workload whose image has no SSH server, on a real local grid (docs/ssh.md): a Master, a relay and an agent,
each its own process; Debian's OpenSSH client (``ssh``, ``scp``, ``sftp``) as a renter runs it, through
``idlegrid workload proxy`` as its ProxyCommand and the relay. The agent is the SSH server: a command, ``scp`` both
ways, ``sftp``, ``ssh -L`` to the container's HTTP server; another account's key is refused; the host key is checked
against the line ``idlegrid ssh-config`` printed (StrictHostKeyChecking=yes), and a wrong one fails the connection.

One host runs a real busybox container on a real Podman (the docker runtime, through Podman's Docker API); a faster
one runs the process runtime sandboxed. GPUs are simulated (none exists here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.test_renter_access import cli, web_server
from tests.e2e.test_scheduler import MASTER_SETTINGS, RenterClient, renter, sandboxed_hosts, wait_workload, workload
from tests.support.grid import Grid, free_port, running_grid, wait_for
from tests.support.podman import LOCAL_IMAGES_ALLOWED

SSH_TIMEOUT_S = 60


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS, egress_allow=LOCAL_IMAGES_ALLOWED) as g:
        yield g


def keypair(folder: Path, name: str) -> Path:
    """A fresh ed25519 key made by OpenSSH's ssh-keygen; its private file's path (the public one beside it, .pub)."""
    path = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@test", "-f", str(path)], check=True)
    return path


@dataclass
class SshWorld:
    """A running workload of alice's, her key registered, an ssh config and known_hosts from ``idlegrid ssh-config``."""

    grid: Grid
    alice: RenterClient
    workload_id: str
    port: int  # the container's HTTP server, a declared port
    folder: Path
    alice_key: Path
    config: Path
    known_hosts: Path

    def env(self, api_key: str | None = None) -> dict[str, str]:
        """The environment the ProxyCommand finds the API and the renter's API key in."""
        return {**os.environ, "IDLEGRID_API": self.grid.api_url, "IDLEGRID_API_KEY": api_key or self.alice.api_key}

    def run(self, tool: str, *args: str, key: Path | None = None, api_key: str | None = None) -> subprocess.CompletedProcess[str]:
        """``ssh``/``scp``/``sftp`` with the config ssh-config printed, a key, batch mode (no question asked)."""
        options = ["-F", str(self.config), "-i", str(key or self.alice_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"]
        return subprocess.run(
            [tool, *options, *args], capture_output=True, text=True, timeout=SSH_TIMEOUT_S, env=self.env(api_key)
        )


def ssh_world(grid: Grid, alice: RenterClient, workload_id: str, port: int, root: Path) -> SshWorld:
    folder = root / "renter"  # the renter's own files (tmp_path also holds the grid's)
    folder.mkdir()
    alice_key = keypair(folder, "alice")
    added = cli(grid, alice.api_key, "ssh-key", "add", f"{alice_key}.pub")
    assert added.returncode == 0 and "alice@test" in added.stdout, added.stderr
    proxy = f"{sys.executable} -m management.cli"
    printed = cli(grid, alice.api_key, "ssh-config", workload_id, "--proxy-command", proxy)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith(f"Host {workload_id}\n") and f"ProxyCommand {proxy} workload proxy %h" in printed.stdout
    known = cli(grid, alice.api_key, "ssh-config", workload_id, "--known-hosts")
    assert known.returncode == 0 and known.stdout.startswith(f"{workload_id} ssh-ed25519 "), known.stderr
    known_hosts = folder / "known_hosts"
    known_hosts.write_text(known.stdout)
    config = folder / "config"
    # The printed block, plus where this test keeps known_hosts (instead of ~/.ssh/known_hosts).
    config.write_text(printed.stdout + f"    UserKnownHostsFile {known_hosts}\n")
    return SshWorld(grid, alice, workload_id, port, folder, alice_key, config, known_hosts)


def check_ssh_reaches_the_container(world: SshWorld, place: str) -> None:
    """Acceptance 1 of issue 27, on whatever runtime ``world``'s host runs: a command, scp both ways, sftp, -L; in
    ``place``, a directory of the container its user may write."""
    wl = world.workload_id
    done = world.run("ssh", wl, "echo hello-over-ssh; echo to-err >&2; exit 3")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "hello-over-ssh\n" and "to-err" in done.stderr

    terminal = world.run("ssh", "-tt", wl, "tty; stty size; echo TERM=$TERM")  # -tt: a terminal though ours is none
    assert terminal.returncode == 0, terminal.stderr
    assert "/dev/pts/" in terminal.stdout and "24 80" in terminal.stdout, terminal.stdout

    payload = os.urandom(3 * 1024 * 1024 + 17)  # several SFTP reads and writes, the last one short
    (world.folder / "up.bin").write_bytes(payload)
    up = world.run("scp", str(world.folder / "up.bin"), f"{wl}:{place}/up.bin")
    assert up.returncode == 0, up.stderr
    sums = world.run("ssh", wl, f"wc -c < {place}/up.bin")
    assert sums.stdout.strip() == str(len(payload)), sums.stderr
    down = world.run("scp", f"{wl}:{place}/up.bin", str(world.folder / "down.bin"))
    assert down.returncode == 0, down.stderr
    assert (world.folder / "down.bin").read_bytes() == payload

    batch = world.folder / "sftp-batch"
    (world.folder / "note.txt").write_text("written with sftp\n")
    batch.write_text(
        f"mkdir {place}/d\ncd {place}/d\nput {world.folder / 'note.txt'} note.txt\nls\n"
        f"get note.txt {world.folder / 'note-back.txt'}\nrename note.txt renamed.txt\nls\n"
    )
    sftp = world.run("sftp", "-b", str(batch), wl)
    assert sftp.returncode == 0, sftp.stdout + sftp.stderr
    assert (world.folder / "note-back.txt").read_text() == "written with sftp\n"
    assert "renamed.txt" in sftp.stdout
    seen = world.run("ssh", wl, f"cat {place}/d/renamed.txt")
    assert seen.stdout == "written with sftp\n", seen.stderr

    local = free_port()
    forward = subprocess.Popen(
        [
            "ssh",
            "-F",
            str(world.config),
            "-i",
            str(world.alice_key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-N",
            "-L",
            f"127.0.0.1:{local}:localhost:{world.port}",
            wl,
        ],
        env=world.env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def fetch() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.txt", timeout=10) as answer:
                return answer.read().decode()

        assert wait_for(fetch, 30, "the container's HTTP server through ssh -L") == "hello-from-the-container\n"
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def check_refusals(world: SshWorld) -> None:
    """Another account's key does not log in, even through alice's own tunnel; a host key other than the published one
    fails the connection before any login."""
    wl = world.workload_id
    bob = renter(world.grid, "bob")
    bob_key = keypair(world.folder, "bob")
    assert cli(world.grid, bob.api_key, "ssh-key", "add", f"{bob_key}.pub").returncode == 0
    refused = world.run("ssh", wl, "true", key=bob_key)
    assert refused.returncode == 255 and "Permission denied (publickey)" in refused.stderr, refused.stderr
    # bob's own API key cannot even open the tunnel to alice's workload: it is not his (404, as if absent)
    theirs = world.run("ssh", wl, "true", key=bob_key, api_key=bob.api_key)
    assert theirs.returncode == 255 and f"no workload {wl!r}" in theirs.stderr, theirs.stderr

    genuine = world.known_hosts.read_text()
    impostor = keypair(world.folder, "impostor").with_suffix(".pub").read_text().split()
    world.known_hosts.write_text(f"{wl} {impostor[0]} {impostor[1]}\n")
    try:
        spoofed = world.run("ssh", wl, "true")
        assert spoofed.returncode == 255 and "Host key verification failed" in spoofed.stderr, spoofed.stderr
    finally:
        world.known_hosts.write_text(genuine)
    assert world.run("ssh", wl, "true").returncode == 0


def test_openssh_reaches_a_sandboxed_process_workload_through_the_relay(grid, drop, tmp_path):
    (drop / "index.txt").write_text("hello-from-the-container\n")
    sandboxed_hosts(grid, 1)
    alice = renter(grid, "alice")
    port = free_port()
    submitted = alice.submit_workload(workload("web", web_server(port, drop), ports=[port]))
    wait_workload(alice, submitted["id"], "running", lambda w: w["state"] == "running")
    world = ssh_world(grid, alice, submitted["id"], port, tmp_path)
    check_ssh_reaches_the_container(world, ".")  # the container's working directory, its user's own
    check_refusals(world)

    # `idlegrid workload ssh` in one step: its own known_hosts from the Master, StrictHostKeyChecking=yes.
    one_step = cli(
        grid, alice.api_key, "workload", "ssh", world.workload_id, "-i", str(world.alice_key), "--", "echo one-step; exit 5"
    )
    assert one_step.returncode == 5 and one_step.stdout == "one-step\n", one_step.stderr
    # Keys listed and deleted with the CLI; with none left, no SSH tunnel opens, and the refusal says how to add one.
    listed = cli(grid, alice.api_key, "ssh-key", "list", "--json")
    [key] = json.loads(listed.stdout)["items"]
    assert key["name"] == "alice@test" and key["account"] == "alice"
    assert cli(grid, alice.api_key, "ssh-key", "delete", key["id"]).returncode == 0
    keyless = world.run("ssh", world.workload_id, "true")
    assert keyless.returncode == 255 and "has no SSH public keys" in keyless.stderr, keyless.stderr
    events = grid.client.get("/api/v1/events", subject=submitted["id"], limit=100)["items"]
    assert {e["data"]["kind"] for e in events if e["kind"] == "tunnel.opened"} == {"ssh"}


@pytest.mark.podman
def test_openssh_reaches_a_busybox_container_with_no_ssh_server_on_a_podman_host(grid, podman, tmp_path):
    assert grid.enroll("podman-host", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("podman-host")
    grid.start_podman_agent("podman-host", podman)
    grid.wait_state(agent_id, "ready")
    alice = renter(grid, "alice")
    serve = "mkdir -p /www && echo hello-from-the-container > /www/index.txt && exec httpd -f -p 8888 -h /www"
    submitted = alice.submit_workload(
        {"name": "web", "image": podman.image, "command": ["sh", "-c", serve], "replica": {"gpus": 1}, "ports": [8888]}
    )
    wait_workload(alice, submitted["id"], "running", lambda w: w["state"] == "running", timeout=60)
    try:
        no_sshd = cli(grid, alice.api_key, "workload", "exec", submitted["id"], "--no-tty", "--", "sh", "-c", "which sshd")
        assert no_sshd.returncode != 0  # the image has no SSH server: the grid is the server end
        world = ssh_world(grid, alice, submitted["id"], 8888, tmp_path)
        check_ssh_reaches_the_container(world, "/tmp")
        check_refusals(world)
    finally:
        alice.cancel_workload(submitted["id"])

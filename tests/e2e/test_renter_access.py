"""Renter access on a real local grid: a Master, a relay and an agent, each its own process; the agent dials out and
never listens. A renter reaches its workload's container through the relay with the CLI a renter uses
(``idlegrid workload logs|exec|port-forward``, run as processes): logs, a command with its output and exit status, an
HTTP server in the container through a forwarded local port. Another renter is refused; every opening is an event.

Most hosts here run the process runtime sandboxed (each container a uid of its own); one test runs a real container on
a host whose agent drives a real Podman service through its Docker API. GPUs are simulated (none exists here).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from management.client.api import ApiClient
from tests.e2e.test_scheduler import MASTER_SETTINGS, renter, sandboxed_hosts, wait_workload, workload
from tests.support.grid import Grid, free_port, running_grid, wait_for
from tests.support.podman import LOCAL_IMAGES_ALLOWED

CLI = [sys.executable, "-m", "management.cli"]


@pytest.fixture
def grid(tmp_path: Path) -> Iterator[Grid]:
    with running_grid(tmp_path, MASTER_SETTINGS, egress_allow=LOCAL_IMAGES_ALLOWED) as g:
        yield g


def cli(grid: Grid, key: str, *args: str, stdin: str = "", timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``idlegrid ARGS`` as a renter runs it: the connection options go before a container command's ``--``."""
    at = args.index("--") if "--" in args else len(args)
    return subprocess.run(
        [*CLI, *args[:at], "--api", grid.api_url, "--api-key", key, *args[at:]],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def web_server(port: int, www: Path) -> str:
    """A container that serves ``www`` over HTTP on ``port`` and logs each request (to its output)."""
    return f"echo serving on {port} && exec python3 -m http.server {port} --bind 127.0.0.1 --directory {www}"


@pytest.fixture
def serving(grid: Grid, drop: Path) -> tuple[ApiClient, str, int, str]:
    """A running workload of alice's serving a known file (from ``drop``, which the sandbox's user may read)."""
    (drop / "index.txt").write_text("hello-from-the-container\n")
    sandboxed_hosts(grid, 1)
    alice = renter(grid, "alice")
    port = free_port()
    submitted = alice.submit_workload(workload("web", web_server(port, drop), ports=[port]))
    wait_workload(alice, submitted["id"], "running", lambda w: w["state"] == "running")
    return alice, submitted["id"], port, alice.api_key


def test_exec_runs_a_command_in_the_container_through_the_relay_with_its_output_and_exit_status(grid, serving):
    _, workload_id, _, key = serving
    done = cli(
        grid,
        key,
        "workload",
        "exec",
        workload_id,
        "--no-tty",
        "--",
        "sh",
        "-c",
        "cat; echo to-err >&2; exit 3",
        stdin="typed by the renter\n",
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "typed by the renter\n"
    assert "to-err" in done.stderr


def test_port_forward_reaches_an_http_server_in_the_container_and_logs_show_the_requests(grid, serving):
    _, workload_id, port, key = serving
    local = free_port()
    forward = subprocess.Popen(
        [*CLI, "workload", "port-forward", workload_id, f"{local}:{port}", "--api", grid.api_url, "--api-key", key],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stderr is not None
        line = forward.stderr.readline()
        assert line.startswith(f"Forwarding 127.0.0.1:{local} -> {workload_id} port {port}"), line

        def fetch() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.txt", timeout=10) as answer:
                return answer.read().decode()

        assert wait_for(fetch, 20, "the container's HTTP server through the forwarded port") == "hello-from-the-container\n"
        assert [fetch() for _ in range(3)] == ["hello-from-the-container\n"] * 3  # each connection its own stream
    finally:
        forward.terminate()
        forward.wait(timeout=10)
    logs = wait_for(
        lambda: (
            (done := cli(grid, key, "workload", "logs", workload_id, "--tail", "-1")).returncode == 0
            # http.server logs requests to its stderr; the process runtime keeps a container's output and errors in
            # one log, in the order written, so they come as output (docs/agent.md, "Renter access in the runtimes").
            and "GET /index.txt" in done.stdout
            and done
        ),
        20,
        "the container's request log through `workload logs`",
    )
    assert f"serving on {port}" in logs.stdout


def test_another_renter_is_refused_and_every_opening_is_an_event_naming_the_account(grid, serving):
    alice, workload_id, port, key = serving
    bob = renter(grid, "bob")
    for args in (("exec", workload_id, "--no-tty", "--", "true"), ("logs", workload_id)):
        refused = cli(grid, bob.api_key, "workload", *args)
        assert refused.returncode != 0
        assert f"404 not_found: no workload {workload_id!r}" in refused.stderr, refused.stderr
    assert cli(grid, key, "workload", "exec", workload_id, "--no-tty", "--", "true").returncode == 0
    events = wait_for(
        lambda: [
            e for e in grid.client.get("/api/v1/events", subject=workload_id, limit=100)["items"] if e["kind"] == "tunnel.opened"
        ],
        10,
        "tunnel.opened events",
    )
    assert {(e["data"]["account"], e["data"]["kind"]) for e in events} == {("alice", "exec")}


def test_a_port_forward_to_a_port_the_workload_did_not_declare_is_refused(grid, serving, drop):
    """Issue 22 D9: a renter forwarded to another renter's server on the host's loopback and to the Master's own API.
    A port tunnel reaches only the ports the workload declared: the API refuses any other, naming the declared ones,
    before a ticket is signed or the agent dials anything (tests/management/test_api_tunnels.py); the CLI says so
    before it listens, naming the fix (issue 37)."""
    alice, workload_id, port, key = serving
    neighbour = free_port()  # a co-tenant's server on the host's loopback, which alice's workload did not declare
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(neighbour), "--bind", "127.0.0.1", "--directory", str(drop)]
    )
    try:
        master_port = int(grid.api_url.rsplit(":", 1)[1].split("/")[0])
        for target in (neighbour, master_port):
            refused = cli(grid, key, "workload", "port-forward", workload_id, f"{free_port()}:{target}")
            assert refused.returncode != 0
            assert (
                f"workload {workload_id} declares no port {target} (it declares {port}): submit it again with --port {target}"
            ) in refused.stderr, refused.stderr
            assert "Forwarding" not in refused.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
    events = grid.client.get("/api/v1/events", subject=workload_id, limit=100)["items"]
    assert [e for e in events if e["kind"] == "tunnel.opened"] == []  # no ticket was signed


def test_logs_over_plain_http_come_from_the_master_through_the_tunnel(grid, serving):
    alice, workload_id, port, key = serving
    request = urllib.request.Request(
        f"{grid.api_url}/api/v1/workloads/{workload_id}/logs?tail=-1", headers={"Authorization": f"Bearer {key}"}
    )
    deadline = time.monotonic() + 20
    while True:
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain")
            text = answer.read().decode()
        if f"serving on {port}" in text or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert f"serving on {port}" in text


@pytest.mark.podman
def test_exec_and_port_forward_reach_a_real_container_on_a_podman_host_behind_the_relay(grid, podman):
    """The same through the docker runtime against a real Podman: a busybox container serving HTTP on its own
    network; its GPU is simulated (the agent asks the engine for no device: there is none here)."""
    assert grid.enroll("podman-host", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("podman-host")
    grid.start_podman_agent("podman-host", podman)
    grid.wait_state(agent_id, "ready")
    alice = renter(grid, "alice")
    serve = "mkdir -p /www && echo hello-from-podman > /www/index.txt && echo serving && exec httpd -f -p 8888 -h /www"
    submitted = alice.submit_workload(
        {"name": "web", "image": podman.image, "command": ["sh", "-c", serve], "replica": {"gpus": 1}, "ports": [8888]}
    )
    wait_workload(alice, submitted["id"], "running", lambda w: w["state"] == "running", timeout=60)
    key = alice.api_key
    try:
        done = cli(
            grid, key, "workload", "exec", submitted["id"], "--no-tty", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; exit 7"
        )
        assert done.returncode == 7, done.stderr
        assert done.stdout.strip() == grid.agent(agent_id)["gpus"][0]["uuid"]
        local = free_port()
        forward = subprocess.Popen(
            [*CLI, "workload", "port-forward", submitted["id"], f"{local}:8888", "--api", grid.api_url, "--api-key", key],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert forward.stderr is not None and forward.stderr.readline().startswith(f"Forwarding 127.0.0.1:{local}")

            def fetch() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{local}/index.txt", timeout=10) as answer:
                    return answer.read().decode()

            assert wait_for(fetch, 30, "busybox httpd in the container through the forwarded port") == "hello-from-podman\n"
        finally:
            forward.terminate()
            forward.wait(timeout=10)
        logs = cli(grid, key, "workload", "logs", submitted["id"])
        assert logs.returncode == 0 and "serving" in logs.stdout, logs.stderr
    finally:
        alice.cancel_workload(submitted["id"])

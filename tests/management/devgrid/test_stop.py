"""Stopping a local grid leaves nothing running: its process-runtime containers (which outlive their agents by design)
and the slirp4netns that gave each its network, which runs from a sandbox root of its own, not from under the grid's.
A sandboxed container (as root) is a real one here: the agent's process runtime with its namespaces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.runtime.process import ProcessRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from management.devgrid.localgrid import kill_processes_under
from tests.support.grid import pid_alive


def _gone(proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + 5
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc.poll() is not None


def test_a_stopped_grid_ends_its_containers_and_their_slirp4netns_and_nothing_else(tmp_path: Path) -> None:
    root = tmp_path / "grid"
    work = root / "agents" / "host-0-work" / "c1"
    work.mkdir(parents=True)
    # A stand-in for slirp4netns: a shell under that name, outside the grid's root, with its arguments' shape
    # (... PID tap0); the real one needs a namespace to serve.
    fake = tmp_path / "bin" / "slirp4netns"
    fake.parent.mkdir()
    shutil.copy("/bin/sh", fake)
    container = subprocess.Popen(["sleep", "60"], cwd=work)
    waits = [str(fake), "-c", "read line"]  # a builtin: no child process to leave behind
    serving = subprocess.Popen([*waits, str(container.pid), "tap0"], cwd="/", stdin=subprocess.PIPE)
    other = subprocess.Popen([*waits, str(os.getpid()), "tap0"], cwd="/", stdin=subprocess.PIPE)
    try:
        kill_processes_under(root)
        assert _gone(container) and _gone(serving)
        assert other.poll() is None and pid_alive(other.pid)  # another's slirp4netns is not the grid's
    finally:
        for proc in (container, serving, other):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _ended(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return not pid_alive(pid)


@pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime sandboxes a container (namespaces of its own) only as root")
async def test_a_stopped_grid_ends_its_sandboxed_containers_found_by_their_agents_records(tmp_path: Path) -> None:
    root = tmp_path / "grid"
    runtime = ProcessRuntime(root / "agents" / "host-0")  # where a local grid keeps an agent's state
    spec = ContainerSpec(name="worker", image="none", command=["sh", "-c", "sleep 600 & wait"])
    await runtime.create(spec, labels={LABEL_COMMAND_ID: "cmd-1", LABEL_AGENT_ID: "agt-1"})
    record = json.loads((root / "agents" / "host-0" / "containers" / "worker.json").read_bytes())
    shim, slirp = record["pid"], record["slirp_pid"]
    try:
        assert pid_alive(shim) and slirp > 0 and pid_alive(slirp)
        # Its working directory reads from inside its own mount namespace: nothing under the grid's root says it is ours.
        assert not os.readlink(f"/proc/{shim}/cwd").startswith(str(root))
        kill_processes_under(root)
        assert _ended(shim) and _ended(slirp)
    finally:
        await runtime.delete("worker")

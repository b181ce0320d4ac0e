"""Stopping a local grid leaves nothing running: its process-runtime containers (which outlive their agents by design)
and the slirp4netns that gave each its network, which runs from a sandbox root of its own, not from under the grid's."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

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

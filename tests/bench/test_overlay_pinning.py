"""bench.overlay --split-cores: a process tree pinned to the relay host's CPUs, the replicas' side to the last one."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest

from bench.overlay import _pin_tree, core_split


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning apart needs 2 CPUs or more")
def test_a_process_and_its_children_are_pinned_and_the_split_leaves_the_last_cpu_to_the_replicas():
    host, replicas = core_split()
    assert replicas == {max(os.sched_getaffinity(0))} and host and not host & replicas
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    children: list[str] = []
    try:
        deadline = time.monotonic() + 10
        while not children:  # the shell has started its sleep
            assert time.monotonic() < deadline, "the shell never started its child"
            children = open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split()
            time.sleep(0.01)
        assert _pin_tree(parent.pid, replicas) == 2
        assert os.sched_getaffinity(parent.pid) == replicas and os.sched_getaffinity(int(children[0])) == replicas
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        parent.kill()
        parent.wait()

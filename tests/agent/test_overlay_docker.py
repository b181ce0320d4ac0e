"""A gang replica's overlay in the docker runtime: the container's own network namespace, found through the engine
(real Podman, its Docker-compatible API), with Debian's nebula in it. The lighthouse named is the namespace's own
127.0.0.1, so nothing leaves the container's namespace."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.runtime.docker import DockerRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from tests.support.overlay_specs import replica_overlay

pytestmark = [
    pytest.mark.podman,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("nebula") is None, reason="needs root and Debian's nebula"),
]


@pytest.fixture
async def runtime(podman):
    rt = DockerRuntime(podman.socket_path)
    yield rt
    await rt.close()
    podman.podman("rm", "--all", "--force", "--time", "0")


async def test_a_docker_replicas_overlay_runs_in_the_containers_namespace(runtime, podman, tmp_path: Path) -> None:
    overlays, overlay = replica_overlay(tmp_path, 0)
    spec = overlays.prepare(
        ContainerSpec(name="wl-ab-r0-a1", image=podman.image, command=["sleep", "300"], overlay=overlay), runtime
    )
    await runtime.create(spec, labels={LABEL_COMMAND_ID: "c1", LABEL_AGENT_ID: "agt-1"})
    try:
        netns = await runtime.network_namespace(spec.name)
        assert netns is not None and os.readlink(netns) != os.readlink("/proc/self/ns/net")
        await overlays.attach(spec, runtime)
        deadline = time.monotonic() + 10
        seen = ""
        while "100.64.1.1/10" not in seen and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            seen = podman.podman("exec", spec.name, "ip", "addr").stdout  # what the container itself sees
        assert "100.64.1.1/10" in seen
        env = podman.podman("exec", spec.name, "env").stdout
        assert "MASTER_ADDR=100.64.1.1" in env and "NCCL_SOCKET_IFNAME=ig0" in env
        assert "IDLEGRID_HOSTFILE=/etc/idlegrid-hostfile" in env
        hostfile = podman.podman("exec", spec.name, "cat", "/etc/idlegrid-hostfile").stdout  # inside the container
        assert hostfile == "100.64.1.1 slots=1\n100.64.1.2 slots=1\n"
        assert "100.64.1.1" not in subprocess.run(["ip", "-br", "addr"], capture_output=True, text=True).stdout
        # The fence: the overlay range is unreachable in the container's namespace whenever ig0 is not there.
        routes = subprocess.run(["nsenter", f"--net={netns}", "ip", "route"], capture_output=True, text=True).stdout
        assert "unreachable 100.64.0.0/10 metric 4242" in routes, routes
    finally:
        await overlays.close()

"""Delete is graceful in both runtimes: the container's process gets SIGTERM and up to ``timeout_s`` to act on it
before SIGKILL. The scheduler's preemption relies on this. The trap exits with 7, a code only the handler gives:
143 would be SIGTERM unhandled, 137 a SIGKILL."""

from __future__ import annotations

import time

import pytest

from agent.runtime.docker import DockerRuntime
from agent.runtime.process import ProcessRuntime
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec

# Writes "ready" once the trap is set, and on SIGTERM writes where the test looks, then exits 7.
TRAPPING = 'trap "echo TERM > {seen}; exit 7" TERM; echo ready > {ready}; while :; do sleep 0.1; done'


def labels(command_id: str) -> dict[str, str]:
    return {LABEL_COMMAND_ID: command_id, LABEL_AGENT_ID: "agt-1"}


def wait_for_file(path, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.05)


async def test_the_process_runtime_sends_sigterm_and_the_process_acts_on_it_before_any_kill(tmp_path):
    runtime = ProcessRuntime(tmp_path / "state", user="")  # the agent's own user: it may write in tmp_path
    seen, ready = tmp_path / "seen", tmp_path / "ready"
    script = TRAPPING.format(seen=seen, ready=ready)
    await runtime.create(ContainerSpec(name="graceful", image="none", command=["sh", "-c", script]), labels=labels("cmd-1"))
    wait_for_file(ready)
    deleted = await runtime.delete("graceful", timeout_s=10)
    # It ended on SIGTERM, not the timeout's SIGKILL: its trap ran (it wrote TERM) and its exit status is the trap's 7,
    # where a kill would leave 137 and nothing written.
    assert seen.read_text().strip() == "TERM"
    assert deleted is not None and deleted.exit_code == 7


@pytest.mark.podman
async def test_the_docker_api_runtime_sends_sigterm_and_the_container_acts_on_it_before_any_kill(podman):
    runtime = DockerRuntime(podman.socket_path)
    try:
        script = TRAPPING.format(seen="/tmp/seen", ready="/tmp/ready")
        spec = ContainerSpec(name="graceful-pod", image=podman.image, command=["sh", "-c", script])
        await runtime.create(spec, labels=labels("cmd-2"))
        deadline = time.monotonic() + 30
        while podman.podman("exec", "graceful-pod", "cat", "/tmp/ready", check=False).returncode != 0:
            assert time.monotonic() < deadline, "the container never set its trap"
            time.sleep(0.1)
        deleted = await runtime.delete("graceful-pod", timeout_s=20)
        # The exit status is the trap's 7, not a SIGKILL's 137: the container acted on SIGTERM, not the 20 s kill.
        assert deleted is not None and deleted.exit_code == 7
    finally:
        await runtime.close()
        podman.podman("rm", "--all", "--force", "--time", "0")

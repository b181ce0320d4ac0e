"""The local grid's endpoint worker image (management/devgrid/podman_host.py ``WORKER``): built offline from the
host's Python and the handler library, it serves requests in a Podman container through the worker API on a unix
socket bound into it, as the agent serves one (docs/endpoints.md, "The agent's side").

Real parts: Podman (runc) running the image, the handler library inside it, a real HTTP server on the socket playing
the agent's side (tests/common/endpoint_worker/agent_standin.py)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from common.endpoint_worker import contract
from management.devgrid.podman_host import WORKER, WORKER_IMAGE
from tests.common.endpoint_worker.agent_standin import AgentStandIn
from tests.support.podman import PodmanService

pytestmark = pytest.mark.podman


def test_the_worker_image_serves_requests_from_a_socket_bound_into_its_container(podman: PodmanService) -> None:
    podman.ensure_image(WORKER)
    assert WORKER_IMAGE.startswith("localhost/idlegrid-worker:")
    with tempfile.TemporaryDirectory(prefix="worker-api-") as api_dir:
        standin = AgentStandIn(socket_path=str(Path(api_dir) / "api.sock")).start()
        env = {**standin.env(), contract.ENV_API: "unix:///idlegrid/worker/api.sock", contract.ENV_CONCURRENCY: "2"}
        flags = [arg for name, value in env.items() for arg in ("--env", f"{name}={value}")]
        container = "idlegrid-worker-image-test"
        worker = subprocess.Popen(
            ["podman", "run", "--rm", "--name", container, "--network", "none", "--volume", f"{api_dir}:/idlegrid/worker",
             *flags, WORKER_IMAGE],
            env=podman.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            standin.submit("r1", {"prompt": "hello from podman"})
            standin.submit("r2", "no prompt")
            standin.wait_for(lambda: {"r1", "r2"} <= standin.results.keys())
            assert standin.results["r1"] == {"echo": {"prompt": "hello from podman"}, "words": 3, "attempt": 1}
            assert [output for _, output in sorted(standin.partials["r1"])] == ["hello", "from", "podman"]
            assert standin.results["r2"] == {"echo": "no prompt", "words": 0, "attempt": 1}
            assert set(standin.authorizations) == {f"Bearer {standin.token}"}
        finally:
            podman.podman("stop", "--time", "10", container, check=False)  # SIGTERM: the library drains and exits
            output, _ = worker.communicate(timeout=30)
            standin.stop()
        assert worker.returncode == 0, output


# Threads still running when the interpreter exits: Python ends each with pthread_exit, which unwinds through libgcc_s,
# a library glibc loads by name at that moment (ldd lists it for nothing). Without it in the image the exit aborts
# with status 139 — what a worker stopped mid-wait did once in CI, at random; four spinning threads make it near sure.
DAEMON_THREADS_AT_EXIT = """
import threading, time
def spin():
    while True:
        sum(range(1000))
for _ in range(4):
    threading.Thread(target=spin, daemon=True).start()
time.sleep(0.2)
print("exiting")
"""


def test_python_in_the_worker_image_exits_cleanly_with_daemon_threads_still_running(podman: PodmanService) -> None:
    podman.ensure_image(WORKER)
    for attempt in range(4):
        run = subprocess.run(
            ["podman", "run", "--rm", "--network", "none", WORKER_IMAGE, "python3", "-c", DAEMON_THREADS_AT_EXIT],
            env=podman.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert (run.returncode, run.stdout.strip()) == (0, "exiting"), (attempt, run.stderr)
        assert "libgcc_s" not in run.stderr

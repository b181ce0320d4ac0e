"""Images on a real local grid: a Master, a relay and an agent as processes, the agent's docker runtime on a real
Podman (Docker API) that lacks every image, two real registries (Debian docker-registry: one public, one behind
htpasswd). A renter's workload whose image the host lacks is pulled and runs; a private image runs with the renter's
credentials, and another renter without them is refused (image_unauthorized, the renter's fault); a wrong tag fails
with "image not found" shown to the renter (API and CLI) and the host's reputation unchanged; the host page and the
offers list the public images the host now has, never the private one. GPUs are simulated (none exists here)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_scheduler import MASTER_SETTINGS, renter, wait_workload
from tests.support.grid import TEST_PROVIDER, Grid, running_grid, wait_for
from tests.support.podman import PodmanService
from tests.support.registry import MB, PASSWORD, USER, Images, ThrottledProxy, filled_registries, pulling_engine

pytestmark = [pytest.mark.podman, pytest.mark.e2e]
CLI = [sys.executable, "-m", "management.cli"]


@pytest.fixture(scope="module")
def images(podman: PodmanService, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Images]:
    with filled_registries(podman, tmp_path_factory.mktemp("images")) as made:
        yield made


@pytest.fixture
def engine(images: Images, tmp_path: Path) -> Iterator[PodmanService]:
    with pulling_engine(tmp_path / "engine", images) as service:
        yield service


@pytest.fixture
def grid(tmp_path: Path, images: Images) -> Iterator[Grid]:
    # The registries are on 127.0.0.1: the operator allows renters to name them (common/egress.py).
    with running_grid(tmp_path / "grid", MASTER_SETTINGS, egress_allow=images.allowed) as g:
        yield g


def job(name: str, image: str, **fields: object) -> dict[str, object]:
    return {
        "name": name,
        "image": image,
        "command": ["sh", "-c", "echo started; exec sleep 600"],
        "replica": {"gpus": 1},
        **fields,
    }


def test_a_renters_images_are_pulled_private_ones_with_credentials_and_a_wrong_tag_is_the_renters_fault(grid, engine, images):
    assert grid.enroll("puller", grid.relays["relay-1"]).returncode == 0
    agent_id = grid.agent_id("puller")
    settings = {
        "IDLEGRID_AGENT_RUNTIME_PROBE_S": "1",
        "IDLEGRID_AGENT_IMAGE_PROGRESS_S": "0.1",
        # The GPU self-test's probe runs in an image of the test's registry (its default is on Docker Hub, which no
        # test may reach): pulled before the host is offered, as a provider's host would pull the default.
        "IDLEGRID_AGENT_GPU_SELFTEST_IMAGE": images.small[2],
        # The registries are on 127.0.0.1: this host's provider allows them by name (common/egress.py).
        "IDLEGRID_AGENT_EGRESS_ALLOW": ",".join(images.allowed),
    }
    grid.start_agent("puller", "--runtime", "docker", "--docker-socket", str(engine.socket_path), simulate="a10:3", env=settings)
    grid.wait_state(agent_id, "ready", timeout=60)  # after the GPU self-test: its image is pulled, three containers run
    alice = renter(grid, "alice")

    public = alice.submit_workload(job("public", images.small[0]))
    wait_workload(alice, public["id"], "running", lambda w: w["state"] == "running", timeout=90)

    # Through a registry slowed to 1 MB/s the 9 MB image takes seconds: its progress is the workload's detail meanwhile.
    with ThrottledProxy(images.slow_port, images.public, rate=1 * MB).in_thread():
        slow = alice.submit_workload(job("slow", images.slow_big))
        pulling = wait_for(
            lambda: " MB of " in (detail := alice.workload(slow["id"])["detail"]) and detail, 60, "the pull's progress"
        )
        wait_workload(alice, slow["id"], "running", lambda w: w["state"] == "running", timeout=90)
    assert pulling.startswith("pulling image: ") and pulling.endswith("layers")
    assert alice.workload(slow["id"])["detail"] == ""
    alice.cancel_workload(slow["id"])

    auth = {"username": USER, "password": PASSWORD}
    private = alice.submit_workload(job("private", images.secret, registry_auth=auth))
    shown = alice.workload(private["id"])
    assert shown["spec"]["registry_auth"] == {"username": USER}  # the password is never shown again
    wait_workload(alice, private["id"], "running", lambda w: w["state"] == "running", timeout=90)

    # Another renter names the private image the host now has, without credentials: the registry is asked again.
    bob = renter(grid, "bob")
    peek = bob.submit_workload(job("peek", images.secret))
    refused = wait_workload(bob, peek["id"], "failed", lambda w: w["state"] == "failed", timeout=90)
    assert "(image_unauthorized)" in refused["state_reason"] and refused["host_failure"] is None

    wrong = alice.submit_workload(job("wrong", f"{images.public.host}/tools/busy:no-such-tag"))
    failed = wait_workload(alice, wrong["id"], "failed", lambda w: w["state"] == "failed", timeout=90)
    assert "image not found" in failed["state_reason"] and failed["host_failure"] is None
    show = subprocess.run(
        [*CLI, "workload", "get", wrong["id"], "--api", grid.api_url, "--api-key", alice.api_key],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert show.returncode == 0 and "image not found" in show.stdout, show.stderr

    host = grid.agent(agent_id)
    evidence = host["reputation"]["evidence"]
    assert (evidence["containers_failed"], evidence["containers_refused"], evidence["containers_started"]) == (0, 2, 3)
    has = wait_for(
        lambda: (listed := grid.agent(agent_id)["images"]) and images.small[0] in listed and listed,
        30,
        "the host page to list the images pulled",
    )
    assert len(has) <= 32
    assert images.secret not in has  # pulled with alice's credentials: nobody else is told it is here
    grid.client.set_default_price({"on_demand": "3.60"}, provider=TEST_PROVIDER)
    [offer] = wait_for(lambda: bob.search_offers("num_gpus>=1")["offers"], 30, "the host's offer")
    assert images.small[0] in offer["images"] and images.secret not in offer["images"]
    for workload_id in (public["id"], private["id"]):
        alice.cancel_workload(workload_id)

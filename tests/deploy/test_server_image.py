"""The Master's and relay's image (deploy/server/Containerfile) runs a grid: a Master on a MongoDB store (the
nx-27017 wire server, as the store contract tests use) and a relay, each a container of the image as its
unprivileged user, the Master's state in a volume; a provider's host installed by deploy/agent/install.sh from the
agent's image enrolls through that relay, and the Master in its container lists the host's GPUs.

Mocked: the GPUs (simulated) and the agent's engine socket (none in a test container; see test_agent_image.py).
Every container shares the host's network, so each daemon binds a free port of 127.0.0.1."""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from management.client.api import ApiClient
from management.console.assets import vendor_available
from management.devgrid.localgrid import free_port
from tests.deploy.images import (
    AGENT_UID,
    SERVER_IMAGE,
    ImagePodman,
    container_and_volume,
    install,
)
from tests.support.grid import wait_for
from tests.support.mongo import Nx27017, database_url

pytestmark = pytest.mark.e2e

STATE = "/var/lib/idlegrid"


@pytest.fixture
def mongo(tmp_path: Path) -> Iterator[Nx27017]:
    server = Nx27017(tmp_path / "mongo").start()
    try:
        yield server
    finally:
        server.stop()


def serve(engine: ImagePodman, name: str, volume: str, *args: str) -> None:
    engine.run("run", "--detach", "--name", name, "--network", "host", "--volume", f"{volume}:{STATE}", SERVER_IMAGE, *args)


def logs(engine: ImagePodman, name: str) -> str:
    done = engine.run("logs", name, check=False)
    return (done.stdout + done.stderr)[-3000:]


def test_a_master_and_a_relay_from_the_image_enroll_an_installed_agent(
    engine: ImagePodman, mongo: Nx27017, tmp_path: Path
) -> None:
    api_port, link_port, agent_port, http_port = free_port(), free_port(), free_port(), free_port()
    store = database_url(mongo.uri, "idlegrid")
    with (
        container_and_volume(engine, "idlegrid-master-test") as (master, state),
        container_and_volume(engine, "idlegrid-relay-test") as (relay, _),
        container_and_volume(engine, "idlegrid-agent-test") as (agent, agent_state),
    ):
        serve(
            engine, master, state, "master", "--api-port", str(api_port), "--link-port", str(link_port),
            "--links-port", str(free_port()), "--store-url", store,
        )  # fmt: skip
        api = f"http://127.0.0.1:{api_port}"
        health = wait_for(lambda: ApiClient(api, None).health(), 60, f"the Master's /healthz\n{logs(engine, master)}")
        assert health["store"] == "mongodb", health
        assert engine.run("exec", master, "id", "-u").stdout.strip() == AGENT_UID
        if vendor_available():  # the checkout's npm install travels into the image: the console's charts work there
            with urllib.request.urlopen(f"{api}/console/vendor/htmx.min.js", timeout=10) as page:
                assert page.status == 200 and b"htmx" in page.read()

        # The operator's first steps (docs/run-a-grid.md): the relay's certificate from the Master's CA, then the relay.
        # Issuing it needs no network: none is made (CNI's bridge failed here once on a loaded CI, "unknown FS magic on
        # /run/netns/...", as a process-runtime sandbox's new mount namespace hid the one podman was making).
        engine.run(
            "run", "--rm", "--network", "none", "--volume", f"{state}:{STATE}", SERVER_IMAGE,
            "ca", "issue-access", "--state-dir", f"{STATE}/master", "--relay-id", "relay-1", "--out", f"{STATE}/relay-1",
        )  # fmt: skip
        serve(
            engine, relay, state,
            "access", "--relay-id", "relay-1", "--region", "eu-west", "--master-url", f"wss://127.0.0.1:{link_port}/link",
            "--agent-port", str(agent_port), "--http-port", str(http_port),
            "--cert", f"{STATE}/relay-1/relay-1.crt", "--key", f"{STATE}/relay-1/relay-1.key", "--ca", f"{STATE}/relay-1/ca.crt",
        )  # fmt: skip
        operator_key = engine.run("exec", master, "cat", f"{STATE}/master/operator.token").stdout.strip()
        operator = ApiClient(api, operator_key)
        wait_for(lambda: "relay-1" in operator.health()["relays"], 60, f"the relay's link\n{logs(engine, relay)}")
        ca_file = tmp_path / "ca.crt"
        ca_file.write_text(engine.run("exec", master, "cat", f"{STATE}/master/pki/ca.crt").stdout)
        operator.create_account("prov-img", "provider", name="prov-img")
        token = operator.create_join_token("prov-img")["token"]

        done = install(
            engine,
            "--token", token, "--access", f"https://127.0.0.1:{http_port}", "--ca-file", str(ca_file),
            "--socket", "none", "--no-gpus", "--name", agent, "--volume", agent_state,
            "--", "--simulate", "a10:1", "--no-bandwidth",
        )  # fmt: skip
        assert done.returncode == 0, f"{done.stderr}\nrelay:\n{logs(engine, relay)}"
        enrolled = re.search(r"enrolled as (agt-[0-9a-f]+)", done.stderr)
        assert enrolled, done.stderr
        try:
            host = wait_for(lambda: (a := operator.agent(enrolled.group(1))).get("gpus") and a, 60, "the Master to list the GPUs")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nagent:\n{logs(engine, agent)}\nrelay:\n{logs(engine, relay)}") from None
        assert host["provider"] == "prov-img"
        assert [(gpu["model"], gpu["simulated"]) for gpu in host["gpus"]] == [("a10", True)]
        assert json.loads(engine.run("container", "inspect", master).stdout)[0]["Config"]["User"] == f"{AGENT_UID}:{AGENT_UID}"

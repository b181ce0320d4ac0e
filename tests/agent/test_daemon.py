"""The agent daemon: what it reports about its runtime, the relay directory it keeps, and how it stops.

In-process tests use agents enrolled offline through the Master's own enrollment code (bench/provision.py); the
ones that need a relay or a Master start them as real processes (tests/support/grid.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
import time
from pathlib import Path

import pytest
from websockets.frames import Close

from agent.config import AgentConfig
from agent.daemon import Agent
from agent.detect import detect_gpus
from agent.directory import DIRECTORY_FILE, save_directory
from agent.errors import EXIT_CERTIFICATE_REVOKED, is_revocation
from agent.runtime.images import PullProgress
from bench.fleet_agents import agent_dir
from bench.provision import provision_agents
from common.wire import CLOSE_POLICY, CLOSE_REVOKED, AgentEventKind, RelayDirectory, RelayEntry, Welcome, encode
from master.config import MasterConfig
from tests.agent.gpu_hosts import SYSFS, Commands, no_amdsmi, no_nvml
from tests.support.grid import QUICK_RECONNECT, Grid, wait_for, write_toml

RELAY_A = RelayEntry(relay_id="relay-a", region="eu-west", url="wss://127.0.0.1:1")
RELAY_B = RelayEntry(relay_id="relay-b", region="us-east", url="wss://127.0.0.1:2")


@pytest.fixture
def enrolled(tmp_path: Path) -> Path:
    """An agent state directory, enrolled offline: identity, key, certificate, CA and command keys."""
    asyncio.run(provision_agents(MasterConfig(state_dir=str(tmp_path / "master")), tmp_path / "agents", 1))
    return agent_dir(tmp_path / "agents", 0)


def agent_config(state_dir: Path, **settings: object) -> AgentConfig:
    base: dict[str, object] = {
        "state_dir": str(state_dir),
        "access_urls": ["wss://127.0.0.1:1"],
        "simulate": "a10:1",
        "measure_bandwidth": False,
    }
    return AgentConfig(**{**base, **settings})  # type: ignore[arg-type]


# --- runtime and isolation in hello --------------------------------------------------------------------------


def test_docker_is_the_default_runtime():
    assert AgentConfig().runtime == "docker"


async def test_with_no_engine_reachable_the_agent_says_so_once_and_offers_nothing_to_run(enrolled, tmp_path, caplog):
    agent = Agent(agent_config(enrolled, docker_socket=str(tmp_path / "no-engine.sock")))
    try:
        with caplog.at_level(logging.ERROR, logger="agent.daemon"):
            await agent.probe_runtime()
            await agent.probe_runtime()  # still down: not said again
        inventory = agent._hello().inventory
        assert (inventory.runtime, inventory.isolation) == ("", "none")
        said = [r.getMessage() for r in caplog.records if "no container runtime" in r.getMessage()]
        assert len(said) == 1 and "no-engine.sock" in said[0]
    finally:
        await agent.close()


async def test_an_engine_that_never_answers_is_no_runtime_after_the_probe_timeout(enrolled, tmp_path):
    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts, never answers

    engine = await asyncio.start_unix_server(hang, path=str(tmp_path / "hung.sock"))
    agent = Agent(agent_config(enrolled, docker_socket=str(tmp_path / "hung.sock"), runtime_probe_timeout_s=0.3))
    try:
        started = time.monotonic()
        await agent.probe_runtime()
        # Behaviour, not speed: the probe gives up at its 0.3 s timeout instead of waiting on the hung engine forever
        # (which would hold up the connection to the relay); 5 s leaves a loaded machine sixteen times the timeout.
        assert time.monotonic() - started < 5
        assert agent._hello().inventory.runtime == ""
        assert "did not answer within 0.3 s" in (agent.runtime_problem or "")
    finally:
        await agent.close()
        engine.close()


async def test_hello_carries_the_cards_the_host_has_and_does_not_offer(enrolled):
    """Issue 41: the cards detection found on the bus and no library read go to the Master with why (docs/gpus.md)."""
    agent = Agent(agent_config(enrolled))
    try:
        agent.collector = detect_gpus(
            SYSFS / "driver-not-loaded", open_nvml=no_nvml, import_module=no_amdsmi, runner=Commands()
        )  # a host whose cards have no driver (tests/fixtures/gpus), as the agent opens it without --simulate
        inventory = agent._hello().inventory
        assert inventory.gpus == [] and len(inventory.unoffered) == 6
        assert {card.kind for card in inventory.unoffered} == {"integrated", "no_driver", "unsupported"}
    finally:
        await agent.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime reports 'sandbox' only when the agent is root")
async def test_the_process_runtime_reports_itself_and_its_sandbox_in_hello(enrolled):
    agent = Agent(agent_config(enrolled, runtime="process"))
    try:
        await agent.probe_runtime()
        inventory = agent._hello().inventory
        assert (inventory.runtime, inventory.isolation) == ("process", "sandbox")
    finally:
        await agent.close()


async def test_the_process_runtime_run_as_the_agents_own_user_reports_no_isolation(enrolled):
    agent = Agent(agent_config(enrolled, runtime="process", process_user=""))
    try:
        await agent.probe_runtime()
        inventory = agent._hello().inventory
        assert (inventory.runtime, inventory.isolation) == ("process", "none")
    finally:
        await agent.close()


@pytest.mark.podman
async def test_a_docker_host_lists_its_images_in_hello_and_a_new_image_is_a_change(enrolled, podman):
    agent = Agent(agent_config(enrolled, docker_socket=str(podman.socket_path)))
    try:
        await agent.probe_runtime()
        assert podman.image in agent._hello().inventory.images
        assert await agent.probe_runtime() is False  # nothing changed
        podman.podman("tag", podman.image, "localhost/idlegrid-busybox:another")
        try:
            assert await agent.probe_runtime() is True  # a fresh hello goes out
            assert agent._hello().inventory.images[0] in (podman.image, "localhost/idlegrid-busybox:another")
        finally:
            podman.podman("rmi", "localhost/idlegrid-busybox:another")
    finally:
        await agent.close()


async def test_pull_progress_goes_to_the_master_at_most_once_per_period_per_container(enrolled):
    agent = Agent(agent_config(enrolled, image_progress_s=3600.0))
    sent: list[object] = []

    async def link(frame: object) -> None:  # the relay link, which this in-process test has none of
        sent.append(frame)

    agent._send = link  # type: ignore[method-assign]
    try:
        progress = PullProgress()
        progress.feed({"status": "Pulling fs layer", "id": "a1"})
        agent._on_pull_progress("wl-1-r0-a1", progress)
        agent._on_pull_progress("wl-1-r0-a1", progress)  # within the period: not sent
        agent._on_pull_progress("wl-2-r0-a1", progress)  # another container's pull
        await asyncio.gather(*agent._pull_sends)
    finally:
        await agent.close()
    assert [(f.kind, f.container, f.message) for f in sent] == [  # type: ignore[attr-defined]
        (AgentEventKind.IMAGE_PULL, "wl-1-r0-a1", "pulling image: 0 of 1 layers"),
        (AgentEventKind.IMAGE_PULL, "wl-2-r0-a1", "pulling image: 0 of 1 layers"),
    ]


# --- the state directory ---------------------------------------------------------------------------------------


async def test_the_agent_makes_its_state_directory_and_database_private_whatever_the_umask(enrolled):
    enrolled.chmod(0o755)  # as an older agent, or a hand-made directory, may have left it
    old_umask = os.umask(0)
    try:
        agent = Agent(agent_config(enrolled))
    finally:
        os.umask(old_umask)
    try:
        assert stat.S_IMODE(enrolled.stat().st_mode) == 0o700
        assert stat.S_IMODE((enrolled / "commands.db").stat().st_mode) == 0o600
    finally:
        await agent.close()


# --- the relay directory ---------------------------------------------------------------------------------------


async def test_the_relay_directory_from_the_master_is_kept_across_a_restart(enrolled):
    agent = Agent(agent_config(enrolled))
    try:
        welcome = Welcome(version=1, agent_id=agent.identity.agent_id, heartbeat_s=5, telemetry_s=10, relays=[RELAY_A])
        await agent._on_message(encode(welcome))
        await agent._on_message(encode(RelayDirectory(relays=[RELAY_A, RELAY_B])))
    finally:
        await agent.close()
    assert (enrolled / DIRECTORY_FILE).stat().st_mode & 0o077 == 0

    restarted = Agent(agent_config(enrolled))
    try:
        assert restarted.connector.directory == [RELAY_A, RELAY_B]
        # A welcome from a Master that sends no directory keeps the one the agent has.
        await restarted._on_message(encode(Welcome(version=1, agent_id="x", heartbeat_s=5, telemetry_s=10)))
        assert restarted.connector.directory == [RELAY_A, RELAY_B]
    finally:
        await restarted.close()


# --- settings typos ----------------------------------------------------------------------------------------------


# --- real processes: stopping, revocation, failover --------------------------------------------------------------


@pytest.fixture
def grid(tmp_path: Path):
    g = Grid(tmp_path)
    try:
        g.start_master()
        g.start_relay("relay-1", "eu-west")
        yield g
    finally:
        g.stop()


def test_an_agent_stopped_with_sigterm_closes_its_connection_going_away(grid):
    agent_id, daemon = grid.run_agent("leaver")
    assert daemon.terminate() == 0
    relay_log = grid.relays["relay-1"].daemon.log
    # 1001, going away: a clean stop the relay reports to the Master at once, not a lost connection.
    wait_for(lambda: _relay_saw_close(relay_log, agent_id, 1001), 5, "the relay to log close code 1001")


def _relay_saw_close(log: Path, agent_id: str, code: int) -> bool:
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("agent") == agent_id and entry.get("close_code") == code:
                return True
    return False


def test_a_revoked_agent_stops_saying_enroll_again_with_its_own_exit_code(grid):
    agent_id, daemon = grid.run_agent("revoked")
    status, _ = grid.call("POST", f"/api/v1/agents/{agent_id}/revoke")
    assert status == 200
    exit_code = daemon.process.wait(timeout=20)  # not retrying forever
    assert exit_code == EXIT_CERTIFICATE_REVOKED
    assert daemon.logged("certificate revoked: enroll again")

    again = grid.start_agent("revoked", "--config", str(grid.root / "config" / "revoked.toml"))
    assert again.process.wait(timeout=30) == EXIT_CERTIFICATE_REVOKED  # a restart is refused the same way


def test_sigkill_of_its_relay_moves_the_agent_along_its_directory_to_a_relay_in_another_region(grid):
    relay_1 = grid.relays["relay-1"]
    relay_2 = grid.start_relay("relay-2", "us-east")
    agent_id, daemon = grid.run_agent("traveller", region="eu-west")
    daemon.terminate()
    # What the Master sends (RelayDirectory), as the agent keeps it: the agent itself knows only relay-1's URL.
    directory = [
        RelayEntry(relay_id="relay-1", region="eu-west", url=relay_1.agent_url),
        RelayEntry(relay_id="relay-2", region="us-east", url=relay_2.agent_url),
    ]
    save_directory(grid.agent_dir("traveller"), directory)
    write_toml(grid.root / "config" / "traveller.toml", {**QUICK_RECONNECT, "region": "eu-west"})
    grid.start_agent("traveller", "--config", str(grid.root / "config" / "traveller.toml"))
    wait_for(lambda: _ready_through(grid, agent_id, "relay-1"), 30, "the agent on relay-1, its home region's relay")

    assert relay_1.daemon is not None
    relay_1.daemon.kill()  # SIGKILL
    killed_at = time.monotonic()
    wait_for(lambda: _ready_through(grid, agent_id, "relay-2"), 10, "the agent ready through relay-2", interval=0.05)
    print(f"\nfailover along the directory: ready through relay-2 {time.monotonic() - killed_at:.2f} s after the SIGKILL")


def _ready_through(grid: Grid, agent_id: str, relay_id: str) -> bool:
    agent = grid.agent(agent_id)
    return agent["state"] in ("ready", "busy") and agent.get("relay") == relay_id


def test_only_a_close_for_a_revoked_certificate_counts_as_revocation():
    assert is_revocation(Close(CLOSE_REVOKED, ""))
    assert is_revocation(Close(CLOSE_POLICY, "certificate revoked"))  # what relays send today
    assert not is_revocation(Close(CLOSE_POLICY, "certificate expired; renew it"))  # renewal, then retry
    assert not is_revocation(Close(1011, "certificate revoked"))
    assert not is_revocation(None)  # the connection dropped without a close frame


# --- reports give way to control on a backed-up link (issue 29) -------------------------------------------------


class _BackedUpLink:
    """The agent's WebSocket as far as ``_send_report`` looks at it: what it sends, and how much waits unsent.

    A stand-in: backing a real loopback socket up past its kernel buffers takes megabytes and timing; what is under
    test is the agent's rule, which reads only the transport's write-buffer size."""

    def __init__(self, unsent: int) -> None:
        self.unsent = unsent
        self.sent: list[str] = []
        self.transport = self

    def get_write_buffer_size(self) -> int:
        return self.unsent

    async def send(self, data: bytes, text: bool = False) -> None:
        self.sent.append(json.loads(data)["type"])


async def test_a_report_finding_the_link_backed_up_is_skipped_and_counted_while_control_still_goes(enrolled):
    from common.wire import CommandAck, Heartbeat, Telemetry

    agent = Agent(agent_config(enrolled, report_backlog_bytes=1000))
    link = _BackedUpLink(unsent=5000)
    agent._ws = link  # type: ignore[assignment]
    try:
        assert not await agent._send_report(Heartbeat(seq=1, ts=1.0))
        assert not await agent._send_report(Telemetry(ts=1.0, samples=[]))
        await agent._send(CommandAck(id="c1"))
        link.unsent = 0
        assert await agent._send_report(Heartbeat(seq=2, ts=2.0))
    finally:
        agent._ws = None
        await agent.close()
    assert link.sent == ["command_ack", "heartbeat"]
    assert agent.reports_skipped == 2


async def test_a_simulated_hosts_hello_names_its_benchmark_and_the_challenge_forms_it_answers(enrolled, tmp_path):
    agent = Agent(agent_config(enrolled, docker_socket=str(tmp_path / "no-engine.sock")))
    try:
        hello = agent._hello()
        assert (hello.benchmark, hello.challenge_forms) == ("simulated", ["rounds"])
    finally:
        await agent.close()

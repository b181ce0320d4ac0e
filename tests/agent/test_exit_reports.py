"""A renter's container that ends on its own is reported by the agent at once (an event) and durably (every
heartbeat until the container is deleted), so an exit that happened while the link was down, or before the agent
restarted, still reaches the Master. Real agent, real process runtime; the relay connection is a recorder."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.config import AgentConfig
from agent.daemon import Agent
from bench.fleet_agents import agent_dir
from bench.provision import provision_agents
from common.containers import LABEL_AGENT_ID, LABEL_COMMAND_ID, ContainerSpec
from common.wire import AgentEvent, AgentEventKind, AgentFrame, Heartbeat, decode_agent_frame
from master.config import MasterConfig


@dataclass
class RecordingLink:
    """Stands in for the relay connection: keeps every frame the agent sends."""

    frames: list[AgentFrame] = field(default_factory=list)
    raw: list[bytes | str] = field(default_factory=list)
    transport: None = None  # no socket buffer: the agent's report lane never finds it backed up

    async def send(self, data: bytes | str, text: bool = False) -> None:
        self.raw.append(data)
        self.frames.append(decode_agent_frame(data))

    def exit_events(self) -> list[AgentEvent]:
        return [f for f in self.frames if isinstance(f, AgentEvent) and f.kind == AgentEventKind.CONTAINER_EXITED]

    def heartbeats(self) -> list[Heartbeat]:
        return [f for f in self.frames if isinstance(f, Heartbeat)]


@pytest.fixture
def enrolled(tmp_path: Path) -> Path:
    asyncio.run(provision_agents(MasterConfig(state_dir=str(tmp_path / "master")), tmp_path / "agents", 1))
    return agent_dir(tmp_path / "agents", 0)


def make_agent(state_dir: Path) -> Agent:
    config = AgentConfig(
        state_dir=str(state_dir),
        access_urls=["wss://127.0.0.1:1"],
        simulate="a10:1",
        measure_bandwidth=False,
        runtime="process",
        process_user="",
        exit_check_s=0.05,
    )
    agent = Agent(config)
    agent.session.heartbeat_s = 0.1
    agent.connected.set()  # as after a welcome
    return agent


async def until(predicate, what: str, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return value


async def start_job(agent: Agent, script: str, name: str = "job") -> None:
    spec = ContainerSpec(name=name, image="none", command=["sh", "-c", script])
    await agent.runtime.create(spec, labels={LABEL_COMMAND_ID: f"cmd-{name}", LABEL_AGENT_ID: agent.identity.agent_id})


async def test_an_exit_is_sent_at_once_as_an_event_and_repeated_by_every_heartbeat_until_deleted(enrolled):
    agent = make_agent(enrolled)
    link = RecordingLink()
    agent._ws = link  # type: ignore[assignment]
    loops = [asyncio.create_task(agent._exit_check_loop(None)), asyncio.create_task(agent._heartbeat_loop(None))]  # type: ignore[arg-type]
    try:
        await start_job(agent, "sleep 0.3; exit 3")
        await until(lambda: link.exit_events(), "the exit event")
        [event] = link.exit_events()
        assert (event.container, event.code) == ("job", 3)
        await until(lambda: len([h for h in link.heartbeats() if h.exited]) >= 3, "three heartbeats after the exit")
        assert all(h.exited == {"job": 3} and h.running == [] for h in link.heartbeats() if h.exited)
        assert len(link.exit_events()) == 1  # told once; the heartbeats carry it from then on

        await agent.runtime.delete("job")
        seen = len(link.heartbeats())
        await until(lambda: len(link.heartbeats()) >= seen + 2, "heartbeats after the delete")
        assert link.heartbeats()[-1].exited == {}
        assert b'"exited"' not in link.raw[-1]  # nothing ended: the hot path's frame does not even name the field
    finally:
        for loop in loops:
            loop.cancel()
        await agent.close()


async def test_an_exit_while_the_link_was_down_is_told_on_the_next_link_and_by_a_restarted_agent(enrolled):
    agent = make_agent(enrolled)
    check = asyncio.create_task(agent._exit_check_loop(None))  # type: ignore[arg-type]
    try:
        await start_job(agent, "exit 5")
        await until(lambda: not agent._watch_exits.is_set(), "the check to see the exit")
        link = RecordingLink()
        agent._ws = link  # type: ignore[assignment]
        agent._watch_exits.set()  # reconnected (a command ran, or a heartbeat saw a container): the check looks again
        await until(lambda: link.exit_events(), "the exit event on the new link")
        assert link.exit_events()[0].code == 5
    finally:
        check.cancel()
        await agent.close()

    restarted = make_agent(enrolled)  # a new agent process: the container outlived the old one
    link = RecordingLink()
    restarted._ws = link  # type: ignore[assignment]
    heartbeat = asyncio.create_task(restarted._heartbeat_loop(None))  # type: ignore[arg-type]
    try:
        await until(lambda: link.heartbeats(), "a heartbeat")
        assert link.heartbeats()[0].exited == {"job": 5}
        assert [e.code for e in link.exit_events()] == [5]
    finally:
        heartbeat.cancel()
        await restarted.runtime.delete("job")
        await restarted.close()


async def test_a_simulated_container_finished_by_a_test_is_reported_like_a_real_one(enrolled):
    from agent.runtime.simulated import SimulatedRuntime

    runtime = SimulatedRuntime()
    config = AgentConfig(
        state_dir=str(enrolled), access_urls=["wss://127.0.0.1:1"], simulate="a10:1", measure_bandwidth=False, runtime="simulated"
    )
    agent = Agent(config, runtime=runtime)
    agent.session.heartbeat_s = 0.1
    agent.connected.set()
    link = RecordingLink()
    agent._ws = link  # type: ignore[assignment]
    heartbeat = asyncio.create_task(agent._heartbeat_loop(None))  # type: ignore[arg-type]
    try:
        await start_job(agent, "ignored by the simulated runtime", name="sim-job")
        runtime.finish("sim-job", 2)
        await until(lambda: [h for h in link.heartbeats() if h.exited], "a heartbeat with the exit")
        assert [(e.container, e.code) for e in link.exit_events()] == [("sim-job", 2)]
    finally:
        heartbeat.cancel()
        await agent.close()

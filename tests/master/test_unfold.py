"""The Master unfolds a relay's ``report_fold`` into what each agent's frames would have done one by one
(master/intake.py ``_unfold``, master/agent_channel.py ``_on_reports``); a real Master on SQLite, driven through its
relay-link handlers (tests/master/linked.py)."""

from __future__ import annotations

import asyncio
import functools
import time

from common.inventory import GpuSample
from common.lanes import Lane, LaneBounds
from common.wire import AgentReports, Error, Heartbeat, ReportFold, Telemetry, encode
from master.config import MasterConfig
from master.intake import IntakeCounters, LinkIntake
from master.master import Master
from tests.master.linked import connect, enrolled, gpus, relay_link, to_agent


def fold(*reports: AgentReports, alive: tuple[str, ...] = ()) -> ReportFold:
    return ReportFold(alive=list(alive), reports=list(reports))


async def started(tmp_path) -> Master:
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    return master


async def test_a_folds_telemetry_and_heartbeats_are_taken_as_the_frames_themselves(tmp_path):
    master = await started(tmp_path)
    try:
        link = relay_link()
        await connect(master, link, "agt-1", gpus(2))
        now = time.time()
        samples = [GpuSample(uuid="GPU-h100-0", ts=now, temperature_c=61.0), GpuSample(uuid="GPU-h100-1", ts=now)]
        frames: list[Heartbeat | Telemetry] = [Heartbeat(seq=1, ts=now, running=["c1"]), Telemetry(ts=now, samples=samples)]
        await master.channel.on_link_frame(link, fold(AgentReports(agent_id="agt-1", frames=frames)))

        assert master.agent("agt-1").state == "busy"
        assert master.telemetry.latest["GPU-h100-0"] == samples[0]
        assert master.telemetry.latest["GPU-h100-1"] == samples[1]
    finally:
        await master.stop()


async def test_an_agent_named_alive_is_handled_as_its_last_full_heartbeat_again(tmp_path):
    master = await started(tmp_path)
    try:
        link = relay_link()
        await connect(master, link, "agt-1", gpus(1))
        await master.channel.on_link_frame(
            link, fold(AgentReports(agent_id="agt-1", frames=[Heartbeat(seq=1, ts=time.time(), running=["c1"])]))
        )
        agent = master.agent("agt-1")
        assert agent.state == "busy"
        # Meanwhile the Master's view moved on (as a command's result could move it): the agent's next heartbeat, the
        # same as its last one, must set it right again, as it would have unfolded.
        await master.registry.transition(agent, "workload_finished", "for the test")
        seen = agent.last_seen
        await master.channel.on_link_frame(link, fold(alive=("agt-1",)))

        assert agent.state == "busy"
        assert agent.last_seen is not None and seen is not None and agent.last_seen >= seen
    finally:
        await master.stop()


async def test_an_idle_agent_named_alive_is_handled_as_its_last_heartbeat_which_said_nothing(tmp_path):
    master = await started(tmp_path)
    try:
        link = relay_link()
        await connect(master, link, "agt-1", gpus(1))
        overlay = {"c1": {"10.9.0.2": "direct"}}
        said: list[Heartbeat | Telemetry] = [Heartbeat(seq=1, ts=time.time(), running=["c1"], overlay=overlay)]
        await master.channel.on_link_frame(link, fold(AgentReports(agent_id="agt-1", frames=said)))
        assert master.agent("agt-1").state == "busy" and master.overlay_paths("agt-1", "c1") == {"10.9.0.2": "direct"}
        idle: list[Heartbeat | Telemetry] = [Heartbeat(seq=2, ts=time.time(), ping="nonce-1"), Heartbeat(seq=3, ts=time.time())]
        await master.channel.on_link_frame(link, fold(AgentReports(agent_id="agt-1", frames=idle)))
        agent = master.agent("agt-1")
        assert agent.state == "ready" and master.overlay_paths("agt-1", "c1") == {}
        await master.registry.transition(agent, "workload_started", "for the test")
        seen = agent.last_seen
        await master.channel.on_link_frame(link, fold(alive=("agt-1",)))

        assert agent.state == "ready" and agent.last_seen >= seen  # no container runs, as the last heartbeat said
        assert master.overlay_paths("agt-1", "c1") == {}
    finally:
        await master.stop()


async def test_a_fold_takes_nothing_of_an_agent_not_linked_through_it_and_asks_an_unwelcomed_one_for_hello(tmp_path):
    master = await started(tmp_path)
    try:
        link, other = relay_link("relay-a"), relay_link("relay-b")
        await connect(master, other, "agt-elsewhere", gpus(1, prefix="GPU-b"))
        await enrolled(master, "agt-new")
        await master.channel.on_link_frame(
            link, fold(AgentReports(agent_id="agt-elsewhere", frames=[Heartbeat(seq=1, ts=time.time(), running=["c1"])]))
        )
        assert master.agent("agt-elsewhere").state == "ready"

        # An agent connected through the link but with no hello yet: asked for one, as a heartbeat would have it asked.
        link.agents.add("agt-new")
        master.hub.agent_links["agt-new"] = link
        await master.channel.on_link_frame(link, fold(alive=("agt-new",)))
        await master.channel.on_link_frame(
            link, fold(AgentReports(agent_id="agt-new", frames=[Heartbeat(seq=1, ts=time.time())]))
        )
        told = to_agent(link, "agt-new")
        assert [type(f) for f in told] == [Error] and told[0].code == "hello_required"  # type: ignore[union-attr]
    finally:
        await master.stop()


async def test_an_agent_only_named_alive_to_a_master_without_its_hello_is_asked_for_one_once_per_interval(tmp_path):
    """After a takeover (or a restart) the relay goes on folding an agent's unchanged heartbeats into its ``alive``
    set: the new Master, which has neither its hello nor a heartbeat of it, must ask for a hello on the name alone, or
    the agent stays unknown to it (found by ``bench takeover`` in CI: its agents never ready at the new leader)."""
    master = await started(tmp_path)
    try:
        link = relay_link("relay-a")
        await enrolled(master, "agt-kept")
        link.agents.add("agt-kept")
        master.hub.agent_links["agt-kept"] = link
        await master.channel.on_link_frame(link, fold(alive=("agt-kept",)))
        told = to_agent(link, "agt-kept")
        assert [type(f) for f in told] == [Error] and told[0].code == "hello_required"  # type: ignore[union-attr]
        await master.channel.on_link_frame(link, fold(alive=("agt-kept",)))  # moments later: not asked again
        assert len(to_agent(link, "agt-kept")) == 1
    finally:
        await master.stop()


async def _nothing(_: object) -> None:
    return None


async def test_the_intake_hears_every_agent_of_a_fold_that_its_link_speaks_for_when_it_reads_it():
    heard: dict[str, float] = {}
    agents = {"agt-1", "agt-2"}
    intake = LinkIntake(_nothing, _nothing, LaneBounds(), IntakeCounters(), heard, agents)
    message = encode(fold(AgentReports(agent_id="agt-2", frames=[]), alive=("agt-1", "agt-gone")))

    await intake.take(message)

    assert set(heard) == {"agt-1", "agt-2"}  # agt-gone left the link: a fold folded before it left does not revive it


async def test_a_folding_links_backlog_is_a_second_fold_waiting_not_the_size_of_one() -> None:
    """The pacer's backlog (master/pacing.py): one fold of 10,000 agents is counted as about 1.6 MB, past the 1 MiB a
    link of single frames is judged by; it waits whenever it arrives, and only a second one says the Master is behind."""
    intake = LinkIntake(_nothing, _nothing, LaneBounds(), IntakeCounters())
    big = fold(*(AgentReports(agent_id=f"agt-{n}", frames=[]) for n in range(2)))
    intake.queue.push(big, Lane.TELEMETRY, 2 * 1024 * 1024)
    assert not intake.backlogged(1024 * 1024, folds=True)
    assert intake.backlogged(1024 * 1024, folds=False)  # as many bytes of single frames: behind
    intake.queue.push(big, Lane.TELEMETRY, 1024)
    assert intake.backlogged(1024 * 1024, folds=True)


async def test_an_agent_gone_silent_keeps_no_overlay_paths(tmp_path):
    """The overlay's paths live in memory only as long as the agent's heartbeats say them: a silent agent's are dropped
    when it goes offline (they were kept for every agent that ever reported one, gone or not)."""
    master = await started(tmp_path)
    try:
        link = relay_link()
        await connect(master, link, "agt-1", gpus(1))
        said: list[Heartbeat | Telemetry] = [
            Heartbeat(seq=1, ts=time.time(), running=["c1"], overlay={"c1": {"10.9.0.2": "direct"}})
        ]
        await master.channel.on_link_frame(link, fold(AgentReports(agent_id="agt-1", frames=said)))
        assert master.overlay_paths("agt-1", "c1") == {"10.9.0.2": "direct"}

        gone = await master.registry.sweep(time.time() + 3600, timeout_s=60)

        assert gone == ["agt-1"] and master.agent("agt-1").state == "offline"
        assert master.overlay_paths("agt-1", "c1") == {} and "agt-1" not in master.registry.overlay_paths
    finally:
        await master.stop()


async def test_an_idle_agents_alive_name_is_handled_at_once_and_any_other_in_its_turn(tmp_path):
    """master/intake.py ``_unfold`` with master/agent_channel.py ``alive_at_once``: the name of an idle agent whose last
    heartbeat said nothing is all liveness, taken without a trip through the link handler; a busy agent's name (its
    containers are checked again) goes the whole way."""
    master = await started(tmp_path)
    try:
        link = relay_link()
        await connect(master, link, "agt-idle", gpus(1))
        await connect(master, link, "agt-busy", gpus(1, prefix="GPU-b"))
        now = time.time()
        said = [
            AgentReports(agent_id="agt-idle", frames=[Heartbeat(seq=1, ts=now)]),
            AgentReports(agent_id="agt-busy", frames=[Heartbeat(seq=1, ts=now, running=["c1"])]),
        ]
        await master.channel.on_link_frame(link, fold(*said))
        assert master.agent("agt-busy").state == "busy"
        idle_seen = master.agent("agt-idle").last_seen
        handled: list[str] = []

        async def handle(frame: object) -> None:
            assert isinstance(frame, AgentReports)
            handled.append(frame.agent_id)
            await master.channel.on_link_frame(link, frame)

        alive = functools.partial(master.channel.alive_at_once, link)
        intake = LinkIntake(handle, _nothing, LaneBounds(), IntakeCounters(), {}, link.agents, alive=alive)
        running = asyncio.create_task(intake.run())
        await intake.take(encode(fold(alive=("agt-idle", "agt-busy"))))
        for _ in range(100):
            if handled:
                break
            await asyncio.sleep(0.01)
        intake.close()
        await running

        assert handled == ["agt-busy"]
        assert master.agent("agt-idle").last_seen > idle_seen and master.agent("agt-idle").state == "ready"
        assert master.agent("agt-busy").state == "busy"  # its heartbeat's running container, checked again
    finally:
        await master.stop()


async def test_alive_at_once_leaves_every_name_that_asks_more_than_liveness_to_the_whole_handling(tmp_path):
    master = await started(tmp_path)
    try:
        link, other = relay_link("relay-a"), relay_link("relay-b")
        await connect(master, link, "agt-quiet", gpus(1))
        await connect(master, other, "agt-elsewhere", gpus(1, prefix="GPU-e"))
        await connect(master, link, "agt-unfolded", gpus(1, prefix="GPU-u"))
        now = time.time()
        for agent_id, via in (("agt-quiet", link), ("agt-elsewhere", other)):
            await master.channel.on_link_frame(via, fold(AgentReports(agent_id=agent_id, frames=[Heartbeat(seq=1, ts=now)])))

        assert master.channel.alive_at_once(link, "agt-quiet")
        assert not master.channel.alive_at_once(link, "agt-elsewhere")  # not linked through this relay
        assert not master.channel.alive_at_once(link, "agt-unfolded")  # no full heartbeat of it in a fold yet
        assert not master.channel.alive_at_once(link, "agt-unknown")
        await master.registry.transition(master.agent("agt-quiet"), "workload_started", "for the test")
        assert not master.channel.alive_at_once(link, "agt-quiet")  # busy: its containers are checked again
    finally:
        await master.stop()

"""An agent's silence is judged on what the Master has read of it, not only on the heartbeats it has handled
(master/intake.py, master/upkeep.py): a Master behind on its own telemetry must not send live agents offline and
ask each for a new hello, which made an overload worse (issue 29)."""

from __future__ import annotations

import time

from master.config import MasterConfig
from master.intake import LinkIntake
from master.master import Master
from tests.master.linked import connect, events, gpus, relay_link


async def test_an_agent_heard_recently_is_not_swept_offline_though_its_heartbeats_wait(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, heartbeat_s=1.0, missed_heartbeats=3)
    master = Master(config)
    await master.start()
    try:
        link = relay_link()
        for agent_id in ("agt-waiting", "agt-silent"):
            await connect(master, link, agent_id, gpus(1))
        master.parts.upkeep.started_at = time.time() - 60  # past the start grace
        now = time.time()
        for agent_id in ("agt-waiting", "agt-silent"):
            master.agent(agent_id).last_seen = now - 10  # no heartbeat handled for 10 s: three missed and more
        # What the intake records when it reads a frame of the agent (tests/master/test_intake.py shows it does):
        # agt-waiting's heartbeat was read a moment ago and waits behind control; agt-silent said nothing.
        master.hub.heard["agt-waiting"] = now - 0.5
        master.hub.heard["agt-silent"] = now - 10

        await master.parts.upkeep.sweep()

        assert master.agent("agt-waiting").state == "ready"
        assert "agt-waiting" in master.channel.sessions  # its session kept: no new hello asked of it
        assert master.agent("agt-silent").state == "offline"
        assert "agt-silent" not in master.channel.sessions
        lost = [e for e in await events(master, "agent.") if e.data.get("event") == "heartbeat_lost"]
        assert [e.subject for e in lost] == ["agt-silent"], lost
    finally:
        await master.stop()


async def test_the_agents_of_a_link_whose_reader_waited_for_room_are_not_swept_for_that_silence(tmp_path):
    config = MasterConfig(state_dir=str(tmp_path), link_port=0, heartbeat_s=1.0, missed_heartbeats=3)
    master = Master(config)
    await master.start()
    try:
        held, flowing = relay_link("relay-held"), relay_link("relay-flowing")
        await connect(master, held, "agt-behind", gpus(1))
        await connect(master, flowing, "agt-silent", gpus(1))
        for link in (held, flowing):
            link.intake = LinkIntake(_nothing, _nothing, master.hub.lanes, master.hub.intake, master.hub.heard)
        master.parts.upkeep.started_at = time.time() - 60
        now = time.time()
        for agent_id in ("agt-behind", "agt-silent"):
            master.agent(agent_id).last_seen = now - 10
            master.hub.heard[agent_id] = now - 10
        # relay-held's reader waited for room in its lanes a second ago (backpressure): it read nothing meanwhile,
        # so its agents' frames may be waiting in the socket; relay-flowing's reader never waited.
        assert held.intake is not None
        held.intake.stalled_until = now - 1

        await master.parts.upkeep.sweep()

        assert master.agent("agt-behind").state == "ready" and "agt-behind" in master.channel.sessions
        assert master.agent("agt-silent").state == "offline"
    finally:
        await master.stop()


async def _nothing(*_: object) -> None:
    return None


class _CountedScans(dict):
    """The registry's agents, counting how often the whole fleet is gone through."""

    scans = 0

    def values(self):
        self.scans += 1
        return super().values()


async def test_the_sweep_goes_through_the_fleet_only_once_an_agent_may_be_silent(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, heartbeat_s=1.0, missed_heartbeats=3))
    await master.start()
    try:
        link = relay_link()
        for agent_id in ("agt-a", "agt-b"):
            await connect(master, link, agent_id, gpus(1))
        registry = master.registry
        registry.agents = counted = _CountedScans(registry.agents)
        now = time.time()

        assert await registry.sweep(now, 3.0, {}) == []  # one look: the oldest was seen a moment ago
        assert await registry.sweep(now + 1.0, 3.0, {}) == []
        assert await registry.sweep(now + 2.5, 3.0, {}) == []
        assert counted.scans == 1  # no agent could have been silent for 3 s yet: nobody looked

        gone = await registry.sweep(now + 3.5, 3.0, {})
        assert sorted(gone) == ["agt-a", "agt-b"] and counted.scans == 2
    finally:
        await master.stop()


async def test_an_agent_judged_again_with_an_old_last_seen_is_swept_at_once(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0, heartbeat_s=1.0, missed_heartbeats=3))
    await master.start()
    try:
        link = relay_link()
        for agent_id in ("agt-fresh", "agt-back"):
            await connect(master, link, agent_id, gpus(1))
        registry = master.registry
        now = time.time()
        back = master.agent("agt-back")
        await registry.transition(back, "heartbeat_lost", "silent")
        assert await registry.sweep(now, 3.0, {}) == []  # agt-fresh alone is judged: seen a moment ago
        back.last_seen = now - 100  # offline, last heard long ago
        await registry.transition(back, "connected", "back, its heartbeats not yet read")

        assert await registry.sweep(now + 1.0, 3.0, {}) == ["agt-back"]
        assert master.agent("agt-fresh").state == "ready"
    finally:
        await master.stop()

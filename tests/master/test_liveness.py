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

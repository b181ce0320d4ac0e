"""An agent's silence is judged on what the Master has read of it, not only on the heartbeats it has handled
(master/intake.py, master/upkeep.py): a Master behind on its own telemetry must not send live agents offline and
ask each for a new hello, which made an overload worse (issue 29)."""

from __future__ import annotations

import time

from master.config import MasterConfig
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

"""A container that ended on its own, as a real Master (SQLite) learns it from an agent: recorded once on the agent,
its GPUs kept until a delete, announced on the change feed; heartbeats repeat it, so it survives a lost event."""

from __future__ import annotations

import time

from common.containers import ContainerSpec, DeleteSpec
from common.wire import AgentEvent, AgentEventKind, CommandResult, Heartbeat
from master.changes import CommandFinished, ContainerExited, HostChanged
from master.master import Master
from tests.master.linked import connect, disconnect, events, relay, relay_link

SPEC = ContainerSpec(name="job", image="none", gpus=["GPU-h100-0"])


async def running_job(master: Master):
    link = relay_link()
    await connect(master, link, "agt-a")
    create = await master.create_command("agt-a", SPEC)
    await relay(master, link, "agt-a", CommandResult(id=create.id, ok=True))
    await relay(master, link, "agt-a", Heartbeat(seq=1, ts=time.time(), running=["job"]))
    return link


async def test_an_exit_in_a_heartbeat_is_recorded_once_and_the_gpus_stay_held_until_the_delete(master):
    link = await running_job(master)
    changes = master.changes.subscribe()
    agent = master.registry.agents["agt-a"]
    assert agent.state == "busy"

    for seq in (2, 3):  # repeated in every heartbeat until deleted
        await relay(master, link, "agt-a", Heartbeat(seq=seq, ts=time.time(), exited={"job": 3, "not-ours": 1}))
    assert agent.exited == {"job": 3}
    assert master.registry.gpus["GPU-h100-0"].state == "busy"  # the container still exists and holds its GPU
    assert (await master.store.agents.get("agt-a")).exited == {"job": 3}
    [event] = await events(master, "container.exited", "agt-a")
    assert event.data == {"container": "job", "code": 3}
    assert changes.get_nowait() == ContainerExited(agent_id="agt-a", container="job", code=3)
    assert changes.get_nowait() == HostChanged(agent_id="agt-a", state="ready", previous="busy", reason="no container running")
    assert changes.get_nowait() is None  # the repeat announced nothing

    delete = await master.create_command("agt-a", DeleteSpec(name="job"))
    await relay(master, link, "agt-a", CommandResult(id=delete.id, ok=True))
    assert agent.exited == {} and agent.containers == {}
    assert master.registry.gpus["GPU-h100-0"].state == "available"
    assert changes.get_nowait() == CommandFinished(
        command_id=delete.id, agent_id="agt-a", kind="delete_container", state="succeeded", container="job"
    )


async def test_an_exit_event_is_taken_at_once_and_the_heartbeat_repeating_it_changes_nothing(master):
    link = await running_job(master)
    changes = master.changes.subscribe()
    exited = AgentEvent(kind=AgentEventKind.CONTAINER_EXITED, ts=time.time(), container="job", code=137)
    await relay(master, link, "agt-a", exited)
    assert master.registry.agents["agt-a"].exited == {"job": 137}
    await relay(master, link, "agt-a", Heartbeat(seq=5, ts=time.time(), exited={"job": 137}))
    assert changes.get_nowait() == ContainerExited(agent_id="agt-a", container="job", code=137)
    assert not isinstance(changes.get_nowait(), ContainerExited)


async def test_the_feed_announces_hosts_going_and_coming_and_every_final_command(master):
    changes = master.changes.subscribe()
    link = relay_link()
    await connect(master, link, "agt-a")
    assert changes.get_nowait() == HostChanged(
        agent_id="agt-a", state="ready", previous="enrolled", reason="connected through relay-a"
    )
    failed = await master.create_command("agt-a", SPEC)
    await relay(master, link, "agt-a", CommandResult(id=failed.id, ok=False, error="image not found"))
    assert changes.get_nowait() == CommandFinished(
        command_id=failed.id, agent_id="agt-a", kind="create_container", state="failed", container="job", error="image not found"
    )
    timed_out = await master.create_command("agt-a", SPEC, timeout_s=0.01)
    await master.commands.expire(time.time() + 1)
    finished = changes.get_nowait()
    assert isinstance(finished, CommandFinished) and (finished.command_id, finished.state) == (timed_out.id, "timed_out")
    await disconnect(master, link, "agt-a", "closed")
    change = changes.get_nowait()
    assert isinstance(change, HostChanged) and (change.state, change.previous) == ("offline", "ready")
    await master.drain("agt-a")
    assert changes.get_nowait() == HostChanged(
        agent_id="agt-a", state="maintenance", previous="offline", reason="drained by an operator"
    )


async def test_a_lost_relay_announces_each_of_its_hosts_offline(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    await connect(master, link, "agt-b")
    changes = master.changes.subscribe()
    await master.channel.on_link_closed(link)
    announced = [changes.get_nowait(), changes.get_nowait()]
    assert {(c.agent_id, c.state, c.previous) for c in announced if isinstance(c, HostChanged)} == {
        ("agt-a", "offline", "ready"),
        ("agt-b", "offline", "ready"),
    }
    assert changes.get_nowait() is None

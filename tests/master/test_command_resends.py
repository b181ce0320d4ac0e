"""A hello resends what the agent's earlier connection may have missed, and only that: a command created while the
hello was being handled went out on the new connection already, and a second copy of it is a second chance for a
relay to tamper one of them (tests/e2e/test_commands.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

from common.containers import DeleteSpec
from common.wire import AgentConnected, Command
from master.master import Master
from tests.master.linked import connect, enrolled, gpus, hello, relay, relay_link, to_agent


def copies(link, agent_id: str, command_id: str) -> int:
    return sum(1 for frame in to_agent(link, agent_id) if isinstance(frame, Command) and frame.body.id == command_id)


async def test_a_command_created_while_the_hello_is_handled_goes_out_once(
    master: Master, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = relay_link()
    await enrolled(master, "agt-a")
    link.agents.add("agt-a")
    master.hub.links.setdefault(link.relay_id, link)
    await master.channel.on_link_frame(link, AgentConnected(agent_id="agt-a", serial="", cert_not_after=time.time() + 60))
    registered, go_on = asyncio.Event(), asyncio.Event()
    on_hello = master.registry.on_hello

    async def slow_on_hello(*args, **kwargs) -> None:  # the store's queue behind a storm of hellos, say
        await on_hello(*args, **kwargs)
        registered.set()
        await go_on.wait()

    monkeypatch.setattr(master.registry, "on_hello", slow_on_hello)
    handling = asyncio.create_task(relay(master, link, "agt-a", hello(gpus(2))))
    await asyncio.wait_for(registered.wait(), 5)
    assert master.registry.agents["agt-a"].state == "ready"  # what the API shows: a renter's command may come now
    command = await master.create_command("agt-a", DeleteSpec(name="job-1"))
    go_on.set()
    await asyncio.wait_for(handling, 5)
    assert copies(link, "agt-a", command.id) == 1


async def test_a_command_sent_before_the_agent_reconnected_is_sent_again_at_its_hello(master: Master) -> None:
    link = relay_link()
    await connect(master, link, "agt-a")
    command = await master.create_command("agt-a", DeleteSpec(name="job-1"))
    assert copies(link, "agt-a", command.id) == 1
    await connect(master, link, "agt-a")  # a new connection: the first copy may have died with the old one
    assert copies(link, "agt-a", command.id) == 2

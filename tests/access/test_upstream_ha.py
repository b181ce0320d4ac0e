"""The relay's link to highly available Masters (docs/ha.md): it dials the leader among ``master_urls``, follows a
standby's refusal (close code 4011, the leader's URL as the reason), moves on when a Master is down, and keeps its
agents connected through a takeover. The Masters are stand-ins (conftest.py); the real pair is tests/e2e."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import pytest

from access import cli as access_cli
from access.config import AccessConfig
from common.wire import CLOSE_NOT_LEADER, AgentConnected
from tests.access.conftest import MasterStandIn, RelayFactory, TestPki, eventually, heartbeat, result


@pytest.fixture
async def second(pki: TestPki) -> AsyncIterator[MasterStandIn]:
    stand_in = MasterStandIn(pki)
    await stand_in.start()
    try:
        yield stand_in
    finally:
        await stand_in.stop()


def test_master_url_alone_is_a_list_of_one_and_master_urls_replace_it() -> None:
    assert AccessConfig().masters == ["wss://127.0.0.1:7100/link"]
    config = AccessConfig(master_urls=["wss://m1:7100/link", "wss://m2:7100/link"])
    assert config.masters == ["wss://m1:7100/link", "wss://m2:7100/link"]
    with pytest.raises(Exception, match="master_urls must hold wss:// URLs"):
        AccessConfig(master_urls=["http://m1"])


def test_master_url_given_once_per_master_on_the_command_line_lists_them_all() -> None:
    parser = argparse.ArgumentParser()
    access_cli._add_arguments(parser)
    one = access_cli.overrides(parser.parse_args(["--master-url", "wss://m1:7100/link"]))
    assert (one["master_url"], one["master_urls"]) == ("wss://m1:7100/link", None)
    two = access_cli.overrides(parser.parse_args(["--master-url", "wss://m1:7100/link", "--master-url", "wss://m2:7100/link"]))
    assert two["master_urls"] == ["wss://m1:7100/link", "wss://m2:7100/link"]


async def test_a_standby_refuses_the_link_naming_the_leader_and_the_relay_links_there(
    make_relay: RelayFactory, master: MasterStandIn, second: MasterStandIn
) -> None:
    second.standby_naming = master.url  # the first URL listed stands by; the leader is listed second
    relay = await make_relay(master_urls=[second.url, master.url], backoff_initial_s=5.0, backoff_max_s=5.0)
    assert relay.link.is_up  # within make_relay's wait: no backoff was waited out
    assert second.refused == 1 and len(master.hellos) == 1


async def test_a_refusal_naming_a_master_not_listed_is_followed_too(
    make_relay: RelayFactory, master: MasterStandIn, second: MasterStandIn
) -> None:
    second.standby_naming = master.url
    relay = await make_relay(master_urls=[second.url], backoff_initial_s=5.0, backoff_max_s=5.0)
    assert relay.link.is_up and len(master.hellos) == 1


async def test_when_the_leader_dies_the_relay_links_to_the_next_master_and_its_agents_stay_connected(
    make_relay: RelayFactory, master: MasterStandIn, second: MasterStandIn, pki: TestPki, open_agent
) -> None:
    second.standby_naming = master.url
    relay = await make_relay(master_urls=[master.url, second.url])
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(), "the first heartbeat")
        await master.stop()  # SIGKILL of the leader
        await eventually(lambda: not relay.link.is_up, "the relay to notice")
        await ws.send(result("c-1"))  # in flight during the takeover: buffered by the relay
        await eventually(lambda: second.refused >= 1, "the standby to refuse while the lease has not lapsed")
        second.standby_naming = None  # the standby took the lease
        await eventually(lambda: relay.link.is_up, "the relay to link to the new leader", timeout=5)
        await second.wait_for(lambda: second.relayed(), "the buffered result at the new leader")
        assert ws.close_code is None  # the agent never lost its connection to the relay
        await ws.send(heartbeat(2))
        await second.wait_for(lambda: len(second.relayed()) == 2, "the agent heard through the new leader")
    assert isinstance(second.frames[0], AgentConnected) and second.frames[0].agent_id == agent.identity.id
    assert [f["type"] for _, f in second.relayed()] == ["command_result", "heartbeat"]


async def test_a_leader_stepping_down_closes_the_link_naming_the_new_leader_and_the_relay_follows(
    make_relay: RelayFactory, master: MasterStandIn, second: MasterStandIn, pki: TestPki, open_agent
) -> None:
    relay = await make_relay(master_urls=[master.url, second.url], backoff_initial_s=5.0, backoff_max_s=5.0)
    agent = pki.agent()
    async with open_agent(relay, agent) as ws:
        await ws.send(heartbeat(1))
        await master.wait_for(lambda: master.relayed(), "the first heartbeat")
        master.standby_naming = second.url
        await master.links[-1].close(CLOSE_NOT_LEADER, second.url)
        await eventually(lambda: len(second.hellos) == 1 and relay.link.is_up, "the relay to follow", timeout=2)
        await ws.send(heartbeat(2))
        await second.wait_for(lambda: second.relayed(), "the agent heard through the new leader")
        assert ws.close_code is None
    assert master.refused == 0  # it followed the named leader rather than redialling the list

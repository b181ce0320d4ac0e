"""The change feed on its own: ordered delivery, a bounded queue that collapses to one resync, no cost unheard, each
subscriber given only the kinds it named, synchronous listeners."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import SubscriptionClosed
from master.changes import AgentWritten, Change, ChangeFeed, ContainerExited, HoldsChanged, HostChanged, Resync, SamplesTaken


def exited(n: int) -> ContainerExited:
    return ContainerExited(agent_id="agt-a", container=f"job-{n}", code=n)


async def test_each_subscriber_gets_every_change_published_after_it_subscribed_in_order():
    feed = ChangeFeed()
    feed.publish(exited(0))  # nobody listens: gone
    first, second = feed.subscribe(), feed.subscribe()
    for n in (1, 2, 3):
        feed.publish(exited(n))
    assert [await first.get() for _ in range(3)] == [exited(1), exited(2), exited(3)]
    assert [await second.get() for _ in range(3)] == [exited(1), exited(2), exited(3)]
    assert first.get_nowait() is None


async def test_a_waiting_subscriber_wakes_when_a_change_is_published():
    feed = ChangeFeed()
    subscription = feed.subscribe()
    waiting = asyncio.ensure_future(subscription.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    change = HostChanged(agent_id="agt-a", state="offline", previous="ready", reason="relay lost")
    feed.publish(change)
    assert await asyncio.wait_for(waiting, timeout=1.0) == change


async def test_a_slow_subscriber_gets_one_resync_instead_of_an_unbounded_queue_then_carries_on():
    feed = ChangeFeed()
    slow = feed.subscribe(capacity=3)
    for n in range(10):
        feed.publish(exited(n))
    assert slow.pending() == 1  # everything collapsed into one marker
    assert await slow.get() == Resync(dropped=10)
    feed.publish(exited(99))
    assert await slow.get() == exited(99)


async def test_a_closed_subscription_ends_its_iteration_and_hears_nothing_more():
    feed = ChangeFeed()
    subscription = feed.subscribe()
    feed.publish(exited(1))
    subscription.close()
    assert not feed.listening
    feed.publish(exited(2))
    assert [change async for change in subscription] == [exited(1)]
    with pytest.raises(SubscriptionClosed):
        await subscription.get()


def test_a_capacity_below_one_is_refused():
    with pytest.raises(ValueError, match="capacity"):
        ChangeFeed().subscribe(capacity=0)


def test_a_queue_gets_the_placement_changes_unless_it_names_other_kinds():
    feed = ChangeFeed()
    placement, samples = feed.subscribe(), feed.subscribe(kinds=[SamplesTaken])
    taken = SamplesTaken(agent_id="agt-a", samples=[])
    feed.publish(taken)
    feed.publish(exited(1))
    feed.publish(AgentWritten(agent_id="agt-a"))  # neither asked for it
    assert placement.get_nowait() == exited(1) and placement.get_nowait() is None
    assert samples.get_nowait() == taken and samples.get_nowait() is None


def test_a_listener_is_called_at_once_with_the_kinds_it_named_until_it_stops():
    feed = ChangeFeed()
    heard: list[Change] = []
    assert not feed.wants(HoldsChanged)
    stop = feed.listen(heard.append, [HoldsChanged, AgentWritten])
    assert feed.wants(HoldsChanged) and feed.wants(AgentWritten) and not feed.wants(SamplesTaken)
    feed.publish(HoldsChanged(agent_id=None))
    feed.publish(exited(1))
    feed.publish(AgentWritten(agent_id="agt-b"))
    assert heard == [HoldsChanged(agent_id=None), AgentWritten(agent_id="agt-b")]
    stop()
    stop()  # twice is harmless
    feed.publish(HoldsChanged(agent_id="agt-a"))
    assert len(heard) == 2 and not feed.wants(HoldsChanged) and not feed.listening


def test_a_closed_subscription_takes_no_kind_any_more():
    feed = ChangeFeed()
    subscription = feed.subscribe()
    assert feed.wants(HostChanged)
    subscription.close()
    assert not feed.wants(HostChanged) and not feed.listening

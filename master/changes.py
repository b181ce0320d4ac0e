"""The Master's change feed: what management code (a scheduler) reacts to, pushed, never polled.

The Master publishes a typed ``Change`` whenever something a placement decision rests on changes: a GPU's health, a
host's reachability or standing, a container ending on its own, a container command reaching its final state.
Subscribers each get a bounded queue. Publishing never blocks and never grows memory without bound: a subscriber that
falls ``capacity`` changes behind has its queue replaced by one ``Resync`` marker, after which it must re-read a
snapshot (the Master's registry, allocations and open commands) and carry on from the changes that follow. Nobody
subscribed: publishing costs one truth test.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import msgspec

from common.errors import SubscriptionClosed

DEFAULT_CAPACITY = 10_000  # changes a subscriber may fall behind before it is told to resync


class GpuHealthChanged(msgspec.Struct, frozen=True, kw_only=True, tag="gpu_health"):
    """A GPU turned faulty (``healthy`` False, with the reason) or was repaired / cooled down (True)."""

    uuid: str
    agent_id: str
    healthy: bool
    reason: str


class HostChanged(msgspec.Struct, frozen=True, kw_only=True, tag="host"):
    """A host's state changed (master/states.py AgentState): offline, back (ready), busy, maintenance, quarantined, retired."""

    agent_id: str
    state: str
    previous: str
    reason: str


class ContainerExited(msgspec.Struct, frozen=True, kw_only=True, tag="container_exited"):
    """A container ended on its own with exit status ``code``; it (and its GPUs) stays until a delete removes it."""

    agent_id: str
    container: str
    code: int


class CommandFinished(msgspec.Struct, frozen=True, kw_only=True, tag="command_finished"):
    """A container command reached a final state (master/states.py CommandState): succeeded, failed, timed_out."""

    command_id: str
    agent_id: str
    kind: str
    state: str
    container: str
    error: str | None = None


class Resync(msgspec.Struct, frozen=True, kw_only=True, tag="resync"):
    """Changes were lost to this subscriber (it fell too far behind): re-read a snapshot, then carry on."""

    dropped: int


Change = GpuHealthChanged | HostChanged | ContainerExited | CommandFinished | Resync


class Subscription:
    """One subscriber's queue of changes; read with ``await get()`` or ``async for change in subscription``."""

    def __init__(self, feed: ChangeFeed, capacity: int) -> None:
        self._feed = feed
        self._capacity = capacity
        self._queue: deque[Change] = deque()
        self._dropped = 0  # changes lost since the last Resync was handed out
        self._ready = asyncio.Event()
        self.closed = False

    def offer(self, change: Change) -> None:
        """Called by the feed: queue ``change``, or collapse to one Resync when full. Never blocks."""
        if self._dropped:
            self._dropped += 1
        elif len(self._queue) >= self._capacity:
            self._dropped = len(self._queue) + 1
            self._queue.clear()
        else:
            self._queue.append(change)
        self._ready.set()

    def pending(self) -> int:
        """Changes waiting (a pending Resync counts as one)."""
        return len(self._queue) + (1 if self._dropped else 0)

    def get_nowait(self) -> Change | None:
        if self._dropped:
            resync, self._dropped = Resync(dropped=self._dropped), 0
            return resync
        if self._queue:
            return self._queue.popleft()
        self._ready.clear()
        return None

    async def get(self) -> Change:
        """The next change, waiting for one."""
        while True:
            change = self.get_nowait()
            if change is not None:
                return change
            if self.closed:
                raise SubscriptionClosed("this subscription was closed")
            await self._ready.wait()

    def close(self) -> None:
        """Stop receiving; a waiting ``get`` raises SubscriptionClosed, iteration ends."""
        self.closed = True
        self._feed._subscribers.discard(self)
        self._ready.set()

    def __aiter__(self) -> AsyncIterator[Change]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Change]:
        while True:
            try:
                yield await self.get()
            except SubscriptionClosed:
                return


class ChangeFeed:
    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()

    def subscribe(self, capacity: int = DEFAULT_CAPACITY) -> Subscription:
        """A new subscriber, seeing every change published from now on."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        subscription = Subscription(self, capacity)
        self._subscribers.add(subscription)
        return subscription

    @property
    def listening(self) -> bool:
        """Whether anyone is subscribed: publishers may skip building a change when not."""
        return bool(self._subscribers)

    def publish(self, change: Change) -> None:
        for subscription in self._subscribers:
            subscription.offer(change)

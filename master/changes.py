"""The Master's one change feed: everything management code reacts to, pushed, never polled.

The Master publishes a typed ``Change`` whenever something management rests on changes. The placement changes
(``PLACEMENT``): a GPU's health, a host's reachability or standing, a container ending on its own, a container command
reaching its final state. The frequent ones, which only some subscribers want: a batch of GPU samples taken
(``SamplesTaken``: alerts see every sample), an agent record written (``AgentWritten``), a host's GPU records written
(``GpusWritten``), the GPU holds on a host changed (``HoldsChanged``: the offer index).

Two ways to subscribe, both naming the kinds wanted:

- ``subscribe(kinds=...)``: a bounded queue, read with ``await get()`` or ``async for``. Publishing never blocks and
  never grows memory without bound: a subscriber that falls ``capacity`` changes behind has its queue replaced by one
  ``Resync`` marker, after which it must re-read a snapshot (the Master's registry, allocations and open commands)
  and carry on from the changes that follow. Without ``kinds``: the placement changes.
- ``listen(callback, kinds)``: ``callback(change)`` is called synchronously, inside the publisher's call, so what it
  records is there before the change is acted on. It must be cheap and must not raise (a mark in a set, an append).

Publishers ask ``wants(kind)`` before building a change: with nobody interested it costs one dictionary look-up.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection

import msgspec

from common.errors import SubscriptionClosed
from common.inventory import GpuSample

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


class SamplesTaken(msgspec.Struct, frozen=True, kw_only=True, tag="samples_taken"):
    """A telemetry frame's plausible samples of ``agent_id``'s own GPUs were taken (master/telemetry.py)."""

    agent_id: str
    samples: list[GpuSample]


class AgentWritten(msgspec.Struct, frozen=True, kw_only=True, tag="agent_written"):
    """An agent record was written (a hello, a drain or undrain, a transition: whatever changed it beyond a heartbeat)."""

    agent_id: str


class GpusWritten(msgspec.Struct, frozen=True, kw_only=True, tag="gpus_written"):
    """A host's GPU records were written (a state, a flag, a fault, a GPU withdrawn or added), also when another host
    caused it (a duplicated uuid marks the holder's card)."""

    agent_id: str


class HoldsChanged(msgspec.Struct, frozen=True, kw_only=True, tag="holds_changed"):
    """The GPU holds on host ``agent_id`` changed (master/allocations.py); None: every host's may have (a rebuild)."""

    agent_id: str | None


Change = (
    GpuHealthChanged
    | HostChanged
    | ContainerExited
    | CommandFinished
    | SamplesTaken
    | AgentWritten
    | GpusWritten
    | HoldsChanged
    | Resync
)
ChangeKind = type[
    GpuHealthChanged | HostChanged | ContainerExited | CommandFinished | SamplesTaken | AgentWritten | GpusWritten | HoldsChanged
]
PLACEMENT: tuple[ChangeKind, ...] = (GpuHealthChanged, HostChanged, ContainerExited, CommandFinished)
Listener = Callable[[Change], None]


class Subscription:
    """One subscriber's queue of changes; read with ``await get()`` or ``async for change in subscription``."""

    def __init__(self, feed: ChangeFeed, capacity: int, kinds: frozenset[ChangeKind]) -> None:
        self._feed = feed
        self.kinds = kinds
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
        self._feed._drop(self)
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
        # kind -> who takes it: a queue's ``offer`` or a listener; rebuilt on each (un)subscription, read on each publish
        self._takers: dict[ChangeKind, tuple[Listener, ...]] = {}
        self._listeners: list[tuple[Listener, frozenset[ChangeKind]]] = []

    def subscribe(self, capacity: int = DEFAULT_CAPACITY, *, kinds: Collection[ChangeKind] = PLACEMENT) -> Subscription:
        """A new queue subscriber, seeing every change of ``kinds`` published from now on."""
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        subscription = Subscription(self, capacity, frozenset(kinds))
        self._subscribers.add(subscription)
        self._rebuild()
        return subscription

    def listen(self, listener: Listener, kinds: Collection[ChangeKind]) -> Callable[[], None]:
        """Call ``listener(change)`` synchronously for every change of ``kinds`` published from now on. It must be
        cheap and must not raise. Returns how to stop listening."""
        entry = (listener, frozenset(kinds))
        self._listeners.append(entry)
        self._rebuild()

        def stop() -> None:
            if entry in self._listeners:
                self._listeners.remove(entry)
                self._rebuild()

        return stop

    def _drop(self, subscription: Subscription) -> None:
        self._subscribers.discard(subscription)
        self._rebuild()

    def _rebuild(self) -> None:
        takers: dict[ChangeKind, list[Listener]] = {}
        for subscription in self._subscribers:
            for kind in subscription.kinds:
                takers.setdefault(kind, []).append(subscription.offer)
        for listener, kinds in self._listeners:
            for kind in kinds:
                takers.setdefault(kind, []).append(listener)
        self._takers = {kind: tuple(each) for kind, each in takers.items()}

    @property
    def listening(self) -> bool:
        """Whether anyone is subscribed to anything: ``wants`` says whether anyone takes a given kind."""
        return bool(self._takers)

    def wants(self, kind: ChangeKind) -> bool:
        """Whether anyone takes changes of ``kind``: publishers may skip building one when not."""
        return kind in self._takers

    def publish(self, change: Change) -> None:
        for take in self._takers.get(type(change), ()):  # type: ignore[arg-type]  # a Resync is never published
            take(change)

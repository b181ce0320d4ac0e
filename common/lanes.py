"""Lanes: control before telemetry in one queue, bounded, telemetry coalesced (latest wins); the one queue type
between agent and Master (the relay's buffer towards the Master and the Master's intake of each relay link).

A queue between agent and Master carries two kinds of frame. Control (commands, acks, results, hellos, notices of
agents coming and going, revocations) must all arrive, in order. Telemetry (heartbeats, GPU samples) says only what
its newest frame says: an older sample not yet sent is worth nothing once a newer one of the same source waits. When
one queue carries both in arrival order, a command waits behind every sample queued before it, and under overload
that wait grows without bound (bench/HISTORY.md, "overload").

``LaneQueue`` keeps them apart, sans I/O (the shells that read and write sockets wait on it; it never waits):

- ``pop`` gives the oldest control item while there is one, then the oldest admission item (hellos: agents already
  in come first), then the oldest telemetry item. Each lane is FIFO.
- Control and admission are never dropped. Each is bounded, control by ``control_bytes``, admission by
  ``admission_bytes``: ``push`` returns ``Pushed.FULL`` past its lane's bound and the caller waits (backpressure: it
  stops reading its source). Their bounds are apart so that a storm's hellos (thousands of agents coming back at
  once, several KiB each) do not fill the room of the results behind them: with one shared bound the reader stopped
  at the hellos, and results waited behind them in the socket for as long as the Master took to welcome them.
- ``items`` (when set) bounds the items of all lanes together: past it the oldest waiting telemetry item is evicted
  to make room for the new one; when none is left, control and admission get ``FULL`` and telemetry is dropped
  (``Pushed.DROPPED``, counted as evicted). A ``force``d push (the relay's notices: tiny and few) passes every bound.
- Telemetry never waits. While the telemetry lane holds ``coalesce_bytes`` or more (or always, while ``coalesce``
  is set), a new item whose key (say, agent and frame type) has one waiting replaces it: latest wins. Where it goes
  is the queue's ``replace`` policy: ``IN_PLACE``, into the waiting one's slot, which keeps its turn (the Master's
  intake), or ``LAST``, the waiting one let go and the new one queued last (the relay). Past ``telemetry_bytes`` the
  oldest telemetry items are evicted until the new one fits; an item larger than the lane itself is dropped. Every
  replacement, eviction and forgotten item is counted (``replaced``, ``evicted``, ``forgotten``) and told to
  ``on_drop``, so the loss is never silent.
- A sender that writes items out in batches ``take``s them (the oldest, in ``pop``'s order), writes them, then
  reports ``done``; a failed write ``give_back``s them to the head of their lanes, in order. Items taken still count
  in the lanes' sizes and bounds until done, and are never replaced, evicted, forgotten or withdrawn meanwhile. A
  queue has one reader at a time: ``pop`` does not see what is taken (the relay's sender takes, the intake pops).
- ``source`` (say, an agent) names who pushed an item: ``withdraw_last`` takes back a source's newest item while it
  waits (the relay withdraws the notice of an agent that came and went with nothing said). ``discard`` takes back
  every waiting item a predicate picks; neither counts as a drop (nothing was lost: the item had nothing to say).
  ``pushed`` marks a point in the stream: ``sent_through(mark)`` says whether every item queued before it has left.

Invariants (tests/common/test_lanes.py drives them with hypothesis): the byte count of each lane is the sum of its
items' sizes; the telemetry lane never holds more than ``telemetry_bytes``, nor all lanes together more than
``items`` items unforced; control items come out exactly once, in the order they went in (and taken ones given back
go out again in that order); no admission item comes out while a control item waits, and no telemetry item while a
control or admission item waits; each of control and admission holds at most its bound (or one item); per key,
telemetry comes out in the order it went in; pushed = popped + replaced + evicted + forgotten + waiting.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgspec

T = TypeVar("T")


class Lane(enum.IntEnum):
    """In the order ``pop`` serves them."""

    CONTROL = 0
    ADMISSION = 1  # hellos: taken after the control of agents already in, before any telemetry
    TELEMETRY = 2


_LANES = tuple(Lane)


class Pushed(enum.Enum):
    QUEUED = "queued"
    REPLACED = "replaced"  # a telemetry item took a waiting one's place (latest wins)
    FULL = "full"  # a control or admission item found no room: nothing was queued, wait and push again
    DROPPED = "dropped"  # a telemetry item found no room it could make: let go at once, counted as evicted


class Replace(enum.Enum):
    """Where a telemetry item goes that replaces a waiting one of its key."""

    IN_PLACE = "in_place"  # into the waiting one's slot: the newest sample goes out at the oldest one's turn
    LAST = "last"  # the waiting one is let go and the new one queued last, as if it had never waited


class Drop(enum.StrEnum):
    """Why a telemetry item was let go, as told to ``on_drop``."""

    REPLACED = "replaced"  # a newer one of its key took its place
    EVICTED = "evicted"  # past a bound: ``telemetry_bytes`` or ``items``
    FORGOTTEN = "forgotten"  # ``forget``: its source left


# The members as module constants: in Python 3.11 reading a member off its enum class costs about 150 ns (a descriptor
# call), as much as a third of a push; these are read for every item.
_CONTROL, _ADMISSION, _TELEMETRY = Lane
_QUEUED, _REPLACED, _FULL, _DROPPED = Pushed
_DROP_REPLACED, _DROP_EVICTED, _DROP_FORGOTTEN = Drop


@dataclass(frozen=True, slots=True)
class LaneBounds:
    """What each lane may hold. Defaults fit a Master link: about a second of 10,000 agents' control, and
    a few seconds of their telemetry; no bound on the count of items."""

    control_bytes: int = 8 * 1024 * 1024
    telemetry_bytes: int = 4 * 1024 * 1024
    coalesce_bytes: int = 1024 * 1024
    admission_bytes: int = 64 * 1024 * 1024  # hellos: at most one per agent per connection, a few KiB each
    items: int | None = None  # items in all lanes together (taken and not done included); None: bytes only

    def __post_init__(self) -> None:
        if min(self.control_bytes, self.telemetry_bytes, self.admission_bytes) < 1:
            raise ValueError(
                f"lane bounds must be positive, got {self.control_bytes}, {self.admission_bytes} and {self.telemetry_bytes}"
            )
        if not 0 <= self.coalesce_bytes <= self.telemetry_bytes:
            raise ValueError(f"coalesce_bytes must be between 0 and telemetry_bytes, got {self.coalesce_bytes}")
        if self.items is not None and self.items < 1:
            raise ValueError(f"lane bounds must be positive, got items={self.items}")


class _Slot(msgspec.Struct, Generic[T], gc=False, eq=False):
    """One item and what the queue knows of it. ``live`` until it leaves (done, popped, let go, withdrawn): a slot
    that is not is skipped where it lies and compacted away. ``taken``: handed to a sender, out of its lane.

    A struct made in C, one per item on the hot path of every frame: a third of a Python class's cost to make
    (bench/HISTORY.md, "One queue type"). Out of the collector's sight (``gc=False``): a slot is never part of a
    cycle, as nothing but the queue holds it and its value never holds the queue."""

    value: T
    size: int
    key: Hashable  # telemetry's coalescing key, else None
    source: Hashable
    lane: Lane
    seq: int  # ``pushed`` when it was queued
    live: bool = True
    taken: bool = False


class LaneQueue(Generic[T]):
    """Items of three lanes; see the module docstring for the rules."""

    def __init__(
        self,
        bounds: LaneBounds | None = None,
        *,
        replace: Replace = Replace.IN_PLACE,
        on_drop: Callable[[Drop], None] | None = None,
    ) -> None:
        self.bounds = bounds or LaneBounds()
        self._replace = replace
        self._in_place = replace is Replace.IN_PLACE
        self.coalesce = False  # True: telemetry is coalesced whatever the lane holds (the relay, its Master away)
        self._on_drop = on_drop
        self._lanes: list[deque[_Slot[T]]] = [deque(), deque(), deque()]  # by Lane; slots not live lie here until passed
        self._bytes = [0, 0, 0]  # by Lane: bytes of its items not yet out (taken ones included)
        self._count = [0, 0, 0]  # by Lane: its items not yet out (taken ones included)
        self._latest: dict[Hashable, _Slot[T]] = {}  # key -> its newest waiting telemetry slot (never a taken one)
        self._last_of: dict[Hashable, _Slot[T]] = {}  # source -> the slot of its newest push, while not out
        self._taken: list[_Slot[T]] = []
        self.pushed = 0  # items ever queued: the mark of the next one (``sent_through``)
        self.replaced = 0  # telemetry items let go because a newer one of the same key took their place
        self.evicted = 0  # telemetry items let go to stay under telemetry_bytes or items
        self.forgotten = 0  # telemetry items let go by ``forget`` (their source left)

    @property
    def replace(self) -> Replace:
        """Where a replacing telemetry item goes; fixed when the queue is made."""
        return self._replace

    def __len__(self) -> int:
        """Items not yet out, taken ones included."""
        count = self._count
        return count[0] + count[1] + count[2]

    def bytes(self, lane: Lane) -> int:
        """Bytes in ``lane``, taken ones included."""
        return self._bytes[lane]

    @property
    def control_waiting(self) -> int:
        return self._count[0] + self._count[1]

    @property
    def telemetry_waiting(self) -> int:
        return self._count[2]

    def push(
        self, value: T, lane: Lane, size: int, key: Hashable = None, *, source: Hashable = None, force: bool = False
    ) -> Pushed:
        """Queue ``value`` (``size`` bytes) in ``lane``; ``key`` names a telemetry item's coalescing key (latest wins
        per key), ``source`` who pushed it (``withdraw_last``); ``force``: past every bound."""
        bounds, count = self.bounds, self._count
        if lane is not _TELEMETRY:
            if not force:
                used = self._bytes[lane]
                # One item is always taken when its lane is empty, however large: otherwise it could never pass.
                if used and used + size > (bounds.control_bytes if lane is _CONTROL else bounds.admission_bytes):
                    return _FULL
                if bounds.items is not None and count[0] + count[1] + count[2] >= bounds.items and not self._evict_oldest():
                    return _FULL
            self._append(value, lane, size, None, source)
            return _QUEUED
        pushed = _QUEUED
        older = self._latest.get(key) if key is not None else None
        if older is not None and (self.coalesce or self._bytes[2] >= bounds.coalesce_bytes):
            self._dropped(_DROP_REPLACED)
            if self._in_place:
                self._bytes[2] += size - older.size
                older.value, older.size = value, size
                if older.source is not None and self._last_of.get(older.source) is older:
                    del self._last_of[older.source]  # the slot is the new push's now, and its source's newest
                older.source = source
                if source is not None:
                    self._last_of[source] = older
                self._evict_to_fit(0, keep=older)
                return _REPLACED
            self._retire(older)
            pushed = _REPLACED
        limit = bounds.telemetry_bytes
        if size > limit:  # larger than the lane itself: it can never wait here
            self._dropped(_DROP_EVICTED)
            return _DROPPED
        if self._bytes[2] + size > limit:
            self._evict_to_fit(size)
            if self._bytes[2] + size > limit:  # taken items hold the room
                self._dropped(_DROP_EVICTED)
                return _DROPPED
        if not force and bounds.items is not None and count[0] + count[1] + count[2] >= bounds.items and not self._evict_oldest():
            self._dropped(_DROP_EVICTED)  # the next one of its key will say the same
            return _DROPPED
        self._append(value, lane, size, key, source)
        return pushed

    def pop(self, *, control: bool | None = None) -> tuple[T, Lane] | None:
        """The next item and its lane: control first, then admission, then telemetry; None when empty. ``control``
        True: from the control lane only; False: from the others only (a consumer of each, side by side)."""
        lanes = self._lanes
        if control is not False:
            slot = self._pop_from(lanes[0])
            if slot is not None or control:
                return None if slot is None else (slot.value, _CONTROL)
        slot = self._pop_from(lanes[1]) or self._pop_from(lanes[2])
        return None if slot is None else (slot.value, slot.lane)

    def take(self, max_items: int, max_bytes: int) -> list[T]:
        """The oldest items, in ``pop``'s order, handed to a sender until ``done`` or ``give_back``: at most
        ``max_items`` and, past the first, ``max_bytes`` in all. A take not yet done is given back first."""
        self.give_back()
        taken, latest = self._taken, self._latest
        batch: list[T] = []
        size = 0
        for lane in self._lanes:
            while lane:
                slot = lane[0]
                if not slot.live:
                    lane.popleft()
                    continue
                if batch and (len(batch) >= max_items or size + slot.size > max_bytes):
                    return batch
                lane.popleft()
                slot.taken = True
                taken.append(slot)
                batch.append(slot.value)
                size += slot.size
                if slot.key is not None and latest.get(slot.key) is slot:
                    del latest[slot.key]  # on its way out: a newer one of its key waits apart
        return batch

    def done(self) -> None:
        """What was taken went out."""
        for slot in self._taken:
            slot.taken = False
            self._retire(slot)
        self._taken = []
        for lane in _LANES:
            self._compact(lane)

    def give_back(self) -> None:
        """What was taken did not go out: back to the head of its lanes, in order, as if never taken."""
        taken, latest = self._taken, self._latest
        if not taken:
            return
        self._taken = []
        for slot in reversed(taken):
            slot.taken = False
            self._lanes[slot.lane].appendleft(slot)
            if slot.key is not None and slot.key not in latest:
                latest[slot.key] = slot

    def forget(self, key: Hashable) -> bool:
        """Let go of the newest waiting telemetry item of ``key`` (say, of an agent that left); whether there was one."""
        slot = self._latest.get(key)
        if slot is None:
            return False
        self._retire(slot)
        self._dropped(_DROP_FORGOTTEN)
        return True

    def withdraw_last(self, source: Hashable, where: Callable[[T], bool]) -> bool:
        """Take back ``source``'s newest item if it still waits (not taken) and ``where`` picks it; whether it did."""
        slot = self._last_of.get(source)
        if slot is None or not slot.live or slot.taken or not where(slot.value):
            return False
        self._retire(slot)
        return True

    def discard(self, where: Callable[[T], bool]) -> int:
        """Take back every waiting item (not taken) that ``where`` picks; how many."""
        gone = 0
        for lane in _LANES:
            for slot in self._lanes[lane]:
                if slot.live and where(slot.value):
                    self._retire(slot)
                    gone += 1
            self._compact(lane)
        return gone

    def in_order(self) -> list[T]:
        """Every item not yet out, in the order they go: per lane, the taken ones first (they are its head)."""
        out: list[T] = []
        for lane in _LANES:
            out.extend(slot.value for slot in self._taken if slot.lane == lane)
            out.extend(slot.value for slot in self._lanes[lane] if slot.live)
        return out

    def sent_through(self, mark: int) -> bool:
        """Whether no item queued before ``mark`` (a value of ``pushed``) is still in (a replaced-in-place item keeps
        its slot's mark)."""
        if any(slot.seq < mark for slot in self._taken):
            return False
        for lane in self._lanes:
            for slot in lane:
                if slot.live:
                    if slot.seq < mark:
                        return False
                    break
        return True

    def _append(self, value: T, lane: Lane, size: int, key: Hashable, source: Hashable) -> None:
        slot = _Slot(value, size, key, source, lane, self.pushed)
        self.pushed += 1
        queue = self._lanes[lane]
        queue.append(slot)
        self._bytes[lane] += size
        count = self._count[lane] = self._count[lane] + 1
        if key is not None:
            self._latest[key] = slot
        if source is not None:
            self._last_of[source] = slot
        if len(queue) > 2 * count + 1024:  # slots let go where they lay must not pile up
            self._compact(lane)

    def _pop_from(self, queue: deque[_Slot[T]]) -> _Slot[T] | None:
        while queue:
            slot = queue.popleft()
            if slot.live:
                self._retire(slot)
                return slot
        return None

    def _evict_to_fit(self, size: int, keep: _Slot[T] | None = None) -> None:
        """Evict the oldest telemetry until ``size`` more bytes fit; ``keep`` (a slot just refreshed) goes last."""
        limit, queue = self.bounds.telemetry_bytes, self._lanes[2]
        kept: _Slot[T] | None = None
        while self._bytes[2] + size > limit and queue:
            slot = queue.popleft()
            if not slot.live:
                continue
            if slot is keep:
                kept = slot
                continue
            self._retire(slot)
            self._dropped(_DROP_EVICTED)
        if kept is not None:
            if self._bytes[2] > limit:  # alone it is still too large
                self._retire(kept)
                self._dropped(_DROP_EVICTED)
            else:
                queue.appendleft(kept)  # all older ones went: it is the head again

    def _evict_oldest(self) -> bool:
        """Evict the oldest waiting telemetry item to make room for another; whether there was one."""
        slot = self._pop_from(self._lanes[2])
        if slot is None:
            return False
        self._dropped(_DROP_EVICTED)
        return True

    def _retire(self, slot: _Slot[T]) -> None:
        slot.live = False
        lane = slot.lane
        self._bytes[lane] -= slot.size
        self._count[lane] -= 1
        if slot.key is not None and self._latest.get(slot.key) is slot:
            del self._latest[slot.key]
        if slot.source is not None and self._last_of.get(slot.source) is slot:
            del self._last_of[slot.source]

    def _dropped(self, why: Drop) -> None:
        if why is _DROP_REPLACED:
            self.replaced += 1
        elif why is _DROP_EVICTED:
            self.evicted += 1
        else:
            self.forgotten += 1
        if self._on_drop is not None:
            self._on_drop(why)

    def _compact(self, lane: Lane) -> None:
        queue = self._lanes[lane]
        if len(queue) > 2 * self._count[lane] + 1024:
            self._lanes[lane] = deque(slot for slot in queue if slot.live)

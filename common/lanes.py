"""Lanes: control before telemetry in one queue, bounded in bytes, telemetry coalesced (latest wins).

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
- Telemetry never waits. While the telemetry lane holds ``coalesce_bytes`` or more, a new item whose key (say,
  agent and frame type) has one waiting replaces it in place: latest wins, the waiting slot keeps its turn. Past
  ``telemetry_bytes`` the oldest telemetry items are evicted until the new one fits. Every replacement and eviction
  is counted (``replaced``, ``evicted``), so the loss is never silent.

Invariants (tests/common/test_lanes.py drives them with hypothesis): the byte count of each lane is the sum of its
items' sizes; the telemetry lane never holds more than ``telemetry_bytes``; control items come out exactly once, in
the order they went in; no admission item comes out while a control item waits, and no telemetry item while a
control or admission item waits; each of control and admission holds at most its bound (or one item); per key, telemetry
comes out in the order it went in; pushed = popped + replaced + evicted + forgotten + waiting.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class Lane(enum.IntEnum):
    """In the order ``pop`` serves them."""

    CONTROL = 0
    ADMISSION = 1  # hellos: taken after the control of agents already in, before any telemetry
    TELEMETRY = 2


class Pushed(enum.Enum):
    QUEUED = "queued"
    REPLACED = "replaced"  # a telemetry item took a waiting one's place (latest wins)
    FULL = "full"  # a control or admission item found no room: nothing was queued, wait and push again


@dataclass(frozen=True, slots=True)
class LaneBounds:
    """Bytes each lane may hold. Defaults fit a Master link: about a second of 10,000 agents' control, and
    a few seconds of their telemetry."""

    control_bytes: int = 8 * 1024 * 1024
    telemetry_bytes: int = 4 * 1024 * 1024
    coalesce_bytes: int = 1024 * 1024
    admission_bytes: int = 64 * 1024 * 1024  # hellos: at most one per agent per connection, a few KiB each

    def __post_init__(self) -> None:
        if min(self.control_bytes, self.telemetry_bytes, self.admission_bytes) < 1:
            raise ValueError(
                f"lane bounds must be positive, got {self.control_bytes}, {self.admission_bytes} and {self.telemetry_bytes}"
            )
        if not 0 <= self.coalesce_bytes <= self.telemetry_bytes:
            raise ValueError(f"coalesce_bytes must be between 0 and telemetry_bytes, got {self.coalesce_bytes}")


@dataclass(eq=False, slots=True)
class _Slot(Generic[T]):
    value: T
    size: int
    key: Hashable
    live: bool = True


class LaneQueue(Generic[T]):
    """Items of three lanes; see the module docstring for the rules."""

    def __init__(self, bounds: LaneBounds | None = None) -> None:
        self.bounds = bounds or LaneBounds()
        self._control: deque[tuple[T, int]] = deque()
        self._admission: deque[tuple[T, int]] = deque()
        self._telemetry: deque[_Slot[T]] = deque()
        self._latest: dict[Hashable, _Slot[T]] = {}  # key -> its newest waiting telemetry slot
        self._control_bytes = 0
        self._admission_bytes = 0
        self._telemetry_bytes = 0
        self._telemetry_live = 0
        self.replaced = 0  # telemetry items let go because a newer one of the same key took their place
        self.evicted = 0  # telemetry items let go to stay under telemetry_bytes
        self.forgotten = 0  # telemetry items let go by ``forget`` (their source left)

    def __len__(self) -> int:
        return len(self._control) + len(self._admission) + self._telemetry_live

    def bytes(self, lane: Lane) -> int:
        """Bytes waiting in ``lane``."""
        if lane is Lane.TELEMETRY:
            return self._telemetry_bytes
        return self._control_bytes if lane is Lane.CONTROL else self._admission_bytes

    @property
    def control_waiting(self) -> int:
        return len(self._control) + len(self._admission)

    @property
    def telemetry_waiting(self) -> int:
        return self._telemetry_live

    def push(self, value: T, lane: Lane, size: int, key: Hashable = None) -> Pushed:
        """Queue ``value`` (``size`` bytes) in ``lane``; ``key`` names a telemetry item's source (latest wins per key)."""
        if lane is Lane.CONTROL:
            # One item is always taken when its lane is empty, however large: otherwise it could never pass.
            if self._control_bytes and self._control_bytes + size > self.bounds.control_bytes:
                return Pushed.FULL
            self._control.append((value, size))
            self._control_bytes += size
            return Pushed.QUEUED
        if lane is Lane.ADMISSION:
            if self._admission_bytes and self._admission_bytes + size > self.bounds.admission_bytes:
                return Pushed.FULL
            self._admission.append((value, size))
            self._admission_bytes += size
            return Pushed.QUEUED
        return self._push_telemetry(value, size, key)

    def pop(self, *, control: bool | None = None) -> tuple[T, Lane] | None:
        """The next item and its lane: control first, then admission, then telemetry; None when empty. ``control``
        True: from the control lane only; False: from the others only (a consumer of each, side by side)."""
        if self._control and control is not False:
            value, size = self._control.popleft()
            self._control_bytes -= size
            return value, Lane.CONTROL
        if control:
            return None
        if self._admission:
            value, size = self._admission.popleft()
            self._admission_bytes -= size
            return value, Lane.ADMISSION
        while self._telemetry:
            slot = self._telemetry.popleft()
            if slot.live:
                self._retire(slot)
                return slot.value, Lane.TELEMETRY
        return None

    def forget(self, key: Hashable) -> bool:
        """Let go of the newest waiting telemetry item of ``key`` (say, of an agent that left); whether there was one."""
        slot = self._latest.get(key)
        if slot is None:
            return False
        self._retire(slot)
        self.forgotten += 1
        return True

    def _push_telemetry(self, value: T, size: int, key: Hashable) -> Pushed:
        older = self._latest.get(key) if key is not None else None
        if older is not None and self._telemetry_bytes >= self.bounds.coalesce_bytes:
            self._telemetry_bytes += size - older.size
            older.value, older.size = value, size
            self.replaced += 1
            self._evict_to_fit(0, keep=older)
            return Pushed.REPLACED
        if size > self.bounds.telemetry_bytes:
            self.evicted += 1  # larger than the lane itself: it can never wait here
            return Pushed.QUEUED
        self._evict_to_fit(size)
        slot = _Slot(value, size, key)
        self._telemetry.append(slot)
        self._telemetry_bytes += size
        self._telemetry_live += 1
        if key is not None:
            self._latest[key] = slot
        return Pushed.QUEUED

    def _evict_to_fit(self, size: int, keep: _Slot[T] | None = None) -> None:
        """Evict the oldest telemetry until ``size`` more bytes fit; ``keep`` (a slot just refreshed) goes last."""
        limit = self.bounds.telemetry_bytes
        kept: _Slot[T] | None = None
        while self._telemetry_bytes + size > limit and self._telemetry:
            slot = self._telemetry.popleft()
            if not slot.live:
                continue
            if slot is keep:
                kept = slot
                continue
            self._retire(slot)
            self.evicted += 1
        if kept is not None:
            if self._telemetry_bytes > limit:  # alone it is still too large
                self._retire(kept)
                self.evicted += 1
            else:
                self._telemetry.appendleft(kept)  # all older ones went: it is the head again
        if len(self._telemetry) > 2 * self._telemetry_live + 1024:  # forgotten slots must not pile up
            self._telemetry = deque(slot for slot in self._telemetry if slot.live)

    def _retire(self, slot: _Slot[T]) -> None:
        slot.live = False
        self._telemetry_bytes -= slot.size
        self._telemetry_live -= 1
        if slot.key is not None and self._latest.get(slot.key) is slot:
            del self._latest[slot.key]

"""The Master's intake of one relay link: frames read at once, handled control first.

A relay link used to be read one message at a time and each frame handled before the next message was read: while
the Master was slower than its relays, whole batches of heartbeats waited in the socket, in websockets' queue and in
the relay's buffer ahead of every command result (bench/HISTORY.md, "overload"). Now a reader task takes each
message as it arrives, decodes it and sorts its frames into a ``LaneQueue`` (common/lanes.py); two handler tasks
take them out, one the control lane, the other admission then telemetry, so that a result is handled while a hello is
(a hello's store writes took 0.4-2 s in a storm, and results waited behind it); two frames of one agent are never
handled at once, and an agent's frames are handled in the order one task would have taken them. Each agent frame
kind's lane is declared with its frame (common/wire.py ``lane``); today:

- control: command acks and results, events, agents connecting and leaving, enrollment, the relay's stats;
- admission: hellos (after the control of agents already in, before any telemetry); hellos of different agents are
  handled up to ``ADMIT_AT_ONCE`` at once beside the handler (each waits on the store, and their writes join:
  master/batches.py ``GroupWrite``), each agent still marked as handled from the start, so its next frame waits;
- telemetry: heartbeats and telemetry, keyed by (agent, type): past the coalescing bound the newest of an agent
  replaces its waiting one, past the byte bound the oldest go; every frame let go is counted (``IntakeCounters``).

An agent's frame type is read from the head of its JSON (``{"type":"heartbeat"``, as every agent writes it): a frame
that hides its type further in is taken as control, which only gives it an earlier turn. When an agent leaves
(``agent_disconnected``), its waiting telemetry goes (counted as forgotten): the Master would ignore it anyway.

Liveness: the time each agent's frame was last read here goes into ``heard`` (agent id -> wall time), whatever lane
it waits in and whether it is handled at all. The Master judges an agent's silence on that too (master/upkeep.py):
a heartbeat that waits behind control, or is replaced by a newer one, still says its agent is there. Judged on
handled heartbeats alone, an overloaded Master sent agents offline for its own delay, forgot their sessions, asked
each for a new hello and so made the overload worse (bench/HISTORY.md, "Overload").

Backpressure: when the control lane or the admission lane is full (``LaneBounds.control_bytes``,
``admission_bytes``: apart, so that a storm's hellos do not stop the reading of results), the reader waits before
reading on, so TCP slows the relay down; telemetry never makes it wait. When the link closes, the control still waiting is
handled before the link's close is (results must not be lost); telemetry still waiting is let go, counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import get_args

import msgspec

from common.errors import ProtocolError
from common.lanes import Lane, LaneBounds, LaneQueue, Pushed
from common.wire import (
    LANE_OF_KIND,
    TELEMETRY_KINDS,
    AgentDisconnected,
    AgentFrame,
    AgentReports,
    LinkFrame,
    Relay,
    ReportFold,
    Telemetry,
    decode_link_message,
    tag_of,
)

log = logging.getLogger(__name__)

# An agent frame's JSON as agents encode it starts with its tag: a bounded prefix tells its lane, as each frame kind
# declares it (common/wire.py). Control needs no prefix: a frame no prefix names is control.
_AGENT_KINDS = frozenset(tag_of(frame) for frame in get_args(AgentFrame))
_PREFIX_LANES = {
    f'{{"type":"{kind}"'.encode(): (lane, kind)
    for kind, lane in sorted(LANE_OF_KIND.items(), key=lambda item: -item[1])  # telemetry first: the most frequent
    if lane is not Lane.CONTROL and kind in _AGENT_KINDS
}
_PREFIX_BYTES = max(len(prefix) for prefix in _PREFIX_LANES)
NOTICE_BYTES = 128  # what a link frame that carries no agent frame is counted as
# What a fold is counted as in the telemetry lane's byte bound, roughly: per agent named, per sample.
FOLD_AGENT_BYTES, FOLD_SAMPLE_BYTES = 48, 160
# Frames handled between yields to the event loop, so that the reader (and other links) keep going.
HANDLE_SLICE = 64
# Hellos of different agents handled at once on one link: a hello waits on the store (its events, GPUs and agent
# record), and one at a time a link's ramp went at the store's round trip, not its throughput (50 hellos/s on a loaded
# machine, bench/HISTORY.md "100,000 agents"); at once, their writes join (master/batches.py ``GroupWrite``).
ADMIT_AT_ONCE = 32


@dataclass(slots=True)
class IntakeCounters:
    """Totals over every link of this Master, for metrics and the pacer."""

    frames: int = 0
    replaced: int = 0
    evicted: int = 0
    forgotten: int = 0
    waits: int = 0  # times a reader waited for room in the control lanes (backpressure)
    busy_s: float = 0.0  # time the links' handlers spent handling frames, store waits included (master/pacing.py)

    @property
    def shed(self) -> int:
        return self.replaced + self.evicted


def lane_of(frame: LinkFrame) -> tuple[Lane, tuple[str, str] | None, int]:
    """The lane of a link frame, its coalescing key (telemetry only) and its size in bytes, roughly. A frame of the
    relay's own (a notice, stats, enrollment) is control."""
    if isinstance(frame, ReportFold):
        return Lane.TELEMETRY, None, fold_size(frame)  # no key: a fold is never replaced by the next one
    if not isinstance(frame, Relay):
        return Lane.CONTROL, None, NOTICE_BYTES
    inner = memoryview(frame.frame)
    head = bytes(inner[:_PREFIX_BYTES])
    size = len(inner) + NOTICE_BYTES
    for prefix, (lane, kind) in _PREFIX_LANES.items():
        if head.startswith(prefix):
            return lane, ((frame.agent_id, kind) if lane is Lane.TELEMETRY else None), size
    return Lane.CONTROL, None, size


def fold_size(fold: ReportFold) -> int:
    """A fold's size in the lanes' byte bounds, roughly (its decoded form holds no bytes to measure)."""
    named = len(fold.alive) + len(fold.reports)
    samples = sum(len(f.samples) + 1 if isinstance(f, Telemetry) else 2 for r in fold.reports for f in r.frames)
    return NOTICE_BYTES + FOLD_AGENT_BYTES * named + FOLD_SAMPLE_BYTES * samples


def fold_agents(fold: ReportFold) -> list[str]:
    """Every agent a fold names."""
    return [*fold.alive, *(report.agent_id for report in fold.reports)]


def detached(frame: Relay) -> Relay:
    """``frame`` holding only its own bytes: a decoded ``Raw`` is a view that keeps its whole message alive (a batch,
    up to a MiB), so one waiting heartbeat would hold its batch, and the lanes' byte bounds would bound nothing."""
    return Relay(agent_id=frame.agent_id, frame=msgspec.Raw(bytes(frame.frame)))


Handler = Callable[[LinkFrame | AgentReports], Awaitable[None]]
OnBadFrame = Callable[[ProtocolError], Awaitable[None]]


class LinkIntake:
    """One link's lanes, between its reader (``take``) and its handler task (``run``)."""

    def __init__(
        self,
        handle: Handler,
        on_bad_frame: OnBadFrame,
        bounds: LaneBounds,
        counters: IntakeCounters,
        heard: dict[str, float] | None = None,
        agents: Collection[str] | None = None,
        *,
        alive: Callable[[str], bool] | None = None,
    ) -> None:
        self._handle = handle
        # A fold's alive name handled at once, synchronously, when its agent's turn is free and that is all it asks
        # (master/agent_channel.py ``alive_at_once``); whether it was. None: every name goes through ``_handle``.
        self._alive = alive
        # The agents the link speaks for now (its ``AccessLink.agents``): a fold may still name one that left (it was
        # folded before), which is not heard of; None: every agent named is.
        self._agents = agents
        self.heard: dict[str, float] = heard if heard is not None else {}  # agent id -> when a frame of it was last read
        self._on_bad_frame = on_bad_frame
        self.queue: LaneQueue[LinkFrame | ProtocolError] = LaneQueue(bounds)
        self._counters = counters
        self._ready = {True: asyncio.Event(), False: asyncio.Event()}  # control's handler, the others' handler
        # Agents with a frame being handled, and the count of each agent's control frames not handled yet (in the lane
        # or waiting for their turn); a frame of an agent waits its turn while either says so (``_in_turn``), woken by
        # ``_turn`` at each frame's end.
        self._handling: set[str] = set()
        self._control_of: dict[str, int] = {}
        self._turn = asyncio.Event()
        self._turn_waiters = 0
        self._admitting: set[asyncio.Task[None]] = set()  # hellos being handled beside the handler (``_admit``)
        self._admit_room = asyncio.Semaphore(ADMIT_AT_ONCE)
        self._room = asyncio.Event()
        self._closed = False
        self._seen = (0, 0, 0)  # the queue's replaced, evicted, forgotten already added to the counters
        # Backpressure: while the reader waits for room it reads nothing, so nothing of its agents is heard either.
        self.stalled_since: float | None = None  # wall time the reader began waiting, while it waits
        self.stalled_until = 0.0  # wall time its last wait ended

    async def take(self, message: bytes | str) -> None:
        """Sort one message's frames into the lanes; waits while the control lanes are full."""
        now, heard = time.time(), self.heard
        for frame in decode_link_message(message):
            if isinstance(frame, ProtocolError):
                lane, key, size = Lane.CONTROL, None, NOTICE_BYTES
            else:
                lane, key, size = lane_of(frame)
                if isinstance(frame, Relay):
                    heard[frame.agent_id] = now
                    frame = detached(frame)
                elif isinstance(frame, ReportFold):
                    self._hear_fold(frame, now)
                elif isinstance(frame, AgentDisconnected):
                    heard.pop(frame.agent_id, None)
                    for kind in TELEMETRY_KINDS:
                        self.queue.forget((frame.agent_id, kind))
            agent_id = getattr(frame, "agent_id", None)
            while self.queue.push(frame, lane, size, key) is Pushed.FULL:
                self._counters.waits += 1
                self._room.clear()
                self._wake()
                self.stalled_since = self.stalled_since or time.time()
                try:
                    await self._room.wait()
                finally:
                    self.stalled_since, self.stalled_until = None, time.time()
            if lane is Lane.CONTROL and isinstance(agent_id, str):
                self._control_of[agent_id] = self._control_of.get(agent_id, 0) + 1
            self._counters.frames += 1
        self._sync_counters()
        self._wake()

    def _hear_fold(self, fold: ReportFold, now: float) -> None:
        """Every agent a fold names is heard now, as if each of its frames had been read here."""
        agents, heard = self._agents, self.heard
        for agent_id in fold_agents(fold):
            if agents is None or agent_id in agents:
                heard[agent_id] = now

    def backlogged(self, coalesce_bytes: int, *, folds: bool) -> bool:
        """Whether telemetry waits here past what the Master drains by itself (the pacer's backlog, master/pacing.py):
        ``coalesce_bytes`` of frames from a relay that does not fold; from one that folds, a second fold (the Master
        is an interval behind). One fold of 10,000 agents is counted as about 1.6 MB: a single fold waiting, as one
        does whenever it arrives, read as a backlog and kept a 25,000-agent grid paced down eightfold
        (bench/HISTORY.md, "100,000 agents")."""
        if folds:
            return self.queue.telemetry_waiting > 1
        return self.queue.bytes(Lane.TELEMETRY) >= coalesce_bytes

    def stalled_within(self, now: float, window_s: float) -> bool:
        """Whether the reader waited for room at any time in the last ``window_s`` seconds (or waits now)."""
        return self.stalled_since is not None or now - self.stalled_until < window_s

    def close(self) -> None:
        """No more frames come: ``run`` handles the control still waiting, lets telemetry go, and returns."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        self._ready[True].set()
        self._ready[False].set()

    async def run(self) -> None:
        """Handle frames until closed and the control and admission lanes are empty: the control lane in one task,
        hellos then telemetry in another, so that a command's result never waits for a hello being handled (its
        store writes: 0.4-2 s in a storm, bench/HISTORY.md). Two frames of one agent are never handled at once."""
        tasks = [
            asyncio.create_task(self._serve(control=True), name="intake-control"),
            asyncio.create_task(self._serve(control=False), name="intake-admission"),
        ]
        try:
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for task in [*tasks, *self._admitting]:
                task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done:
            task.result()  # a handler's exception, as the link's handler task had it before

    async def _serve(self, *, control: bool) -> None:
        handled, ready = 0, self._ready[control]
        while True:
            got = self.queue.pop(control=control)
            if got is None:  # (room is made by a pop, never here: the reader may wait for the other handler's lane)
                if self._closed:
                    await self._admitted()
                    return
                ready.clear()
                await ready.wait()
                continue
            frame, lane = got
            agent_id = getattr(frame, "agent_id", None)
            if lane is Lane.TELEMETRY and self._closed:
                await self._admitted()
                self._let_go_telemetry()
                return
            self._room.set()
            began = time.perf_counter()
            if lane is Lane.ADMISSION and isinstance(agent_id, str) and await self._admitted_aside(frame, agent_id):
                pass
            elif isinstance(frame, ReportFold):
                await self._unfold(frame)  # it counts its own busy time: it yields between slices of agents
            else:
                try:
                    await self._in_turn(frame, control=control)  # its store writes included: what bounds the Master
                finally:
                    if lane is Lane.CONTROL and isinstance(agent_id, str):
                        self._control_done(agent_id)
                self._counters.busy_s += time.perf_counter() - began
            handled += 1
            if handled % HANDLE_SLICE == 0:
                self._sync_counters()
                await asyncio.sleep(0)

    def _control_done(self, agent_id: str) -> None:
        """A control frame of ``agent_id`` was handled: counted in ``_control_of`` until now, not only until it left
        the lane, so that the agent's hello or telemetry never overtakes it while it waits for its turn."""
        left = self._control_of.pop(agent_id) - 1
        if left:
            self._control_of[agent_id] = left
        elif self._turn_waiters:
            self._turn.set()
            self._turn = asyncio.Event()

    async def _admitted_aside(self, frame: LinkFrame | ProtocolError, agent_id: str) -> bool:
        """Start handling a hello beside the handler (once there is room: ``ADMIT_AT_ONCE``) when its agent has no
        frame being handled and no control frame waiting, which it would otherwise wait for (``_in_turn``); whether
        it was. The agent is marked as handled at once, so that its next frame waits for the hello."""
        await self._admit_room.acquire()
        if agent_id in self._handling or agent_id in self._control_of:
            self._admit_room.release()
            return False
        self._handling.add(agent_id)
        task = asyncio.create_task(self._admit(frame, agent_id), name=f"admit-{agent_id}")
        self._admitting.add(task)
        task.add_done_callback(self._admitting.discard)
        return True

    async def _admit(self, frame: LinkFrame | ProtocolError, agent_id: str) -> None:
        """One hello, handled beside the handler (up to ``ADMIT_AT_ONCE`` at once), its agent marked as handled."""
        began = time.perf_counter()
        try:
            await self._handle_one(frame)
        finally:
            self._counters.busy_s += time.perf_counter() - began
            self._handling.discard(agent_id)
            self._admit_room.release()
            if self._turn_waiters:
                self._turn.set()
                self._turn = asyncio.Event()

    async def _admitted(self) -> None:
        """Wait for the hellos being handled beside the handler (the link closes: they end before its close)."""
        while self._admitting:
            await asyncio.gather(*list(self._admitting), return_exceptions=True)

    async def _unfold(self, fold: ReportFold) -> None:
        """A fold's agents one by one, each in its turn as its frames one by one would have been: never while another
        frame of the agent is handled or a control frame of it waits, so a command's result is never held behind a
        fold, and a fold behind a result holds up only that agent's part of it."""
        handled, counters, began = 0, self._counters, time.perf_counter()
        alive, in_hand, control_of = self._alive, self._handling, self._control_of
        names: Iterable[str | AgentReports] = itertools.chain(fold.alive, fold.reports)
        for named in names:
            if isinstance(named, str):
                # Its turn is free (nothing of it in hand, no control of it waiting) and the name asks only what
                # ``alive`` does at once: no coroutine, no report object. Else in its turn, as any other.
                if alive is None or named in in_hand or named in control_of or not alive(named):
                    await self._in_turn(AgentReports(agent_id=named), control=False)
            else:
                await self._in_turn(named, control=False)
            handled += 1
            if handled % HANDLE_SLICE == 0:  # the Master's busy time, not the others' turns in between (pacing)
                counters.busy_s += time.perf_counter() - began
                await asyncio.sleep(0)
                began = time.perf_counter()
        counters.busy_s += time.perf_counter() - began

    async def _in_turn(self, frame: LinkFrame | AgentReports | ProtocolError, *, control: bool) -> None:
        """Handle ``frame`` in its agent's turn, keeping the order one handler taking control first had: never while
        another frame of its agent is handled, and a hello or telemetry never while a control frame of its agent waits
        (an agent's ``agent_connected`` is handled before its hello, its results before a hello read after them)."""
        agent_id = getattr(frame, "agent_id", None)
        if not isinstance(agent_id, str):
            await self._handle_one(frame)
            return
        while agent_id in self._handling or (not control and agent_id in self._control_of):
            self._turn_waiters += 1
            try:
                await self._turn.wait()
            finally:
                self._turn_waiters -= 1
        self._handling.add(agent_id)
        try:
            await self._handle_one(frame)
        finally:
            self._handling.discard(agent_id)
            if self._turn_waiters:  # a fresh event per frame only when someone waits for one
                self._turn.set()
                self._turn = asyncio.Event()

    def _let_go_telemetry(self) -> None:
        left = 1 + self.queue.telemetry_waiting
        while self.queue.pop(control=False) is not None:
            pass
        self.queue.forgotten += left
        self._sync_counters()

    async def _handle_one(self, frame: LinkFrame | AgentReports | ProtocolError) -> None:
        if isinstance(frame, ProtocolError):
            await self._on_bad_frame(frame)
            return
        await self._handle(frame)

    def _sync_counters(self) -> None:
        """Add what this link's queue let go since the last sync to the Master's totals."""
        queue, counters = self.queue, self._counters
        replaced, evicted, forgotten = self._seen
        counters.replaced += queue.replaced - replaced
        counters.evicted += queue.evicted - evicted
        counters.forgotten += queue.forgotten - forgotten
        self._seen = (queue.replaced, queue.evicted, queue.forgotten)

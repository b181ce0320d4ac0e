"""Interpreter settings for the daemons, which hold the state of thousands of peers for days: the garbage collector
and, where a worker thread shares the interpreter with the event loop, the switch interval.

CPython's default (a young collection every 700 net allocations) promotes any object that lives a few
milliseconds, such as a frame waiting for its upstream write, into the oldest generation; once those
promotions add up to a quarter of the heap, a full collection walks every object of every connection and
stops the event loop for as long as that takes (about a second for 5,000 agent links on one relay core,
bench/HISTORY.md). Rarer young collections let such objects die young, so full collections come with real
growth of the heap and not with steady traffic. What is alive at start-up (modules, classes, configuration)
never becomes garbage, so it is frozen out of every later collection.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)
# Young collections between middle ones (CPython's default: 10). A middle collection walks everything that survived
# the young ones since the last: after the Master admitted 10,000 agents, 20 young collections' worth was half a
# million objects (their GPU records, sessions and buckets), walked in one 180-530 ms pause a few seconds into the
# bench's hold. At 5 the same objects are walked in pauses a quarter as long, most of them while the agents come in.
MIDDLE_THRESHOLD = 5
OLD_THRESHOLD = 10  # CPython's default; a full collection also waits for 25% growth of the old generation


def tune_for_daemon(*, freeze_survivors: bool = False) -> None:
    """Call once, after imports and before serving. ``freeze_survivors``: the daemon's heap is mostly state that lives
    as long as the process (the Master's agents, GPUs and their aggregates): each full collection's survivors are frozen
    out of the next ones (``SurvivorFreezer``)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    if freeze_survivors:
        SurvivorFreezer.install()


@dataclass(frozen=True)
class CompletePolicy:
    """When a full collection should walk the frozen objects too (a complete collection, which frees the cyclic
    garbage among them): once they have grown ``growth`` times over since the last one, and, above ``floor_objects``
    (where a complete collection's pause starts to matter), no sooner than ``min_interval_s`` after it."""

    growth: float = 2.0
    # With a floor of 1,000,000 a complete collection in a ramp to 30,000 agents held the Master's loop 908 ms (bench
    # fleet, 3 simulated relays), where the full collections around it took 300-370 ms.
    floor_objects: int = 250_000
    min_interval_s: float = 6 * 3600.0

    def due(self, frozen: int, frozen_after_complete: int, since_complete_s: float) -> bool:
        if frozen < self.growth * max(frozen_after_complete, 1):
            return False
        return frozen < self.floor_objects or since_complete_s >= self.min_interval_s


@dataclass
class SurvivorFreezer:
    """Freezes what each full collection leaves alive, so the next one walks only what was promoted since.

    A full collection walks every object of the oldest generation with the event loop held. At 100,000 agents the
    Master's heap is millions of objects (each agent's record, eight GPU records with their inventory, its session and
    minute aggregates) that live as long as the process, and its full collections held the loop 9.9 and 18.5 s
    (docs/capacity.md). Frozen after one collection, they are not walked again: the next full collection costs what
    was promoted since, which the thresholds bound (YOUNG_THRESHOLD x MIDDLE_THRESHOLD x OLD_THRESHOLD allocations).

    The price: an object frozen while alive that later dies in a reference cycle is not freed by later full
    collections (objects freed by their reference count, most of them, are freed as ever). So when the frozen objects
    have doubled since the last complete collection (and, above a quarter of a million objects, six hours have passed:
    ``CompletePolicy``), they are unfrozen after a full collection, the next full collection walks them all (a long pause, at most
    four a day, each after the heap doubled), and its survivors are frozen again. A collection's callback cannot start
    one (the collector is busy), hence "the next". ``gc.get_freeze_count()`` says how many are frozen.
    """

    policy: CompletePolicy = field(default_factory=CompletePolicy)
    clock: Callable[[], float] = time.monotonic
    frozen_after_complete: int = 0
    completed_at: float = field(default=0.0)
    complete_next: bool = False
    completes: int = 0

    def __post_init__(self) -> None:
        self.completed_at = self.clock()
        self.frozen_after_complete = gc.get_freeze_count()

    @classmethod
    def install(cls, policy: CompletePolicy | None = None) -> SurvivorFreezer:
        """One per process, in ``gc.callbacks`` (a second call returns the first one)."""
        for callback in gc.callbacks:
            owner = getattr(callback, "__self__", None)
            if isinstance(owner, SurvivorFreezer):
                return owner
        freezer = cls(policy or CompletePolicy())
        gc.callbacks.append(freezer.on_gc)
        return freezer

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase != "stop" or info.get("generation") != 2:
            return
        now = self.clock()
        if self.complete_next:  # this collection walked the unfrozen objects too
            self.complete_next = False
            gc.freeze()
            self.frozen_after_complete, self.completed_at = gc.get_freeze_count(), now
            self.completes += 1
            return
        gc.freeze()
        if self.policy.due(gc.get_freeze_count(), self.frozen_after_complete, now - self.completed_at):
            gc.unfreeze()  # into the oldest generation: the next full collection walks them
            self.complete_next = True


# How long a thread may keep the interpreter lock while another waits for it (CPython's default: 5 ms).
SWITCH_INTERVAL_S = 0.001


def share_the_interpreter_quickly() -> None:
    """For a daemon whose event loop shares the interpreter with a busy worker thread (the Master's store thread):
    each time the loop gives the lock up for a socket call, it waits up to the switch interval to get it back while
    the worker is busy in Python code. At CPython's 5 ms, a loop with dozens of socket calls a turn crawled whenever
    the store wrote a batch; at 1 ms the worker gives way sooner, at the cost of more switches (bench/HISTORY.md)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim  # a CDLL call lets go of the interpreter lock while it runs
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_MALLOC_TRIM = _find_malloc_trim()


def release_free_memory() -> bool:
    """Hand the C heap's free pages back to the kernel; whether any were (False where the C library cannot).

    Python keeps its small objects in arenas of its own, but everything larger (a dict of 80,000 GPUs, a list of a
    minute's rollups, a frame's bytes, the store's pages) comes from the C library's heap. glibc returns memory to the
    kernel only from the top of that heap, so the free space a minute's flush leaves between blocks still in use stays
    in the daemon's RSS: 24-48 MB of the Master's at 10,000 agents, varying run to run with where those blocks fell
    (bench/HISTORY.md). ``malloc_trim(0)`` gives back every free page wherever it lies; the pages are mapped again, zeroed,
    when the heap next grows into them.
    """
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))

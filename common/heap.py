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
from collections.abc import Callable

YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)
# Young collections between middle ones (CPython's default: 10). A middle collection walks everything that survived
# the young ones since the last: after the Master admitted 10,000 agents, 20 young collections' worth was half a
# million objects (their GPU records, sessions and buckets), walked in one 180-530 ms pause a few seconds into the
# bench's hold. At 5 the same objects are walked in pauses a quarter as long, most of them while the agents come in.
MIDDLE_THRESHOLD = 5
OLD_THRESHOLD = 10  # CPython's default; a full collection also waits for 25% growth of the old generation


def tune_for_daemon() -> None:
    """Call once, after imports and before serving."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)


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

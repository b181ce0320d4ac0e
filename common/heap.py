"""Interpreter settings for the daemons, which hold the state of thousands of peers for days: the garbage collector
and, where a worker thread shares the interpreter with the event loop, the switch interval.

CPython's default (a young collection every 700 net allocations) promotes any object that lives a few
milliseconds, such as a frame waiting for its upstream write, into the oldest generation; once those
promotions add up to a quarter of the heap, a full collection walks every object of every connection and
stops the event loop for as long as that takes (about a second for 5,000 agent links on one relay core,
bench/README.md). Rarer young collections let such objects die young, so full collections come with real
growth of the heap and not with steady traffic. What is alive at start-up (modules, classes, configuration)
never becomes garbage, so it is frozen out of every later collection.
"""

from __future__ import annotations

import gc
import sys

YOUNG_THRESHOLD = 20_000  # allocations between young collections (CPython's default: 700)
MIDDLE_THRESHOLD = 20  # young collections between middle ones (default 10)
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
    the store wrote a batch; at 1 ms the worker gives way sooner, at the cost of more switches (bench/README.md)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)

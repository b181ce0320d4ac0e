"""The event loop every daemon runs on: uvloop (libuv, its TLS in Cython) by default, asyncio's own on request.

``IDLEGRID_EVENT_LOOP=asyncio`` picks the standard library's loop (for comparison, or where uvloop cannot be
installed); ``uvloop`` (the default) falls back to it, with a warning, when uvloop is not importable.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from common.errors import ConfigError

log = logging.getLogger(__name__)

T = TypeVar("T")
LOOPS = ("uvloop", "asyncio")
ENV = "IDLEGRID_EVENT_LOOP"


def chosen() -> str:
    """The loop asked for: ``uvloop`` or ``asyncio``; anything else is an error the operator sees at start."""
    name = os.environ.get(ENV, "uvloop").strip().lower() or "uvloop"
    if name not in LOOPS:
        raise ConfigError(f"{ENV}={name!r}: choose one of {', '.join(LOOPS)}")
    return name


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    if chosen() == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop is not installed; running on asyncio's own event loop")
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    try:
        factory = loop_factory()
    except ConfigError:
        main.close()  # never run: say only what is wrong, not that a coroutine was never awaited
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_uvloop() -> bool:
    """Whether the running loop is uvloop's (whose TLS and accept path differ from asyncio's)."""
    return type(asyncio.get_running_loop()).__module__.startswith("uvloop")

"""Filters the console's templates use to show times, durations and amounts the same way everywhere."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def when(ts: float | None) -> str:
    """A unix time as UTC "2026-11-23 01:02:03", "-" for none."""
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts))


def duration(seconds: float | None) -> str:
    """Seconds as "3 h 05 min", "12 min", "45 s"; "-" for none."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 86400:
        return f"{s // 86400} d {s % 86400 // 3600} h"
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min"
    return f"{s} s"


FILTERS: dict[str, Callable[..., Any]] = {"when": when, "duration": duration}

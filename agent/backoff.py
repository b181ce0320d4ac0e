"""Reconnect delays: capped exponential backoff with full jitter, so thousands of agents never retry in step."""

from __future__ import annotations

import random


def full_jitter(attempt: int, *, initial_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """A delay drawn uniformly from [0, min(max_s, initial_s * 2**attempt)]."""
    ceiling = min(max_s, initial_s * (2 ** min(attempt, 32)))
    return (rng or random).uniform(0.0, ceiling)

"""Load-balanced mode's choices as pure functions (docs/endpoints.md, "Load-balanced mode"): which ready worker takes
the next HTTP request, and whether a request that finds no ready worker is held for one or refused.

The shell (pool.py ``BalancedPool``, used by the links listener's management/links/endpoint_proxy.py) keeps each
worker's outstanding requests and readiness, asks ``pick`` for each request, and holds what ``admit`` says to hold
until a worker becomes ready (a burst from zero waits for the cold start instead of failing), up to a bound on how
many wait and for how long. The held requests are the queue the autoscaler reads in this mode.

- ``pick(backends, after)``: the ready backend with the fewest outstanding requests (least outstanding requests, as
  Envoy and Knative's activator balance); among equals, the first whose id comes after ``after`` (the last one
  picked) in id order, wrapping around, so ties rotate instead of all going to one worker. None when none is ready.
- ``admit(held, limits)``: ``HOLD`` while fewer than ``max_held`` wait, else ``REFUSE`` (the answer is a 503 with
  ``Retry-After``); ``expired(held_since, now, limits)`` says a held request waited ``max_hold_s`` and is answered
  503 instead of waiting longer.

Invariants (tests/management/endpoints/test_balancer.py, hypothesis properties of these names):

1. ``never_picks_unready``: a pick is always a ready backend; None exactly when none is.
2. ``picks_least_outstanding``: no ready backend has fewer outstanding requests than the one picked.
3. ``ties_rotate``: picking over and over from equal backends (each pick's count going up by one) visits every ready
   backend before any twice.
4. ``spread_within_one``: requests picked one after another with none finishing leave the ready backends' counts
   within one of each other when they started equal.
5. ``holds_are_bounded``: ``admit`` never holds more than ``max_held``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Admission", "Backend", "HoldLimits", "admit", "expired", "pick"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One worker as the balancer sees it."""

    worker_id: str
    ready: bool  # its readiness path answered 200 last time it was asked, and it is not being stopped
    outstanding: int  # requests sent to it that have not finished


@dataclass(frozen=True, slots=True)
class HoldLimits:
    max_held: int = 256  # requests waiting for a ready worker at once, per endpoint
    max_hold_s: float = 120.0  # how long one waits before it is answered 503 (a cold start from zero fits)

    def __post_init__(self) -> None:
        if self.max_held < 0 or not self.max_hold_s >= 0:
            raise ValueError("max_held and max_hold_s must not be negative")


class Admission(enum.Enum):
    HOLD = "hold"
    REFUSE = "refuse"


def pick(backends: Sequence[Backend], after: str = "") -> str | None:
    """The worker to send the next request to: least outstanding among the ready ones, ties rotating past ``after``."""
    ready = [b for b in backends if b.ready]
    if not ready:
        return None
    fewest = min(b.outstanding for b in ready)
    tied = sorted(b.worker_id for b in ready if b.outstanding == fewest)
    return next((worker for worker in tied if worker > after), tied[0])


def admit(held: int, limits: HoldLimits) -> Admission:
    """A request that found no ready worker: held (it waits for one) while fewer than ``max_held`` wait, else refused."""
    return Admission.HOLD if held < limits.max_held else Admission.REFUSE


def expired(held_since: float, now: float, limits: HoldLimits) -> bool:
    """Whether a held request has waited as long as it may."""
    return now - held_since >= limits.max_hold_s

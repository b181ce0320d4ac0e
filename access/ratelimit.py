"""Token buckets and the limits built on them: frames per agent, connections per client address, reconnects per
certificate, enrollments per client address. Pure: time comes in, nothing here touches a socket."""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable

from common.tokenbucket import TokenBucket


class KeyedRateLimiter:
    """One bucket per key (e.g. client IP), remembering at most ``max_keys``; the least recently seen go first.

    Forgetting a key only ever gives it a fresh (full) bucket, so the memory bound cannot lock anyone out.
    """

    def __init__(self, rate: float, burst: float, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def allow(self, key: str) -> bool:
        now = self._clock()
        return self._bucket(key, now).allow(now)

    def retry_after_s(self, key: str) -> float:
        """Seconds until ``key`` may try again (0 when it may now)."""
        now = self._clock()
        return self._bucket(key, now).wait_s(now)

    def _bucket(self, key: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket


class Admission(enum.Enum):
    """What to do with one agent frame, as far as its sender's budget goes."""

    PASS = "pass"
    REFUSE = "refuse"  # over the rate: answer ``rate_limited``, do not relay
    CUT_OFF = "cut_off"  # the agent kept sending long after being told to slow down: disconnect it


class FrameBudget:
    """One agent connection's frame allowance: ``rate``/s with bursts of ``burst``, and a patience of ``flood_limit``.

    Every frame over the rate (refused, or passed anyway because it must) draws on the patience, which refills at
    the same rate. An agent that honours ``rate_limited`` answers never exhausts it; one that floods the relay does,
    within a fraction of a second, and is cut off rather than read forever.
    """

    __slots__ = ("frames", "_patience")

    def __init__(self, rate: float, burst: float, flood_limit: float, now: float) -> None:
        self.frames = TokenBucket(rate, burst, now)
        self._patience = TokenBucket(rate, flood_limit, now)

    def admit(self, now: float, *, must_pass: bool = False) -> Admission:
        """Spend one frame. ``must_pass`` frames (command results) are never refused, only counted."""
        within = self.frames.charge(now) if must_pass else self.frames.allow(now)
        if within:
            return Admission.PASS
        if not self._patience.allow(now):
            return Admission.CUT_OFF
        return Admission.PASS if must_pass else Admission.REFUSE


class AddressGate:
    """Per client address: how many connections it holds at once and how fast it opens new ones.

    Consulted at TCP accept, before any TLS work, so a flood from one address costs an ``accept()`` and a close.
    Open counts are kept only for addresses holding connections; rates for at most ``max_keys`` addresses.
    """

    def __init__(
        self, max_open: int, rate: float, burst: float, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_open = max_open
        self._open: dict[str, int] = {}
        self._rate = KeyedRateLimiter(rate, burst, max_keys=max_keys, clock=clock)

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; or why not: ``ip_connections`` or ``ip_rate``."""
        held = self._open.get(address, 0)
        if held >= self.max_open:
            return "ip_connections"
        if not self._rate.allow(address):
            return "ip_rate"
        self._open[address] = held + 1
        return None

    def release(self, address: str) -> None:
        """A connection ``admit`` counted has closed."""
        held = self._open.get(address, 0) - 1
        if held > 0:
            self._open[address] = held
        else:
            self._open.pop(address, None)

    def holding(self, address: str) -> int:
        return self._open.get(address, 0)

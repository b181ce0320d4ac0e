"""Token buckets: per agent connection for frames, per client address for enrollment. Pure: time comes in."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable


class TokenBucket:
    """Allows ``burst`` events at once and ``rate`` per second sustained."""

    __slots__ = ("rate", "burst", "_tokens", "_stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = now

    def allow(self, now: float, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens if there are enough; False (and nothing taken) otherwise."""
        self._refill(now)
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False

    def charge(self, now: float, cost: float = 1.0) -> None:
        """Take tokens even into debt: frames that must pass still count against the sender's budget."""
        self._refill(now)
        self._tokens = max(self._tokens - cost, -float(self.burst))

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._stamp)
        self._stamp = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)


class KeyedRateLimiter:
    """One bucket per key (e.g. client IP), remembering at most ``max_keys``; the least recently seen go first.

    Forgetting a key only ever gives it a fresh (full) bucket, so the memory bound cannot lock anyone out.
    """

    def __init__(
        self, rate: float, burst: float, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._clock = clock
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def allow(self, key: str) -> bool:
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        return bucket.allow(now)

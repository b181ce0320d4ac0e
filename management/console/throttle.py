"""Sign-in attempts, rate-limited per account and per client address (common/tokenbucket.py).

Guessing passwords costs an attacker one attempt per bucket refill, whichever it varies: the account it tries or the
address it tries from. A refused attempt is answered with how long to wait; nothing is checked until then.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from common.tokenbucket import TokenBucket

MAX_TRACKED = 10_000  # buckets kept per kind at most; when full the oldest-idle half is forgotten


class SignInThrottle:
    def __init__(self, burst: int, per_minute: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._rate = per_minute / 60.0
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def wait_s(self, account: str, address: str) -> float:
        """0 and one attempt taken from both buckets when both allow it; otherwise how long until they would."""
        now = self._clock()
        keys = (f"account:{account.lower()[:64]}", f"address:{address}")
        buckets = [self._bucket(key, now) for key in keys]
        waits = [bucket.wait_s(now) for bucket in buckets]
        if max(waits) > 0:
            return max(waits)
        for bucket in buckets:
            bucket.allow(now)
        return 0.0

    def _bucket(self, key: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED:
                for stale in list(self._buckets)[: MAX_TRACKED // 2]:
                    del self._buckets[stale]
            bucket = self._buckets[key] = TokenBucket(self._rate, self._burst, now)
        return bucket

"""Sign-in attempts, rate-limited per (account, client address) and per client address (common/tokenbucket.py).

Guessing passwords costs an attacker one attempt per bucket refill: for one account from one address, and for any
accounts from one address. There is deliberately no bucket for the account alone: one would let anyone lock any
account out of the console by spending its attempts from their own address, while the account's owner, from another
address, has the right password. A refused attempt is answered with how long to wait; nothing is checked until then.

Memory is bounded (``max_tracked`` buckets) without forgetting a bucket that still throttles:

- A refused attempt changes nothing and creates no bucket (a missing bucket is a full one), so an attacker whose
  address is spent cannot fill the table by naming thousands of accounts.
- Only an attempt that is let in may add buckets. When the table is full, buckets that have refilled to their burst
  go first (forgetting them loses nothing: a new one is the same), least recently used first; then buckets that
  would still let an attempt in, least recently used first. A bucket that throttles (less than one attempt left) is
  never forgotten: when every bucket throttles, a new (account, address) waits until one stops throttling.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from common.tokenbucket import TokenBucket

MAX_TRACKED = 10_000  # buckets kept at most
MAX_ACCOUNT_CHARS = 64  # of the account name in a bucket's key (ids are shorter; longer names are junk)


class SignInThrottle:
    def __init__(
        self,
        burst: int,
        per_minute: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._burst = burst
        self._rate = per_minute / 60.0
        self._clock = clock
        self._max = max_tracked
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()  # least recently used first

    def __len__(self) -> int:
        return len(self._buckets)

    def wait_s(self, account: str, address: str) -> float:
        """0 and one attempt taken from both buckets when both allow it; otherwise how long until they would (and
        nothing is taken, nothing created)."""
        now = self._clock()
        keys = (f"pair:{account.lower()[:MAX_ACCOUNT_CHARS]}\n{address}", f"address:{address}")
        waits = [bucket.wait_s(now) for key in keys if (bucket := self._buckets.get(key)) is not None]
        if waits and max(waits) > 0:
            return max(waits)
        missing = [key for key in keys if key not in self._buckets]
        if missing and not self._make_room(len(missing), now):
            return self._soonest_free_s(now)
        for key in keys:
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(self._rate, self._burst, now)
            self._buckets.move_to_end(key)
            bucket.allow(now)
        return 0.0

    def _make_room(self, needed: int, now: float) -> bool:
        """Forget buckets until ``needed`` more fit: refilled ones first, then ones that would let an attempt in;
        False when that is not enough (the rest all throttle)."""
        excess = len(self._buckets) + needed - self._max
        if excess <= 0:
            return True
        for forgettable in (lambda b: b.wait_s(now, self._burst) == 0, lambda b: b.wait_s(now) == 0):
            for key in [k for k, b in self._buckets.items() if forgettable(b)][:excess]:
                del self._buckets[key]
                excess -= 1
            if excess <= 0:
                return True
        return False

    def _soonest_free_s(self, now: float) -> float:
        """How long until some bucket stops throttling (and may be forgotten); at least a moment."""
        return max(min((b.wait_s(now) for b in self._buckets.values()), default=0.0), 1e-3)

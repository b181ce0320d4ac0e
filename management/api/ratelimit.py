"""Per-key request rate limits: a token bucket for each API key, so one busy or runaway client slows only itself.

Runs after authentication (it limits keys, not addresses: unauthenticated requests are refused before they
cost anything). A key over its limit gets 429 with ``Retry-After`` (whole seconds) and the JSON error shape;
every other key keeps its own full budget. Buckets live in memory, per Master process.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from common.tokenbucket import TokenBucket
from management.api.auth import SCOPE_KEY
from management.api.errors import Handler, error_response

MAX_BUCKETS = 100_000  # keys tracked at most; when full the buckets start over (each key its full burst again)


class KeyRateLimits:
    """``rate`` requests per second sustained and ``burst`` at once, for each key on its own."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"an API rate limit needs rate > 0 and burst >= 1, not rate={rate}, burst={burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def retry_after_s(self, key: str) -> float:
        """0 when ``key`` may make a request now (and it is counted); otherwise how long until it may."""
        now = self._clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._buckets.clear()
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
        if bucket.allow(now):
            return 0.0
        return bucket.wait_s(now)

    def middleware(self) -> Middleware:
        @web.middleware
        async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
            scope = request.get(SCOPE_KEY)
            if scope is None:  # not an authenticated API call (health, metrics, an unknown route)
                return await handler(request)
            wait = self.retry_after_s(scope.principal.key_hash)
            if wait > 0:
                response = error_response(
                    429,
                    "rate_limited",
                    f"this API key made more than {self.rate:g} requests a second (bursts of {self.burst}); "
                    f"retry in {wait:.2f} s",
                )
                response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
                return response
            return await handler(request)

        return limit

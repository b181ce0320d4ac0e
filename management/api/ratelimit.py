"""Request rate limits: a token bucket for each API key and one for each account (all its keys together), so one
busy or runaway client slows only itself, and an account that mints more keys gets no more requests.

Runs after authentication (it limits keys and accounts, not addresses: unauthenticated requests are refused before
they cost anything). A request is served when both its key's and its account's buckets allow it (and then counts in
both); otherwise it gets 429 with ``Retry-After`` (whole seconds) and the JSON error shape saying which limit it hit.
Every other key and account keeps its own full budget. Buckets live in memory, per Master process.

An endpoint's invocation keys (its request routes, docs/endpoints.md) are no API keys: their calls count against one
bucket per endpoint (``endpoint_rate``, ``endpoint_burst``: all its invocation keys together), sized for an endpoint's
clients (1,000 requests a second and more), and against no key's or account's bucket. The owner's own API key on the
same routes keeps its API key's limits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from common.tokenbucket import TokenBucket
from management.api.auth import INVOKED_ENDPOINT_KEY, SCOPE_KEY
from management.http.errors import Handler, error_response

MAX_BUCKETS = (
    100_000  # keys (and, apart, accounts) tracked at most; when full the buckets start over (each key its full burst again)
)


class KeyRateLimits:
    """``rate`` requests per second sustained and ``burst`` at once, for each key on its own; ``account_rate`` and
    ``account_burst`` for each account, all its keys together (by default the same as a key's)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        account_rate: float | None = None,
        account_burst: int | None = None,
        endpoint_rate: float = 2000.0,
        endpoint_burst: int = 4000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        account_rate = rate if account_rate is None else account_rate
        account_burst = burst if account_burst is None else account_burst
        for r, b in ((rate, burst), (account_rate, account_burst), (endpoint_rate, endpoint_burst)):
            if r <= 0 or b < 1:
                raise ValueError(f"an API rate limit needs rate > 0 and burst >= 1, not rate={r}, burst={b}")
        self.rate = rate
        self.burst = burst
        self.account_rate = account_rate
        self.account_burst = account_burst
        self.endpoint_rate = endpoint_rate
        self.endpoint_burst = endpoint_burst
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self._accounts: dict[str, TokenBucket] = {}
        self._endpoints: dict[str, TokenBucket] = {}

    def retry_after_s(self, key: str, account: str | None = None) -> float:
        """0 when ``key`` (of ``account``) may make a request now (and it is counted against both); otherwise how
        long until it may (and nothing is counted)."""
        return self.verdict(key, account)[0]

    def verdict(self, key: str, account: str | None = None) -> tuple[float, str]:
        """(0, "") when the request may go (counted against the key and the account); otherwise (how long until it
        may, "key" or "account": the limit that holds it back)."""
        now = self._clock()
        key_bucket = _bucket(self._buckets, key, self.rate, self.burst, now)
        held = [(key_bucket.wait_s(now), "key")]
        account_bucket = None
        if account is not None:
            account_bucket = _bucket(self._accounts, account, self.account_rate, self.account_burst, now)
            held.append((account_bucket.wait_s(now), "account"))
        wait, which = max(held)
        if wait > 0:
            return wait, which
        key_bucket.allow(now)
        if account_bucket is not None:
            account_bucket.allow(now)
        return 0.0, ""

    def endpoint_wait_s(self, endpoint_id: str) -> float:
        """0 when ``endpoint_id``'s invocation keys may make a request now (and it is counted); else how long until."""
        now = self._clock()
        bucket = _bucket(self._endpoints, endpoint_id, self.endpoint_rate, self.endpoint_burst, now)
        wait = bucket.wait_s(now)
        if wait <= 0:
            bucket.allow(now)
        return max(wait, 0.0)

    def endpoint_refusal(self, endpoint_id: str, wait: float) -> web.Response:
        """The 429 of a call held back by its endpoint's limit (``wait``: how long until it may)."""
        said = (
            f"endpoint {endpoint_id}'s invocation keys (all together) made more than {self.endpoint_rate:g} "
            f"requests a second (bursts of {self.endpoint_burst})"
        )
        return _refusal(said, wait)

    def middleware(self) -> Middleware:
        @web.middleware
        async def limit(request: web.Request, handler: Handler) -> web.StreamResponse:
            scope = request.get(SCOPE_KEY)
            if scope is None:  # not an authenticated API call (health, metrics, an unknown route)
                return await handler(request)
            principal = scope.principal
            endpoint_id = request.get(INVOKED_ENDPOINT_KEY)
            if endpoint_id is not None:
                wait, which = self.endpoint_wait_s(endpoint_id), "endpoint"
            else:
                wait, which = self.verdict(principal.key_hash, principal.account)
            if wait > 0:
                if endpoint_id is not None:
                    return self.endpoint_refusal(endpoint_id, wait)
                if which == "account":
                    said = (
                        f"account {principal.account!r} (all its keys together) made more than {self.account_rate:g} "
                        f"requests a second (bursts of {self.account_burst})"
                    )
                else:
                    said = f"this API key made more than {self.rate:g} requests a second (bursts of {self.burst})"
                return _refusal(said, wait)
            return await handler(request)

        return limit


def _refusal(said: str, wait: float) -> web.Response:
    response = error_response(429, "rate_limited", f"{said}; retry in {wait:.2f} s")
    response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
    return response


def _bucket(buckets: dict[str, TokenBucket], name: str, rate: float, burst: int, now: float) -> TokenBucket:
    bucket = buckets.get(name)
    if bucket is None:
        if len(buckets) >= MAX_BUCKETS:
            buckets.clear()
        bucket = buckets[name] = TokenBucket(rate, burst, now)
    return bucket

"""A token bucket with the clock passed in: the one rate-limiting primitive the relay and the Master share."""

from __future__ import annotations


class TokenBucket:
    """Allows ``burst`` events at once and ``rate`` per second sustained."""

    __slots__ = ("rate", "burst", "_tokens", "_stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._stamp = now

    def retune(self, rate: float, burst: float, now: float) -> None:
        """A new rate and burst from ``now`` on, keeping the tokens there are (at most the new burst): a change is
        not a fresh burst. Made anew at each change of the Master's admission pace, a relay's bucket let a storm's
        agents in 400 at once whenever the pace changed."""
        self._refill(now)
        self.rate, self.burst = rate, burst
        self._tokens = min(self._tokens, float(burst))

    def allow(self, now: float, cost: float = 1.0) -> bool:
        """Take ``cost`` tokens if there are enough; False (and nothing taken) otherwise."""
        self._refill(now)
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False

    def charge(self, now: float, cost: float = 1.0) -> bool:
        """Take tokens even into debt: frames that must pass still count against the sender's budget.

        True when the tokens were there; False when this went (further) into debt."""
        self._refill(now)
        covered = self._tokens >= cost
        self._tokens = max(self._tokens - cost, -float(self.burst))
        return covered

    def wait_s(self, now: float, cost: float = 1.0) -> float:
        """Seconds until ``cost`` tokens will be there (0 when they are now)."""
        self._refill(now)
        return max(0.0, (cost - self._tokens) / self.rate)

    def _refill(self, now: float) -> None:
        elapsed = max(0.0, now - self._stamp)
        self._stamp = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)

"""Token buckets and the limits built on them: frames per agent, connections per client address, reconnects per
certificate, enrollments per client address, speed-test transfers and bytes per client address. Pure: time comes
in, nothing here touches a socket."""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

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

    def allow(self, key: str, cost: float = 1.0) -> bool:
        now = self._clock()
        return self._bucket(key, now).allow(now, cost)

    def charge(self, key: str, cost: float) -> None:
        """Take ``cost`` tokens even into debt: what was spent must count, whether or not it was asked for first."""
        now = self._clock()
        self._bucket(key, now).charge(now, cost)

    def retry_after_s(self, key: str, cost: float = 1.0) -> float:
        """Seconds until ``key`` may spend ``cost`` (0 when it may now)."""
        now = self._clock()
        return self._bucket(key, now).wait_s(now, cost)

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


class OpenCounts:
    """How many of something each key holds at once (connections, transfers); a key holding none is forgotten,
    so memory follows what is open now, not who ever came."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def take(self, key: str) -> None:
        self._held[key] = self._held.get(key, 0) + 1

    def release(self, key: str) -> None:
        held = self._held.get(key, 0) - 1
        if held > 0:
            self._held[key] = held
        else:
            self._held.pop(key, None)

    def held(self, key: str) -> int:
        return self._held.get(key, 0)

    def __iter__(self) -> Iterator[str]:
        """The keys holding something now."""
        return iter(self._held)


class AddressGate:
    """Per client address: how many connections it holds at once and how fast it opens new ones.

    Consulted at TCP accept, before any TLS work, so a flood from one address costs an ``accept()`` and a close.
    Open counts are kept only for addresses holding connections; rates for at most ``max_keys`` addresses.
    """

    def __init__(
        self, max_open: int, rate: float, burst: float, *, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_open = max_open
        self._open = OpenCounts()
        self._rate = KeyedRateLimiter(rate, burst, max_keys=max_keys, clock=clock)

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``; or why not: ``ip_connections`` or ``ip_rate``."""
        if self._open.held(address) >= self.max_open:
            return "ip_connections"
        if not self._rate.allow(address):
            return "ip_rate"
        self._open.take(address)
        return None

    def release(self, address: str) -> None:
        """A connection ``admit`` counted has closed."""
        self._open.release(address)

    def holding(self, address: str) -> int:
        return self._open.held(address)


@dataclass(frozen=True)
class TransferRefusal:
    reason: str  # metrics label: ``transfers`` (too many at once) or ``bytes`` (the window's bytes are spent)
    retry_after_s: float
    message: str  # what the client is told


class TransferGate:
    """The speed test's allowance per client address: ``max_transfers`` downloads or uploads at once, and
    ``bytes_per_window`` bytes moved, refilled evenly over ``window_s`` (a token bucket of bytes).

    A real measurement (speedtest-cli's mini mode, a few hundred MB in two ten-second phases) fits in the
    defaults; a client looping on the biggest image runs out of bytes within seconds and is told when to
    come back. Open counts are kept only for addresses with transfers in progress; byte budgets for at most
    ``max_keys`` addresses (forgetting one only refills it).
    """

    def __init__(
        self,
        max_transfers: int,
        bytes_per_window: int,
        window_s: float,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_transfers = max_transfers
        self.bytes_per_window = bytes_per_window
        self.window_s = window_s
        self._open = OpenCounts()
        self._bytes = KeyedRateLimiter(bytes_per_window / window_s, bytes_per_window, max_keys=max_keys, clock=clock)

    def begin(self, address: str, size: int) -> TransferRefusal | None:
        """Start a transfer of ``size`` bytes (0 when not known yet) for ``address``, or say why not and when to
        come back. A started transfer must be ``end``ed."""
        if self._open.held(address) >= self.max_transfers:
            return TransferRefusal(
                "transfers",
                1.0,
                f"speed-test limit: at most {self.max_transfers} transfers at once per client address; "
                "retry when one has finished",
            )
        if size > self.bytes_per_window:
            return TransferRefusal(
                "bytes",
                self.window_s,
                f"speed-test limit: {size} bytes is more than this endpoint moves for one client address "
                f"in {self.window_s:g} s ({self.bytes_per_window} bytes)",
            )
        if not self._bytes.allow(address, size):
            wait = self._bytes.retry_after_s(address, size)
            return TransferRefusal(
                "bytes",
                wait,
                f"speed-test limit: this client address has used its {self.bytes_per_window} bytes per "
                f"{self.window_s:g} s; {size} more are available in {wait:.0f} s",
            )
        self._open.take(address)
        return None

    def charge(self, address: str, size: int) -> None:
        """Count bytes moved beyond what ``begin`` was told (an upload of undeclared length)."""
        self._bytes.charge(address, size)

    def end(self, address: str) -> None:
        """A transfer ``begin`` let start has finished, however it ended."""
        self._open.release(address)

    def transfers(self, address: str) -> int:
        return self._open.held(address)

"""The rules of spend caps, pure (no I/O, no clock): which caps the grid takes, what a renter spent in a cap's window,
which caps are reached, and the record of which hard caps keep which renters' projects from new paid work.

A cap limits a renter's spending on the whole account or on one project, over the last hour (rolling) or the current
UTC calendar month. What is spent is what the renter's rentals cost inside the window, by the meter's own rule
(management/market/charges.py ``cost_until``: whole seconds at the prices in force), charged yet or not, a running one
up to where its meter stands (the caller passes it ended there); a rental refunded through its host costs nothing.
Invariants (tests/management/payments/test_caps.py):
- a cap is reached when what is spent in its window is at least its limit, never before;
- spending outside the window, or of another project (for a project's cap), does not count;
- the settings the grid takes are bounded: a positive limit of at most ``MAX_LIMIT``, at most ``MAX_CAPS`` caps, a
  project named for a project's cap (and none for the account's), no two caps of the same scope, window and kind.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from common.errors import IdlegridError
from management.market.charges import cost_until
from management.market.money import MICRO, format_amount
from management.payments.records import SpendCap
from master.port import RentalRecord

MAX_CAPS = 20
MAX_LIMIT = 1_000_000_000 * MICRO  # a billion of the currency: a cap above it is no cap, and a typo
HOUR_S = 3600.0


class InvalidCaps(IdlegridError):
    """Spend caps the grid does not take (the message says which and why)."""

    code = "invalid_caps"


def check_caps(caps: Sequence[SpendCap]) -> list[SpendCap]:
    """``caps`` when the grid takes them; InvalidCaps naming the first that it does not."""
    if len(caps) > MAX_CAPS:
        raise InvalidCaps(f"at most {MAX_CAPS} caps, not {len(caps)}")
    seen: set[tuple[str, str, str, bool]] = set()
    for n, cap in enumerate(caps, start=1):
        if cap.limit <= 0:
            raise InvalidCaps(f"cap {n}: the limit must be more than 0, not {format_amount(cap.limit)}")
        if cap.limit > MAX_LIMIT:
            raise InvalidCaps(f"cap {n}: the limit must be at most {format_amount(MAX_LIMIT)}, not {format_amount(cap.limit)}")
        if cap.scope == "project" and not cap.project:
            raise InvalidCaps(f"cap {n}: a project's cap names its project")
        if cap.scope == "account" and cap.project:
            raise InvalidCaps(f"cap {n}: the account's cap names no project (scope 'project' caps one)")
        key = (cap.scope, cap.project, cap.window, cap.hard)
        if key in seen:
            raise InvalidCaps(f"cap {n}: the same scope, window and kind as an earlier cap")
        seen.add(key)
    return list(caps)


def window_start(window: str, now: float) -> float:
    """When ``window`` began at ``now``: an hour ago, or the first second of the UTC month."""
    if window == "hour":
        return now - HOUR_S
    day = datetime.fromtimestamp(now, UTC)
    return datetime(day.year, day.month, 1, tzinfo=UTC).timestamp()


def cost_in(rental: RentalRecord, start: float, end: float) -> int:
    """What ``rental`` cost from ``start`` to ``end`` (0 when it was refunded through its host)."""
    if rental.host_failure:
        return 0
    until = min(end, rental.ended_at) if rental.ended_at is not None else end
    since = max(start, rental.started_at)
    if until <= since:
        return 0
    return cost_until(rental, until) - cost_until(rental, since)


def applies(cap: SpendCap, project: str) -> bool:
    """Whether spending of a workload in ``project`` counts against ``cap``."""
    return cap.scope == "account" or cap.project == project


def spent(cap: SpendCap, rentals: Iterable[RentalRecord], projects: Mapping[str, str], now: float) -> int:
    """What the renter spent in ``cap``'s window up to ``now`` on what it caps; ``projects``: workload id -> project."""
    start = window_start(cap.window, now)
    return sum(cost_in(r, start, now) for r in rentals if applies(cap, projects.get(r.workload_id, "")))


@dataclass(frozen=True)
class CapReading:
    """One cap and what was spent in its window."""

    cap: SpendCap
    spent: int

    @property
    def reached(self) -> bool:
        return self.spent >= self.cap.limit


def read_caps(
    caps: Sequence[SpendCap], rentals: Sequence[RentalRecord], projects: Mapping[str, str], now: float
) -> list[CapReading]:
    return [CapReading(cap, spent(cap, rentals, projects, now)) for cap in caps]


def describe(cap: SpendCap, currency: str) -> str:
    """The cap in words: "the hard cap of 10.00 USD per hour on project train"."""
    where = f"on project {cap.project}" if cap.scope == "project" else "on the account"
    kind = "hard" if cap.hard else "soft"
    return f"the {kind} cap of {format_amount(cap.limit)} {currency} per {cap.window} {where}"


class CapBlocks:
    """Which hard caps keep which renters from new paid work: ``(account, project)`` -> why, where project "" is the
    whole account. Replaced whole by the watch at each reading; the scheduler asks ``reason``."""

    def __init__(self) -> None:
        self._blocked: dict[tuple[str, str], str] = {}

    def replace(self, account: str, blocked: Mapping[str, str]) -> None:
        """The account's blocks now (project -> why; "" for the whole account), replacing the earlier ones."""
        for key in [k for k in self._blocked if k[0] == account]:
            del self._blocked[key]
        for project, why in blocked.items():
            self._blocked[(account, project)] = why

    def reason(self, account: str, project: str) -> str:
        """Why work of ``account`` in ``project`` may not start on paid hosts now ("" when it may)."""
        return self._blocked.get((account, ""), "") or self._blocked.get((account, project), "")

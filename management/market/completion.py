"""Each host's rental completion rate by close reason (docs/disputes.md, "Completion rates"), the way Akash publishes
its providers' lease-completion rates. Pure: the rentals and the reviews in, the rates out.

A rental that ended closes, for each of its hosts, for one reason:

- ``completed``: its workload succeeded;
- ``cancelled``: its renter (or an operator) cancelled it;
- ``failed``: the workload failed on its own (a non-zero exit, the renter's money ran out), not through a host;
- ``requeued``: it went back to the queue (a preemption, a hard spend cap, a bid), not through a host;
- ``host_failure``: it ended through this host (``host_failure`` names it: lost, a GPU fault, a start it failed);
- ``other_host``: it ended through another host of the rental.

A host's completion rate is the share of its rentals in the window that did not end through it. Below ``threshold``,
with at least ``min_rentals`` counted, the host is under review: it is not offered until an operator reviews it, and
the review starts its count afresh (only rentals that ended after the review count).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from master.port import RentalRecord

REASONS: tuple[str, ...] = ("completed", "cancelled", "failed", "requeued", "host_failure", "other_host")
_BY_STATE = {"succeeded": "completed", "cancelled": "cancelled", "failed": "failed", "queued": "requeued"}


class CompletionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    threshold: float = 0.8  # below it (0 turns the gate off) a host is under review
    min_rentals: int = 5  # fewer rentals say nothing


class CompletionRate(msgspec.Struct, frozen=True, kw_only=True):
    """One host's figures: its rentals counted, by close reason, the rate (None with fewer than the minimum), whether
    it is under review, and when an operator last reviewed it (None: never)."""

    agent_id: str
    rentals: int = 0
    by_reason: dict[str, int] = {}
    rate: float | None = None
    under_review: bool = False
    reviewed_at: float | None = None


def close_reason(rental: RentalRecord, agent_id: str) -> str:
    """Why ``rental`` closed, for host ``agent_id`` (one of REASONS)."""
    if rental.host_failure:
        return "host_failure" if rental.host_failure.split(":", 1)[0] == agent_id else "other_host"
    state = rental.end_reason.removeprefix("workload ").split(":", 1)[0].strip()
    return _BY_STATE.get(state, "failed" if state else "completed")


def completion_rates(
    rentals: Iterable[RentalRecord], reviews: Mapping[str, float], policy: CompletionPolicy
) -> dict[str, CompletionRate]:
    """Every host with an ended rental (or a review): its completion rate over ``rentals``, counting for each host only
    those that ended after its last review (``reviews``: agent id -> when)."""
    counts: dict[str, dict[str, int]] = {}
    for rental in rentals:
        if rental.ended_at is None:
            continue
        for host in rental.hosts:
            if rental.ended_at <= reviews.get(host.agent_id, float("-inf")):
                continue
            reason = close_reason(rental, host.agent_id)
            by = counts.setdefault(host.agent_id, {})
            by[reason] = by.get(reason, 0) + 1
    rates: dict[str, CompletionRate] = {}
    for agent_id in sorted(set(counts) | set(reviews)):
        by = counts.get(agent_id, {})
        n = sum(by.values())
        rate = (n - by.get("host_failure", 0)) / n if n >= policy.min_rentals and n else None
        rates[agent_id] = CompletionRate(
            agent_id=agent_id,
            rentals=n,
            by_reason={r: by[r] for r in REASONS if by.get(r)},
            rate=round(rate, 4) if rate is not None else None,
            under_review=rate is not None and rate < policy.threshold,
            reviewed_at=reviews.get(agent_id),
        )
    return rates

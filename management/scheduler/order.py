"""The order in which the core considers queued jobs: priority class, market rank, aging, fair share, FIFO.

- Class rank decides first, so a boost from waiting never lifts a job above the next class.
- Then the market: on-demand and reserved rentals before interruptible ones, interruptibles by bid (higher first).
- Aging: one boost step per ``aging_step_s`` waited, at most ``aging_max_boost`` steps.
- Fair share (Slurm's classic factor): ``F = 2 ** (-U / S)`` where ``U`` is the account's share of all
  decayed usage and ``S`` its share of all shares; a project's factor is computed the same way inside its
  account. Among equal class and boost, the most under-served account (highest factor) goes first.
- Then submission time (FIFO), then the job id, so the order is total and deterministic.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Mapping

from management.scheduler.model import ON_DEMAND_RANK, Job, Policy, Snapshot

OrderKey = tuple[int, int, int, float, float, float, str]


def fair_share_factors(usage: Mapping[str, float], shares: Mapping[str, float], accounts: Iterable[str]) -> dict[str, float]:
    """``2 ** (-U/S)`` per account: 1.0 for an account that used nothing, 0.5 for one that used exactly its share."""
    names = set(accounts) | set(usage) | set(shares)
    total_usage = sum(max(0.0, usage.get(a, 0.0)) for a in names)
    total_shares = sum(shares.get(a, 1.0) for a in names)
    out: dict[str, float] = {}
    for a in names:
        share = shares.get(a, 1.0)
        if share <= 0:
            out[a] = 0.0
            continue
        u = max(0.0, usage.get(a, 0.0)) / total_usage if total_usage > 0 else 0.0
        s = share / total_shares
        out[a] = 2.0 ** (-u / s)
    return out


def project_factors(snapshot: Snapshot, jobs: Iterable[Job]) -> dict[tuple[str, str], float]:
    """The fair-share factor of each (account, project) among the projects of its account."""
    policy = snapshot.policy
    if not snapshot.project_usage:
        return {}  # nobody used anything: every project's factor is 1.0
    by_account: dict[str, set[str]] = {}
    for j in jobs:
        by_account.setdefault(j.account, set()).add(j.project)
    for account, project in snapshot.project_usage:
        by_account.setdefault(account, set()).add(project)
    out: dict[tuple[str, str], float] = {}
    for account, projects in by_account.items():
        usage = {p: snapshot.project_usage.get((account, p), 0.0) for p in projects}
        shares = {p: policy.project_shares.get((account, p), 1.0) for p in projects}
        for p, f in fair_share_factors(usage, shares, projects).items():
            out[(account, p)] = f
    return out


def aging_boost(policy: Policy, waited_s: float) -> int:
    if policy.aging_step_s <= 0 or waited_s <= 0:
        return 0
    return min(int(waited_s // policy.aging_step_s), policy.aging_max_boost)


class QueueOrder:
    """Computes the order key of queued jobs for one snapshot (factors are computed once)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        policy = snapshot.policy
        self.rank = {c.name: c.rank for c in policy.classes}
        queue = snapshot.queue
        self.account_factor = fair_share_factors(snapshot.usage, policy.shares, {j.account for j in queue})
        self.project_factor = project_factors(snapshot, queue)

    def key(self, job: Job) -> OrderKey:
        """Smaller goes first."""
        snap = self.snapshot
        rank = self.rank.get(job.priority, -(10**9))
        boost = aging_boost(snap.policy, snap.now - job.submitted_at)
        return (
            -rank,
            -job.market_rank,
            -boost,
            -self.account_factor.get(job.account, 1.0),
            -self.project_factor.get((job.account, job.project), 1.0),
            job.submitted_at,
            job.id,
        )

    def ordered(self, jobs: Iterable[Job], limit: int | None = None) -> list[Job]:
        """``jobs`` in order (the first ``limit`` only, when given). Keys are built inline: this runs on
        the whole queue every cycle, and a call per job would cost more than the ordering itself.

        With a limit, class rank decides first, so only the classes the first ``limit`` jobs can come from
        get full keys: the jobs of lower classes are counted, never keyed."""
        snap = self.snapshot
        now, step, cap = snap.now, snap.policy.aging_step_s, snap.policy.aging_max_boost
        rank, af, pf = self.rank, self.account_factor, self.project_factor
        missing = -(10**9)
        queue = list(jobs)
        lowest = missing  # the lowest rank that can be among the first ``limit``
        if limit is not None and limit < len(queue):
            per_rank = Counter(rank.get(j.priority, missing) for j in queue)
            taken = 0
            for r in sorted(per_rank, reverse=True):
                taken += per_rank[r]
                if taken >= limit:
                    lowest = r
                    break
        decorated = [
            (
                -rank.get(j.priority, missing),
                -(j.bid if j.rental == "interruptible" else ON_DEMAND_RANK),
                -(min(int((now - j.submitted_at) // step), cap) if step > 0 and now > j.submitted_at else 0),
                -af.get(j.account, 1.0),
                -pf.get((j.account, j.project), 1.0),
                j.submitted_at,
                j.id,
                i,  # ids are unique, but a total order must never need to compare the jobs themselves
                j,
            )
            for i, j in enumerate(queue)
            if lowest == missing or rank.get(j.priority, missing) >= lowest
        ]
        chosen = heapq.nsmallest(limit, decorated) if limit is not None and limit < len(decorated) else sorted(decorated)
        return [d[-1] for d in chosen]

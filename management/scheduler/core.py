"""One scheduling cycle: ``schedule(snapshot) -> Plan``, and ``explain(snapshot, job_id)`` for one waiting job.

The cycle, in order (docs/scheduler.md has the whole contract):
1. running jobs on unhealthy units or offline hosts get ``Requeue`` (their units stay held this cycle);
2. queued jobs are taken in ``QueueOrder`` (class, aging, fair share, FIFO); for each:
   impossible on this grid -> ``Reject``; over quota -> waits (does not block anyone);
   fits -> ``Place`` (all replicas or none); else a class that may preempt looks for the fewest lower,
   preemptible victims whose units make it fit -> ``Preempt`` each; else the first such job is the *head*:
   it gets a reservation (the earliest time running jobs' ends free enough room) and every later job
   may start only where it cannot delay that start (EASY backfill).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from common.containers import registry_of
from common.errors import NotFound
from common.inventory import image_refusal
from management.market.money import affordable_price, format_amount, period_cost
from management.scheduler.model import (
    Assignment,
    Explanation,
    FilterCount,
    Host,
    Job,
    Place,
    Plan,
    Policy,
    Preempt,
    PriorityClass,
    QuotaCheck,
    Reject,
    Requeue,
    Snapshot,
)
from management.scheduler.order import QueueOrder
from management.scheduler.pool import (
    FreePool,
    RunningByStart,
    Shape,
    host_static_ok,
    nvlink_group,
    price_for,
    price_refusal,
    runtime_allowed,
    shape_matches,
)

VICTIM_CHUNK = 128  # preemption reads victims in chunks of this many, most recently started first ...
VICTIM_HOSTS_ENOUGH = 2  # ... and stops once room is found on this many hosts more than the replicas asked


def _market_then_gain(entry: tuple[int, Job]) -> tuple[int, int]:
    """Of a (units freed, victim) pair: the lowest market rank first, then the largest gain."""
    return entry[1].market_rank, -entry[0]


FILTER_NAMES = (
    "unhealthy or offline",
    "host takes no work",
    "did not start there",
    "runtime/isolation",
    "region",
    "reputation",
    "bandwidth",
    "disk",
    "price",
    "model",
    "vendor",
    "tier",
    "VRAM",
    "compute capability",
    "MIG profile",
    "CPU",
    "RAM",
    "held by others",
    "NVLink",
    "replica fit",
)


@dataclass(slots=True)
class Reservation:
    """The head's reservation: it can start at ``start`` on ``hosts`` (EASY backfill protects it)."""

    job: Job
    start: float | None  # None: no running job's end is known that makes room
    hosts: frozenset[str]


class _Cycle:
    def __init__(self, snapshot: Snapshot, pool: FreePool | None) -> None:
        self.s = snapshot
        self.policy = snapshot.policy
        self.pool = pool if pool is not None else FreePool(snapshot)
        if pool is not None:
            pool.adopt(snapshot)
        self.classes = {c.name: c for c in self.policy.classes}
        self.plan = Plan()
        self.order = QueueOrder(snapshot)
        self.in_use: dict[str, int] = {}
        self.tier_in_use: dict[tuple[str, str], int] = {}
        self.placed_jobs: dict[str, Job] = {}
        self.broken: set[str] = set()
        self.victims: set[str] = set()  # running jobs being stopped (before or during this cycle)
        self.terminating: dict[str, list[Job]] = {}
        self.head: Reservation | None = None
        self.preempting: dict[str, int] = {}  # preemptor -> victims it waits for
        self._reserve_keys: list[str] = []
        self._no_fit: set[tuple[object, ...]] = set()
        self._spent: dict[str, int] = {}  # account -> the first period of what this cycle placed for it
        self._no_victims: set[tuple[object, ...]] = set()
        self._running_synced = False
        self._preemptible_rank = {c.name: c.rank for c in self.policy.classes if c.preemptible}
        self._preempt_attempts = 0
        self._duration_limited = self.pool.limits_duration()  # a host limits rentals' durations: they decide fits too
        self.pool.now = snapshot.now
        quotas = self.policy.quotas
        running = snapshot.running.values()
        if quotas:  # usage against quotas is all that is counted
            for job in running:
                if job.assignment and job.account in quotas:
                    self._charge(job, job.assignment)
        for job in [j for j in running if j.preempted_for is not None]:
            self.victims.add(job.id)
            self.terminating.setdefault(job.preempted_for, []).append(job)  # type: ignore[arg-type]

    # --- bookkeeping ---------------------------------------------------------------------------------

    def _charge(self, job: Job, assignment: Assignment) -> None:
        units = self.s.units
        for replica in assignment:
            for uid in replica:
                self.in_use[job.account] = self.in_use.get(job.account, 0) + 1
                unit = units.get(uid)
                if unit is not None and unit.tier is not None:
                    key = (job.account, unit.tier)
                    self.tier_in_use[key] = self.tier_in_use.get(key, 0) + 1

    def _class(self, job: Job) -> PriorityClass | None:
        return self.classes.get(job.priority)

    # --- 1. reallocation -----------------------------------------------------------------------------

    def requeue_broken(self) -> None:
        s = self.s
        units, holders = s.units, s.holders
        # the common case (nothing faulty, every host up) costs one pass over the units and one over the hosts
        hosts = s.hosts.values()
        offline = {h.id for h in hosts if not h.online}
        bad = [u.id for u in units.values() if not u.healthy]
        if offline:
            bad += [u.id for u in units.values() if u.host in offline]
        not_taking = {h.id for h in hosts if not h.takes_work}
        if not_taking:
            bad += [u.id for u in units.values() if u.host in not_taking]
        for u in bad:  # a kept pool may still list them as idle
            self.pool.refresh(u)
        suspects = {holders[u] for u in bad if u in holders and (not units[u].healthy or units[u].host in offline)}
        if not holders.keys() <= units.keys():  # a subset test builds no set; the difference only when it fails
            suspects |= {holders[u] for u in holders.keys() - units.keys()}  # units that left the grid
        for job_id in sorted(suspects):
            job = s.running.get(job_id)
            broken = self._broken_reason(job) if job is not None else None
            if job is not None and broken is not None:
                self.broken.add(job.id)
                self.plan.decisions.append(Requeue(job.id, broken[1], host=broken[0]))

    def _broken_reason(self, job: Job) -> tuple[str, str] | None:
        """(the host it broke through, "" when the snapshot no longer knows it; why), or None if it is sound."""
        for replica in job.assignment or ():
            for uid in replica:
                unit = self.s.units.get(uid)
                if unit is None:
                    return "", f"unit {uid} left the grid"
                if not unit.healthy:
                    return unit.host, f"unit {uid} on host {unit.host} is unhealthy"
                host = self.s.hosts.get(unit.host)
                if host is None or not host.online:
                    return unit.host, f"host {unit.host} went offline"
        return None

    # --- 2. the queue ----------------------------------------------------------------------------------

    def ordered_queue(self, whole: bool) -> list[Job]:
        queue = self.s.queue
        limit = self.policy.max_considered_per_cycle
        return self.order.ordered(queue, None if whole else limit)

    def run(self, explain: bool, only: str | None = None) -> Explanation | None:
        ordered = self.ordered_queue(whole=only is not None)
        places = 0
        try:
            for position, job in enumerate(ordered, 1):
                if only is None and places >= self.policy.max_places_per_cycle:
                    if explain:
                        for rest_pos, rest in enumerate(ordered[position - 1 :], position):
                            self._explain(rest, rest_pos, ordered, "not_reached")
                    break
                status = self._consider(job)
                if status in ("placed", "rejected"):
                    places += status == "placed"
                    if job.id == only:
                        return None
                    continue
                if explain or job.id == only:
                    e = self._explain(job, position, ordered, status)
                    if job.id == only:
                        return e
            return None
        finally:
            for key in self._reserve_keys:
                self.pool.unreserve(key)

    def _consider(self, job: Job) -> str:
        spent = self._spent.get(job.account, 0)
        if job.balance is not None and spent:  # what is left after this cycle's earlier placements for the account
            left = affordable_price(job.balance - spent, job.units_asked, self.policy.metering_period_s)
            job = dataclasses.replace(job, affordable=left)
        reason = self._invalid(job)
        if reason is not None:
            self.plan.decisions.append(Reject(job.id, reason))
            return "rejected"
        if self._cannot_fit(job) is not None:
            return "cannot_fit"  # waits, explained; it never becomes the head, so it holds nobody up
        if self._quota_check(job, None) is not None:
            return "quota"
        exclude: frozenset[str] = frozenset()
        if self.head is not None:
            if not self.policy.backfill:
                return "behind_head"
            if not self._ends_before_head(job):
                exclude = self.head.hosts
        duration = (job.max_duration_s, job.reserved_s) if self._duration_limited else None
        terms = (job.rental, job.bid, job.max_price, job.pin, job.funded, job.capped, job.affordable, duration)
        fail_key = (job.request, job.constraints, job.replicas, job.placement, bool(exclude), terms, job.runs_image, job.avoid)
        assignment = None if fail_key in self._no_fit else self.pool.place(job, exclude)
        if assignment is None:
            # the pool only shrinks during a cycle (what-ifs are undone), so the same ask fails again
            self._no_fit.add(fail_key)
        else:
            over = self._quota_check(job, assignment)
            if over is not None:
                self.pool.release(job.id)
                return "quota"
            self.plan.decisions.append(Place(job.id, assignment))
            if job.balance is not None:
                self._spent[job.account] = spent + self._first_period(job, assignment)
            if job.max_duration_s is not None:
                self.pool.note_end(job.id, self.s.now + job.max_duration_s)
            if job.account in self.policy.quotas:
                self._charge(job, assignment)
            self.placed_jobs[job.id] = job
            return "placed"
        cls = self._class(job)
        victims_key = (fail_key, cls.rank if cls is not None else 0, job.market_rank)
        if (
            cls is not None
            and victims_key not in self._no_victims
            and self._preempt_attempts < self.policy.max_preemption_attempts_per_cycle
            and (cls.may_preempt or self._outbids_someone(job, cls))
        ):
            if self._preempt_for(job, cls, exclude):
                return "preempting"
            if job.id not in self.terminating:  # victims only get fewer during a cycle
                self._no_victims.add(victims_key)
        if self.head is None:
            self.head = self._reservation(job)
            return "head"
        return "waiting"

    def _ends_before_head(self, job: Job) -> bool:
        head = self.head
        if head is None or head.start is None:
            return True  # no known start to delay
        return job.max_duration_s is not None and self.s.now + job.max_duration_s <= head.start

    # --- rejection and quota -----------------------------------------------------------------------

    def _invalid(self, job: Job) -> str | None:
        """Why ``job`` can never run under this policy, whatever hosts join (it is rejected), or None."""
        cls = self._class(job)
        if cls is None:
            names = ", ".join(c.name for c in self.policy.classes)
            return f"priority class {job.priority!r} does not exist (classes: {names})"
        r = job.request
        if r.gpus < 1 or job.replicas < 1:
            return "the workload asks for no GPUs (gpus and replicas must be at least 1)"
        quota = self.policy.quotas.get(job.account)
        if quota is not None and quota.gpus is not None and job.units_asked > quota.gpus:
            return f"the workload asks for {_gpus(job.units_asked)} at once; account {job.account}'s quota is {quota.gpus}"
        return None

    def _first_period(self, job: Job, assignment: Assignment) -> int:
        """What one metering period of ``job`` costs on the hosts of ``assignment``."""
        total = 0
        for units in assignment:
            host = self.s.hosts[self.s.units[units[0]].host]
            total += period_cost(price_for(host, job), len(units), self.policy.metering_period_s)
        return total

    def _cannot_fit(self, job: Job) -> str | None:
        """Why ``job`` cannot be placed on the grid as it is now, even empty (hosts may still join), or None."""
        r = job.request
        allow = job.constraints.allow_process_runtime
        shape_part = (r.gpus, r.min_vram_mib, r.models, r.vendors, r.tiers, r.min_compute_capability, r.mig_profile)
        key = (shape_part, job.replicas, allow, self.policy.allow_process_runtime, job.runs_image)
        cache = self.pool.capacity_verdicts
        if key not in cache:
            cache[key] = self._capacity_reason(job)
        return cache[key]

    def _capacity_reason(self, job: Job) -> str | None:
        r = job.request
        static = self.pool.static_counts()
        shapes = [s for s in static if shape_matches(s, r)]
        if not shapes:
            if r.tiers and not any(s[1] in r.tiers for s in static):
                return f"no GPU on this grid is in tier {', '.join(sorted(r.tiers))}"
            if r.models and not any(s[0] in r.models for s in static):
                return f"no GPU on this grid is a {', '.join(sorted(r.models))}"
            if r.vendors and not any(s[7] in r.vendors for s in static):
                return f"no GPU on this grid is made by {' or '.join(sorted(r.vendors))}"
            if r.mig_profile is not None and not any(s[4] == r.mig_profile for s in static):
                return f"no GPU on this grid offers MIG profile {r.mig_profile}"
            return "no GPU on this grid matches the request (model, vendor, tier, VRAM, compute capability, MIG profile)"
        allow = job.constraints.allow_process_runtime and self.policy.allow_process_runtime
        histogram = self.pool.static_histogram(job.runs_image, allow)
        replicas = 0
        biggest = 0
        for shape in shapes:
            for count, n_hosts in histogram.get(shape, {}).items():
                biggest = max(biggest, count)
                replicas += (count // r.gpus) * n_hosts
        if biggest == 0 and not job.runs_image:
            return (
                'image "none" runs the command on the host itself, only on hosts of the process runtime; none here that '
                "has matching GPUs may run it"
            )
        if biggest == 0:
            return "an image runs only on hosts with a container engine; none here that has matching GPUs has one"
        if biggest < r.gpus:
            return f"each replica asks for {_gpus(r.gpus)} on one host; the most any host has that match is {biggest}"
        if replicas < job.replicas:
            return f"the gang needs {job.replicas} replicas of {_gpus(r.gpus)}; this grid can hold at most {replicas}"
        return None

    def _quota_check(self, job: Job, assignment: Assignment | None) -> QuotaCheck | None:
        """The quota ``job`` would exceed (before placing: overall; with an assignment: per tier), or None."""
        quota = self.policy.quotas.get(job.account)
        if quota is None:
            return None
        if assignment is None:
            used = self.in_use.get(job.account, 0)
            if quota.gpus is not None and used + job.units_asked > quota.gpus:
                return QuotaCheck("gpus", quota.gpus, used, job.units_asked)
            return None
        asked: dict[str, int] = {}
        for replica in assignment:
            for uid in replica:
                tier = self.s.units[uid].tier
                if tier is not None:
                    asked[tier] = asked.get(tier, 0) + 1
        for tier, n in sorted(asked.items()):
            limit = quota.per_tier.get(tier)
            used = self.tier_in_use.get((job.account, tier), 0)
            if limit is not None and used + n > limit:
                return QuotaCheck(f"tier:{tier}", limit, used, n)
        return None

    # --- preemption --------------------------------------------------------------------------------

    def _running_index(self) -> RunningByStart:
        index = self.pool.running_by_start
        if not self._running_synced:
            index.sync(self.s.running)
            self._running_synced = True
        return index

    def _outbids_someone(self, job: Job, cls: PriorityClass) -> bool:
        """Whether an interruptible job runs whose (class rank, market rank) is below ``job``'s (a market victim)."""
        if not self.pool.interruptible_holds:  # no interruptible job holds anything: nobody to outbid
            return False
        ranks = self._preemptible_rank
        mine = (cls.rank, job.market_rank)
        return any(
            (rank := ranks.get(priority)) is not None and (rank, bid) < mine
            for priority, bid in self._running_index().interruptible
        )

    def _victim_chunks(self, job: Job, cls: PriorityClass) -> Iterator[list[Job]]:
        """Running jobs ``job`` (of class ``cls``) may preempt, most recently started first (then by id), in
        chunks of ``VICTIM_CHUNK``, read lazily.

        The pool keeps the running jobs grouped by start time across cycles (synced with this snapshot once
        per cycle, by identity), so no cycle regroups or sorts them all; the reading usually stops after a
        few chunks. Victims chosen before the iterator is made are left out (the set does not change while
        it is read).
        """
        index = self._running_index()
        rank_of = self._preemptible_rank
        below, victims, broken = cls.rank, self.victims, self.broken
        by_class = cls.may_preempt
        mine = (cls.rank, job.market_rank)
        chunk: list[Job] = []
        for group in index.groups_most_recent_first():
            for v in group:
                if v.preemptible and v.assignment and v.rental != "reserved":
                    rank = rank_of.get(v.priority)
                    if (
                        rank is not None
                        and ((by_class and rank < below) or (v.rental == "interruptible" and (rank, v.bid) < mine))
                        and v.id not in victims
                        and v.id not in broken
                    ):
                        chunk.append(v)
                        if len(chunk) == VICTIM_CHUNK:
                            yield chunk
                            chunk = []
        if chunk:
            yield chunk

    def _fits_with(self, job: Job, exclude: frozenset[str]) -> bool:
        if self.pool.place(job, exclude) is None:
            return False
        self.pool.release(job.id)
        return True

    def _preempt_for(self, job: Job, cls: PriorityClass, exclude: frozenset[str]) -> bool:
        """Decide victims for ``job`` (or find the ones already stopping suffice); False if none make it fit."""
        pool = self.pool
        self._preempt_attempts += 1
        held: dict[str, Assignment] = {}
        # jobs already stopping for it, and requeued jobs (they stop this cycle), count as room first
        mine = list(self.terminating.get(job.id, []))
        mine += [self.s.running[j] for j in sorted(self.broken) if j in pool.holds and j not in {m.id for m in mine}]
        for v in mine:
            held[v.id] = pool.release(v.id)
        chosen: list[Job] = []
        if not self._fits_with(job, exclude):
            picked = self._pick_victims(job, cls, exclude, held)
            if picked is None:
                for v in mine:
                    pool.restore(v, held[v.id])
                return False
            chosen = picked
        assignment = pool.place(job, exclude)
        assert assignment is not None  # it fitted with exactly these units released
        pool.release(job.id)
        for v in chosen + mine:
            pool.restore(v, held[v.id])
        # the idle units it will use are kept from everyone else this cycle; the victims' stay held
        key = f"preemptor:{job.id}"
        pool.reserve(key, (u for replica in assignment for u in replica))
        self._reserve_keys.append(key)
        for v in chosen:
            self.victims.add(v.id)
            vc = self._class(v)
            if cls.may_preempt and vc is not None and vc.rank < cls.rank:
                reason = f"preempted for {job.id} (priority {job.priority}) over {v.priority}"
            else:
                reason = f"preempted for {job.id} ({_market_terms(job)}) over its bid {format_amount(v.bid)}"
            self.plan.decisions.append(Preempt(v.id, job.id, reason))
        self.preempting[job.id] = len(chosen) + len(mine)
        return True

    def _frees_on(self, victim: Job, hosts: frozenset[str]) -> bool:
        """Whether stopping ``victim`` frees a unit (or its CPU/RAM) on any of ``hosts``."""
        units = self.s.units
        return any(u in units and units[u].host in hosts for replica in victim.assignment or () for u in replica)

    def _pick_victims(
        self, job: Job, cls: PriorityClass, exclude: frozenset[str], held: dict[str, Assignment]
    ) -> list[Job] | None:
        """The fewest victims (then the most recently started) whose units make ``job`` fit, left released.

        Per host, the victims to free for one replica are counted (most recently started first); hosts are
        taken cheapest first until the job fits, then victims it turns out not to need are spared, oldest first.
        On failure everything is restored and None is returned.
        """
        pool, units, hosts = self.pool, self.s.units, self.s.hosts
        g = job.request.gpus
        shapes = set(pool.shapes_for(job.request))
        first_chunk: list[Job] | None = None
        # per (host, shape): what each victim there would free. Victims are read most recent first, in
        # chunks; once room is found on enough hosts the rest of the victims are not read (a bound per cycle).
        on_host_shape: dict[tuple[str, Shape], list[tuple[int, Job]]] = {}
        hosts_with = pool.hosts_with(shapes)
        host_ok: dict[str, bool] = {}
        best_on: dict[str, tuple[int, int, float, str, list[Job]]] = {}
        shape_of_unit, placeable = pool.shape, pool.placeable
        replica_hosts = pool.running_by_start.replica_hosts
        for chunk in self._victim_chunks(job, cls):
            if first_chunk is None:
                first_chunk = chunk
            touched: set[tuple[str, Shape]] = set()
            for v in chunk:
                # a victim none of whose replicas is on a host with units of a wanted shape cannot help
                if hosts_with.isdisjoint(replica_hosts(v, units)):
                    continue
                gains: dict[tuple[str, Shape], int] = {}
                for rep in v.assignment or ():
                    for u in rep:
                        unit = units.get(u)
                        if unit is not None and (shape := shape_of_unit[u]) in shapes and placeable(u):
                            key = (unit.host, shape)
                            gains[key] = gains.get(key, 0) + 1
                for key, gain in gains.items():
                    on_host_shape.setdefault(key, []).append((gain, v))
                    touched.add(key)
            for h, shape in touched:
                if h not in host_ok:
                    host = hosts.get(h)
                    host_ok[h] = h not in exclude and host is not None and host_static_ok(host, job, self.policy)
                if not host_ok[h]:
                    continue
                victims = on_host_shape[(h, shape)]
                have = len(pool.free.get(h, {}).get(shape, ()))
                # the largest first gives the fewest victims; among equal gains the most recently started
                # (they were appended in that order, and a stable sort keeps it)
                # interruptibles first, the lowest bid first (on-demand victims of a lower class all rank alike)
                victims.sort(key=_market_then_gain)
                need: list[Job] = []
                for gain, v in victims:
                    if have >= g:
                        break
                    need.append(v)
                    have += gain
                if have >= g and need:
                    top = max(v.market_rank for v in need)
                    option = (top, len(need), -max(v.started_at or 0.0 for v in need), h, need)
                    if h not in best_on or option[:3] < best_on[h][:3]:
                        best_on[h] = option
            if len(best_on) >= job.replicas + VICTIM_HOSTS_ENOUGH:
                break
        options = list(best_on.values())
        options.sort(key=lambda o: (o[0], o[1], o[2], o[3]))
        chosen: list[Job] = []
        fits = False
        for _, _, _, _, need in options:
            for v in need:
                if v.id not in held:
                    held[v.id] = pool.release(v.id)
                    chosen.append(v)
            if self._fits_with(job, exclude):
                fits = True
                break
        if not fits:  # a gang may need more than one replica's room per host: more, most recent first (bounded)
            for v in first_chunk or ():
                if v.id not in held:
                    held[v.id] = pool.release(v.id)
                    chosen.append(v)
                    # it did not fit before; freeing nothing on a host with units it could take changes nothing
                    if self._frees_on(v, hosts_with) and self._fits_with(job, exclude):
                        fits = True
                        break
        if not fits:
            for v in chosen:
                pool.restore(v, held.pop(v.id))
            return None
        for v in sorted(chosen, key=lambda v: (v.started_at or 0.0, v.id)):  # spare the oldest it does not need
            if len(chosen) == 1:
                break
            pool.restore(v, held[v.id])
            if self._fits_with(job, exclude):
                chosen = [c for c in chosen if c.id != v.id]
                del held[v.id]
            else:
                held[v.id] = pool.release(v.id)
        return chosen

    # --- EASY backfill reservation -------------------------------------------------------------------

    def _ending(self) -> Iterator[tuple[float, Job]]:
        """Jobs holding units, in the order they will have ended (max durations; victims by grace; broken now)."""
        now = self.s.now
        early: list[tuple[float, str]] = [(now, j) for j in self.broken]
        early += [(now + self.policy.grace_s, j) for j in self.victims]
        seen: set[str] = set()
        for end, job_id in self.pool.ends_in_order(early):
            if job_id in seen or job_id not in self.pool.holds:
                continue
            seen.add(job_id)
            job = self.s.running.get(job_id) or self.placed_jobs.get(job_id)
            if job is not None:
                yield max(end, now), job

    def earliest_fit(self, job: Job) -> tuple[float, frozenset[str]] | None:
        """The earliest time ``job`` fits as running jobs end (jobs ahead ignored), and the hosts it gets then."""
        pool = self.pool
        if self._fits_with(job, frozenset()):
            assignment = pool.place(job)
            assert assignment is not None
            pool.release(job.id)
            return self.s.now, frozenset(self.s.units[r[0]].host for r in assignment)
        g, units = job.request.gpus, self.s.units
        shape_set = set(pool.shapes_for(job.request))
        # replica slots (idle units of one shape on one host, in groups of g): a cheap bound checked first
        slots = sum(
            (count // g) * len(hosts) for shape in shape_set for count, hosts in pool.buckets.get(shape, {}).items() if count >= g
        )
        hosts_with = pool.hosts_with(shape_set)
        released: list[tuple[Job, Assignment]] = []
        found: tuple[float, frozenset[str]] | None = None
        # ends are first only counted (idle units per host and shape, as they would be); the pool is
        # changed only when the count says the job may fit, and put back as it was afterwards
        pending: list[Job] = []
        extra: dict[tuple[str, Shape], int] = {}
        try:
            for end, ending in self._ending():
                relevant = False  # it frees units, CPU or RAM on a host that has units of a shape the job takes
                for rep in pool.holds[ending.id].replicas:
                    for u in rep:
                        if not relevant and u in units and units[u].host in hosts_with:
                            relevant = True
                        shape = pool.shape.get(u)
                        if shape is None or shape not in shape_set or pool.holder.get(u) != ending.id or not pool.placeable(u):
                            continue
                        key = (units[u].host, shape)
                        now_idle = len(pool.free.get(key[0], {}).get(shape, ())) + extra.get(key, 0)
                        extra[key] = extra.get(key, 0) + 1
                        slots += (now_idle + 1) // g - now_idle // g
                if relevant:
                    pending.append(ending)
                if slots < job.replicas:
                    continue
                for p in pending:
                    released.append((p, pool.release(p.id)))
                pending.clear()
                extra.clear()
                placed = pool.place(job)
                if placed is not None:
                    pool.release(job.id)
                    found = end, frozenset(units[r[0]].host for r in placed)
                    break
        finally:
            for ending, assignment in reversed(released):
                pool.restore(ending, assignment)
        return found

    def _reservation(self, job: Job) -> Reservation:
        fit = self.earliest_fit(job) if self.policy.backfill else None
        if fit is None:
            return Reservation(job, None, frozenset())
        return Reservation(job, fit[0], fit[1])

    # --- explanations ------------------------------------------------------------------------------

    def filter_counts(self, job: Job) -> list[FilterCount]:
        s, pool, policy = self.s, self.pool, self.policy
        r, c = job.request, job.constraints
        remaining = list(s.units.values())
        counts: list[FilterCount] = []

        def keep(name: str, pred: object) -> None:
            nonlocal remaining
            before = len(remaining)
            remaining = [u for u in remaining if pred(u)]  # type: ignore[operator]
            counts.append(FilterCount(name, before - len(remaining), len(remaining)))

        hosts = s.hosts
        keep(FILTER_NAMES[0], lambda u: u.healthy and u.host in hosts and hosts[u.host].online)
        keep(FILTER_NAMES[1], lambda u: hosts[u.host].takes_work)
        keep(FILTER_NAMES[2], lambda u: u.host not in job.avoid)
        if job.avoid:
            counts[-1].detail = f"its container did not start on {', '.join(sorted(job.avoid))} through the host"
        before = {u.host for u in remaining}
        keep(FILTER_NAMES[3], lambda u: runtime_allowed(hosts[u.host], job, policy))
        counts[-1].detail = _runtime_detail(job, policy, [hosts[h] for h in before - {u.host for u in remaining}])
        keep(FILTER_NAMES[4], lambda u: not c.regions or hosts[u.host].region in c.regions)
        keep(FILTER_NAMES[5], lambda u: hosts[u.host].reputation >= c.min_reputation)
        bw = c.min_bandwidth_mbps
        keep(FILTER_NAMES[6], lambda u: bw is None or (hosts[u.host].bandwidth_mbps or 0.0) >= bw)
        disk = c.min_disk_gib
        keep(FILTER_NAMES[7], lambda u: disk is None or (hosts[u.host].disk_free_gib or 0.0) >= disk)
        refused = {h: why for h in {u.host for u in remaining} if (why := price_refusal(hosts[h], job)) is not None}
        keep(FILTER_NAMES[8], lambda u: u.host not in refused)
        counts[-1].detail = _price_detail(job, refused)
        keep(FILTER_NAMES[9], lambda u: not r.models or u.model in r.models)
        keep(FILTER_NAMES[10], lambda u: not r.vendors or u.vendor in r.vendors)
        keep(FILTER_NAMES[11], lambda u: not r.tiers or u.tier in r.tiers)
        keep(FILTER_NAMES[12], lambda u: u.vram_mib >= r.min_vram_mib)
        mcc = r.min_compute_capability
        keep(FILTER_NAMES[13], lambda u: mcc is None or u.compute_capability >= mcc)
        keep(FILTER_NAMES[14], lambda u: u.mig_profile == r.mig_profile)
        keep(FILTER_NAMES[15], lambda u: pool.cpu_free.get(u.host, 0.0) >= r.cpu_cores)
        keep(FILTER_NAMES[16], lambda u: pool.ram_free.get(u.host, 0) >= r.ram_mib)
        keep(FILTER_NAMES[17], lambda u: u.id not in pool.holder)
        by_host: dict[str, list[str]] = {}
        for u in remaining:
            by_host.setdefault(u.host, []).append(u.id)
        if c.nvlink and r.gpus > 1:
            ok = {h for h, ids in by_host.items() if nvlink_group(ids, r.gpus, s.units) is not None}
        else:
            ok = set(by_host)
        keep(FILTER_NAMES[18], lambda u: u.host in ok)
        keep(FILTER_NAMES[19], lambda u: len(by_host[u.host]) >= r.gpus)
        return counts

    def _explain(self, job: Job, position: int, ordered: list[Job], status: str) -> Explanation:
        s = self.s
        e = Explanation(job.id, position, len(s.queue), ahead=[j.id for j in ordered[max(0, position - 6) : position - 1]])
        if status == "not_reached":  # not looked at this cycle: nothing measured, nothing claimed
            e.blocked_by = "cycle batch limit"
            e.summary = (
                f"Not reached this cycle: a cycle places at most {self.policy.max_places_per_cycle} workloads; "
                "it is looked at again in the next one."
            )
            self.plan.explanations[job.id] = e
            return e
        e.filters = self.filter_counts(job)
        quota = self.policy.quotas.get(job.account)
        if quota is not None and quota.gpus is not None:
            e.quota = QuotaCheck("gpus", quota.gpus, self.in_use.get(job.account, 0), job.units_asked)
        e.fits_now = self._fits_with(job, frozenset())
        fit = self.earliest_fit(job)
        e.estimated_start = fit[0] if fit is not None else None
        head = self.head
        if status == "cannot_fit":
            e.cannot_fit = self._cannot_fit(job)
            e.estimated_start = None
            e.summary = (
                f"Cannot be placed on this grid as it is now: {e.cannot_fit}. It waits, and starts when hosts that "
                "match join; or change the request."
            )
        elif status == "quota":
            over = self._quota_check(job, None)
            if over is None:  # a per-tier quota: find which by trying
                placed = self.pool.place(job)
                if placed is not None:
                    over = self._quota_check(job, placed)
                    self.pool.release(job.id)
            e.quota = over or e.quota
            q = e.quota
            what = "GPUs" if q is None or q.quota == "gpus" else f"GPUs of {q.quota[5:]}"
            e.summary = (
                f"Waiting for quota: account {job.account} holds {q.in_use} of its {q.limit} {what} and this workload "
                f"asks for {q.asked} more; it starts when the account's other workloads free enough."
                if q is not None
                else f"Waiting for quota of account {job.account}."
            )
            e.blocked_by = f"the {_quota_name(q.quota)} quota of account {job.account}" if q is not None else "quota"
            e.estimated_start = None  # when the account's own workloads end: not known from the grid
        elif status == "preempting":
            n = self.preempting.get(job.id, 0)
            e.blocked_by = f"{_count(n, 'lower-priority workload')} being stopped for it"
            e.estimated_start = s.now + self.policy.grace_s
            e.summary = (
                f"Starting soon: {_count(n, 'lower-priority workload')} {'is' if n == 1 else 'are'} being stopped to make room "
                f"(they get {self.policy.grace_s:g} s to exit)."
            )
        elif status == "head" and head is not None:
            e.reserved_start = head.start
            e.estimated_start = head.start
            if head.start is None:
                e.summary = self._no_room_summary(job, e, "It is next in line for room")
            else:
                e.summary = (
                    f"Next in line for room: {_gpus(job.units_asked)} reserved for it from {_at(head.start)}, when "
                    "running workloads are due to end; others only use room that does not delay it."
                )
        elif status in ("behind_head", "waiting") and head is not None and (status == "behind_head" or e.fits_now):
            hj = head.job
            when = f" from {_at(head.start)}" if head.start is not None else ""
            reserved = _gpus(hj.units_asked)
            e.blocked_by = f"waits behind {hj.id} (priority {hj.priority}), which has {reserved} reserved for it{when}"
            if head.start is not None and e.estimated_start is not None:
                e.estimated_start = max(e.estimated_start, head.start)
            hint = (
                " A workload with a max duration that ends before then could start now."
                if head.start is not None and self.policy.backfill
                else ""
            )
            e.summary = f"Waiting behind {hj.id} (priority {hj.priority}), which is next in line for room{when}.{hint}"
        else:
            e.summary = self._no_room_summary(job, e, "Waiting for room")
        self.plan.explanations[job.id] = e
        return e

    def _no_room_summary(self, job: Job, e: Explanation, lead: str) -> str:
        for f in e.filters:
            if f.remaining == 0 and f.removed > 0:
                if f.name in ("held by others", "replica fit", "CPU", "RAM"):
                    break
                if f.detail:
                    return f"{lead}: no GPU passes the {f.name} filter ({f.name}: {f.detail}); change the request or wait."
                return f"{lead}: no GPU passes the {f.name} filter (it removed the last {f.removed}); change the request or wait."
        when = (
            f"; expected about {_at(e.estimated_start)}"
            if e.estimated_start is not None
            else "; no running workload that would make room has a known end"
        )
        r = job.request
        gang = f"{job.replicas} replicas of " if job.replicas > 1 else ""
        priced = "".join(f" ({f.name}: {f.detail})" for f in e.filters if f.detail and f.removed)
        return f"{lead}: it needs {gang}{_gpus(r.gpus, 'matching')} on one host and not enough are idle now{priced}{when}."


def schedule(snapshot: Snapshot, *, pool: FreePool | None = None, explain: bool = True) -> Plan:
    """One cycle. With ``pool`` (an index built for this snapshot) the plan's placements are applied to it.

    ``explain=False`` skips the per-job explanations (they cost a pass over the units per waiting job).
    """
    cycle = _Cycle(snapshot, pool)
    cycle.requeue_broken()
    cycle.run(explain)
    return cycle.plan


def explain(snapshot: Snapshot, job_id: str) -> Explanation:
    """Why the queued job ``job_id`` waits: the cycle is run only up to it (nothing after it is looked at)."""
    if not any(j.id == job_id for j in snapshot.queue):
        raise NotFound(f"job {job_id} is not in the queue")
    cycle = _Cycle(snapshot, None)
    cycle.requeue_broken()
    e = cycle.run(explain=False, only=job_id)
    if e is not None:
        return e
    # it would be placed (or rejected) this cycle
    for d in cycle.plan.decisions:
        if isinstance(d, Reject) and d.job_id == job_id:
            job = next(j for j in snapshot.queue if j.id == job_id)
            rejected = Explanation(job_id, 0, len(snapshot.queue), summary=f"Rejected: {d.reason}.")
            rejected.filters = cycle.filter_counts(job)
            return rejected
    order = cycle.ordered_queue(whole=True)
    pos = next(i for i, j in enumerate(order, 1) if j.id == job_id)
    job = order[pos - 1]
    out = Explanation(job_id, pos, len(snapshot.queue), ahead=[j.id for j in order[max(0, pos - 6) : pos - 1]])
    cycle.pool.release(job_id)  # the cycle placed it: its own GPUs, CPU and RAM are not held by others
    out.filters = cycle.filter_counts(job)
    out.fits_now = True
    out.estimated_start = snapshot.now
    out.summary = "Starts at the next cycle: it fits on idle GPUs and nothing ahead of it needs them."
    return out


def never_fits(snapshot: Snapshot, job: Job) -> str | None:
    """Why ``job`` (not yet queued) could not run on this grid as it is now, even empty, or None; an empty grid says
    nothing (hosts may still join). What rent and submit refuse at once, with what would fix it: the process runtime
    the job does not allow (its constraint) or the operator does not offer, a model or tier the grid lacks."""
    if not snapshot.hosts:
        return None
    reason = _never_fits(snapshot, job)
    if reason is None:
        return _image_never_got(snapshot, job)
    if job.runs_image and not any(has_engine(h) for h in snapshot.hosts.values()):
        return _no_engine(snapshot)
    allowing = dataclasses.replace(
        job, runs_image=False, constraints=dataclasses.replace(job.constraints, allow_process_runtime=True)
    )
    offered = dataclasses.replace(snapshot, policy=dataclasses.replace(snapshot.policy, allow_process_runtime=True))
    flag = PROCESS_RUNTIME_FLAG
    if job.runs_image and _never_fits(offered, allowing) is None:
        offer = (
            "" if snapshot.policy.allow_process_runtime else ", which this grid's operator does not offer (offer_sandboxed_hosts)"
        )
        return (
            f"{reason} among the hosts with a container engine; the others run commands on the host itself (the process "
            f'runtime{offer}): image "none" with {flag} runs there'
        )
    if not job.runs_image and not job.constraints.allow_process_runtime and _never_fits(snapshot, allowing) is None:
        return f'image "none" runs the command on the host itself, on hosts of the process runtime: allow it with {flag}'
    if not job.runs_image and not snapshot.policy.allow_process_runtime and _never_fits(offered, allowing) is None:
        return (
            'image "none" runs the command on the host itself, on hosts of the process runtime, which this grid\'s '
            "operator does not offer (offer_sandboxed_hosts); name an image to run on the hosts with a container engine"
        )
    r = job.request
    if r.models or r.tiers:
        models = sorted({u.model for u in snapshot.units.values() if u.model})
        reason = f"{reason} (replica.models / replica.tiers; the GPU models here: {', '.join(models) or 'none'})"
    bare = sum(1 for h in snapshot.hosts.values() if h.isolation == "none")
    if bare:
        verb = "isolates" if bare == 1 else "isolate"
        reason += (
            f"; {_count(bare, 'host')} here {verb} nothing (isolation none) and take{'s' if bare == 1 else ''} no renter's work"
        )
    return reason


ENGINE_FIX = "a provider's host with Docker or Podman, its agent on the docker runtime (--runtime docker)"
# The one setting that lets a workload onto the process runtime, as each of the renter's tools spells it.
PROCESS_RUNTIME_FLAG = (
    "constraints.allow_process_runtime (the CLI's --allow-process-runtime, the console's \"May run as a sandboxed process\")"
)


def has_engine(host: Host) -> bool:
    """Whether ``host`` could run an image for a renter: a container engine (or the simulated runtime), isolating."""
    return host.runtime != "process" and host.isolation != "none"


def _no_engine(snapshot: Snapshot) -> str:
    """An image on a grid none of whose hosts runs a container engine: what would run it."""
    process = "" if snapshot.policy.allow_process_runtime else " (which this grid's operator does not offer)"
    return (
        f"an image runs only on a host with a container engine, and no host of this grid has one: it needs {ENGINE_FIX}; "
        f'the hosts here run commands on the host itself, the process runtime{process}: image "none" with '
        f"{PROCESS_RUNTIME_FLAG} runs there"
    )


def _image_never_got(snapshot: Snapshot, job: Job) -> str | None:
    """Why no host of this grid with a container engine can ever get ``job``'s image (none has it, none may pull it
    from its registry: common/inventory.py ``image_refusal``), with what would fix it; None when one can, or when the
    grid has no such host (the capacity check speaks then). A rental looks at the host it rents alone."""
    if not job.runs_image:
        return None
    engines = [h for h in snapshot.hosts.values() if has_engine(h) and (job.pin is None or h.id == job.pin)]
    per_reason: dict[str, int] = {}
    for host in engines:
        why = image_refusal(host.image_source, host.images, job.image)
        if why is None:
            return None
        per_reason[why] = per_reason.get(why, 0) + 1
    if not per_reason:
        return None
    registry = registry_of(job.image)
    where = f"offer {job.pin} cannot" if job.pin is not None else "no host of this grid with a container engine can"
    had = sorted({image for h in engines for image in h.images})
    return (
        f"{where} get image {job.image}: {_verb_counts(per_reason)}. It runs on a host that pulls from {registry} "
        f"(its agent's image_pull on, {registry} within image_registries_allowed) or that has the image loaded"
        + (f"; the images here: {', '.join(had[:8])}" if had else "")
    )


def _never_fits(snapshot: Snapshot, job: Job) -> str | None:
    cycle = _Cycle(snapshot, None)
    return cycle._invalid(job) or cycle._cannot_fit(job)


def reserved_start(snapshot: Snapshot, job: Job) -> float | None:
    """The earliest time ``job`` fits as running jobs end (the queue ignored); ``now`` if it fits now."""
    cycle = _Cycle(snapshot, None)
    cycle.requeue_broken()
    fit = cycle.earliest_fit(job)
    return fit[0] if fit is not None else None


def _at(ts: float) -> str:
    """A moment as a person reads it (the core has no clock: formatting one is not reading one)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _market_terms(job: Job) -> str:
    if job.rental == "interruptible":
        return f"interruptible, bid {format_amount(job.bid)}"
    return job.rental


def runtime_refusal(host: Host, job: Job, policy: Policy) -> str | None:
    """Why ``host`` cannot run ``job`` by its runtime, in words a renter acts on, or None."""
    if host.isolation == "none":
        return "isolate nothing (isolation none) and take no renter's work"
    if host.runtime == "docker" and not job.runs_image:
        return 'run a container engine, and image "none" runs only on hosts of the process runtime'
    if host.runtime == "process" and job.runs_image:
        return "run commands on the host itself (process runtime) and no image; an image runs only where a container engine is"
    if host.runtime == "process" and not job.constraints.allow_process_runtime:
        return "run the process runtime, which the workload does not allow (constraints.allow_process_runtime)"
    if host.runtime == "process" and not policy.allow_process_runtime:
        return "run the process runtime, which this grid's operator does not offer (offer_sandboxed_hosts)"
    if job.runs_image:
        return image_refusal(host.image_source, host.images, job.image)
    return None


def _runtime_detail(job: Job, policy: Policy, removed: list[Host]) -> str:
    """What the runtime filter removed, by reason, e.g. '2 hosts run a container engine, and image "none" ...'."""
    per_reason: dict[str, int] = {}
    for host in removed:
        why = runtime_refusal(host, job, policy)
        if why is not None:
            per_reason[why] = per_reason.get(why, 0) + 1
    return _verb_counts(per_reason)


def _verb_counts(per_reason: dict[str, int]) -> str:
    """Reasons that start with a verb, each with how many hosts it holds for: "1 host lacks ...; 2 hosts pull ..."."""
    parts = []
    for why, n in sorted(per_reason.items(), key=lambda item: (-item[1], item[0])):
        verb, rest = why.split(" ", 1)
        parts.append(f"{_count(n, 'host')} {verb + 's' if n == 1 else verb} {rest}")
    return "; ".join(parts)


def _price_detail(job: Job, refused: dict[str, str]) -> str:
    """What the price filter removed, by reason, e.g. "12 hosts list more than your max_price 2.00"."""
    per_reason: dict[str, int] = {}
    for why in refused.values():
        per_reason[why] = per_reason.get(why, 0) + 1
    parts = []
    for why, n in sorted(per_reason.items(), key=lambda item: (-item[1], item[0])):
        hosts = _count(n, "host")
        if why == "max_price":
            listed = "a reserved price of" if job.rental == "reserved" else ""
            what = f"list {listed + ' ' if listed else ''}more than your max_price {format_amount(job.max_price or 0)}"
        elif why == "bid":
            what = f"ask a min bid above your bid {format_amount(job.bid)}"
        elif why == "not_interruptible":
            what = "are not rented interruptible"
        elif why == "pin":
            what = f"are not the offer you rent ({job.pin})"
        elif why == "duration":
            what = "take rentals only up to a max duration shorter than yours (or yours sets none)"
        elif job.capped:  # unfunded: a hard spend cap reached
            what = f"charge money and {job.capped}: it waits until the cap allows it (or is raised)"
        elif job.funded and job.affordable is not None:  # unfunded: too little for one metering period
            what = (
                "charge more than your available balance pays for one metering period of this workload "
                f"(it covers up to {format_amount(job.affordable)} per GPU-hour)"
            )
        else:  # unfunded
            what = "charge money and your account has no available balance"
        parts.append(f"{hosts} {what}")
    return "; ".join(parts)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _gpus(n: int, adjective: str = "") -> str:
    return f"{n} {adjective + ' ' if adjective else ''}GPU" + ("" if n == 1 else "s")


def _quota_name(quota: str) -> str:
    return "GPU" if quota == "gpus" else f"{quota.removeprefix('tier:')} tier"

"""The free-unit index the core places against: which units are idle, where, of what kind.

Placing by scanning 80,000 units per job would be far too slow, so the pool keeps, for each unit *shape*
(model, tier, VRAM, compute capability, MIG profile), the idle units per host and the hosts bucketed by
how many idle units of that shape they have. Finding a host for a replica of ``g`` units is then a walk
over the buckets ``g, g+1, ...`` (bin-packing: the fullest host that still fits) or from the top down
(spread), checking host-level constraints only on the hosts it meets.

Invariants:
- a unit is in the pool only if it is healthy, its host is online and takes work, and nobody holds it;
- ``holder`` has exactly one entry per held unit (one holder per unit, always);
- free CPU and RAM of a host are its totals less what the replicas placed there asked for.

Tentative work (a gang's replicas, a preemption or reservation what-if) is done by ``take``/``release``
and undone by their inverse, so the index is never copied during a cycle.

Kept across cycles as well (a pool the loop keeps): hold end times in order, and the running jobs by start
time (``RunningByStart``), which preemption reads most recently started first.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain

from common.containers import canonical_image
from common.inventory import image_refusal
from management.scheduler.model import Assignment, Host, Job, Policy, ReplicaRequest, Snapshot, Unit

# model, tier, VRAM, compute capability, MIG profile; the host's on-demand and reserved price, so that the idle units
# are bucketed by price too and a priced job walks the cheapest buckets first (a free grid has one price); the vendor
Shape = tuple[str, str | None, int, tuple[int, int], str | None, int, int, str]
REPUTATION_PROBE = 8  # among equally good hosts, the best reputation of the first few that pass is taken


def shape_of(unit: Unit, host: Host | None = None) -> Shape:
    price, reserved = (host.price, host.reserved_price) if host is not None else (0, 0)
    return (unit.model, unit.tier, unit.vram_mib, unit.compute_capability, unit.mig_profile, price, reserved, unit.vendor)


def shape_matches(shape: Shape, r: ReplicaRequest) -> bool:
    model, tier, vram, cc, mig, _, _, vendor = shape
    if r.models and model not in r.models:
        return False
    if r.vendors and vendor not in r.vendors:
        return False
    if r.tiers and tier not in r.tiers:
        return False
    if vram < r.min_vram_mib:
        return False
    if r.min_compute_capability is not None and cc < r.min_compute_capability:
        return False
    return mig == r.mig_profile


def runtime_fits(host: Host, runs_image: bool, process_allowed: bool) -> bool:
    """Whether ``host`` can run a job with an image (``runs_image``) or one whose image is "none" (a command run on the
    host itself): an image needs a container engine (docker), "none" the process runtime, which also needs the job and
    the operator to allow it (``process_allowed``); a host that isolates nothing runs no renter's work."""
    if host.isolation == "none":
        return False
    if host.runtime == "process":
        return not runs_image and process_allowed
    if host.runtime == "docker":
        return runs_image
    return True  # simulated: it runs nothing for real


def runtime_allowed(host: Host, job: Job, policy: Policy) -> bool:
    """Whether ``host`` runs ``job`` by its runtime (``runtime_fits``) and, for an image, can get that image."""
    process_allowed = policy.allow_process_runtime and job.constraints.allow_process_runtime
    if not runtime_fits(host, job.runs_image, process_allowed):
        return False
    return not job.runs_image or host.image_source is None or image_refusal(host.image_source, host.images, job.image) is None


def price_for(host: Host, job: Job) -> int:
    """What ``job`` pays per GPU-hour on ``host``: the listed price (on demand), the reserved price, or its bid."""
    if job.rental == "interruptible":
        return job.bid
    return host.reserved_price if job.rental == "reserved" else host.price


def price_refusal(host: Host, job: Job) -> str | None:
    """Why ``host`` is not for ``job`` by price or rental terms, or None: "pin" (not the offer rented), "not_interruptible"
    (no min bid), "bid" (under the min bid), "max_price", "duration" (longer than the host takes, or unbounded),
    "unfunded" (it would pay and the renter has no money, or a hard spend cap of its renter's is reached)."""
    if job.pin is not None and host.id != job.pin:
        return "pin"
    rental = job.rental
    if rental == "interruptible":
        if host.min_bid is None:
            return "not_interruptible"
        if host.min_bid > job.bid:
            return "bid"
    elif job.max_price is not None and (host.reserved_price if rental == "reserved" else host.price) > job.max_price:
        return "max_price"
    if host.max_duration_s is not None:
        duration = job.reserved_s if rental == "reserved" and job.reserved_s is not None else job.max_duration_s
        if duration is None or duration > host.max_duration_s:
            return "duration"
    price = price_for(host, job)
    if price > 0 and (job.capped or not job.funded or (job.affordable is not None and price > job.affordable)):
        return "unfunded"
    return None


def host_static_ok(host: Host, job: Job, policy: Policy) -> bool:
    """Every host-level constraint except free CPU/RAM: takes work, runtime, region, reputation, bandwidth, disk, price."""
    c = job.constraints
    if not (host.online and host.takes_work) or host.id in job.avoid or not runtime_allowed(host, job, policy):
        return False
    if (
        job.rental != "on_demand"
        or not job.funded
        or job.capped
        or job.affordable is not None
        or job.max_price is not None
        or job.pin is not None
        or host.max_duration_s is not None
    ) and price_refusal(host, job) is not None:  # checked per host met: a free grid's job makes no call
        return False
    if c.regions and host.region not in c.regions:
        return False
    if host.reputation < c.min_reputation:
        return False
    if c.min_bandwidth_mbps is not None and (host.bandwidth_mbps is None or host.bandwidth_mbps < c.min_bandwidth_mbps):
        return False
    if c.min_disk_gib is not None and (host.disk_free_gib is None or host.disk_free_gib < c.min_disk_gib):
        return False
    return True


def nvlink_group(units: Iterable[str], size: int, table: Mapping[str, Unit]) -> tuple[str, ...] | None:
    """``size`` units from ``units`` that are pairwise NVLink-connected (greedy, in index order), or None."""
    pool = list(units)
    for i, first in enumerate(pool):
        group = [first]
        for other in pool[i + 1 :]:
            peers_other = table[other].nvlink_peers
            if all(g in peers_other and other in table[g].nvlink_peers for g in group):
                group.append(other)
                if len(group) == size:
                    return tuple(group)
        if size == 1:
            return (first,)
    return None


class RunningByStart:
    """The running jobs of the latest snapshot, grouped by start time, kept across cycles with a kept pool.

    ``sync`` brings it in line with a snapshot's running jobs by identity (jobs are frozen values: an
    unchanged job is the same object), so a cycle pays a walk that compares pointers instead of regrouping
    and sorting every running job. ``most_recent_first`` yields them by start time, latest first, then by id
    (a group is sorted when first read after it changed). What it holds is only ever read from snapshots.
    """

    __slots__ = ("_jobs", "_groups", "_starts", "_ordered", "_hosts", "interruptible")

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}  # as last synced
        self._groups: dict[float, dict[str, Job]] = {}  # start time -> its jobs
        self._starts: list[float] = []  # ascending
        self._ordered: dict[float, list[Job]] = {}  # start time -> its jobs by id, while unchanged
        self._hosts: dict[str, frozenset[str]] = {}  # job -> the hosts of its replicas, while unchanged
        # (priority class, bid) -> how many interruptible jobs run with it: whether a market preemption can find anyone
        self.interruptible: dict[tuple[str, int], int] = {}

    def sync(self, running: Mapping[str, Job]) -> None:
        jobs = self._jobs
        seen = jobs.get
        changed = [(job_id, job) for job_id, job in running.items() if seen(job_id) is not job]
        added = sum(1 for job_id, _ in changed if job_id not in jobs)
        if len(jobs) + added != len(running):  # some ended: find which
            for job_id in [j for j in jobs if j not in running]:
                self._drop(job_id)
        new_starts: list[float] = []
        for job_id, job in changed:
            if job_id in jobs:
                self._drop(job_id)
            start = job.started_at or 0.0
            group = self._groups.get(start)
            if group is None:
                group = self._groups[start] = {}
                new_starts.append(start)
            group[job_id] = job
            jobs[job_id] = job
            if job.rental == "interruptible":
                key = (job.priority, job.bid)
                self.interruptible[key] = self.interruptible.get(key, 0) + 1
            self._ordered.pop(start, None)
        if len(new_starts) > 64:  # a first sync, or a burst of starts: one sort instead of many inserts
            self._starts = sorted(self._groups)
        else:
            for start in new_starts:
                bisect.insort(self._starts, start)

    def replica_hosts(self, job: Job, units: Mapping[str, Unit]) -> frozenset[str]:
        """The hosts of ``job``'s replicas (of each replica's first unit still on the grid), kept while the
        job is unchanged: a unit's host is part of the grid's layout, which a kept pool assumes fixed."""
        hosts = self._hosts.get(job.id)
        if hosts is None:
            hosts = frozenset(
                unit.host for replica in job.assignment or () if replica and (unit := units.get(replica[0])) is not None
            )
            if self._jobs.get(job.id) is job:
                self._hosts[job.id] = hosts
        return hosts

    def _drop(self, job_id: str) -> None:
        self._hosts.pop(job_id, None)
        job = self._jobs.pop(job_id)
        if job.rental == "interruptible":
            key = (job.priority, job.bid)
            left = self.interruptible[key] - 1
            if left:
                self.interruptible[key] = left
            else:
                del self.interruptible[key]
        start = job.started_at or 0.0
        group = self._groups[start]
        del group[job_id]
        self._ordered.pop(start, None)
        if not group:
            del self._groups[start]
            del self._starts[bisect.bisect_left(self._starts, start)]

    def groups_most_recent_first(self) -> Iterator[list[Job]]:
        """The jobs as last synced, one group per start time, latest first; each group by id (do not
        ``sync`` while reading)."""
        ordered = self._ordered
        for start in reversed(self._starts):
            group = ordered.get(start)
            if group is None:
                group = ordered[start] = sorted(self._groups[start].values(), key=_job_id)
            yield group

    def most_recent_first(self) -> Iterator[Job]:
        """Every job as last synced, latest start first, then by id."""
        for group in self.groups_most_recent_first():
            yield from group


def _job_id(job: Job) -> str:
    return job.id


@dataclass(slots=True)
class _Hold:
    job_id: str
    replicas: Assignment
    cpu: float
    ram: int
    interruptible: bool = False


class FreePool:
    """Idle units indexed by shape and host; see the module docstring for the invariants."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.hosts = snapshot.hosts
        self.units = snapshot.units
        self.policy = snapshot.policy
        self.free: dict[str, dict[Shape, dict[str, None]]] = {}  # host -> shape -> idle unit ids (ordered set)
        self.buckets: dict[Shape, dict[int, dict[str, None]]] = {}  # shape -> idle count -> hosts
        self.cpu_free: dict[str, float] = {h.id: h.cpu_cores for h in snapshot.hosts.values()}
        self.ram_free: dict[str, int] = {h.id: h.ram_mib for h in snapshot.hosts.values()}
        self.holder: dict[str, str] = dict(snapshot.holders)
        self.holds: dict[str, _Hold] = {}
        self.interruptible_holds = 0  # holds of interruptible jobs: with none, no market preemption is looked for
        self._shapes_for: dict[ReplicaRequest, list[Shape]] = {}
        self._static: dict[Shape, dict[str, int]] | None = None
        self._histograms: dict[tuple[bool, bool], dict[Shape, dict[int, int]]] = {}
        self._hosts_with: dict[frozenset[Shape], frozenset[str]] = {}
        self._warm: dict[str, frozenset[str]] = {}  # image -> the hosts that hold it (kept with the hosts)
        self.capacity_verdicts: dict[tuple[object, ...], str | None] = {}  # for rejections; the grid's shape is fixed
        self.now = snapshot.now
        self.ends: dict[str, float] = {}  # job -> when it ends at the latest (max duration), where known
        self._ends_sorted: list[tuple[float, str]] = []  # (end, job) ascending; entries of gone jobs skipped when read
        hosts = self.hosts
        self.shape: dict[str, Shape] = {uid: shape_of(u, hosts.get(u.host)) for uid, u in self.units.items()}
        self._prices: dict[str, tuple[int, int]] = {h.id: (h.price, h.reserved_price) for h in hosts.values()}  # in shapes
        self.running_by_start = RunningByStart()  # synced by the core when a cycle looks for victims
        self._duration_limited: bool | None = None  # whether a host limits rentals' durations (kept with the hosts)
        for uid in sorted(self.units, key=lambda u: (self.units[u].host, self.units[u].index, u)):
            if uid not in self.holder:
                self._add_free(uid)
        for job in snapshot.running.values():
            if job.assignment is not None:
                self._record(job, job.assignment)
                if job.ends_at is not None:
                    self.ends[job.id] = job.ends_at
        self._ends_sorted = sorted((end, job_id) for job_id, end in self.ends.items())
        self.static_counts()  # part of building the index, not of the first cycle

    # --- when holds end --------------------------------------------------------------------------------

    def note_end(self, job_id: str, end: float) -> None:
        self.ends[job_id] = end
        bisect.insort(self._ends_sorted, (end, job_id))
        if len(self._ends_sorted) > 2 * len(self.holds) + 1024:  # drop entries of jobs that are gone (order kept)
            holds = self.holds
            self.ends = ends = {j: e for j, e in self.ends.items() if j in holds}
            kept: list[tuple[float, str]] = []
            for entry in self._ends_sorted:
                if ends.get(entry[1]) == entry[0] and (not kept or kept[-1] != entry):
                    kept.append(entry)
            self._ends_sorted = kept

    def ends_in_order(self, extra: list[tuple[float, str]]) -> Iterator[tuple[float, str]]:
        """(end, job id) of current holds by end time, ``extra`` merged in; may repeat a job (callers skip).

        A walk over the kept sorted list (no copy, no heap): the pool must not be changed by ``note_end``
        while the iterator is in use (taking and releasing units is fine: holds are checked as it goes).
        """
        holds, ends = self.holds, self.ends
        if not extra:
            for end, job_id in self._ends_sorted:
                if job_id in holds and ends.get(job_id) == end:
                    yield end, job_id
            return
        early = sorted(extra)
        early_set = set(early)
        k, n = 0, len(early)
        for entry in self._ends_sorted:
            while k < n and early[k] <= entry:
                end, job_id = early[k]
                k += 1
                if job_id in holds:
                    yield end, job_id
            end, job_id = entry
            if job_id in holds and (ends.get(job_id) == end or entry in early_set):
                yield end, job_id
        for end, job_id in early[k:]:
            if job_id in holds:
                yield end, job_id

    # --- index maintenance -------------------------------------------------------------------------

    def placeable(self, uid: str) -> bool:
        unit = self.units.get(uid)
        if unit is None or not unit.healthy:
            return False
        host = self.hosts.get(unit.host)
        return host is not None and host.online and host.takes_work

    def _add_free(self, uid: str) -> None:
        if not self.placeable(uid):
            return
        unit = self.units[uid]
        shape = self.shape.get(uid) or shape_of(unit, self.hosts.get(unit.host))
        per_shape = self.free.setdefault(unit.host, {}).setdefault(shape, {})
        n = len(per_shape)
        per_shape[uid] = None
        buckets = self.buckets.setdefault(shape, {})
        if n:
            del buckets[n][unit.host]
        buckets.setdefault(n + 1, {})[unit.host] = None

    def _remove_free(self, uid: str) -> None:
        unit = self.units[uid]
        shape = self.shape.get(uid) or shape_of(unit, self.hosts.get(unit.host))
        per_shape = self.free[unit.host][shape]
        n = len(per_shape)
        del per_shape[uid]
        buckets = self.buckets[shape]
        del buckets[n][unit.host]
        if n > 1:
            buckets.setdefault(n - 1, {})[unit.host] = None

    def adopt(self, snapshot: Snapshot) -> None:
        """Read hosts, units and policy from this (later) snapshot of the same grid."""
        changed_hosts = snapshot.hosts is not self.hosts
        self.hosts, self.units, self.policy, self.now = snapshot.hosts, snapshot.units, snapshot.policy, snapshot.now
        self._shapes_for.clear()
        if changed_hosts:
            self._duration_limited = None
            self._warm.clear()
            self._reprice()

    def _reprice(self) -> None:
        """Move the units of hosts whose prices changed to the shapes of their new prices (a pass over the hosts)."""
        hosts, prices = self.hosts, self._prices
        moved = set()
        for h, host in hosts.items():
            now = (host.price, host.reserved_price)
            if prices.get(h, now) != now:
                moved.add(h)
        if not moved:
            return
        for uid, unit in self.units.items():
            if unit.host in moved:
                free = self.is_free(uid)
                if free:
                    self._remove_free(uid)
                self.shape[uid] = shape_of(unit, hosts.get(unit.host))
                if free:
                    self._add_free(uid)
        for h in moved:
            prices[h] = (hosts[h].price, hosts[h].reserved_price)
        self._static = None
        self._histograms.clear()
        self._hosts_with.clear()

    def refresh(self, uid: str) -> None:
        """Bring one unit's idle entry in line with its health and its host's state (after either changed)."""
        free, held = self.is_free(uid), uid in self.holder
        if free and not self.placeable(uid):
            self._remove_free(uid)
        elif not free and not held and uid in self.units and self.placeable(uid):
            self._add_free(uid)

    def is_free(self, uid: str) -> bool:
        unit = self.units.get(uid)
        if unit is None:
            return False
        return uid in self.free.get(unit.host, {}).get(self.shape.get(uid) or shape_of(unit, self.hosts.get(unit.host)), {})

    def _record(self, job: Job, assignment: Assignment) -> None:
        r = job.request
        for replica in assignment:
            if replica:
                host = self.units[replica[0]].host if replica[0] in self.units else None
                if host in self.cpu_free:
                    self.cpu_free[host] -= r.cpu_cores
                    self.ram_free[host] -= r.ram_mib
        self._hold(job, assignment)

    def _hold(self, job: Job, assignment: Assignment) -> None:
        interruptible = job.rental == "interruptible"
        self.interruptible_holds += interruptible
        previous = self.holds.get(job.id)
        if previous is not None:
            self.interruptible_holds -= previous.interruptible
        self.holds[job.id] = _Hold(job.id, assignment, job.request.cpu_cores, job.request.ram_mib, interruptible)

    def take(self, job: Job, assignment: Assignment) -> None:
        """``job`` now holds ``assignment`` (every unit must be idle)."""
        for replica in assignment:
            for uid in replica:
                self._remove_free(uid)
                self.holder[uid] = job.id
        self._record(job, assignment)

    def release(self, job_id: str) -> Assignment:
        """``job_id`` holds nothing any more; its placeable units become idle. Returns what it held."""
        hold = self.holds.pop(job_id, None)
        if hold is None:
            return ()
        self.interruptible_holds -= hold.interruptible
        for replica in hold.replicas:
            if replica and replica[0] in self.units:
                host = self.units[replica[0]].host
                if host in self.cpu_free:
                    self.cpu_free[host] += hold.cpu
                    self.ram_free[host] += hold.ram
            for uid in replica:
                if self.holder.get(uid) == job_id:
                    del self.holder[uid]
                    self._add_free(uid)
        return hold.replicas

    def restore(self, job: Job, assignment: Assignment) -> None:
        """Undo ``release``: ``job`` holds ``assignment`` again (units that were not placeable were never freed)."""
        for replica in assignment:
            for uid in replica:
                if self.is_free(uid):
                    self._remove_free(uid)
                self.holder[uid] = job.id
        self._record(job, assignment)

    # --- finding room ------------------------------------------------------------------------------

    def shapes_for(self, r: ReplicaRequest) -> list[Shape]:
        shapes = self._shapes_for.get(r)
        if shapes is None:
            shapes = [s for s in self.static_counts() if shape_matches(s, r)]
            self._shapes_for[r] = shapes
        return shapes

    def _host_fits(self, host_id: str, job: Job) -> bool:
        host = self.hosts[host_id]
        r = job.request
        return (
            host_static_ok(host, job, self.policy)
            and self.cpu_free[host_id] >= r.cpu_cores
            and self.ram_free[host_id] >= r.ram_mib
        )

    def _units_on(self, host_id: str, shape: Shape, job: Job) -> tuple[str, ...] | None:
        idle = self.free[host_id][shape]
        g = job.request.gpus
        if g == 1:
            return (next(iter(idle)),)
        group = nvlink_group(idle, g, self.units)
        if group is not None:
            return group
        if job.constraints.nvlink:
            return None
        return tuple(list(idle)[:g])

    def limits_duration(self) -> bool:
        """Whether any host limits a rental's duration (one pass, kept while the snapshot's hosts are the same mapping)."""
        if self._duration_limited is None:
            self._duration_limited = any(h.max_duration_s is not None for h in self.hosts.values())
        return self._duration_limited

    def _candidates(self, job: Job, exclude: frozenset[str]) -> Iterator[tuple[str, Shape]]:
        """Hosts (with the shape to use there) in order of preference for one replica of ``job``: the cheapest
        first, then by the placement order (``_candidates_by_fit``). Shapes carry their hosts' prices, so this is
        the placement walk over the buckets of the lowest price, then of the next: a free grid has one."""
        shapes = self.shapes_for(job.request)
        if job.rental == "interruptible":  # it pays its bid wherever it runs
            return self._warm_first(job, exclude, shapes)
        reserved = job.rental == "reserved"
        by_price: dict[int, list[Shape]] = {}
        for shape in shapes:
            by_price.setdefault(shape[6] if reserved else shape[5], []).append(shape)
        if len(by_price) <= 1:
            return self._warm_first(job, exclude, shapes)
        return chain.from_iterable(self._warm_first(job, exclude, by_price[p]) for p in sorted(by_price))

    def _warm_first(self, job: Job, exclude: frozenset[str], shapes: list[Shape]) -> Iterator[tuple[str, Shape]]:
        """``_candidates_by_fit``, but for a job that prefers warm hosts (an endpoint's worker), the hosts of these
        shapes (one price) that already hold its image first: no pull, the shortest cold start."""
        if not (job.prefer_warm and job.runs_image and job.image):
            return self._candidates_by_fit(job, exclude, shapes)
        warm = self.warm_hosts(job.image)
        if not warm:
            return self._candidates_by_fit(job, exclude, shapes)
        return chain(
            self._candidates_by_fit(job, exclude, shapes, only=warm), self._candidates_by_fit(job, exclude | warm, shapes)
        )

    def warm_hosts(self, image: str) -> frozenset[str]:
        """The hosts whose reported images include ``image`` (hello's list, most recently used first)."""
        found = self._warm.get(image)
        if found is None:
            wanted = canonical_image(image)
            found = frozenset(h.id for h in self.hosts.values() if any(canonical_image(i) == wanted for i in h.images))
            self._warm[image] = found
        return found

    def _candidates_by_fit(
        self, job: Job, exclude: frozenset[str], shapes: list[Shape], *, only: frozenset[str] | None = None
    ) -> Iterator[tuple[str, Shape]]:
        """Hosts (with the shape to use there, one of ``shapes``) in placement order (bin-packing or spread, then
        reputation); ``only``: of these hosts alone."""
        g = job.request.gpus
        spread = (job.placement or self.policy.placement_default) == "spread"
        levels: dict[int, list[Shape]] = {}
        for shape in shapes:
            for count, hosts in self.buckets.get(shape, {}).items():
                if count >= g and hosts:
                    levels.setdefault(count, []).append(shape)
        for count in sorted(levels, reverse=spread):
            for shape in levels[count]:
                hosts = self.buckets[shape][count]
                best: list[tuple[float, str]] = []
                for host_id in hosts:
                    if host_id in exclude or (only is not None and host_id not in only) or not self._host_fits(host_id, job):
                        continue
                    best.append((-self.hosts[host_id].reputation, host_id))
                    if len(best) >= REPUTATION_PROBE:
                        break
                best.sort()
                for _, host_id in best:
                    yield host_id, shape
                if len(best) >= REPUTATION_PROBE:  # the rest of this bucket, beyond the probe
                    seen = {h for _, h in best}
                    for host_id in list(hosts):
                        if host_id in seen or host_id in exclude or (only is not None and host_id not in only):
                            continue
                        if self._host_fits(host_id, job):
                            yield host_id, shape

    def _find_replica(self, job: Job, exclude: frozenset[str]) -> tuple[str, ...] | None:
        for host_id, shape in self._candidates(job, exclude):
            units = self._units_on(host_id, shape, job)
            if units is not None:
                return units
        return None

    def place(self, job: Job, exclude: frozenset[str] = frozenset()) -> Assignment | None:
        """Place every replica of ``job`` (all or none) on idle units, avoiding hosts in ``exclude``.

        On success the units are taken (``release(job.id)`` undoes it); on failure nothing changed.
        """
        r = job.request
        if r.gpus <= 0 or job.replicas <= 0:
            return None
        placed: list[tuple[str, ...]] = []
        for _ in range(job.replicas):
            units = self._find_replica(job, exclude)  # sees the room the replicas before it took
            if units is None:
                self._undo(job.id, placed, r)
                return None
            host = self.units[units[0]].host
            for uid in units:
                self._remove_free(uid)
                self.holder[uid] = job.id
            self.cpu_free[host] -= r.cpu_cores
            self.ram_free[host] -= r.ram_mib
            placed.append(units)
        assignment = tuple(placed)
        self._hold(job, assignment)
        return assignment

    def _undo(self, job_id: str, placed: list[tuple[str, ...]], r: ReplicaRequest) -> None:
        for units in placed:
            host = self.units[units[0]].host
            self.cpu_free[host] += r.cpu_cores
            self.ram_free[host] += r.ram_mib
            for uid in units:
                del self.holder[uid]
                self._add_free(uid)

    # --- reservations that hold units without a job (a preemptor's share of idle units) -----------

    def reserve(self, key: str, units: Iterable[str]) -> None:
        taken = tuple(u for u in units if self.is_free(u))
        for uid in taken:
            self._remove_free(uid)
            self.holder[uid] = key
        self.holds[key] = _Hold(key, (taken,), 0.0, 0)

    def unreserve(self, key: str) -> None:
        hold = self.holds.pop(key, None)
        if hold is not None:
            for uid in hold.replicas[0]:
                del self.holder[uid]
                self._add_free(uid)

    # --- what the grid could ever hold, for rejecting the impossible --------------------------------

    def static_counts(self) -> dict[Shape, dict[str, int]]:
        """Units per shape per host, whatever their health or holder (computed once per pool)."""
        counts = self._static
        if counts is None:
            counts = {}
            for unit in self.units.values():
                shape = self.shape.get(unit.id) or shape_of(unit, self.hosts.get(unit.host))
                per_host = counts.setdefault(shape, {})
                per_host[unit.host] = per_host.get(unit.host, 0) + 1
            self._static = counts
        return counts

    def static_histogram(self, runs_image: bool, process_allowed: bool) -> dict[Shape, dict[int, int]]:
        """Per shape: how many hosts (that may run the job at all) have how many units of it, whatever their state."""
        cached = self._histograms.get((runs_image, process_allowed))
        if cached is None:
            cached = {}
            for shape, per_host in self.static_counts().items():
                hist: dict[int, int] = {}
                for host_id, count in per_host.items():
                    host = self.hosts.get(host_id)
                    if host is None or not runtime_fits(host, runs_image, process_allowed):
                        continue
                    hist[count] = hist.get(count, 0) + 1
                cached[shape] = hist
            self._histograms[(runs_image, process_allowed)] = cached
        return cached

    def hosts_with(self, shapes: Iterable[Shape]) -> frozenset[str]:
        """Hosts that have any unit of these shapes (cached per set of shapes)."""
        key = frozenset(shapes)
        found = self._hosts_with.get(key)
        if found is None:
            static = self.static_counts()
            found = frozenset(h for s in key for h in static.get(s, {}))
            self._hosts_with[key] = found
        return found

    def free_count(self, shapes: Iterable[Shape]) -> int:
        return sum(count * len(hosts) for s in shapes for count, hosts in self.buckets.get(s, {}).items())

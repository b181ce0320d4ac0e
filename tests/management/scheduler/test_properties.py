"""The scheduler core's invariants, driven by hypothesis over small random grids, running work and queues.

1. no unit ever has two holders; 2. gangs are all-or-nothing; 3. a higher class is never left waiting
when preempting lower work would fit it; 4. backfill never delays the head's reserved start; 5. two
accounts of equal share, both always submitting, get GPU-seconds within 5% of each other over a day;
6. (prices and bids) no job is ever preempted by a job of lower or equal (class, market) rank, and reserved
rentals never are.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from management.scheduler import (
    Constraints,
    Host,
    Job,
    Place,
    Policy,
    PriorityClass,
    ReplicaRequest,
    Requeue,
    Snapshot,
    Unit,
    add_usage,
    decay,
    reserved_start,
    schedule,
)
from tests.management.scheduler.grid import gpus, placed

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLASSES = ("low", "normal", "high", "critical")
NO_PREEMPTION = tuple(PriorityClass(c.name, c.rank, may_preempt=False) for c in Policy().classes)


@st.composite
def grids(draw: st.DrawFn) -> tuple[dict[str, Host], dict[str, Unit]]:
    hosts: dict[str, Host] = {}
    units: dict[str, Unit] = {}
    for h in range(draw(st.integers(1, 4))):
        hid = f"h{h}"
        hosts[hid] = Host(hid, reputation=draw(st.sampled_from([0.5, 0.9])), takes_work=draw(st.booleans()) or h == 0)
        model = draw(st.sampled_from(["h100-sxm", "l40s"]))
        for u in gpus(hid, draw(st.integers(1, 8)), model):
            units[u.id] = replace(u, healthy=draw(st.integers(0, 9)) > 0)
    return hosts, units


def requests(draw: st.DrawFn, max_gpus: int = 8) -> ReplicaRequest:
    return ReplicaRequest(gpus=draw(st.integers(1, max_gpus)), cpu_cores=draw(st.sampled_from([0.0, 8.0])))


@st.composite
def scenarios(draw: st.DrawFn, classes: tuple[PriorityClass, ...] | None = None, queued_prio: str | None = None) -> Snapshot:
    hosts, units = draw(grids())
    now = 1000.0
    free = sorted(units)
    running: dict[str, Job] = {}
    holders: dict[str, str] = {}
    for i in range(draw(st.integers(0, 6))):
        n = draw(st.integers(1, 4))
        on = [u for u in free if units[u].host == draw(st.sampled_from(sorted(hosts)))][:n]
        if len(on) < n:
            continue
        jid = f"run{i}"
        job = Job(
            jid,
            draw(st.sampled_from(["a", "b", "c"])),
            priority=draw(st.sampled_from(CLASSES[:2] if queued_prio else CLASSES)),
            request=ReplicaRequest(gpus=n),
            max_duration_s=draw(st.one_of(st.none(), st.sampled_from([100.0, 500.0, 2000.0]))),
            started_at=draw(st.sampled_from([0.0, 400.0, 900.0])),
            assignment=(tuple(on),),
            preemptible=draw(st.integers(0, 4)) > 0,
        )
        running[jid] = job
        for u in on:
            free.remove(u)
            holders[u] = jid
    queue = []
    for i in range(1 if queued_prio else draw(st.integers(1, 8))):
        queue.append(
            Job(
                f"q{i}",
                draw(st.sampled_from(["a", "b", "c"])),
                priority=queued_prio or draw(st.sampled_from(CLASSES)),
                submitted_at=float(draw(st.integers(0, 999))),
                replicas=draw(st.integers(1, 3)),
                request=requests(draw),
                constraints=Constraints(nvlink=draw(st.booleans())),
                max_duration_s=draw(st.one_of(st.none(), st.sampled_from([50.0, 300.0, 3000.0]))),
                placement=draw(st.sampled_from(["binpack", "spread"])),
            )
        )
    policy = Policy(classes=classes or Policy().classes)
    return Snapshot(now, hosts, units, holders, running, queue, policy=policy)


def _check_one_holder_each(snap: Snapshot, plan_places: list[Place]) -> None:
    taken = set(snap.holders)
    for p in plan_places:
        for replica in p.assignment:
            for u in replica:
                assert u not in taken, f"{u} given twice"
                assert snap.units[u].healthy and snap.hosts[snap.units[u].host].takes_work
                taken.add(u)


@SETTINGS
@given(scenarios())
def test_1_no_unit_ever_has_two_holders(snap: Snapshot) -> None:
    plan = schedule(snap)
    _check_one_holder_each(snap, plan.places())
    assert len({p.job_id for p in plan.places()}) == len(plan.places())


@SETTINGS
@given(scenarios())
def test_2_gangs_are_all_or_nothing_with_each_replica_on_one_host(snap: Snapshot) -> None:
    jobs = {j.id: j for j in snap.queue}
    for p in schedule(snap).places():
        job = jobs[p.job_id]
        assert len(p.assignment) == job.replicas
        for replica in p.assignment:
            assert len(replica) == job.request.gpus
            assert len({snap.units[u].host for u in replica}) == 1


@SETTINGS
@given(scenarios(queued_prio="high"))
def test_3_a_higher_class_is_never_left_waiting_when_preempting_lower_work_would_fit_it(snap: Snapshot) -> None:
    (hi,) = snap.queue
    rank = {c.name: c.rank for c in snap.policy.classes}
    lower = {j.id for j in snap.running.values() if j.preemptible and rank[j.priority] < rank["high"]}
    freed = replace(
        snap,
        running={k: j for k, j in snap.running.items() if k not in lower},
        holders={u: j for u, j in snap.holders.items() if j not in lower},
    )
    would_fit = hi.id in placed(schedule(freed, explain=False))
    plan = schedule(snap)
    preempted = [p for p in plan.preempts() if p.for_job == hi.id]
    if would_fit:
        # placed, or preempting, or first in line for room that requeued (broken) work frees right now
        e = plan.explanations.get(hi.id)
        soon = snap.now + snap.policy.grace_s
        freed_now = e is not None and e.estimated_start is not None and e.estimated_start <= soon
        assert hi.id in placed(plan) or preempted or freed_now
    # and never a preemption that does not make it fit, nor of work that may not be preempted
    assert {p.job_id for p in preempted} <= lower
    if preempted:  # it fits once the victims (and the jobs requeued this cycle) have stopped
        victims = {p.job_id for p in preempted} | {d.job_id for d in plan.decisions if isinstance(d, Requeue)}
        after = replace(
            snap,
            running={k: j for k, j in snap.running.items() if k not in victims},
            holders={u: j for u, j in snap.holders.items() if j not in victims},
        )
        assert hi.id in placed(schedule(after, explain=False))


@st.composite
def full_markets(draw: st.DrawFn) -> Snapshot:
    """A small grid every GPU of which is rented (any class, kind and bid), and a queue that wants some of it."""
    hosts: dict[str, Host] = {}
    units: dict[str, Unit] = {}
    running: dict[str, Job] = {}
    bids = st.sampled_from([0, 1_000_000, 2_000_000])
    kinds = st.sampled_from(["on_demand", "interruptible", "reserved"])

    def terms() -> dict[str, object]:
        rental = draw(kinds)
        return {
            "rental": rental,
            "bid": draw(bids) if rental == "interruptible" else 0,
            "reserved_s": 3600.0 if rental == "reserved" else None,
            "priority": draw(st.sampled_from(CLASSES)),
        }

    for h in range(draw(st.integers(1, 3))):
        for u in gpus(f"h{h}", draw(st.integers(1, 2))):
            hosts[u.host] = Host(u.host)
            units[u.id] = u
            jid = f"run-{u.id}"
            running[jid] = Job(
                jid,
                "a",
                started_at=float(draw(st.integers(0, 3))),
                assignment=((u.id,),),
                **terms(),  # type: ignore[arg-type]
            )
    queue = [Job(f"q{i}", "b", submitted_at=float(i), **terms()) for i in range(draw(st.integers(1, 3)))]  # type: ignore[arg-type]
    holders = {u: j.id for j in running.values() for r in j.assignment or () for u in r}
    return Snapshot(1000.0, hosts, units, holders, running, queue)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(full_markets())
def test_6_no_job_is_preempted_by_one_of_lower_or_equal_class_and_market_rank_nor_a_reserved_one(snap: Snapshot) -> None:
    rank = {c.name: c.rank for c in snap.policy.classes}
    queued = {j.id: j for j in snap.queue}
    for p in schedule(snap).preempts():
        victim, preemptor = snap.running[p.job_id], queued[p.for_job]
        assert victim.rental != "reserved" and victim.preemptible
        assert (rank[victim.priority], victim.market_rank) < (rank[preemptor.priority], preemptor.market_rank)


@SETTINGS
@given(scenarios(classes=NO_PREEMPTION))
def test_4_backfill_never_delays_the_heads_reserved_start(snap: Snapshot) -> None:
    plan = schedule(snap)
    heads = [e for e in plan.explanations.values() if e.reserved_start is not None]
    assert len(heads) <= 1
    if not heads:
        return
    head = next(j for j in snap.queue if j.id == heads[0].job_id)
    jobs = {j.id: j for j in snap.queue}
    running = dict(snap.running)
    holders = dict(snap.holders)
    for p in plan.places():
        running[p.job_id] = replace(jobs[p.job_id], started_at=snap.now, assignment=p.assignment)
        holders.update({u: p.job_id for r in p.assignment for u in r})
    after = replace(snap, running=running, holders=holders, queue=[head])
    start = reserved_start(after, head)
    assert start is not None and heads[0].reserved_start is not None and start <= heads[0].reserved_start


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    durations=st.lists(st.sampled_from([600.0, 1800.0, 3600.0]), min_size=1, max_size=3),
)
@example(sizes=[2, 3, 1], durations=[3600.0])  # fragments a small grid: failed on 2 hosts of 4 GPUs
def test_5_two_equal_accounts_always_submitting_get_the_same_gpu_seconds_over_a_day(sizes, durations) -> None:
    hosts = {f"h{i}": Host(f"h{i}") for i in range(4)}
    units = {u.id: u for h in hosts for u in gpus(h, 8)}
    policy = Policy(half_life_s=6 * 3600.0)
    step, day = 60.0, 24 * 3600.0
    usage: dict[str, float] = {}
    served = {"a": 0.0, "b": 0.0}
    submitted = {"a": 0, "b": 0}
    queue: list[Job] = []
    running: dict[str, Job] = {}
    now = 0.0
    while now < day:
        for jid, job in list(running.items()):  # completions
            if job.ends_at is not None and job.ends_at <= now:
                del running[jid]
        for account in ("a", "b"):  # both submit without pause: always 3 waiting
            while sum(1 for j in queue if j.account == account) < 3:
                k = submitted[account]
                submitted[account] += 1
                queue.append(
                    Job(
                        f"{account}{k}",
                        account,
                        submitted_at=now,
                        request=ReplicaRequest(gpus=sizes[k % len(sizes)]),
                        max_duration_s=durations[k % len(durations)],
                    )
                )
        holders = {u: j.id for j in running.values() for r in j.assignment or () for u in r}
        snap = Snapshot(now, hosts, units, holders, running, queue, usage=usage, policy=policy)
        for p in schedule(snap, explain=False).places():
            job = next(j for j in queue if j.id == p.job_id)
            queue.remove(job)
            running[job.id] = replace(job, started_at=now, assignment=p.assignment)
        usage = decay(usage, step, policy.half_life_s)
        for job in running.values():
            used = job.request.gpus * job.replicas * step
            usage = add_usage(usage, job.account, used)
            served[job.account] += used
        now += step
    assert abs(served["a"] - served["b"]) / max(served.values()) < 0.05, served

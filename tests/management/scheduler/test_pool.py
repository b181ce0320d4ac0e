"""What a kept ``FreePool`` carries across cycles gives the same answers as one built for each snapshot.

The running jobs by start time and the holds' end times are kept (not rebuilt per cycle) for speed; these
tests drive them through jobs starting, ending and restarting and compare with the answer worked out
from scratch: the order victims are read in, the order ends are met in, and whole plans with preemption.
"""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from management.scheduler import FreePool, Job, Place, Preempt, ReplicaRequest, schedule
from management.scheduler.pool import RunningByStart
from tests.management.scheduler.grid import grid, running, snapshot


def started(jid: str, at: float | None) -> Job:
    return replace(Job(jid, "acme"), started_at=at, assignment=(("u",),))


def from_scratch(jobs: dict[str, Job]) -> list[str]:
    return [j.id for j in sorted(jobs.values(), key=lambda j: (-(j.started_at or 0.0), j.id))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.sampled_from([None, 0.0, 10.0, 20.0, 30.0, 40.0])), max_size=40))
def test_running_jobs_are_read_latest_start_first_then_by_id_through_starts_ends_and_restarts(steps):
    index = RunningByStart()
    jobs: dict[str, Job] = {}
    for i, (n, at) in enumerate(steps):
        jid = f"wl-{n:02d}"
        if i % 3 == 2 and jid in jobs:
            del jobs[jid]  # it ended
        else:
            jobs[jid] = started(jid, at)  # it started, or restarted (a new value with its new start)
        index.sync(dict(jobs))
        assert [j.id for j in index.most_recent_first()] == from_scratch(jobs)
        assert all(j is jobs[j.id] for j in index.most_recent_first())  # the snapshot's own values


def test_a_first_sync_of_many_distinct_starts_is_ordered_like_a_sort():
    rng = random.Random(7)
    jobs = {f"wl-{i:04d}": started(f"wl-{i:04d}", rng.uniform(0, 1e6)) for i in range(2000)}
    index = RunningByStart()
    index.sync(jobs)
    assert [j.id for j in index.most_recent_first()] == from_scratch(jobs)


def test_ends_are_met_in_order_with_the_extra_ones_merged_and_gone_jobs_skipped():
    hosts, units = grid({"h1": 4})
    run = [
        running(replace(Job("a", "acme"), max_duration_s=500.0), [["h1-g0"]], started_at=0.0),  # ends 500
        running(replace(Job("b", "acme"), max_duration_s=100.0), [["h1-g1"]], started_at=0.0),  # ends 100
        running(Job("c", "acme"), [["h1-g2"]], started_at=0.0),  # no known end
    ]
    pool = FreePool(snapshot(hosts, units, run=run))
    assert list(pool.ends_in_order([])) == [(100.0, "b"), (500.0, "a")]
    assert list(pool.ends_in_order([(300.0, "c"), (50.0, "a")])) == [(50.0, "a"), (100.0, "b"), (300.0, "c"), (500.0, "a")]
    pool.release("b")
    assert list(pool.ends_in_order([(300.0, "c")])) == [(300.0, "c"), (500.0, "a")]
    pool.note_end("c", 200.0)
    assert list(pool.ends_in_order([])) == [(200.0, "c"), (500.0, "a")]


def test_the_running_jobs_kept_across_cycles_give_the_plans_a_regrouping_per_cycle_gives():
    rng = random.Random(3)
    hosts, units = grid({f"h{i}": 4 for i in range(6)})
    kept = FreePool(snapshot(hosts, units))
    regrouped = FreePool(snapshot(hosts, units))  # the same kept index of idle units, running jobs regrouped each cycle
    now = 1000.0
    run: dict[str, Job] = {}
    queue: dict[str, Job] = {}
    n = preempted = 0
    for _ in range(60):
        for jid in [j for j, job in run.items() if job.ends_at is not None and job.ends_at <= now]:
            del run[jid]
            kept.release(jid)
            regrouped.release(jid)
        for _ in range(rng.randint(1, 4)):
            prio = rng.choice(("low", "low", "normal", "high", "critical"))
            request = ReplicaRequest(gpus=rng.choice((1, 1, 2, 4)))
            duration = rng.choice((None, 60.0, 200.0))
            queue[f"wl-{n:03d}"] = Job(
                f"wl-{n:03d}", "acme", priority=prio, submitted_at=now, request=request, max_duration_s=duration
            )
            n += 1
        snap = snapshot(hosts, units, queue=list(queue.values()), run=list(run.values()), now=now)
        regrouped.running_by_start = RunningByStart()
        plan = schedule(snap, pool=regrouped, explain=False)
        assert schedule(snap, pool=kept, explain=False).decisions == plan.decisions
        for d in plan.decisions:
            if isinstance(d, Place):
                run[d.job_id] = running(queue.pop(d.job_id), d.assignment, started_at=now)
            elif isinstance(d, Preempt):
                victim = run.pop(d.job_id)
                kept.release(victim.id)
                regrouped.release(victim.id)
                queue[victim.id] = replace(victim, started_at=None, assignment=None)
                preempted += 1
        now += 50.0
    assert preempted >= 5  # the comparison covered preemption

"""``python -m bench scheduler``: the scheduler core's speed on a generated grid, in simulated time.

The grid: ``hosts`` hosts of ``gpus_per_host`` GPUs each, one catalog model per host drawn from a fixed
mix (NVLink among the GPUs of the SXM ones). A backlog of ``queued`` workloads (1-8 GPUs, ``gang_share``
of them gangs of 2-8 whole hosts, four priority classes, ``accounts`` accounts) is placed first, then
a steady stream arrives while others complete, for ``steady_cycles`` cycles of ``cycle_s`` simulated
seconds. The harness plays the loop: it applies each plan to its state and to the core's free-unit
index (so the index is built once, as the real loop keeps it), ends jobs at their max duration, and
stops preempted jobs at once (requeueing them).

Reported: placements per second of time spent in ``schedule`` (one core), cycle time p50/p99/max,
peak RSS, and utilization = busy GPUs / min(all GPUs, busy + GPUs the queue asks for), averaged over
the cycles in which the queue was not empty (the queue's GPUs count only jobs that could ever fit).
"""

from __future__ import annotations

import gc
import random
import resource
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from common.catalog import GpuModel, resolve_alias
from management.scheduler import FreePool, Host, Job, Place, Policy, Preempt, ReplicaRequest, Snapshot, Unit, schedule

MIX = (  # catalog model, share of hosts
    ("h100-sxm", 0.20),
    ("h200", 0.05),
    ("a100-80gb", 0.15),
    ("a100-40gb", 0.05),
    ("l40s", 0.10),
    ("l4", 0.10),
    ("a10", 0.05),
    ("rtx-4090", 0.20),
    ("rtx-3090", 0.10),
)
CLASSES = (("low", 0.3), ("normal", 0.5), ("high", 0.15), ("critical", 0.05))


@dataclass(frozen=True)
class SchedulerBenchOptions:
    hosts: int = 10_000
    gpus_per_host: int = 8
    queued: int = 10_000
    accounts: int = 200
    gang_share: float = 0.10
    steady_cycles: int = 200
    cycle_s: float = 10.0
    arrivals_per_cycle: int = 60
    seed: int = 1
    freeze_heap: bool = True


def _tier(model: GpuModel) -> str:
    if model.memory_mib >= 80_000:
        return "premium"
    return "standard" if model.memory_mib >= 40_000 else "consumer"


def build_grid(o: SchedulerBenchOptions, rng: random.Random) -> tuple[dict[str, Host], dict[str, Unit]]:
    models = [resolve_alias(k) for k, _ in MIX]
    weights = [w for _, w in MIX]
    hosts: dict[str, Host] = {}
    units: dict[str, Unit] = {}
    for h in range(o.hosts):
        hid = f"host-{h:05d}"
        hosts[hid] = Host(hid, provider=f"p{h % 50}", region=f"r{h % 5}", reputation=round(rng.uniform(0.5, 1.0), 2))
        model = rng.choices(models, weights)[0]
        ids = [f"{hid}-g{i}" for i in range(o.gpus_per_host)]
        cc = tuple(int(x) for x in model.compute_capability.split("."))
        for i, uid in enumerate(ids):
            peers = frozenset(x for x in ids if x != uid) if model.form_factor == "sxm" else frozenset()
            units[uid] = Unit(uid, hid, i, model.key, _tier(model), model.memory_mib, (cc[0], cc[1]), nvlink_peers=peers)
    return hosts, units


def make_job(n: int, now: float, o: SchedulerBenchOptions, rng: random.Random) -> Job:
    models = [k for k, _ in MIX]
    prio = rng.choices([c for c, _ in CLASSES], [w for _, w in CLASSES])[0]
    if rng.random() < o.gang_share:
        replicas, gpus = rng.randint(2, 8), o.gpus_per_host
    else:
        replicas, gpus = 1, rng.choice((1, 1, 1, 2, 2, 4, 4, 8))
    wanted = frozenset({rng.choice(models)}) if rng.random() < 0.3 else frozenset()
    return Job(
        f"wl-{n:07d}",
        f"acct-{rng.randrange(o.accounts):03d}",
        project=f"p{rng.randrange(3)}",
        priority=prio,
        submitted_at=now - rng.uniform(0, 600),
        replicas=replicas,
        request=ReplicaRequest(gpus=gpus, models=wanted, cpu_cores=2.0 * gpus, ram_mib=8192 * gpus),
        max_duration_s=rng.choice((600.0, 1800.0, 3600.0, 4 * 3600.0)),
    )


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_scheduler_bench(o: SchedulerBenchOptions) -> dict[str, Any]:
    rng = random.Random(o.seed)
    t0 = time.perf_counter()
    hosts, units = build_grid(o, rng)
    now = 0.0
    queue: dict[str, Job] = {}
    n = 0
    for _ in range(o.queued):
        job = make_job(n, now, o, rng)
        queue[job.id] = job
        n += 1
    policy = Policy()
    running: dict[str, Job] = {}
    holders: dict[str, str] = {}
    snap = Snapshot(now, hosts, units, holders, running, list(queue.values()), policy=policy)
    build_start = time.perf_counter()
    pool = FreePool(snap)
    index_build_s = time.perf_counter() - build_start
    setup_s = time.perf_counter() - t0
    if o.freeze_heap:
        # the grid and its index live as long as the process: keep full collections from walking them
        # each time (a gen-2 pass over ~1M objects stalled a cycle by ~100 ms); what a long-lived loop does
        gc.collect()
        gc.freeze()
    gen2_before = gc.get_stats()[2]["collections"]
    cycle_ms: list[float] = []
    sched_s = 0.0
    places = preempts = rejects = 0
    utilization: list[float] = []
    total_units = len(units)
    backlog_cycles = 0
    cycle = 0
    while True:
        # completions
        for jid in [j for j, job in running.items() if job.ends_at is not None and job.ends_at <= now]:
            _finish(jid, running, holders, pool)
        if backlog_cycles:
            for _ in range(o.arrivals_per_cycle):
                job = make_job(n, now, o, rng)
                queue[job.id] = job
                n += 1
        snap = Snapshot(now, hosts, units, holders, running, list(queue.values()), policy=policy)
        start = time.perf_counter()
        plan = schedule(snap, pool=pool, explain=False)
        took = time.perf_counter() - start
        sched_s += took
        cycle_ms.append(took * 1000)
        for d in plan.decisions:
            if isinstance(d, Place):
                job = queue.pop(d.job_id)
                running[job.id] = replace(job, started_at=now, assignment=d.assignment)
                for replica in d.assignment:
                    for u in replica:
                        holders[u] = job.id
                places += 1
            elif isinstance(d, Preempt):
                victim = running.get(d.job_id)
                if victim is not None:
                    _finish(d.job_id, running, holders, pool)
                    queue[victim.id] = replace(victim, started_at=None, assignment=None)
                    preempts += 1
            else:
                queue.pop(d.job_id, None)
                rejects += 1
        if queue and backlog_cycles:  # steady state: the backlog's ramp (a bounded batch per cycle) is not counted
            utilization.append(_utilization(pool, queue.values(), len(holders)))
        if not backlog_cycles and not plan.places():
            backlog_cycles = cycle + 1  # the backlog is placed as far as it goes: the steady stream starts
        if o.freeze_heap:
            gc.freeze()  # between cycles, untimed: what survived a cycle is not walked by the next full collection
        cycle += 1
        now += o.cycle_s
        if backlog_cycles and cycle >= backlog_cycles + o.steady_cycles:
            break
    steady = cycle_ms[backlog_cycles:] or cycle_ms
    return {
        "hosts": o.hosts,
        "gpus": total_units,
        "queued": o.queued,
        "accounts": o.accounts,
        "cycles": cycle,
        "backlog_cycles": backlog_cycles,
        "placements": places,
        "preemptions": preempts,
        "rejections": rejects,
        "placements_per_s": round(places / sched_s, 1) if sched_s else None,
        "cycle_p50_ms": round(statistics.median(cycle_ms), 2),
        "cycle_p90_ms": round(_pct(cycle_ms, 0.90), 2),
        "cycle_p99_ms": round(_pct(cycle_ms, 0.99), 2),
        "gc_full_collections": gc.get_stats()[2]["collections"] - gen2_before,
        "cycle_max_ms": round(max(cycle_ms), 2),
        "steady_cycle_p50_ms": round(statistics.median(steady), 2),
        "steady_cycle_p99_ms": round(_pct(steady, 0.99), 2),
        "utilization": round(statistics.fmean(utilization), 4) if utilization else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "index_build_s": round(index_build_s, 3),
        "setup_s": round(setup_s, 2),
        "heap_frozen": o.freeze_heap,
    }


def _utilization(pool: FreePool, queue: Iterable[Job], busy: int) -> float:
    """Busy GPUs over what could be busy: idle GPUs count only as far as queued jobs could use them.

    Jobs that name a model can use only idle GPUs of that model; the others any idle GPU (every generated
    job fits the empty grid). Fragmentation is not subtracted: idle GPUs a gang cannot use count against us.
    """
    idle_by_model: dict[str, int] = {}
    for shape, buckets in pool.buckets.items():
        idle_by_model[shape[0]] = idle_by_model.get(shape[0], 0) + sum(c * len(h) for c, h in buckets.items())
    asked_any = 0
    asked_by_model: dict[str, int] = {}
    for job in queue:
        if job.request.models:
            (model,) = job.request.models
            asked_by_model[model] = asked_by_model.get(model, 0) + job.units_asked
        else:
            asked_any += job.units_asked
    usable = asked_any + sum(min(idle_by_model.get(m, 0), n) for m, n in asked_by_model.items())
    could = busy + min(sum(idle_by_model.values()), usable)
    return busy / could if could else 1.0


def _finish(jid: str, running: dict[str, Job], holders: dict[str, str], pool: FreePool) -> None:
    job = running.pop(jid)
    for replica in job.assignment or ():
        for u in replica:
            holders.pop(u, None)
    pool.release(jid)


TARGETS = {"placements_per_s": (">=", 1000.0), "cycle_p99_ms": ("<", 50.0), "utilization": (">=", 0.95)}


def scheduler_table(r: dict[str, Any]) -> str:
    rows = [
        ("grid", f"{r['hosts']:,} hosts, {r['gpus']:,} GPUs; {r['queued']:,} queued, {r['accounts']} accounts"),
        ("cycles (backlog, then steady)", f"{r['cycles']} ({r['backlog_cycles']} + {r['cycles'] - r['backlog_cycles']})"),
        ("placements / preemptions / rejections", f"{r['placements']:,} / {r['preemptions']:,} / {r['rejections']:,}"),
        ("placements per second (one core)", _with_target(r, "placements_per_s")),
        (
            "cycle p50 / p90 / p99 / max ms",
            f"{r['cycle_p50_ms']} / {r['cycle_p90_ms']} / {_with_target(r, 'cycle_p99_ms')} / {r['cycle_max_ms']}",
        ),
        ("full GC collections during the run", str(r["gc_full_collections"])),
        ("steady cycles p50 / p99 ms", f"{r['steady_cycle_p50_ms']} / {r['steady_cycle_p99_ms']}"),
        ("utilization while the queue is not empty", _with_target(r, "utilization")),
        ("peak RSS MiB", str(r["peak_rss_mib"])),
        ("index build s (once)", str(r["index_build_s"])),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def _with_target(r: dict[str, Any], key: str) -> str:
    value = r.get(key)
    op, limit = TARGETS[key]
    if value is None:
        return f"- (target {op} {limit:g}: not measured)"
    met = {"<": value < limit, ">=": value >= limit}[op]
    return f"{value} (target {op} {limit:g}: {'met' if met else 'MISSED'})"

"""``explain``: why a queued job waits, in figures and in one sentence a renter understands."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import NotFound
from management.scheduler import Constraints, Host, Job, Policy, Quota, ReplicaRequest, explain, schedule
from management.scheduler.core import FILTER_NAMES
from tests.management.scheduler.grid import gpus, grid, placed, running, snapshot
from tests.management.scheduler.test_properties import grids


def job(jid: str, n: int = 1, **kw) -> Job:
    return Job(jid, kw.pop("account", "acme"), request=kw.pop("request", ReplicaRequest(gpus=n)), **kw)


def test_every_filter_is_counted_in_the_fixed_order_and_the_one_that_empties_the_pool_is_named():
    hs = [Host("eu1", region="eu"), Host("eu2", region="eu", takes_work=False), Host("us1", region="us")]
    units = gpus("eu1", 4) + gpus("eu2", 4) + gpus("us1", 4, "l40s")
    hosts, us = grid(hs, units=units)
    want = job(
        "w", request=ReplicaRequest(gpus=1, models=frozenset({"l40s"})), constraints=Constraints(regions=frozenset({"eu"}))
    )
    e = explain(snapshot(hosts, us, queue=[want]), "w")
    assert [f.name for f in e.filters] == list(FILTER_NAMES)
    by = {f.name: (f.removed, f.remaining) for f in e.filters}
    assert by["host takes no work"] == (4, 8)
    assert by["region"] == (4, 4)
    assert by["model"] == (4, 0)
    assert not e.fits_now and "model filter" in e.summary
    json.dumps(asdict(e))  # plain types only: the API renders it as it is


def test_a_job_behind_the_head_is_told_who_it_waits_for_and_when_that_starts():
    hosts, units = grid({"h1": 4, "h2": 2})
    run = [running(job("r1", 4, max_duration_s=600.0), [[f"h1-g{i}" for i in range(4)]], started_at=900.0)]
    q = [
        job("head", 4, priority="normal", submitted_at=1.0),
        job("long", 2, priority="low", submitted_at=2.0),  # no max duration: could delay the head
        job("later", 2, priority="low", submitted_at=3.0),
    ]
    snap = snapshot(hosts, units, queue=q, run=run)
    head = explain(snap, "head")
    assert head.reserved_start == 1500.0 and head.position == 1 and "Next in line for room" in head.summary
    # "long" fits h2 now (h2 is not the head's host): nothing to explain but that it starts
    assert explain(snap, "long").fits_now and "next cycle" in explain(snap, "long").summary
    later = explain(snap, "later")
    assert later.position == 3 and later.queue_length == 3 and later.ahead == ["head", "long"]
    assert later.fits_now is False and later.estimated_start == 1500.0


def test_a_fitting_job_held_back_by_the_heads_reservation_names_the_head():
    hosts, units = grid({"h1": 4})
    run = [running(job("r1", 2, max_duration_s=600.0), [["h1-g0", "h1-g1"]], started_at=900.0)]
    q = [job("head", 4, priority="high", submitted_at=1.0), job("long", 2, priority="low", submitted_at=2.0)]
    policy = Policy(classes=tuple(type(c)(c.name, c.rank) for c in Policy().classes))  # nobody may preempt
    e = explain(snapshot(hosts, units, queue=q, run=run, policy=policy), "long")
    assert e.fits_now and e.blocked_by is not None and "head" in e.blocked_by and "priority high" in e.blocked_by
    assert "from 1970-01-01 00:25:00 UTC" in e.blocked_by and "ends before then" in e.summary


def test_quota_is_explained_with_limit_use_and_ask():
    hosts, units = grid({"h": 8})
    run = [running(job("mine", 6), [[f"h-g{i}" for i in range(6)]])]
    snap = snapshot(hosts, units, queue=[job("more", 2)], run=run, policy=Policy(quotas={"acme": Quota(gpus=7)}))
    e = explain(snap, "more")
    assert e.quota is not None and (e.quota.limit, e.quota.in_use, e.quota.asked) == (7, 6, 2)
    assert "holds 6 of its 7 GPUs" in e.summary


def test_a_job_that_is_not_queued_is_not_found():
    hosts, units = grid({"h": 1})
    with pytest.raises(NotFound, match="nope"):
        explain(snapshot(hosts, units, queue=[job("a")]), "nope")


def test_a_job_this_grid_cannot_hold_says_why_and_what_each_constraint_left():
    hosts, units = grid({"h": 2})
    e = explain(snapshot(hosts, units, queue=[job("wide", 3)]), "wide")
    assert e.cannot_fit == "each replica asks for 3 GPUs on one host; the most any host has that match is 2"
    assert e.summary.startswith("Cannot be placed on this grid as it is now") and e.estimated_start is None
    assert e.position == 1 and e.filters and e.filters[-1].name == "replica fit"


def test_a_rejected_job_says_why():
    hosts, units = grid({"h": 2})
    e = explain(snapshot(hosts, units, queue=[job("odd", 1, priority="urgent")]), "odd")
    assert e.summary.startswith("Rejected: priority class 'urgent' does not exist") and e.filters


def test_jobs_past_the_cycles_batch_are_explained_as_not_reached():
    hosts, units = grid({"h": 4})
    q = [job(f"j{i}", submitted_at=float(i)) for i in range(4)]
    plan = schedule(snapshot(hosts, units, queue=q, policy=Policy(max_places_per_cycle=2)))
    assert len(plan.places()) == 2
    assert {k for k, e in plan.explanations.items() if e.blocked_by == "cycle batch limit"} == {"j2", "j3"}
    assert "Not reached this cycle" in plan.explanations["j3"].summary


def test_a_job_asking_for_free_disk_goes_only_to_hosts_that_report_that_much_and_says_so_while_it_waits():
    """constraints.min_disk_gib (the console's "Disk, GiB"): a host's reported free disk must reach it; a host that
    reports none does not."""
    hs = [Host("small", disk_free_gib=50.0), Host("unknown"), Host("big", disk_free_gib=900.0)]
    hosts, units = grid(hs, units=gpus("small", 2) + gpus("unknown", 2) + gpus("big", 2))
    wants = job("w", 2, constraints=Constraints(min_disk_gib=200.0))
    assert placed(schedule(snapshot(hosts, units, queue=[wants]))) == {"w": (("big-g0", "big-g1"),)}
    too_much = job("x", 1, constraints=Constraints(min_disk_gib=1000.0))
    e = explain(snapshot(hosts, units, queue=[too_much]), "x")
    by = {f.name: (f.removed, f.remaining) for f in e.filters}
    assert by["disk"] == (6, 0) and not e.fits_now and "disk filter" in e.summary


def test_a_job_asking_for_a_vendor_is_placed_only_on_its_cards_and_the_explanation_names_the_vendor():
    """Issue 41, point 3: a ROCm image asks for vendor amd; the scheduler places it on AMD cards only."""
    hs = [Host("nv"), Host("amd")]
    amd = [dataclasses.replace(u, vendor="amd") for u in gpus("amd", 2, "l40s")]
    hosts, units = grid(hs, units=gpus("nv", 4) + amd)
    rocm = job("rocm", request=ReplicaRequest(gpus=2, vendors=frozenset({"amd"})))
    plan = schedule(snapshot(hosts, units, queue=[rocm]))
    assert placed(plan)["rocm"] == (("amd-g0", "amd-g1"),)

    wide = job("wide", request=ReplicaRequest(gpus=3, vendors=frozenset({"amd"})))
    e = explain(snapshot(hosts, units, queue=[wide]), "wide")
    by = {f.name: (f.removed, f.remaining) for f in e.filters}
    assert by["vendor"] == (4, 2)
    assert e.cannot_fit == "each replica asks for 3 GPUs on one host; the most any host has that match is 2"

    intel = job("xpu", request=ReplicaRequest(gpus=1, vendors=frozenset({"intel"})))
    e = explain(snapshot(hosts, units, queue=[intel]), "xpu")
    assert e.cannot_fit == "no GPU on this grid is made by intel" and "made by intel" in e.summary
    assert {f.name: f.remaining for f in e.filters}["vendor"] == 0


def test_a_gang_that_fits_an_empty_grid_counts_none_of_its_own_gpus_as_held_by_others():
    hosts, units = grid({"h": 4})
    pair = job("pair", 2, replicas=2, request=ReplicaRequest(gpus=2, cpu_cores=1.0, ram_mib=1024))
    e = explain(snapshot(hosts, units, queue=[pair]), "pair")
    by = {f.name: (f.removed, f.remaining) for f in e.filters}
    assert e.fits_now
    assert (by["CPU"], by["RAM"], by["held by others"]) == ((0, 4), (0, 4), (0, 4)), by
    assert by["replica fit"] == (0, 4)


@given(grids(), st.integers(1, 3), st.integers(1, 4), st.sampled_from([0.0, 2.0]))
def test_a_job_that_fits_never_counts_its_own_gpus_cpu_or_ram_as_held_by_others(layout, replicas, n, cpu) -> None:
    hosts, units = layout  # nothing runs: whatever a filter of holdings removes, the job itself would hold
    want = job("w", replicas=replicas, request=ReplicaRequest(gpus=n, cpu_cores=cpu))
    e = explain(snapshot(hosts, units, queue=[want]), "w")
    if e.fits_now:
        by = {f.name: f.removed for f in e.filters}
        assert (by["CPU"], by["RAM"], by["held by others"]) == (0, 0, 0), e.filters

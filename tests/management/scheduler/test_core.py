"""The scheduler core, one policy at a time: snapshot in, decisions out (no I/O, nothing mocked)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from management.scheduler import (
    Constraints,
    FreePool,
    Host,
    Job,
    Policy,
    Quota,
    Reject,
    ReplicaRequest,
    Requeue,
    schedule,
)
from management.scheduler.core import never_fits
from management.scheduler.model import add_usage, decay
from tests.management.scheduler.grid import gpus, grid, host_of, mig, placed, running, snapshot


def job(jid: str, n: int = 1, *, account: str = "acme", prio: str = "normal", t: float = 0.0, replicas: int = 1, **kw) -> Job:
    request = kw.pop("request", ReplicaRequest(gpus=n))
    return Job(jid, account, priority=prio, submitted_at=t, replicas=replicas, request=request, **kw)


# --- ordering -----------------------------------------------------------------------------------------


def test_a_higher_class_goes_first_even_when_submitted_later():
    hosts, units = grid({"h1": 1})
    plan = schedule(snapshot(hosts, units, queue=[job("old-low", prio="low", t=0), job("new-high", prio="high", t=900)]))
    assert list(placed(plan)) == ["new-high"]


def test_fifo_within_a_class_and_aging_lifts_a_long_waiting_job_but_never_above_the_next_class():
    hosts, units = grid({"h1": 1})
    policy = Policy(aging_step_s=100, aging_max_boost=3)
    # b waited 900 s (boost capped at 3), a waited 50 s; both normal: b first
    q = [job("a", t=950), job("b", t=100)]
    assert list(placed(schedule(snapshot(hosts, units, queue=q, policy=policy)))) == ["b"]
    # a low job that waited forever still loses to a fresh normal one
    q = [job("ancient-low", prio="low", t=-(10**6)), job("fresh", t=1000)]
    assert list(placed(schedule(snapshot(hosts, units, queue=q, policy=policy)))) == ["fresh"]


def test_among_equal_priority_the_most_under_served_account_goes_first():
    hosts, units = grid({"h1": 1})
    q = [job("heavy-1", account="heavy", t=10), job("light-1", account="light", t=20)]
    plan = schedule(snapshot(hosts, units, queue=q, usage={"heavy": 5000.0, "light": 100.0}))
    assert list(placed(plan)) == ["light-1"]


def test_shares_weigh_usage():
    hosts, units = grid({"h1": 1})
    q = [job("big-1", account="big", t=10), job("small-1", account="small", t=20)]
    # big used twice what small used, but has four times the share: big is the more under-served
    policy = Policy(shares={"big": 4.0, "small": 1.0})
    plan = schedule(snapshot(hosts, units, queue=q, usage={"big": 200.0, "small": 100.0}, policy=policy))
    assert list(placed(plan)) == ["big-1"]


def test_usage_decays_by_half_life_and_adds_up():
    assert decay({"a": 100.0}, 3600, 3600) == {"a": 50.0}
    assert decay({"a": 100.0}, 0, 3600) == {"a": 100.0}
    assert add_usage({"a": 1.0}, "b", 2.0) == {"a": 1.0, "b": 2.0}


# --- gangs and placement ----------------------------------------------------------------------------


def test_a_gang_is_placed_whole_with_each_replica_on_one_host():
    hosts, units = grid({"h1": 8, "h2": 8, "h3": 4})
    plan = schedule(snapshot(hosts, units, queue=[job("gang", 8, replicas=2)]))
    assignment = placed(plan)["gang"]
    assert len(assignment) == 2 and all(len(r) == 8 and len(host_of(units, r)) == 1 for r in assignment)


def test_a_gang_that_does_not_fit_holds_nothing_and_smaller_work_still_runs():
    hosts, units = grid({"h1": 8, "h2": 8})
    busy = running(job("busy", 4, max_duration_s=None), [[f"h2-g{i}" for i in range(4)]])
    q = [job("gang", 8, replicas=2, prio="normal"), job("small", 2, prio="low")]
    plan = schedule(snapshot(hosts, units, queue=q, run=[busy]))
    assert "gang" not in placed(plan) and "small" in placed(plan)
    # busy has no max_duration: the gang has no known start, so the small job cannot delay it
    assert plan.explanations["gang"].reserved_start is None


def test_binpack_fills_the_fullest_host_and_keeps_whole_hosts_free():
    hosts, units = grid({"h1": 8, "h2": 8})
    busy = running(job("busy", 6), [[f"h1-g{i}" for i in range(6)]])
    plan = schedule(snapshot(hosts, units, queue=[job("two", 2)], run=[busy]))
    assert host_of(units, placed(plan)["two"][0]) == {"h1"}


def test_spread_takes_the_emptiest_host():
    hosts, units = grid({"h1": 8, "h2": 8})
    busy = running(job("busy", 6), [[f"h1-g{i}" for i in range(6)]])
    plan = schedule(snapshot(hosts, units, queue=[job("two", 2, placement="spread")], run=[busy]))
    assert host_of(units, placed(plan)["two"][0]) == {"h2"}


def test_higher_reputation_is_preferred_among_equal_hosts():
    hs = [Host("low", reputation=0.2), Host("high", reputation=0.9)]
    hosts, units = grid(hs, units=gpus("low", 4) + gpus("high", 4))
    plan = schedule(snapshot(hosts, units, queue=[job("j", 4)]))
    assert host_of(units, placed(plan)["j"][0]) == {"high"}


def test_nvlink_is_required_when_asked_and_preferred_otherwise():
    pcie = gpus("pcie", 4, "l40s")
    hosts, units = grid([Host("pcie")], units=pcie)
    asks = Constraints(nvlink=True)
    plan = schedule(snapshot(hosts, units, queue=[job("nv", 2, constraints=asks, request=ReplicaRequest(gpus=2))]))
    assert not placed(plan) and plan.explanations["nv"].summary
    nv = {f.name: f for f in plan.explanations["nv"].filters}["NVLink"]
    assert nv.removed == 4 and nv.remaining == 0
    assert placed(schedule(snapshot(hosts, units, queue=[job("any", 2)])))


def test_drained_and_isolation_none_and_process_hosts_get_nothing_unless_allowed():
    hs = [Host("drained", takes_work=False), Host("bare", isolation="none"), Host("proc", runtime="process", isolation="sandbox")]
    hosts, units = grid(hs, units=gpus("drained", 1) + gpus("bare", 1) + gpus("proc", 1))
    assert not placed(schedule(snapshot(hosts, units, queue=[job("j")])))
    allowed = job("j", constraints=Constraints(allow_process_runtime=True), runs_image=False)
    assert not placed(schedule(snapshot(hosts, units, queue=[allowed])))  # the operator has not allowed it
    plan = schedule(snapshot(hosts, units, queue=[allowed], policy=Policy(allow_process_runtime=True)))
    assert host_of(units, placed(plan)["j"][0]) == {"proc"}


OFFERED = Policy(allow_process_runtime=True)
MAY_RUN_AS_PROCESS = Constraints(allow_process_runtime=True)


def runtime_grid() -> tuple[dict, dict]:
    hs = [Host("box", runtime="docker"), Host("proc", runtime="process", isolation="sandbox")]
    return grid(hs, units=gpus("box", 2) + gpus("proc", 2))


def test_image_none_goes_only_to_a_process_runtime_host_and_an_image_only_to_a_container_engine():
    hosts, units = runtime_grid()
    bare = [job(f"bare-{i}", runs_image=False, constraints=MAY_RUN_AS_PROCESS, t=i) for i in range(3)]
    plan = schedule(snapshot(hosts, units, queue=bare, policy=OFFERED))
    assert {jid: host_of(units, a[0]) for jid, a in placed(plan).items()} == {"bare-0": {"proc"}, "bare-1": {"proc"}}
    imaged = [job(f"img-{i}", constraints=MAY_RUN_AS_PROCESS, t=i) for i in range(3)]
    plan = schedule(snapshot(hosts, units, queue=imaged, policy=OFFERED))
    assert {jid: host_of(units, a[0]) for jid, a in placed(plan).items()} == {"img-0": {"box"}, "img-1": {"box"}}


def test_why_image_none_waits_names_the_hosts_with_a_container_engine():
    hosts, units = runtime_grid()
    busy = running(job("busy", 2), [[u for u in units if units[u].host == "proc"]])
    bare = job("bare", runs_image=False, constraints=MAY_RUN_AS_PROCESS)
    plan = schedule(snapshot(hosts, units, queue=[bare], run=[busy], policy=OFFERED))
    assert not placed(plan)
    runtime = {f.name: f for f in plan.explanations["bare"].filters}["runtime/isolation"]
    assert (runtime.removed, runtime.remaining) == (2, 2)
    assert runtime.detail == '1 host runs a container engine, and image "none" runs only on hosts of the process runtime'


def test_an_image_where_only_process_hosts_have_the_gpus_cannot_fit_and_never_fits_says_how_it_would():
    hs = [Host("box", runtime="docker"), Host("proc", runtime="process", isolation="sandbox")]
    hosts, units = grid(hs, units=gpus("box", 1) + gpus("proc", 4))
    imaged = job("img", 4, constraints=MAY_RUN_AS_PROCESS)
    plan = schedule(snapshot(hosts, units, queue=[imaged], policy=OFFERED))
    assert not placed(plan) and not any(isinstance(d, Reject) for d in plan.decisions)
    assert "the most any host has that match is 1" in (plan.explanations["img"].cannot_fit or "")
    reason = never_fits(snapshot(hosts, units, queue=[], policy=OFFERED), imaged) or ""
    assert "among the hosts with a container engine" in reason and 'image "none"' in reason, reason
    only_proc = grid([Host("proc", runtime="process", isolation="sandbox")], units=gpus("proc", 4))
    reason = never_fits(snapshot(*only_proc, queue=[], policy=OFFERED), job("img", 1)) or ""
    assert 'image "none" with constraints.allow_process_runtime' in reason, reason


def test_image_none_that_does_not_allow_the_process_runtime_never_fits_naming_the_flag():
    hosts, units = runtime_grid()
    reason = never_fits(snapshot(hosts, units, queue=[], policy=OFFERED), job("bare", runs_image=False)) or ""
    assert reason.startswith('image "none" runs the command on the host itself') and "--allow-process-runtime" in reason
    sandboxed = never_fits(snapshot(hosts, units, queue=[]), job("bare", runs_image=False, constraints=MAY_RUN_AS_PROCESS))
    assert sandboxed is not None and "offer_sandboxed_hosts" in sandboxed and "name an image" in sandboxed, sandboxed


def test_a_host_its_container_did_not_start_on_is_avoided_and_the_explanation_says_so():
    hosts, units = grid({"h1": 1, "h2": 1})
    plan = schedule(snapshot(hosts, units, queue=[job("j", avoid=frozenset({"h1"}))]))
    assert host_of(units, placed(plan)["j"][0]) == {"h2"}
    plan = schedule(snapshot(hosts, units, queue=[job("j", avoid=frozenset({"h1", "h2"}))]))
    assert not placed(plan)
    avoided = {f.name: f for f in plan.explanations["j"].filters}["did not start there"]
    assert avoided.remaining == 0 and avoided.detail == "its container did not start on h1, h2 through the host"
    assert "did not start there" in plan.explanations["j"].summary


runtimes = st.sampled_from([("docker", "container"), ("process", "sandbox"), ("process", "none"), ("simulated", "container")])


@settings(max_examples=60, deadline=None)
@given(st.lists(runtimes, min_size=1, max_size=5), st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_every_placement_lands_where_the_runtime_runs_it(host_kinds, asks):
    """Property: image "none" lands only on process (or simulated) hosts that it and the operator allow, an image only
    on hosts with a container engine (or simulated), and nothing on a host that isolates nothing."""
    hs = [Host(f"h{i}", runtime=rt, isolation=iso) for i, (rt, iso) in enumerate(host_kinds)]
    hosts, units = grid(hs, units=[u for i in range(len(hs)) for u in gpus(f"h{i}", 2)])
    queue = [
        job(f"j{i}", runs_image=image, constraints=Constraints(allow_process_runtime=allow), t=i)
        for i, (image, allow) in enumerate(asks)
    ]
    plan = schedule(snapshot(hosts, units, queue=queue, policy=OFFERED))
    by_id = {j.id: j for j in queue}
    for jid, assignment in placed(plan).items():
        (where,) = host_of(units, assignment[0])
        h = hosts[where]
        assert h.isolation != "none"
        if h.runtime == "docker":
            assert by_id[jid].runs_image
        if h.runtime == "process":
            assert not by_id[jid].runs_image and by_id[jid].constraints.allow_process_runtime


def test_mig_requests_land_only_on_that_profile_and_whole_gpu_requests_never_on_mig():
    hosts, units = grid([Host("m")], units=mig("m", 0, "1g.10gb", 7) + gpus("m", 1, "a100-80gb"))
    # the whole GPU g0 is split; g0 itself is listed too here as a separate whole unit id "m-g0"
    want = ReplicaRequest(gpus=2, mig_profile="1g.10gb")
    plan = schedule(snapshot(hosts, units, queue=[job("small", request=want), job("whole", 1)]))
    got = placed(plan)
    assert all(units[u].mig_profile == "1g.10gb" for u in got["small"][0])
    assert units[got["whole"][0][0]].mig_profile is None
    wrong = ReplicaRequest(gpus=1, mig_profile="3g.40gb")
    plan = schedule(snapshot(hosts, units, queue=[job("other", request=wrong)]))
    assert not plan.decisions and "3g.40gb" in (plan.explanations["other"].cannot_fit or "")


def test_cpu_and_ram_of_a_host_bound_what_it_takes():
    hosts, units = grid([Host("h", cpu_cores=16, ram_mib=65536)], units=gpus("h", 4))
    req = ReplicaRequest(gpus=1, cpu_cores=10, ram_mib=1024)
    plan = schedule(snapshot(hosts, units, queue=[job("a", request=req), job("b", request=req)]))
    assert list(placed(plan)) == ["a"]
    cpu = {f.name: f for f in plan.explanations["b"].filters}["CPU"]
    assert cpu.removed == 4


def test_units_held_outside_the_scheduler_are_never_given_out():
    hosts, units = grid({"h": 2})
    plan = schedule(snapshot(hosts, units, queue=[job("a"), job("b")], extra_holders={"h-g0": "raw-container-7"}))
    assert list(placed(plan)) == ["a"] and placed(plan)["a"] == (("h-g1",),)


# --- rejection -------------------------------------------------------------------------------------


def test_only_what_no_grid_could_run_is_rejected_what_this_grid_cannot_hold_waits_explained():
    hosts, units = grid({"h1": 8, "h2": 8})
    q = [
        job("too-wide", 9),
        job("no-tier", request=ReplicaRequest(gpus=1, tiers=frozenset({"platinum"}))),
        job("no-class", prio="urgent"),
        job("big-gang", 8, replicas=3),
    ]
    plan = schedule(snapshot(hosts, units, queue=q))
    reasons = {d.job_id: d.reason for d in plan.decisions if isinstance(d, Reject)}
    assert set(reasons) == {"no-class"} and "urgent" in reasons["no-class"]  # no priority class of that name, anywhere
    assert not plan.places()  # and nothing else was placed or preempted for them
    cannot = {job_id: e.cannot_fit for job_id, e in plan.explanations.items()}
    assert "the most any host has that match is 8" in (cannot["too-wide"] or "")
    assert "platinum" in (cannot["no-tier"] or "")
    assert "at most 2" in (cannot["big-gang"] or "")  # hosts may join: it waits, saying why
    assert "Cannot be placed on this grid as it is now" in plan.explanations["big-gang"].summary
    busy = running(job("busy", 8), [[f"h1-g{i}" for i in range(8)], [f"h2-g{i}" for i in range(8)]])
    busy = replace(busy, replicas=2, request=ReplicaRequest(gpus=8))
    plan = schedule(snapshot(hosts, units, queue=[job("waits", 8)], run=[busy]))
    assert not plan.decisions and not plan.explanations["waits"].fits_now
    assert plan.explanations["waits"].cannot_fit is None  # busy now is not "cannot fit"


def test_a_job_that_cannot_fit_never_becomes_the_head_so_it_holds_nobody_up():
    hosts, units = grid({"h1": 2})
    blocker = running(job("blocker", 2, max_duration_s=3600.0), [["h1-g0", "h1-g1"]])
    q = [job("huge", 4, t=0.0), job("short", 1, t=1.0, max_duration_s=60.0)]
    plan = schedule(snapshot(hosts, units, queue=q, run=[blocker]))
    e = plan.explanations["short"]
    assert e.blocked_by is None or "huge" not in e.blocked_by  # the one that can never fit here reserves nothing


# --- quotas ----------------------------------------------------------------------------------------


def test_a_job_over_quota_waits_explained_and_does_not_block_others_behind_it():
    hosts, units = grid({"h": 8})
    mine = running(job("mine", 3, account="acme"), [["h-g0", "h-g1", "h-g2"]])
    policy = Policy(quotas={"acme": Quota(gpus=4)})
    q = [job("over", 2, account="acme", prio="high"), job("other", 2, account="zed", prio="low")]
    plan = schedule(snapshot(hosts, units, queue=q, run=[mine], policy=policy))
    assert list(placed(plan)) == ["other"]
    e = plan.explanations["over"]
    assert e.quota is not None and (e.quota.limit, e.quota.in_use, e.quota.asked) == (4, 3, 2)
    assert "quota" in e.summary


def test_per_tier_quota():
    hs = [Host("h")]
    hosts, units = grid(hs, units=gpus("h", 2, "h100-sxm"))
    policy = Policy(quotas={"acme": Quota(per_tier={"premium": 1})})
    plan = schedule(snapshot(hosts, units, queue=[job("a", t=1), job("b", t=2)], policy=policy))
    assert list(placed(plan)) == ["a"]
    assert plan.explanations["b"].quota is not None and plan.explanations["b"].quota.quota == "tier:premium"


# --- preemption ------------------------------------------------------------------------------------


def test_preemption_takes_the_fewest_victims_then_the_most_recently_started():
    hosts, units = grid({"h": 4})
    low = [running(job(f"low{i}", 1, prio="low"), [[f"h-g{i}"]], started_at=100.0 + i) for i in range(3)]
    pair = running(job("pair", 1, prio="low"), [["h-g3"]], started_at=50.0)
    plan = schedule(snapshot(hosts, units, queue=[job("hi", 1, prio="high")], run=[*low, pair]))
    assert [(p.job_id, p.for_job) for p in plan.preempts()] == [("low2", "hi")]
    assert "hi" not in placed(plan)  # it waits for the victim to exit
    assert plan.explanations["hi"].blocked_by and "Starting soon" in plan.explanations["hi"].summary


def test_one_big_victim_beats_two_small_ones():
    hosts, units = grid({"h": 4})
    run = [
        running(job("s1", 1, prio="low"), [["h-g0"]], started_at=300.0),
        running(job("s2", 1, prio="low"), [["h-g1"]], started_at=301.0),
        running(job("big", 2, prio="low"), [["h-g2", "h-g3"]], started_at=10.0),
    ]
    plan = schedule(snapshot(hosts, units, queue=[job("hi", 2, prio="high")], run=run))
    assert [p.job_id for p in plan.preempts()] == ["big"]


def test_no_preemption_unless_the_preemptor_then_fits_nor_of_equal_or_unpreemptible_work():
    hosts, units = grid({"h": 2})
    run = [
        running(job("lo", 1, prio="low"), [["h-g0"]]),
        running(job("peer", 1, prio="high"), [["h-g1"]]),
    ]
    plan = schedule(snapshot(hosts, units, queue=[job("hi", 2, prio="high")], run=run))
    assert not plan.preempts()  # freeing lo alone leaves it short; peer is the same class
    run2 = [running(job("keep", 1, prio="low", preemptible=False), [["h-g0"]])]
    hosts1, units1 = grid({"h": 1})
    assert not schedule(snapshot(hosts1, units1, queue=[job("hi", prio="high")], run=run2)).preempts()
    # a normal job never preempts (its class may not)
    run3 = [running(job("lo", 1, prio="low"), [["h-g0"]])]
    assert not schedule(snapshot(hosts1, units1, queue=[job("n", prio="normal")], run=run3)).preempts()


def test_victims_already_stopping_are_not_preempted_twice_and_their_units_go_to_nobody_else():
    hosts, units = grid({"h": 1})
    stopping = replace(running(job("lo", 1, prio="low"), [["h-g0"]]), preempted_for="hi")
    q = [job("hi", prio="high"), job("other", prio="normal", t=-5)]
    plan = schedule(snapshot(hosts, units, queue=q, run=[stopping]))
    assert not plan.decisions


def test_preempted_units_are_not_given_to_anyone_else_in_the_same_cycle():
    hosts, units = grid({"h": 2})
    run = [running(job("lo", 2, prio="low"), [["h-g0", "h-g1"]])]
    q = [job("hi", 1, prio="high"), job("next", 1, prio="normal")]
    plan = schedule(snapshot(hosts, units, queue=q, run=run))
    assert [p.job_id for p in plan.preempts()] == ["lo"] and not placed(plan)


# --- reallocation ----------------------------------------------------------------------------------


def test_jobs_on_a_faulty_unit_or_an_offline_host_are_requeued_and_nothing_new_lands_there():
    hs = [Host("ok"), Host("gone", online=False)]
    bad = gpus("ok", 2)
    bad[0] = replace(bad[0], healthy=False)
    hosts, units = grid(hs, units=bad + gpus("gone", 2))
    run = [running(job("on-bad", 1), [["ok-g0"]]), running(job("on-gone", 1), [["gone-g0"]])]
    plan = schedule(snapshot(hosts, units, queue=[job("new", 1), job("new2", 1)], run=run))
    requeued = {d.job_id: d.reason for d in plan.decisions if isinstance(d, Requeue)}
    assert set(requeued) == {"on-bad", "on-gone"} and "unhealthy" in requeued["on-bad"] and "offline" in requeued["on-gone"]
    assert placed(plan) == {"new": (("ok-g1",),)}


# --- backfill ----------------------------------------------------------------------------------------


def test_a_higher_class_preempts_instead_of_waiting_for_a_reservation():
    hosts, units = grid({"h1": 4})
    run = [running(job("r1", 4, max_duration_s=1500.0), [[f"h1-g{i}" for i in range(4)]], started_at=500.0)]
    plan = schedule(snapshot(hosts, units, queue=[job("head", 4, prio="high")], run=run))
    assert [p.job_id for p in plan.preempts()] == ["r1"]


def test_easy_backfill_lets_a_short_job_use_the_heads_hosts_but_keeps_a_long_one_off_them():
    hosts, units = grid({"h1": 4, "h2": 2})
    # now=1000: h1 has 2 GPUs busy until t=2000 and 2 idle; h2 is busy with no known end
    run = [
        running(job("r1", 2, max_duration_s=1500.0), [["h1-g0", "h1-g1"]], started_at=500.0),
        running(job("r2", 2), [["h2-g0", "h2-g1"]], started_at=500.0),
    ]
    q = [
        job("head", 4, t=0),  # normal: may not preempt; fits h1 at t=2000
        job("long", 2, prio="low", t=1, max_duration_s=5000.0),
        job("short", 2, prio="low", t=2, max_duration_s=500.0),
    ]
    plan = schedule(snapshot(hosts, units, queue=q, run=run))
    e = plan.explanations["head"]
    assert e.reserved_start == 2000.0
    assert "Next in line for room: 4 GPUs reserved for it from 1970-01-01 00:33:20 UTC" in e.summary
    assert placed(plan) == {"short": (("h1-g2", "h1-g3"),)}  # ends at 1500, before the head's start
    assert "long" in plan.explanations and "head" in (plan.explanations["long"].blocked_by or "")


def test_a_kept_pool_follows_units_that_turn_faulty_and_hosts_that_stop_taking_work():
    hosts, units = grid({"h1": 1, "h2": 1})
    pool = FreePool(snapshot(hosts, units))
    units["h1-g0"] = replace(units["h1-g0"], healthy=False)
    hosts["h2"] = replace(hosts["h2"], takes_work=False)
    plan = schedule(snapshot(hosts, units, queue=[job("a")]), pool=pool)
    assert not placed(plan)
    units["h1-g0"] = replace(units["h1-g0"], healthy=True)
    pool.refresh("h1-g0")  # the loop tells a kept pool about a unit that came back
    assert placed(schedule(snapshot(hosts, units, queue=[job("a")]), pool=pool)) == {"a": (("h1-g0",),)}

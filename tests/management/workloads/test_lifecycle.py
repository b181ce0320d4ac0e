"""The workload lifecycle step, pure: a record and facts in, actions out. Each rule is a named test; the invariants of
the module's docstring are hypothesis properties. The runner's end-to-end tests (test_runner.py) keep a few journeys
on a real Master; the rules are tested here."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import InvalidTransition
from common.storage import CheckpointSpec
from management.workloads.lifecycle import (
    FAILED_COMMAND_STATES,
    Action,
    Adopt,
    Advance,
    Create,
    End,
    Facts,
    HostContainers,
    HostStatus,
    LifecyclePolicy,
    Note,
    ReplicaFacts,
    TakeOver,
    create_refused,
    step,
    strays,
)
from management.workloads.spec import container_name
from management.workloads.states import FINAL_WORKLOAD_STATES, WORKLOAD, AssignmentState, WorkloadState
from master.records import Assignment, RentalTerms, ReplicaSpec, WorkloadRecord, WorkloadSpec

POLICY = LifecyclePolicy(grace_s=7.0, start_timeout_s=300.0, pull_allowance_s=1800.0)
T = 1_000_000.0
WL = "wl-00000000000000aa"


def record(state: str = "running", replicas: int = 1, **fields: Any) -> WorkloadRecord:
    spec_fields: dict[str, Any] = {  # WorkloadSpec's fields, of several types
        k: fields.pop(k) for k in ("restart_policy", "max_restarts", "max_duration_s", "checkpoint") if k in fields
    }
    if "offer" in fields:
        spec_fields["rental"] = RentalTerms(offer=fields.pop("offer"))
    if "bid" in fields:
        spec_fields["rental"] = RentalTerms(kind="interruptible", bid=fields.pop("bid"))
    spec = WorkloadSpec(name="train", image="busybox", replicas=replicas, replica=ReplicaSpec(gpus=1), **spec_fields)
    running = state in ("running", "preempted")
    assignments = fields.pop(
        "assignments",
        [
            Assignment(
                replica=i,
                agent_id=f"agt-{i}",
                units=[f"GPU-{i}"],
                container=container_name(WL, i, 1),
                command_id=f"cmd-{i}",
                state="running" if running else "pending",
            )
            for i in range(replicas)
        ],
    )
    base: dict[str, Any] = {"scheduled_at": T, "started_at": T if state == "running" else None, "attempts": 1}
    return WorkloadRecord(
        id=WL, account="alice", spec=spec, state=state, created_at=T, queued_at=T, assignments=assignments, **(base | fields)
    )


def facts(*replicas: ReplicaFacts) -> Facts:
    return Facts(tuple(replicas))


def listed(**fields: Any) -> ReplicaFacts:
    return ReplicaFacts(listed=True, **fields)


def only(actions: tuple[Action, ...]) -> Action:
    (action,) = actions
    return action


# --- starting ------------------------------------------------------------------------------------------------------


def test_a_placed_replica_without_a_create_gets_one_and_the_pull_allowance_where_its_host_lacks_the_image():
    rec = record("scheduled", replicas=2, assignments=[])
    rec = msgspec.structs.replace(
        rec,
        assignments=[
            Assignment(replica=i, agent_id=f"agt-{i}", units=[f"GPU-{i}"], container=container_name(WL, i, 1)) for i in (0, 1)
        ],
    )
    actions = step(rec, facts(ReplicaFacts(), ReplicaFacts(has_image=False)), POLICY, T)
    assert actions == (Create(0, 300.0), Create(1, 2100.0))


def test_after_a_restart_a_container_already_on_its_host_is_adopted_and_a_create_under_way_taken_over():
    rec = record("scheduled", replicas=2)
    rec = msgspec.structs.replace(rec, assignments=[msgspec.structs.replace(a, command_id="") for a in rec.assignments])
    actions = step(rec, facts(listed(), ReplicaFacts(create_made="cmd-made")), POLICY, T)
    # the adopted container counts as a create that succeeded: the workload is starting
    assert actions == (Adopt(0), TakeOver(1, "cmd-made"), Advance("start", "hosts acknowledged"))


def test_all_creates_succeeded_starts_and_runs_it_with_every_assignment_running():
    rec = record("scheduled", replicas=2)
    actions = step(rec, facts(ReplicaFacts(create_state="succeeded"), ReplicaFacts(create_state="succeeded")), POLICY, T)
    start, run = actions
    assert start == Advance("start", "containers created")
    assert isinstance(run, Advance) and (run.event, run.reason) == ("run", "2 container(s) running")
    assert [a.state for a in run.changes["assignments"]] == ["running", "running"]


def test_a_host_acknowledging_its_create_moves_it_to_starting():
    rec = record("scheduled", replicas=2)
    actions = step(rec, facts(ReplicaFacts(create_state="acked"), ReplicaFacts(create_state="sent")), POLICY, T)
    assert actions == (Advance("start", "hosts acknowledged"),)


def test_pull_progress_is_the_starting_workloads_detail_per_replica_and_cleared_when_none_is_under_way():
    one = record("starting")
    assert step(one, facts(ReplicaFacts(create_state="acked", pulling="pulling image: 1 of 3")), POLICY, T) == (
        Note("pulling image: 1 of 3"),
    )
    two = record("starting", replicas=2)
    actions = step(two, facts(ReplicaFacts(create_state="acked", pulling="p0"), ReplicaFacts(create_state="acked")), POLICY, T)
    assert actions == (Note("replica 0: p0"),)
    pulled = msgspec.structs.replace(one, detail="pulling image: 1 of 3")
    assert step(pulled, facts(ReplicaFacts(create_state="acked")), POLICY, T) == (Note(""),)
    assert step(one, facts(ReplicaFacts(create_state="acked")), POLICY, T) == ()  # nothing changed: nothing done


def test_a_create_that_failed_through_the_host_is_tried_on_another_host_with_the_hosts_words_and_blame():
    """(was test_loop_market.py::test_a_container_that_did_not_start_is_noted_on_the_failure_and_on_a_restart)"""
    failed = ReplicaFacts(create_state="failed", create_error_code="runtime_failed", create_error="OCI runtime: no cgroup")
    action = only(step(record("scheduled"), facts(failed), POLICY, T))
    assert action == End(
        "requeue",
        "1 of 1 container(s) did not start on agt-0 (failed): OCI runtime: no cgroup; "
        "trying another host (1 of 2 hosts may fail it)",
        POLICY.grace_s,
        {"host_failure": "agt-0: container did not start (failed)", "start_failed_on": ["agt-0"]},
    )


def test_a_create_that_failed_through_as_many_hosts_as_start_retries_allow_fails_the_workload_naming_the_last():
    rec = record("scheduled", start_failed_on=["agt-7", "agt-8"])
    action = only(step(rec, facts(ReplicaFacts(create_state="failed")), POLICY, T))
    assert action == End(
        "start_failed",
        "1 of 1 container(s) did not start on agt-0 (failed): no reason given",
        0.0,
        {"host_failure": "agt-0: container did not start (failed)", "start_failed_on": ["agt-7", "agt-8", "agt-0"]},
    )


def test_a_create_that_failed_on_the_host_a_rental_pins_is_not_tried_elsewhere():
    rec = record("scheduled", offer="agt-0")
    action = only(step(rec, facts(ReplicaFacts(create_state="failed", create_error="disk full")), POLICY, T))
    assert isinstance(action, End) and action.event == "start_failed", action
    assert action.reason == "1 of 1 container(s) did not start on agt-0 (failed): disk full"


def test_a_create_that_failed_through_the_host_requeues_a_restarting_workload_still_naming_the_host():
    rec = record("starting", replicas=2, restart_policy="on_failure", max_restarts=3, start_failed_on=["agt-5", "agt-6"])
    action = only(step(rec, facts(ReplicaFacts(create_state="succeeded"), ReplicaFacts(create_state="timed_out")), POLICY, T))
    assert action == End(
        "requeue",
        "1 of 2 container(s) did not start on agt-1 (timed_out): no reason given; restart 1 of 3",
        POLICY.grace_s,
        {
            "restarts": 1,
            "host_failure": "agt-1: container did not start (timed_out)",
            "start_failed_on": ["agt-5", "agt-6", "agt-1"],
        },
    )


def test_a_create_refused_for_the_renters_request_fails_at_once_without_a_restart_or_a_host_to_blame():
    rec = record("starting", restart_policy="always")
    refused = ReplicaFacts(create_state="failed", create_error_code="image_not_found", create_error="no such image")
    action = only(step(rec, facts(refused), POLICY, T))
    assert action == End("start_failed", "did not start (image_not_found): no such image", 0.0)


def test_a_step_that_ends_the_run_sends_no_create():
    rec = record("scheduled", replicas=2)
    rec = msgspec.structs.replace(
        rec, assignments=[rec.assignments[0], msgspec.structs.replace(rec.assignments[1], command_id="")]
    )
    action = only(step(rec, facts(ReplicaFacts(create_state="failed"), ReplicaFacts()), POLICY, T))
    assert isinstance(action, End) and action.event == "requeue"


def test_a_create_the_master_refuses_sends_the_workload_back_to_the_queue():
    assert create_refused(record("scheduled"), "agt-0", "host is offline", POLICY) == End(
        "requeue", "host agt-0 refused the container: host is offline", POLICY.grace_s
    )


# --- running -------------------------------------------------------------------------------------------------------


def test_all_containers_exiting_0_succeeds_it_with_their_codes():
    rec = record("running", replicas=2)
    action = only(step(rec, facts(listed(exit_code=0), listed(exit_code=0)), POLICY, T))
    assert action == End("succeed", "all containers exited 0", 0.0, {"exit_codes": [0, 0]})


def test_restart_policy_always_runs_it_again_after_a_success_until_max_restarts():
    rec = record("running", restart_policy="always", max_restarts=2, restarts=1)
    action = only(step(rec, facts(listed(exit_code=0)), POLICY, T))
    assert action == End("requeue", "all containers exited 0; restart_policy always", POLICY.grace_s, {"restarts": 2})
    spent = msgspec.structs.replace(rec, restarts=2)
    assert only(step(spent, facts(listed(exit_code=0)), POLICY, T)) == End(
        "succeed", "all containers exited 0", 0.0, {"exit_codes": [0]}
    )


def test_a_non_zero_exit_restarts_while_the_policy_allows_then_fails_with_the_codes_and_no_host_to_blame():
    """(was test_loop.py::test_a_failing_container_is_restarted_while_its_policy_allows_then_fails and
    test_loop_market.py::test_a_container_that_exited_non_zero_is_no_host_failure)"""
    rec = record("running", restart_policy="on_failure", max_restarts=1)
    assert only(step(rec, facts(listed(exit_code=3)), POLICY, T)) == End(
        "requeue", "a container exited with code 3; restart 1 of 1", POLICY.grace_s, {"restarts": 1}
    )
    spent = msgspec.structs.replace(rec, restarts=1)
    assert only(step(spent, facts(listed(exit_code=3)), POLICY, T)) == End(
        "fail", "a container exited with code 3", 0.0, {"exit_codes": [3]}
    )


def test_a_host_retired_quarantined_or_gone_requeues_it_naming_the_host():
    """(was test_loop_market.py::test_a_host_that_is_quarantined_under_a_running_workload_is_noted_as_its_host_failure)"""
    rec = record("running", replicas=2)
    action = only(step(rec, facts(ReplicaFacts(host=HostStatus.RETIRED), ReplicaFacts(host=HostStatus.LEFT)), POLICY, T))
    assert action == End(
        "requeue",
        "host agt-0 is gone; host agt-1 is gone",
        POLICY.grace_s,
        {"host_failure": "agt-0: host is gone (retired or quarantined)"},
    )


def test_a_container_vanished_from_a_host_that_answers_requeues_it_but_an_offline_hosts_silence_does_not():
    """(was test_loop_market.py::test_a_container_that_vanished_from_a_host_that_answers_is_noted_as_its_host_failure)"""
    rec = record("running")
    action = only(step(rec, facts(ReplicaFacts(listed=False)), POLICY, T))
    vanished = f"container {container_name(WL, 0, 1)} vanished"
    assert action == End("requeue", f"{vanished} from agt-0", POLICY.grace_s, {"host_failure": f"agt-0: {vanished}"})
    assert step(rec, facts(ReplicaFacts(host=HostStatus.OFFLINE, listed=False)), POLICY, T) == ()


def test_a_workload_past_its_max_duration_is_stopped_with_the_grace_and_failed():
    """(was test_loop.py::test_a_workload_past_its_max_duration_is_stopped_and_failed)"""
    rec = record("running", max_duration_s=60.0)
    assert step(rec, facts(listed()), POLICY, T + 60.0) == ()
    assert only(step(rec, facts(listed()), POLICY, T + 61.0)) == End("fail", "ran past its max_duration_s (60 s)", POLICY.grace_s)


# --- preempted -----------------------------------------------------------------------------------------------------


def test_a_preempted_workload_waits_while_a_host_that_answers_still_lists_its_container():
    rec = record("preempted", replicas=2, preempted_for="wl-high")
    assert step(rec, facts(listed(), ReplicaFacts(host=HostStatus.OFFLINE, listed=True)), POLICY, T) == ()


def test_a_preempted_workload_goes_back_to_the_queue_or_fails_by_restart_policy_once_its_containers_are_gone():
    """(was test_loop.py::test_a_victim_with_restart_policy_never_fails_when_preempted)"""
    gone = facts(ReplicaFacts(listed=False))
    never = record("preempted", preempted_for="wl-high")
    assert only(step(never, gone, POLICY, T)) == Advance("fail", "preempted for wl-high; restart_policy never")
    again = record("preempted", restart_policy="on_failure")
    assert only(step(again, gone, POLICY, T)) == Advance("requeue", "preempted for a higher priority workload; back in the queue")


def test_preempted_work_with_a_checkpoint_or_a_bid_goes_back_to_the_queue_unless_its_spec_says_never():
    gone = facts(ReplicaFacts(listed=False))
    back = Advance("requeue", "preempted for wl-high; back in the queue")
    checkpointed = record("preempted", preempted_for="wl-high", checkpoint=CheckpointSpec(uri="s3://runs/ckpt/"))
    assert only(step(checkpointed, gone, POLICY, T)) == back
    bid = record("preempted", preempted_for="wl-high", bid="0.50")
    assert only(step(bid, gone, POLICY, T)) == back
    told_never = record("preempted", preempted_for="wl-high", bid="0.50", restart_policy="never")
    assert only(step(told_never, gone, POLICY, T)) == Advance("fail", "preempted for wl-high; restart_policy never")


@pytest.mark.parametrize(
    ("fields", "in_force"),
    [
        ({}, "never"),
        ({"rental": RentalTerms(kind="interruptible", bid="0.10")}, "on_failure"),
        ({"rental": RentalTerms(kind="reserved", reserved_s=3600)}, "never"),
        ({"checkpoint": CheckpointSpec(uri="s3://runs/ckpt/")}, "on_failure"),
        ({"checkpoint": CheckpointSpec(uri="s3://runs/ckpt/"), "restart_policy": "never"}, "never"),
        ({"restart_policy": "always"}, "always"),
    ],
)
def test_the_restart_policy_in_force_is_the_specs_else_on_failure_for_checkpointed_or_interruptible_work(fields, in_force):
    assert WorkloadSpec(name="train", image="busybox", **fields).restart_policy_in_force == in_force


def test_queued_and_final_workloads_get_no_action_and_facts_must_match_the_assignments():
    for state in ("queued", "succeeded", "failed", "cancelled"):
        assert step(record(state, assignments=[]), facts(), POLICY, T) == ()
    with pytest.raises(ValueError, match="1 replica facts for 2 assignments"):
        step(record("running", replicas=2), facts(listed()), POLICY, T)


# --- strays --------------------------------------------------------------------------------------------------------


def test_a_workload_container_nobody_holds_is_deleted_again_and_retried_only_after_the_retry_period():
    """(was test_loop.py::test_a_stray_whose_assignment_was_settled_deleted_is_still_deleted_again: an assignment
    settled ``deleted`` holds nothing)"""
    held = record("running")
    settled = record(
        "preempted",
        assignments=[Assignment(replica=0, agent_id="agt-1", units=["GPU-x"], container="wl-bb-r0-a1", state="deleted")],
    )
    hosts = [
        HostContainers("agt-0", True, [container_name(WL, 0, 1), "wl-cc-r0-a1", "someone-elses"]),
        HostContainers("agt-1", True, ["wl-bb-r0-a1", "wl-dd-r0-a1"]),
        HostContainers("agt-2", False, ["wl-ee-r0-a1"]),  # offline: left alone
    ]
    deletes, tried = strays([held, settled], hosts, {("agt-1", "wl-dd-r0-a1")}, {}, T)
    assert [(d.agent_id, d.container) for d in deletes] == [("agt-0", "wl-cc-r0-a1"), ("agt-1", "wl-bb-r0-a1")]
    assert strays([held, settled], hosts, {("agt-1", "wl-dd-r0-a1")}, tried, T + 29.0)[0] == []
    again, _ = strays([held, settled], hosts, {("agt-1", "wl-dd-r0-a1")}, tried, T + 30.0)
    assert len(again) == 2
    _, forgotten = strays([held, settled], hosts[2:], set(), tried, T + 1.0)
    assert forgotten == {}  # no longer seen: forgotten


# --- properties ----------------------------------------------------------------------------------------------------

_COMMAND_STATES = ["", "pending", "sent", "acked", "succeeded", *sorted(FAILED_COMMAND_STATES)]

replica_facts = st.builds(
    ReplicaFacts,
    host=st.sampled_from(list(HostStatus)),
    listed=st.booleans(),
    exit_code=st.none() | st.integers(-1, 3),
    create_state=st.sampled_from(_COMMAND_STATES),
    create_error_code=st.sampled_from(["", "runtime_failure", "image_not_found"]),
    pulling=st.sampled_from(["", "pulling image: 1 of 2"]),
    has_image=st.booleans(),
    create_made=st.sampled_from(["", "cmd-made"]),
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[WorkloadRecord, Facts, float]:
    state = draw(st.sampled_from([str(s) for s in WorkloadState]))
    replicas = draw(st.integers(1, 3))
    max_restarts = draw(st.integers(0, 3))
    rec = record(
        state,
        replicas=replicas,
        restart_policy=draw(st.sampled_from([None, "never", "on_failure", "always"])),
        max_restarts=max_restarts,
        max_duration_s=draw(st.none() | st.sampled_from([1.0, 60.0, 3600.0])),
        restarts=draw(st.integers(0, max_restarts)),
        detail=draw(st.sampled_from(["", "pulling image: 1 of 2"])),
        start_failed_on=draw(st.lists(st.sampled_from([f"agt-{i}" for i in range(5)]), max_size=3, unique=True)),
        **draw(st.sampled_from([{}, {"offer": "agt-0"}, {"bid": "0.50"}])),
    )
    assignments = [
        msgspec.structs.replace(
            a,
            command_id=draw(st.sampled_from(["", a.command_id])),
            state=draw(st.sampled_from([str(s) for s in AssignmentState])),
        )
        for a in rec.assignments
    ]
    rec = msgspec.structs.replace(rec, assignments=assignments)
    return (
        rec,
        facts(*draw(st.lists(replica_facts, min_size=replicas, max_size=replicas))),
        T + draw(st.sampled_from([0.0, 30.0, 7200.0])),
    )


def states_through(rec: WorkloadRecord, actions: tuple[Action, ...]) -> list[str]:
    """The states the workload passes through as the actions are applied; InvalidTransition on a move the table lacks."""
    states = [rec.state]
    for action in actions:
        if isinstance(action, (Advance, End)):
            states.append(WORKLOAD.next(states[-1], action.event))
    return states


@settings(max_examples=300, deadline=None)
@given(cases())
def test_every_transition_the_step_asks_for_is_in_the_table_and_nothing_follows_an_end(case):
    rec, f, now = case
    actions = step(rec, f, POLICY, now)
    states_through(rec, actions)  # raises InvalidTransition on a move the table lacks
    ends = [i for i, action in enumerate(actions) if isinstance(action, End)]
    assert ends in ([], [len(actions) - 1])
    if ends:
        assert not any(isinstance(action, (Create, Adopt, TakeOver)) for action in actions)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_no_workload_is_both_running_and_finished(case):
    rec, f, now = case
    states = states_through(rec, step(rec, f, POLICY, now))
    finished = [s for s in states if s in FINAL_WORKLOAD_STATES]
    if rec.state in FINAL_WORKLOAD_STATES:
        assert states == [rec.state]  # a final workload takes nothing
    elif finished:
        assert states[-1] in FINAL_WORKLOAD_STATES and len(finished) == 1  # it ends once, as the last move
        assert WorkloadState.RUNNING not in states[states.index(finished[0]) :]


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_restart_policy_never_exceeds_its_limit(case):
    rec, f, now = case
    for action in step(rec, f, POLICY, now):
        if isinstance(action, End) and "restarts" in action.changes:
            assert action.event == "requeue"
            assert rec.spec.restart_policy_in_force in ("on_failure", "always")
            assert action.changes["restarts"] == rec.restarts + 1 <= rec.spec.max_restarts


@settings(max_examples=300, deadline=None)
@given(cases())
def test_maximum_duration_always_ends_the_run(case):
    rec, f, now = case
    rec = msgspec.structs.replace(rec, state="running")
    limit = rec.spec.max_duration_s
    if limit is None or now - T <= limit:
        return
    states = states_through(rec, step(rec, f, POLICY, now))
    assert states[-1] != WorkloadState.RUNNING


@settings(max_examples=300, deadline=None)
@given(cases())
def test_creates_are_asked_only_for_replicas_without_one_once_each(case):
    rec, f, now = case
    actions = step(rec, f, POLICY, now)
    asked = [a.replica for a in actions if isinstance(a, (Create, Adopt, TakeOver))]
    assert len(asked) == len(set(asked))
    without = {a.replica for a in rec.assignments if not a.command_id and a.state == AssignmentState.PENDING}
    assert set(asked) <= without


@settings(max_examples=300, deadline=None)
@given(cases())
def test_an_exit_code_is_never_blamed_on_a_host(case):
    rec, f, now = case
    rec = msgspec.structs.replace(rec, state="running")
    f = facts(*(dataclasses.replace(r, host=HostStatus.ANSWERING, listed=True) for r in f.replicas))
    for action in step(rec, f, POLICY, now):
        assert not (isinstance(action, End) and action.changes.get("host_failure"))


@settings(max_examples=300, deadline=None)
@given(cases())
def test_a_start_that_failed_through_hosts_moves_on_at_most_start_retries_times_and_never_off_a_pinned_host(case):
    rec, f, now = case
    for action in step(rec, f, POLICY, now):
        if not (isinstance(action, End) and "start_failed_on" in action.changes):
            continue
        tried = action.changes["start_failed_on"]
        pin = rec.spec.rental.offer if rec.spec.rental is not None else None
        kept = [h for h in dict.fromkeys(rec.start_failed_on) if h != pin]  # the hosts it failed on before, in order
        assert tried[: len(kept)] == kept
        assert pin not in tried  # the pinned host is never avoided
        blamed = action.changes["host_failure"].split(":")[0]
        assert blamed in tried or blamed == pin  # the host is blamed
        if action.event == "requeue" and "restarts" not in action.changes:  # moved on, not a restart
            assert len(tried) <= POLICY.start_retries and blamed != pin


def test_the_transition_table_refuses_what_the_properties_rely_on_it_to_refuse():
    with pytest.raises(InvalidTransition):
        WORKLOAD.next("succeeded", "run")

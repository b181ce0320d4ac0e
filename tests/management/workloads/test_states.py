"""The workload state table, written out here as the specification: every move it allows, and that it refuses
every other (state, event) pair."""

from __future__ import annotations

import itertools
import re
import typing

import msgspec
import pytest

from common.containers import ContainerSpec
from common.errors import InvalidTransition
from management.workloads import book
from management.workloads.spec import DEFAULT_PRIORITY_CLASSES, InvalidWorkloadSpec, check_spec, container_name
from management.workloads.states import FINAL_WORKLOAD_STATES, WORKLOAD, WorkloadChanges, WorkloadState
from master.records import ReplicaSpec, WorkloadRecord, WorkloadSpec
from master.tiers import TierPolicy

ALLOWED = {
    ("queued", "schedule"): "scheduled",
    ("scheduled", "start"): "starting",
    ("starting", "run"): "running",
    ("running", "succeed"): "succeeded",
    ("running", "fail"): "failed",
    # stopped for a higher priority: from any state that holds GPUs; back in the queue, or failed by restart policy
    ("scheduled", "preempt"): "preempted",
    ("starting", "preempt"): "preempted",
    ("running", "preempt"): "preempted",
    ("preempted", "requeue"): "queued",
    ("preempted", "fail"): "failed",
    # its GPU turned faulty or its host went offline: back to the queue
    ("scheduled", "requeue"): "queued",
    ("starting", "requeue"): "queued",
    ("running", "requeue"): "queued",
    # the start failed and no restart is left
    ("scheduled", "start_failed"): "failed",
    ("starting", "start_failed"): "failed",
    # it can never fit
    ("queued", "reject"): "failed",
    # cancel from every state that is not final
    ("queued", "cancel"): "cancelled",
    ("scheduled", "cancel"): "cancelled",
    ("starting", "cancel"): "cancelled",
    ("running", "cancel"): "cancelled",
    ("preempted", "cancel"): "cancelled",
}
STATES = [s.value for s in WorkloadState]
EVENTS = sorted({event for _, event in ALLOWED})


@pytest.mark.parametrize(("state", "event"), sorted(ALLOWED))
def test_each_allowed_move(state, event):
    assert WORKLOAD.next(state, event) == ALLOWED[(state, event)]


@pytest.mark.parametrize(("state", "event"), [p for p in itertools.product(STATES, EVENTS) if p not in ALLOWED])
def test_every_other_move_is_refused(state, event):
    with pytest.raises(InvalidTransition, match=f"no transition from '{state}' on '{event}'"):
        WORKLOAD.next(state, event)


def test_the_table_is_exactly_the_specification():
    assert dict(WORKLOAD.table) == ALLOWED


def test_final_states_take_no_event_and_every_open_state_can_be_cancelled():
    assert FINAL_WORKLOAD_STATES == {"succeeded", "failed", "cancelled"}
    for state in STATES:
        assert WORKLOAD.allows(state, "cancel") == (state not in FINAL_WORKLOAD_STATES)
        if state in FINAL_WORKLOAD_STATES:
            assert not any(WORKLOAD.allows(state, e) for e in EVENTS)


def test_container_names_are_deterministic_and_valid_for_a_container_spec():
    name = container_name("wl-0123456789abcdef", 63, 1000)
    assert name == container_name("wl-0123456789abcdef", 63, 1000) == "wl-0123456789abcdef-r63-a1000"
    ContainerSpec(name=name, image="busybox")  # the agent's own pattern accepts it
    assert re.fullmatch(r"wl-[0-9a-f]{16}-r\d+-a\d+", name)


POLICY = TierPolicy.load()


def spec(**replica: object) -> WorkloadSpec:
    return WorkloadSpec(name="job", image="busybox", replica=ReplicaSpec(**replica))  # type: ignore[arg-type]


def test_a_spec_naming_what_the_master_has_passes():
    tier = POLICY.tiers[0].name
    check_spec(spec(models=["h100-sxm", "a10"], tiers=[tier]), policy=POLICY, priority_classes=DEFAULT_PRIORITY_CLASSES)


@pytest.mark.parametrize(
    ("workload", "field", "named"),
    [
        (spec(models=["h100-sxm", "h900"]), "replica.models", "'h900'"),
        (spec(tiers=["platinum-plus"]), "replica.tiers", "'platinum-plus'"),
        (WorkloadSpec(name="job", image="busybox", priority="urgent"), "priority", "'urgent'"),
        (spec(mig_profile="1g.10gb", gpus=2), "replica.gpus", "mig_profile"),
    ],
)
def test_a_spec_naming_what_the_master_lacks_is_refused_by_field(workload, field, named):
    with pytest.raises(InvalidWorkloadSpec) as refused:
        check_spec(workload, policy=POLICY, priority_classes=DEFAULT_PRIORITY_CLASSES)
    assert str(refused.value).startswith(f"{field}: ") and named in str(refused.value)
    assert refused.value.code == "invalid_workload_spec"


def test_a_gang_needs_the_gang_overlay_unless_it_asks_for_no_network():
    gang = WorkloadSpec(name="pair", image="busybox", replicas=2)
    with pytest.raises(InvalidWorkloadSpec) as refused:
        check_spec(gang, policy=POLICY, priority_classes=DEFAULT_PRIORITY_CLASSES, gang_overlay=False)
    assert str(refused.value).startswith("replicas: this grid runs no gang overlay")
    check_spec(gang, policy=POLICY, priority_classes=DEFAULT_PRIORITY_CLASSES, gang_overlay=True)
    apart = WorkloadSpec(name="pair", image="busybox", replicas=2, network="none")
    check_spec(apart, policy=POLICY, priority_classes=DEFAULT_PRIORITY_CLASSES, gang_overlay=False)
    alone = WorkloadSpec(name="one", image="busybox")  # one replica: no network to make
    check_spec(alone, policy=POLICY, priority_classes=DEFAULT_PRIORITY_CLASSES, gang_overlay=False)


def test_nan_is_refused_where_json_cannot_carry_it():
    for bad in (
        lambda: WorkloadSpec(name="job", image="busybox", max_duration_s=float("nan")),
        lambda: ReplicaSpec(cpu_cores=float("inf")),
    ):
        with pytest.raises(ValueError, match="finite"):
            bad()


def test_a_transition_may_change_every_workload_field_the_book_does_not_keep_fixed_with_that_fields_type() -> None:
    """``WorkloadChanges`` types what ``transition``, ``end`` and ``amend`` take: a new field of the record is either
    one of them (with its type) or fixed by the book."""
    record = typing.get_type_hints(WorkloadRecord)
    changeable = typing.get_type_hints(WorkloadChanges)
    assert set(changeable) | book._FIXED_FIELDS == {f.name for f in msgspec.structs.fields(WorkloadRecord)}
    assert not set(changeable) & book._FIXED_FIELDS
    assert {name: record[name] for name in changeable} == changeable
    assert WorkloadChanges.__required_keys__ == frozenset()  # each change is optional

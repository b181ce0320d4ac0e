"""LaneQueue: control ahead of telemetry, bounded in bytes, telemetry coalesced (latest wins), loss counted."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.lanes import Lane, LaneBounds, LaneQueue, Pushed

BOUNDS = LaneBounds(control_bytes=100, telemetry_bytes=60, coalesce_bytes=20, admission_bytes=80)

push_control = st.tuples(st.just("control"), st.sampled_from([Lane.CONTROL, Lane.ADMISSION]), st.integers(1, 40))
push_telemetry = st.tuples(st.just("telemetry"), st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 30))
pop = st.tuples(st.just("pop"), st.none(), st.none())
forget = st.tuples(st.just("forget"), st.sampled_from(["a", "b", "c", "d"]), st.none())
operations = st.lists(st.one_of(push_control, push_telemetry, pop, forget), max_size=200)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_lanes_keep_their_invariants_under_any_sequence(ops):
    queue: LaneQueue[tuple[str, int]] = LaneQueue(BOUNDS)
    serial = 0
    control_in: list[tuple[str, int]] = []
    control_out: list[tuple[str, int]] = []
    telemetry_pushed = 0
    telemetry_out: list[tuple[str, int]] = []
    for op, arg, size in ops:
        serial += 1
        if op == "control":
            item = ("control", serial)
            if queue.push(item, arg, size) is not Pushed.FULL:
                control_in.append(item)
        elif op == "telemetry":
            telemetry_pushed += 1
            queue.push((arg, serial), Lane.TELEMETRY, size, key=arg)
        elif op == "forget":
            queue.forget(arg)
        else:
            got = queue.pop()
            if got is None:
                assert len(queue) == 0
                continue
            item, lane = got
            if lane is Lane.TELEMETRY:
                # no telemetry comes out while control or admission waits
                assert queue.control_waiting == 0
                telemetry_out.append(item)
            else:
                if lane is Lane.ADMISSION:
                    assert queue.bytes(Lane.CONTROL) == 0  # no hello comes out while control waits
                control_out.append(item)
        assert 0 <= queue.bytes(Lane.TELEMETRY) <= BOUNDS.telemetry_bytes
        assert 0 <= queue.bytes(Lane.CONTROL) <= BOUNDS.control_bytes
        assert 0 <= queue.bytes(Lane.ADMISSION) <= BOUNDS.admission_bytes
    while (got := queue.pop()) is not None:
        item, lane = got
        (telemetry_out if lane is Lane.TELEMETRY else control_out).append(item)
    assert queue.bytes(Lane.CONTROL) == queue.bytes(Lane.ADMISSION) == queue.bytes(Lane.TELEMETRY) == 0
    # control: every item taken comes out exactly once; within a lane, in order
    assert Counter(control_out) == Counter(control_in)
    # per key, telemetry comes out in the order it went in
    for key in "abcd":
        serials = [s for k, s in telemetry_out if k == key]
        assert serials == sorted(serials)
    # nothing is lost silently
    assert telemetry_pushed == len(telemetry_out) + queue.replaced + queue.evicted + queue.forgotten


def test_control_goes_ahead_of_telemetry_queued_before_it():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.push("heartbeat", Lane.TELEMETRY, 10, key="a")
    queue.push("hello", Lane.ADMISSION, 10)
    queue.push("result", Lane.CONTROL, 10)
    assert [queue.pop(), queue.pop(), queue.pop(), queue.pop()] == [
        ("result", Lane.CONTROL),
        ("hello", Lane.ADMISSION),
        ("heartbeat", Lane.TELEMETRY),
        None,
    ]


def test_a_consumer_of_control_and_one_of_the_rest_each_take_only_their_own():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.push("heartbeat", Lane.TELEMETRY, 10, key="a")
    queue.push("hello", Lane.ADMISSION, 10)
    queue.push("result", Lane.CONTROL, 10)
    assert queue.pop(control=False) == ("hello", Lane.ADMISSION)
    assert queue.pop(control=False) == ("heartbeat", Lane.TELEMETRY)
    assert queue.pop(control=False) is None  # the result is not theirs
    assert queue.pop(control=True) == ("result", Lane.CONTROL)
    queue.push("late", Lane.TELEMETRY, 10, key="b")
    assert queue.pop(control=True) is None and len(queue) == 1


def test_below_the_coalescing_bound_every_sample_waits_its_turn():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    assert queue.push("a1", Lane.TELEMETRY, 5, key="a") is Pushed.QUEUED
    assert queue.push("a2", Lane.TELEMETRY, 5, key="a") is Pushed.QUEUED
    assert [queue.pop(), queue.pop()] == [("a1", Lane.TELEMETRY), ("a2", Lane.TELEMETRY)]
    assert queue.replaced == 0


def test_past_the_coalescing_bound_the_newest_sample_takes_the_waiting_ones_place():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.push("a1", Lane.TELEMETRY, 10, key="a")
    queue.push("b1", Lane.TELEMETRY, 10, key="b")
    assert queue.push("a2", Lane.TELEMETRY, 10, key="a") is Pushed.REPLACED
    assert [queue.pop(), queue.pop(), queue.pop()] == [("a2", Lane.TELEMETRY), ("b1", Lane.TELEMETRY), None]
    assert queue.replaced == 1


def test_past_the_telemetry_bound_the_oldest_samples_are_evicted_and_counted():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(control_bytes=100, telemetry_bytes=30, coalesce_bytes=30))
    for name in ("a", "b", "c", "d"):
        queue.push(name, Lane.TELEMETRY, 10, key=name)
    assert queue.bytes(Lane.TELEMETRY) == 30
    assert queue.evicted == 1
    assert [queue.pop() for _ in range(3)] == [("b", Lane.TELEMETRY), ("c", Lane.TELEMETRY), ("d", Lane.TELEMETRY)]


def test_control_past_its_bound_is_refused_not_dropped():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(control_bytes=20, telemetry_bytes=10, coalesce_bytes=5))
    assert queue.push("r1", Lane.CONTROL, 15) is Pushed.QUEUED
    assert queue.push("r2", Lane.CONTROL, 15) is Pushed.FULL
    assert queue.pop() == ("r1", Lane.CONTROL)
    assert queue.push("r2", Lane.CONTROL, 15) is Pushed.QUEUED


def test_hellos_past_their_bound_leave_room_for_the_results_behind_them():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(control_bytes=20, telemetry_bytes=10, coalesce_bytes=5, admission_bytes=30))
    assert queue.push("hello-1", Lane.ADMISSION, 15) is Pushed.QUEUED
    assert queue.push("hello-2", Lane.ADMISSION, 15) is Pushed.QUEUED
    assert queue.push("hello-3", Lane.ADMISSION, 15) is Pushed.FULL  # a storm's hellos wait at their own bound ...
    assert queue.push("result", Lane.CONTROL, 15) is Pushed.QUEUED  # ... and a result still gets in, and out first
    assert queue.bytes(Lane.ADMISSION) == 30 and queue.bytes(Lane.CONTROL) == 15
    assert [queue.pop() for _ in range(2)] == [("result", Lane.CONTROL), ("hello-1", Lane.ADMISSION)]


def test_one_control_item_larger_than_the_bound_still_passes_alone():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(control_bytes=20, telemetry_bytes=10, coalesce_bytes=5))
    assert queue.push("big", Lane.CONTROL, 50) is Pushed.QUEUED
    assert queue.push("next", Lane.CONTROL, 1) is Pushed.FULL


def test_forget_lets_the_newest_sample_of_a_source_go():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.push("a1", Lane.TELEMETRY, 5, key="a")
    assert queue.forget("a")
    assert not queue.forget("a")
    assert queue.pop() is None
    assert queue.forgotten == 1


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="coalesce_bytes"):
        LaneBounds(control_bytes=10, telemetry_bytes=10, coalesce_bytes=11)
    with pytest.raises(ValueError, match="positive"):
        LaneBounds(admission_bytes=0)

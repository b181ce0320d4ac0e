"""LaneQueue: control ahead of telemetry, bounded in bytes, telemetry coalesced (latest wins), loss counted."""

from __future__ import annotations

import functools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.lanes import Drop, Lane, LaneBounds, LaneQueue, Pushed, Replace

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


# --- the generalized queue: a count bound, two replace policies, a sender's take/done/give_back, sources -----------

Item = tuple[int, int, int, str | None, str, bool]  # serial, lane, size, key, source, forced


def of_source(source: str, item: Item) -> bool:
    return item[4] == source


general_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from([Lane.CONTROL, Lane.ADMISSION]), st.integers(1, 40), st.booleans()),
        st.tuples(st.just("telemetry"), st.sampled_from(["a", "b", "c", "d"]), st.integers(1, 30), st.booleans()),
        st.tuples(st.just("pop"), st.none(), st.none(), st.none()),
        st.tuples(st.just("take"), st.integers(1, 4), st.integers(0, 80), st.none()),
        st.tuples(st.just("done"), st.none(), st.none(), st.none()),
        st.tuples(st.just("give_back"), st.none(), st.none(), st.none()),
        st.tuples(st.just("forget"), st.sampled_from(["a", "b", "c", "d"]), st.none(), st.none()),
        st.tuples(st.just("withdraw_last"), st.sampled_from(["s0", "s1", "s2"]), st.none(), st.none()),
        st.tuples(st.just("discard"), st.sampled_from(["s0", "s1", "s2"]), st.none(), st.none()),
        st.tuples(st.just("coalesce"), st.booleans(), st.none(), st.none()),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(general_ops, st.sampled_from(list(Replace)), st.sampled_from([None, 1, 3, 8]))
def test_the_general_queue_keeps_its_invariants_under_any_sequence(ops, replace, items):
    bounds = LaneBounds(control_bytes=100, telemetry_bytes=60, coalesce_bytes=20, admission_bytes=80, items=items)
    dropped: list[Drop] = []
    queue: LaneQueue[Item] = LaneQueue(bounds, replace=replace, on_drop=dropped.append)
    serial, pushed, withdrawn = 0, 0, 0
    queued: list[Item] = []  # every item accepted, in order
    out: list[Item] = []  # every item that left by pop or done, in order
    taken: list[Item] = []
    for op, a, b, force in ops:
        serial += 1
        source = f"s{serial % 3}"
        before = len(queue)
        if op in ("push", "telemetry"):
            lane = a if op == "push" else Lane.TELEMETRY
            item: Item = (serial, int(lane), b, a if op == "telemetry" else None, source, force)
            got = queue.push(item, lane, b, item[3], source=source, force=force)
            if got is not Pushed.FULL:
                pushed += 1
                queued.append(item)
            if got in (Pushed.QUEUED, Pushed.REPLACED) and not force and items is not None:
                assert len(queue) <= max(items, before)  # an unforced push never takes the count past the bound
        elif op == "pop":
            if taken:
                continue  # one reader at a time: a sender's take, or pops (common/lanes.py)
            got_pop = queue.pop()
            if got_pop is not None:
                out.append(got_pop[0])
        elif op == "take":
            taken = queue.take(a, b)
            assert taken == queue.in_order()[: len(taken)]  # the head, in order
            assert len(taken) <= a and (len(taken) <= 1 or sum(i[2] for i in taken) <= b)
        elif op == "done":
            out.extend(taken)
            queue.done()
            taken = []
        elif op == "give_back":
            queue.give_back()
            taken = []
        elif op == "forget":
            queue.forget(a)
        elif op == "withdraw_last":
            withdrawn += queue.withdraw_last(a, lambda item: True)
        elif op == "discard":
            withdrawn += queue.discard(functools.partial(of_source, a))
        else:
            queue.coalesce = a
        inside = queue.in_order()
        assert len(inside) == len(queue)
        for lane in Lane:
            assert queue.bytes(lane) == sum(i[2] for i in inside if i[1] == lane)
        assert queue.bytes(Lane.TELEMETRY) <= bounds.telemetry_bytes
        assert [i[1] for i in inside] == sorted(i[1] for i in inside)  # control, then admission, then telemetry
        assert all(i in inside for i in taken)  # what a sender holds is never let go under it
    queue.done()
    out.extend(taken)
    while (got_pop := queue.pop()) is not None:
        out.append(got_pop[0])
    assert len(set(out)) == len(out)  # nothing leaves twice
    for lane in (Lane.CONTROL, Lane.ADMISSION):
        # control leaves in the order it came, every item that was not withdrawn
        left = [i for i in out if i[1] == lane]
        assert left == [i for i in queued if i in left]
    for key in "abcd":
        serials = [i[0] for i in out if i[3] == key]
        assert serials == sorted(serials)  # per key, telemetry leaves in the order it came
    assert pushed == len(out) + queue.replaced + queue.evicted + queue.forgotten + withdrawn  # nothing lost uncounted
    counts = Counter(dropped)
    assert (counts[Drop.REPLACED], counts[Drop.EVICTED], counts[Drop.FORGOTTEN]) == (
        queue.replaced,
        queue.evicted,
        queue.forgotten,
    )


def test_past_the_count_bound_the_oldest_sample_makes_room_and_then_control_waits():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(items=2))
    queue.push("a1", Lane.TELEMETRY, 5, key="a")
    queue.push("r1", Lane.CONTROL, 5)
    assert queue.push("r2", Lane.CONTROL, 5) is Pushed.QUEUED  # the sample made room
    assert queue.evicted == 1
    assert queue.push("r3", Lane.CONTROL, 5) is Pushed.FULL  # nothing left to let go: wait
    assert queue.push("b1", Lane.TELEMETRY, 5, key="b") is Pushed.DROPPED  # a sample does not wait: it goes
    assert queue.evicted == 2
    assert queue.push("bye", Lane.CONTROL, 5, force=True) is Pushed.QUEUED  # a forced item passes the bound
    assert queue.in_order() == ["r1", "r2", "bye"]


def test_replaced_last_the_newest_sample_goes_at_the_end_of_the_line():
    queue: LaneQueue[str] = LaneQueue(BOUNDS, replace=Replace.LAST)
    queue.push("a1", Lane.TELEMETRY, 10, key="a")
    queue.push("b1", Lane.TELEMETRY, 10, key="b")
    assert queue.push("a2", Lane.TELEMETRY, 10, key="a") is Pushed.REPLACED
    assert queue.in_order() == ["b1", "a2"]
    assert queue.replaced == 1


def test_while_coalescing_samples_are_replaced_below_the_coalescing_bound_too():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.coalesce = True
    queue.push("a1", Lane.TELEMETRY, 1, key="a")
    assert queue.push("a2", Lane.TELEMETRY, 1, key="a") is Pushed.REPLACED
    assert queue.in_order() == ["a2"]


def test_a_sample_larger_than_its_lane_is_dropped_and_the_waiting_ones_stay():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.push("a1", Lane.TELEMETRY, 10, key="a")
    assert queue.push("huge", Lane.TELEMETRY, BOUNDS.telemetry_bytes + 1, key="b") is Pushed.DROPPED
    assert queue.in_order() == ["a1"] and queue.evicted == 1


def test_taken_items_leave_when_done_and_come_back_to_the_head_in_order_when_given_back():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    for name in ("r1", "r2"):
        queue.push(name, Lane.CONTROL, 10)
    queue.push("hello", Lane.ADMISSION, 10)
    queue.push("a1", Lane.TELEMETRY, 10, key="a")
    assert queue.take(3, 1_000) == ["r1", "r2", "hello"]
    assert queue.take(10, 25) == ["r1", "r2"]  # a take not done is given back first; a third would pass 25 bytes
    assert queue.take(10, 0) == ["r1"]  # the first always goes, whatever its size
    queue.push("r3", Lane.CONTROL, 10)
    queue.give_back()
    assert queue.in_order() == ["r1", "r2", "r3", "hello", "a1"]
    assert queue.take(2, 1_000) == ["r1", "r2"]
    queue.done()
    assert queue.in_order() == ["r3", "hello", "a1"] and len(queue) == 3 and queue.bytes(Lane.CONTROL) == 10


def test_a_taken_sample_is_neither_replaced_evicted_nor_forgotten():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(telemetry_bytes=20, coalesce_bytes=0, items=3), replace=Replace.LAST)
    queue.push("a1", Lane.TELEMETRY, 10, key="a")
    assert queue.take(1, 0) == ["a1"]
    assert queue.push("a2", Lane.TELEMETRY, 10, key="a") is Pushed.QUEUED  # queued apart: a1 is on its way out
    assert queue.forget("a")  # a2, the one waiting
    assert queue.push("b1", Lane.TELEMETRY, 15, key="b") is Pushed.DROPPED  # a1's bytes are not for eviction
    assert queue.in_order() == ["a1"] and queue.bytes(Lane.TELEMETRY) == 10
    queue.give_back()
    assert queue.push("b2", Lane.TELEMETRY, 15, key="b") is Pushed.QUEUED  # given back, it may be evicted again
    assert queue.in_order() == ["b2"]


def test_withdraw_last_takes_back_a_sources_newest_item_only_while_it_waits():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    queue.push("hi-a", Lane.CONTROL, 5, source="a")
    queue.push("hi-b", Lane.CONTROL, 5, source="b")
    queue.push("said-b", Lane.CONTROL, 5, source="b")
    assert not queue.withdraw_last("b", lambda item: item.startswith("hi"))  # b said something since
    assert queue.withdraw_last("a", lambda item: item.startswith("hi"))
    assert not queue.withdraw_last("a", lambda item: True)  # nothing of a is left
    assert queue.take(1, 0) == ["hi-b"]
    queue.push("hi-c", Lane.CONTROL, 5, source="c")
    assert queue.take(5, 100) == ["hi-b", "said-b", "hi-c"]
    assert not queue.withdraw_last("c", lambda item: True)  # on its way out
    assert queue.forgotten == queue.evicted == queue.replaced == 0  # withdrawn is not lost


def test_discard_takes_back_every_waiting_item_it_picks_and_in_order_names_the_rest():
    queue: LaneQueue[str] = LaneQueue(BOUNDS)
    for name in ("x1", "y1", "x2"):
        queue.push(name, Lane.CONTROL, 5)
    queue.push("x3", Lane.TELEMETRY, 5, key="x")
    assert queue.discard(lambda item: item.startswith("x")) == 3
    assert queue.in_order() == ["y1"] and queue.bytes(Lane.TELEMETRY) == 0 and queue.pop() == ("y1", Lane.CONTROL)


def test_a_mark_is_sent_through_once_everything_queued_before_it_has_left():
    queue: LaneQueue[str] = LaneQueue(BOUNDS, replace=Replace.LAST)
    queue.push("r1", Lane.CONTROL, 5)
    queue.push("a1", Lane.TELEMETRY, 5, key="a")
    mark = queue.pushed
    queue.push("r2", Lane.CONTROL, 5)
    assert not queue.sent_through(mark)
    assert queue.take(2, 100) == ["r1", "r2"]
    assert not queue.sent_through(mark)  # taken is not gone
    queue.done()
    assert not queue.sent_through(mark)  # a1 waits
    queue.coalesce = True
    queue.push("a2", Lane.TELEMETRY, 5, key="a")  # replaces a1, queued after the mark
    assert queue.sent_through(mark)


def test_every_sample_let_go_is_told_to_on_drop_with_why():
    dropped: list[Drop] = []
    queue: LaneQueue[str] = LaneQueue(LaneBounds(telemetry_bytes=10, coalesce_bytes=0), on_drop=dropped.append)
    queue.push("a1", Lane.TELEMETRY, 5, key="a")
    queue.push("a2", Lane.TELEMETRY, 5, key="a")
    queue.push("b1", Lane.TELEMETRY, 10, key="b")
    queue.forget("b")
    assert dropped == [Drop.REPLACED, Drop.EVICTED, Drop.FORGOTTEN]


def test_the_count_bound_is_checked():
    with pytest.raises(ValueError, match="items"):
        LaneBounds(items=0)


def test_a_sample_replaced_in_place_is_its_new_sources_newest_item():
    queue: LaneQueue[str] = LaneQueue(LaneBounds(telemetry_bytes=60, coalesce_bytes=0))
    queue.push("b-by-s0", Lane.TELEMETRY, 5, key="b", source="s0")
    assert queue.push("b-by-s1", Lane.TELEMETRY, 5, key="b", source="s1") is Pushed.REPLACED
    assert not queue.withdraw_last("s0", lambda item: True)  # s0's item is gone: replaced
    assert queue.pop() == ("b-by-s1", Lane.TELEMETRY)
    assert not queue.withdraw_last("s1", lambda item: True)  # and s1's left with the pop
    assert len(queue) == 0 and queue.bytes(Lane.TELEMETRY) == 0

"""The endpoint autoscaler (management/endpoints/autoscaler.py): each invariant of its docstring is a hypothesis
property here, by the same name, and a few worked examples read as the rules do."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from management.endpoints.autoscaler import (
    STUCK_REASONS,
    Decision,
    QueueView,
    ScalingPolicy,
    Stop,
    StopReason,
    Worker,
    WorkerPhase,
    decide,
    needed_workers,
    queue_delay,
    stuck_reason,
)

NOW = 10_000.0
# Ages in seconds, the policies' thresholds (timeouts, targets) and either side of them among them.
AGES = st.sampled_from([0.0, 0.5, 1.0, 4.0, 4.5, 5.0, 29.0, 30.0, 31.0, 59.0, 60.0, 61.0, 300.0, 601.0]) | st.floats(0, 1_000)


@st.composite
def policies(draw: st.DrawFn) -> ScalingPolicy:
    max_workers = draw(st.integers(0, 12))
    return ScalingPolicy(
        min_workers=draw(st.integers(0, max_workers)),
        max_workers=max_workers,
        idle_timeout_s=draw(st.sampled_from([0.0, 5.0, 60.0, 300.0])),
        target_queue_delay_s=draw(st.sampled_from([0.0, 1.0, 4.0, 30.0])),
        concurrency=draw(st.integers(1, 8)),
        start_timeout_s=draw(st.sampled_from([30.0, 600.0])),
        heartbeat_timeout_s=draw(st.sampled_from([10.0, 30.0])),
    )


@st.composite
def workers(draw: st.DrawFn, index: int) -> Worker:
    phase = draw(st.sampled_from(list(WorkerPhase)))
    since = NOW - draw(AGES)
    in_flight = draw(st.sampled_from([0, 0, 1]) | st.integers(0, 8)) if phase is not WorkerPhase.STARTING else 0
    # mostly heard from lately (healthy), sometimes silent past any heartbeat timeout
    last_seen: float | None = max(since, NOW - draw(st.sampled_from([0.0, 1.0, 9.0, 10.0, 29.0, 31.0, 500.0])))
    idle_since = max(since, NOW - draw(AGES)) if phase is WorkerPhase.READY and in_flight == 0 else None
    if phase is not WorkerPhase.READY:
        last_seen = None
    return Worker(id=f"w{index}", phase=phase, since=since, in_flight=in_flight, last_seen=last_seen, idle_since=idle_since)


@st.composite
def queues(draw: st.DrawFn) -> QueueView:
    waiting = draw(st.sampled_from([0, 0, 0, 1, 2]) | st.integers(0, 60))
    since = NOW - draw(AGES) if waiting else None
    return QueueView(waiting=waiting, oldest_waiting_since=since)


@st.composite
def cases(draw: st.DrawFn) -> tuple[ScalingPolicy, QueueView, list[Worker], bool]:
    count = draw(st.integers(0, 14))
    pool = [draw(workers(i)) for i in range(count)]
    return draw(policies()), draw(queues()), pool, draw(st.booleans())


def healthy(policy: ScalingPolicy, pool: list[Worker]) -> list[Worker]:
    return [w for w in pool if stuck_reason(w, policy, NOW) is None]


def after(decision: Decision, policy: ScalingPolicy, pool: list[Worker]) -> list[Worker]:
    """The healthy workers the decision leaves, the ones it asked for included (as starting, from now)."""
    stopped = {stop.worker for stop in decision.stop}
    kept = [w for w in healthy(policy, pool) if w.id not in stopped]
    return kept + [Worker(id=f"new{i}", phase=WorkerPhase.STARTING, since=NOW) for i in range(decision.start)]


def requeued(policy: ScalingPolicy, queue: QueueView, pool: list[Worker]) -> QueueView:
    """The queue once the stuck workers' requests are back in it (queued now, unless older ones wait)."""
    back = sum(w.in_flight for w in pool if stuck_reason(w, policy, NOW) is not None)
    if not back:
        return queue
    return QueueView(waiting=queue.waiting + back, oldest_waiting_since=queue.oldest_waiting_since or NOW)


def busy(worker: Worker) -> bool:
    return worker.in_flight > 0


# 1
@settings(max_examples=300, deadline=None)
@given(cases())
def test_never_above_max(case):
    policy, queue, pool, may_scale_up = case
    decision = decide(policy, queue, pool, NOW, may_scale_up=may_scale_up)
    left = after(decision, policy, pool)
    assert decision.desired == len(left)
    if len(left) > policy.max_workers:
        assert decision.start == 0
        assert all(busy(w) for w in left), "only busy workers may stay above a lowered max_workers"


# 2
@settings(max_examples=300, deadline=None)
@given(cases())
def test_never_below_min(case):
    policy, queue, pool, _ = case
    decision = decide(policy, queue, pool, NOW, may_scale_up=True)
    assert len(after(decision, policy, pool)) >= policy.min_workers


# 3
@settings(max_examples=300, deadline=None)
@given(cases())
def test_never_stops_work_in_flight(case):
    policy, queue, pool, may_scale_up = case
    by_id = {w.id: w for w in pool}
    for stop in decide(policy, queue, pool, NOW, may_scale_up=may_scale_up).stop:
        if busy(by_id[stop.worker]):
            assert stop.reason in STUCK_REASONS


# 4
@settings(max_examples=300, deadline=None)
@given(cases())
def test_scales_to_zero_only_after_idle_timeout(case):
    policy, queue, pool, may_scale_up = case
    by_id = {w.id: w for w in pool}
    for stop in decide(policy, queue, pool, NOW, may_scale_up=may_scale_up).stop:
        if stop.reason is StopReason.IDLE:
            worker = by_id[stop.worker]
            assert worker.phase is WorkerPhase.READY and worker.in_flight == 0
            assert requeued(policy, queue, pool).waiting == 0
            assert NOW - max(worker.since, worker.idle_since or worker.since) >= policy.idle_timeout_s


# 5
@settings(max_examples=300, deadline=None)
@given(cases())
def test_burst_from_zero_starts_enough(case):
    policy, queue, pool, _ = case
    ready_ones = [w for w in healthy(policy, pool) if w.phase is WorkerPhase.READY]
    if ready_ones or requeued(policy, queue, pool).waiting == 0:
        return
    decision = decide(policy, queue, pool, NOW, may_scale_up=True)
    enough = min(policy.max_workers, max(policy.min_workers, needed_workers(policy, queue, pool)))
    assert len(after(decision, policy, pool)) >= enough  # starting ones counted: no overshoot is property 7's


# 6
@settings(max_examples=300, deadline=None)
@given(cases())
def test_scales_up_on_queue_delay(case):
    policy, queue, pool, _ = case
    count = len(healthy(policy, pool))
    late = queue_delay(queue, NOW) > policy.target_queue_delay_s
    if late and count < needed_workers(policy, queue, pool) and count < policy.max_workers:
        assert decide(policy, queue, pool, NOW, may_scale_up=True).start >= 1


# 7
@settings(max_examples=300, deadline=None)
@given(cases())
def test_starting_workers_count_no_overshoot(case):
    policy, queue, pool, _ = case
    decision = decide(policy, queue, pool, NOW, may_scale_up=True)
    if decision.start == 0:
        return
    left = after(decision, policy, pool)
    assert len(left) <= min(policy.max_workers, max(policy.min_workers, needed_workers(policy, queue, pool)))
    # The next tick: the stuck workers gone, their requests back in the queue, the new workers starting.
    assert decide(policy, requeued(policy, queue, pool), left, NOW).start == 0


# 8
@settings(max_examples=300, deadline=None)
@given(cases())
def test_stuck_workers_replaced(case):
    policy, queue, pool, may_scale_up = case
    decision = decide(policy, queue, pool, NOW, may_scale_up=may_scale_up)
    stuck = {w.id for w in pool if stuck_reason(w, policy, NOW) is not None}
    assert stuck <= {stop.worker for stop in decision.stop}
    assert all(stop.reason in STUCK_REASONS for stop in decision.stop if stop.worker in stuck)
    # never counted as capacity: the decision starts as many as if they were already gone, their requests requeued
    rest = [w for w in pool if w.id not in stuck]
    assert decide(policy, requeued(policy, queue, pool), rest, NOW, may_scale_up=may_scale_up).start == decision.start


# 9
@settings(max_examples=300, deadline=None)
@given(cases())
def test_no_start_when_scale_up_refused(case):
    policy, queue, pool, _ = case
    assert decide(policy, queue, pool, NOW, may_scale_up=False).start == 0


# 10
@settings(max_examples=300, deadline=None)
@given(cases())
def test_holds_within_target(case):
    policy, queue, pool, may_scale_up = case
    alive = healthy(policy, pool)
    any_ready = any(w.phase is WorkerPhase.READY for w in alive)
    if any_ready and len(alive) >= policy.min_workers and queue_delay(queue, NOW) <= policy.target_queue_delay_s:
        assert decide(policy, queue, pool, NOW, may_scale_up=may_scale_up).start == 0


@settings(max_examples=200, deadline=None)
@given(cases())
def test_the_same_facts_give_the_same_decision(case):
    policy, queue, pool, may_scale_up = case
    forward = decide(policy, queue, pool, NOW, may_scale_up=may_scale_up)
    assert forward == decide(policy, queue, list(reversed(pool)), NOW, may_scale_up=may_scale_up)


# Worked examples


def ready(id: str, *, in_flight: int = 0, idle_since: float | None = None, since: float = NOW - 100) -> Worker:
    return Worker(id=id, phase=WorkerPhase.READY, since=since, in_flight=in_flight, last_seen=NOW, idle_since=idle_since)


POLICY = ScalingPolicy(min_workers=0, max_workers=4, idle_timeout_s=60, target_queue_delay_s=4, concurrency=2)


def test_a_burst_from_zero_starts_a_worker_per_concurrency_slots_at_once():
    decision = decide(POLICY, QueueView(waiting=5, oldest_waiting_since=NOW), [], NOW)
    assert decision.start == 3 and decision.stop == () and decision.desired == 3
    assert "no worker" in decision.why


def test_a_burst_arriving_while_its_first_worker_starts_is_held_at_once():
    """The shell ticks as the first request of a burst arrives, and the rest come while that worker starts: they are
    counted with it at the next tick, whatever the delay target, since no worker is taking any of them."""
    pool = [Worker(id="a", phase=WorkerPhase.STARTING, since=NOW - 1)]
    decision = decide(POLICY, QueueView(waiting=6, oldest_waiting_since=NOW - 1), pool, NOW)
    assert decision.start == 2 and "no worker ready" in decision.why  # 6 at 2 a worker: 3, of which 1 starts
    assert (
        decide(
            POLICY,
            QueueView(waiting=6, oldest_waiting_since=NOW - 1),
            [*pool, *(Worker(id=f"n{i}", phase=WorkerPhase.STARTING, since=NOW) for i in range(2))],
            NOW,
        ).start
        == 0
    )


def test_a_burst_past_max_workers_is_capped():
    decision = decide(POLICY, QueueView(waiting=50, oldest_waiting_since=NOW), [], NOW)
    assert decision.start == 4 and "max_workers 4" in decision.why


def test_a_queue_within_its_delay_target_adds_no_worker():
    decision = decide(POLICY, QueueView(waiting=6, oldest_waiting_since=NOW - 3), [ready("a", in_flight=2)], NOW)
    assert decision.start == 0 and "within target" in decision.why


def test_a_queue_past_its_delay_target_adds_workers_counting_the_starting_ones():
    pool = [ready("a", in_flight=2), Worker(id="b", phase=WorkerPhase.STARTING, since=NOW - 10)]
    decision = decide(POLICY, QueueView(waiting=4, oldest_waiting_since=NOW - 5), pool, NOW)
    assert decision.start == 1  # 6 requests at 2 a worker: 3, of which 2 exist (one still starting)
    assert "waited 5.0 s > target 4 s" in decision.why


def test_an_idle_worker_is_kept_until_its_idle_timeout_then_stopped():
    pool = [ready("a", idle_since=NOW - 59)]
    assert decide(POLICY, QueueView(), pool, NOW).stop == ()
    pool = [ready("a", idle_since=NOW - 60)]
    assert decide(POLICY, QueueView(), pool, NOW).stop == (Stop("a", StopReason.IDLE),)


def test_min_workers_are_kept_warm_however_idle():
    policy = msgspec.structs.replace(POLICY, min_workers=1)
    pool = [ready("a", idle_since=NOW - 1_000), ready("b", idle_since=NOW - 500)]
    assert decide(policy, QueueView(), pool, NOW).stop == (Stop("a", StopReason.IDLE),)  # the longest idle goes


def test_an_idle_worker_is_not_stopped_while_requests_wait():
    pool = [ready("a", idle_since=NOW - 1_000)]
    assert decide(POLICY, QueueView(waiting=1, oldest_waiting_since=NOW), pool, NOW).stop == ()


def test_a_busy_worker_is_never_stopped_for_a_lowered_max_but_an_idle_one_is():
    policy = msgspec.structs.replace(POLICY, max_workers=1)
    pool = [ready("a", in_flight=1), ready("b", in_flight=2), ready("c", idle_since=NOW)]
    decision = decide(policy, QueueView(), pool, NOW)
    assert decision.stop == (Stop("c", StopReason.ABOVE_MAX),) and decision.desired == 2


def test_stuck_workers_are_stopped_and_replaced_in_the_same_tick():
    pool = [
        Worker(id="pull", phase=WorkerPhase.STARTING, since=NOW - 601),
        Worker(id="mute", phase=WorkerPhase.READY, since=NOW - 100, in_flight=1, last_seen=NOW - 31),
        Worker(id="gone", phase=WorkerPhase.UNHEALTHY, since=NOW),
    ]
    decision = decide(POLICY, QueueView(waiting=2, oldest_waiting_since=NOW - 1), pool, NOW)
    assert {(s.worker, s.reason) for s in decision.stop} == {
        ("pull", StopReason.START_TIMEOUT),
        ("mute", StopReason.SILENT),
        ("gone", StopReason.UNHEALTHY),
    }
    assert decision.start == 2  # 2 waiting + 1 coming back from the silent worker, 2 a worker: no healthy one left


def test_a_spend_cap_stops_scale_up_but_not_the_stops():
    pool = [Worker(id="gone", phase=WorkerPhase.UNHEALTHY, since=NOW)]
    decision = decide(POLICY, QueueView(waiting=3, oldest_waiting_since=NOW), pool, NOW, may_scale_up=False)
    assert decision.start == 0 and decision.stop == (Stop("gone", StopReason.UNHEALTHY),)
    assert "scale-up refused" in decision.why


@pytest.mark.parametrize(
    "fields",
    [
        {"min_workers": 3, "max_workers": 2},
        {"min_workers": -1},
        {"concurrency": 0},
        {"idle_timeout_s": -1},
        {"heartbeat_timeout_s": 0},
    ],
)
def test_a_policy_that_cannot_hold_is_refused_when_made(fields):
    with pytest.raises(ValueError):
        ScalingPolicy(**fields)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert(fields, ScalingPolicy)


def test_needed_workers_rounds_up_every_request_held():
    assert needed_workers(POLICY, QueueView(waiting=3), [ready("a", in_flight=2)]) == math.ceil(5 / 2)

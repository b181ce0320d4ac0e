"""The pure alert evaluator: pending, firing and resolved with hysteresis, fed sample by sample as the loop does."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from management.monitoring.evaluator import FIRING, PENDING, RESOLVED, AlertState, Series, evaluate
from management.monitoring.rules import AlertRule

HOT = AlertRule(
    name="gpu_overheating", metric="gpu.temperature_c", op=">", threshold=85, for_s=120, clear_threshold=80, severity="critical"
)


def run(rule: AlertRule, values: list[float], *, sample_s: float, period_s: float, window: int = 1000):
    """Samples ``values`` one every ``sample_s`` from t=0; evaluations every ``period_s`` see the samples up to then.
    Returns every transition (phase, at)."""
    states: dict[tuple[str, str], AlertState] = {}
    transitions: list[tuple[str, float]] = []
    points = [(i * sample_s, v) for i, v in enumerate(values)]
    end = len(values) * sample_s
    now = period_s
    while now <= end + period_s:
        seen = tuple(p for p in points if p[0] <= now)[-window:]
        result = evaluate([rule], [Series(metric=rule.metric, subject="GPU-0", points=seen)], states, now)
        states = result.states
        transitions.extend((t.phase, t.at) for t in result.transitions)
        now += period_s
    return transitions, states


def test_a_breach_is_pending_then_fires_once_and_resolves_past_the_clear_threshold():
    series = lambda *pts: [Series(metric="gpu.temperature_c", subject="GPU-0", points=pts, labels={"provider": "p"})]  # noqa: E731
    first = evaluate([HOT], series((0, 90)), {}, 0)
    assert first.transitions == [] and first.states[("gpu_overheating", "GPU-0")].phase == PENDING
    second = evaluate([HOT], series((0, 90), (120, 91)), first.states, 120)
    [fired] = second.transitions
    assert (fired.phase, fired.since, fired.at, fired.labels) == (FIRING, 0, 120, {"provider": "p"})
    third = evaluate([HOT], series((0, 90), (120, 91), (130, 82)), second.states, 130)  # under 85, above 80: firing
    assert third.transitions == [] and third.states[("gpu_overheating", "GPU-0")].phase == FIRING
    fourth = evaluate([HOT], series((130, 82), (140, 79)), third.states, 140)
    [resolved] = fourth.transitions
    assert resolved.phase == RESOLVED and resolved.key != fired.key and resolved.fired_at == 120
    assert fourth.states == {}


def test_a_pending_alert_that_stops_breaching_is_dropped_unannounced():
    states = evaluate([HOT], [Series(metric=HOT.metric, subject="g", points=((0, 90),))], {}, 0).states
    after = evaluate([HOT], [Series(metric=HOT.metric, subject="g", points=((0, 90), (60, 70)))], states, 60)
    assert after.transitions == [] and after.states == {}


def test_a_firing_alert_whose_subject_is_no_longer_reported_resolves():
    at_once = msgspec.structs.replace(HOT, for_s=0)
    fired = evaluate([at_once], [Series(metric=HOT.metric, subject="g", points=((0, 90),))], {}, 0)
    gone = evaluate([HOT], [], fired.states, 10)
    [resolved] = gone.transitions
    assert resolved.phase == RESOLVED and resolved.value is None


def test_clear_for_s_holds_a_firing_alert_until_it_was_clear_that_long():
    rule = AlertRule(name="r", metric="m", op=">", threshold=10, clear_for_s=30)
    transitions, _ = run(rule, [20, 20, 0, 0, 20, 0, 0, 0, 0], sample_s=10, period_s=10)
    assert transitions == [(FIRING, 10.0), (RESOLVED, 80.0)]  # the dip at 20..30 was too short; 50..80 was not


@settings(max_examples=150, deadline=None)
@given(
    start=st.integers(min_value=0, max_value=40),
    for_s=st.integers(min_value=0, max_value=300),
    sample_s=st.sampled_from([1.0, 5.0, 10.0]),
    period_s=st.sampled_from([5.0, 10.0, 15.0, 30.0]),
)
def test_fires_after_the_duration_and_at_most_one_evaluation_period_late(start, for_s, sample_s, period_s):
    rule = AlertRule(name="r", metric="m", op=">", threshold=85, for_s=for_s)
    samples = int((start * sample_s + for_s + 3 * period_s) / sample_s) + 1
    values = [60.0 if i < start else 90.0 for i in range(samples)]
    onset = start * sample_s
    transitions, _ = run(rule, values, sample_s=sample_s, period_s=period_s)
    [(phase, at)] = transitions
    assert phase == FIRING
    assert onset + for_s <= at <= onset + for_s + period_s


@settings(max_examples=150, deadline=None)
@given(
    swings=st.lists(st.floats(min_value=80.5, max_value=95.0), min_size=5, max_size=120),
    period_s=st.sampled_from([5.0, 10.0, 20.0]),
)
def test_a_value_oscillating_within_the_hysteresis_fires_at_most_once_and_never_resolves(swings, period_s):
    rule = AlertRule(name="r", metric="m", op=">", threshold=85, for_s=10, clear_threshold=80)
    hot = [90.0] * (int((10 + period_s) / 5.0) + 2)  # long enough to fire whatever the period
    values = [*hot, *swings]  # then anywhere above the clear threshold, below or above the threshold
    transitions, states = run(rule, values, sample_s=5.0, period_s=period_s)
    assert [phase for phase, _ in transitions] == [FIRING]
    assert states[("r", "GPU-0")].phase == FIRING


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.sampled_from([70.0, 84.0, 86.0, 95.0]), min_size=1, max_size=200))
def test_never_two_firings_without_a_resolve_between(values):
    rule = AlertRule(name="r", metric="m", op=">", threshold=85, for_s=15, clear_threshold=80, clear_for_s=10)
    transitions, _ = run(rule, values, sample_s=5.0, period_s=10.0)
    phases = [phase for phase, _ in transitions]
    assert all(a != b for a, b in zip(phases, phases[1:], strict=False))
    assert not phases or phases[0] == FIRING


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.sampled_from([70.0, 90.0]), min_size=1, max_size=100))
def test_fires_exactly_when_a_run_of_breaching_samples_lasted_for_s(values):
    rule = AlertRule(name="r", metric="m", op=">", threshold=85, for_s=30)
    values = [*values, 70.0]  # ends cool: every run of hot samples is over
    longest = length = 0
    for v in values:
        length = length + 1 if v > 85 else 0
        longest = max(longest, length)
    transitions, _ = run(rule, values, sample_s=5.0, period_s=5.0)
    # a run of n hot samples 5 s apart lasted (n - 1) * 5 s before a cool sample replaced it
    assert bool(transitions) == ((longest - 1) * 5.0 >= 30)

"""The sparse observer (management/monitoring/observe.py): it keeps a telemetry point only when some rule could need
it and emits a series only for a subject that breaches or has a live alert, yet the alerts are exactly those of
the evaluator fed every point of every subject. A real Master (SQLite in tmp_path) holds the fleet; the samples are
handed to the Master's sample listeners as its ingestion does (the GPUs themselves cannot exist here)."""

from __future__ import annotations

import asyncio
import tracemalloc

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.alerts import seed_fleet
from common.inventory import GpuSample
from management.monitoring.alert_loop import AlertLoop, evaluate_in_slices
from management.monitoring.evaluator import FIRING, AlertState, AlertTransition, Evaluation, Point, Series, evaluate
from management.monitoring.observe import (
    FLEET_COMMAND_FAILURE,
    GPU_HARDWARE_ERROR,
    GPU_TEMPERATURE,
    GPU_TEMPERATURE_ANOMALY,
    PAYOUTS_UNRECONCILED,
    FleetObserver,
)
from management.monitoring.rules import AlertRule, load_rules
from master.changes import SamplesTaken
from master.config import MasterConfig
from master.master import Master
from master.records import GpuFault

PERIOD_S = 15.0
OVERHEATING = next(r for r in load_rules() if r.name == "gpu_overheating")  # > 85 for 120 s, clears < 80 for 60 s
COLD = AlertRule(name="gpu_cold", metric=GPU_TEMPERATURE, op="<", threshold=20, for_s=30, clear_threshold=25)
RULES = [OVERHEATING, COLD]
TEMPERATURES = (10.0, 22.0, 50.0, 79.0, 82.0, 86.0, 95.0)  # either side of every threshold and clear threshold
# Seconds into an evaluation period; 15.5: a sample stamped after the evaluation (seen by the next one). Samples of
# a GPU come in time order: a late one, stamped before one already heard, is the one case the observer judges
# differently (see observe.py), and the agents' telemetry is in order.
OFFSETS = (1.0, 6.0, 11.0, 15.5)


def hear(master: Master, agent_id: str, samples: list[GpuSample]) -> None:
    master.changes.publish(SamplesTaken(agent_id=agent_id, samples=samples))  # as the Master's telemetry intake does


def fingerprint(result: Evaluation) -> tuple[list[tuple], dict[tuple[str, str], tuple]]:
    def of(t: AlertTransition) -> tuple:
        return (t.rule, t.subject, t.phase, t.at, t.since, t.fired_at, t.value)

    states = {k: (s.phase, s.since, s.value, s.fired_at, s.clear_since) for k, s in result.states.items()}
    return sorted(of(t) for t in result.transitions), states


async def fleet(tmp_path, agents: int, gpus_per_agent: int) -> tuple[Master, list[str]]:
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    return master, await seed_fleet(master, agents, gpus_per_agent)


# One GPU's story: spells of one temperature, each some evaluation periods long, sampled at some offsets each period
# (none: the GPU is silent), so that alerts get the time to go pending, fire, ride out hysteresis and resolve.
spells = st.lists(
    st.tuples(st.sampled_from(TEMPERATURES), st.integers(1, 10), st.sets(st.sampled_from(range(len(OFFSETS))), max_size=3)),
    min_size=1,
    max_size=5,
)


def by_period(stories: list[list[tuple[float, int, set[int]]]]) -> list[list[dict[int, float]]]:
    """Per evaluation period, per GPU: its samples as {offset index: temperature}."""
    per_gpu = [[{o: t for o in offsets} for t, periods, offsets in story for _ in range(periods)] for story in stories]
    length = max(len(periods) for periods in per_gpu)
    return [[periods[n] if n < len(periods) else {} for periods in per_gpu] for n in range(length)]


async def test_the_sparse_observer_makes_the_same_transitions_as_the_evaluator_fed_every_point(tmp_path):
    master, uuids = await fleet(tmp_path, 1, 3)
    agent_id = master.registry.gpus[uuids[0]].agent_id
    try:

        @settings(max_examples=200, deadline=None)
        @given(stories=st.lists(spells, min_size=3, max_size=3))
        def same_alerts(stories: list[list[tuple[float, int, set[int]]]]) -> None:
            rounds = by_period(stories)
            observer = FleetObserver(master)
            observer.attach()
            try:
                everything: dict[str, list[Point]] = {uuid: [] for uuid in uuids}  # every point ever heard
                full_states: dict[tuple[str, str], AlertState] = {}
                sparse_states: dict[tuple[str, str], AlertState] = {}
                for number, per_gpu in enumerate(rounds):
                    start, now = number * PERIOD_S, (number + 1) * PERIOD_S
                    for uuid, samples in zip(uuids, per_gpu, strict=True):
                        heard = []
                        for offset, temperature in sorted(samples.items()):
                            ts = start + OFFSETS[offset]
                            heard.append(GpuSample(uuid=uuid, ts=ts, temperature_c=temperature, utilization_pct=50.0))
                            everything[uuid].append((ts, temperature))
                        hear(master, agent_id, heard)
                    full = evaluate(
                        RULES,
                        [Series(metric=GPU_TEMPERATURE, subject=u, points=tuple(p)) for u, p in everything.items() if p],
                        full_states,
                        now,
                    )
                    sparse = evaluate(RULES, observer.collect(RULES, now, sparse_states.keys()), sparse_states, now)
                    assert fingerprint(sparse) == fingerprint(full), f"evaluation {number + 1} of {rounds}"
                    full_states, sparse_states = full.states, sparse.states
            finally:
                observer.detach()

        same_alerts()
    finally:
        await master.stop()


async def test_eighty_thousand_quiet_gpus_yield_no_series_and_keep_no_points(tmp_path):
    master, uuids = await fleet(tmp_path, 10_000, 8)
    try:
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        observer = FleetObserver(master)
        # Every shipped rule but the anomaly's, whose baselines hold a few figures per GPU by design (their memory
        # is test_anomaly.py's matter): what is left must cost next to nothing for a quiet fleet.
        loop = AlertLoop(observer, [r for r in load_rules() if r.metric != GPU_TEMPERATURE_ANOMALY])
        observer.watch(loop.rules)
        observer.attach()
        for ts in (1.0, 2.0):  # two samples of every GPU, all cool and busy
            for start in range(0, len(uuids), 8):
                samples = [GpuSample(uuid=u, ts=ts, temperature_c=55.0, utilization_pct=60.0) for u in uuids[start : start + 8]]
                hear(master, master.registry.gpus[uuids[start]].agent_id, samples)
        assert observer.kept_points == 0
        series = observer.collect(loop.rules, 15.0, loop.states.keys())
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        assert [s.metric for s in series] == [FLEET_COMMAND_FAILURE, PAYOUTS_UNRECONCILED]  # the fleet-wide figures only
        grown_kib = sum(stat.size_diff for stat in after.compare_to(before, "filename")) / 1024
        assert grown_kib < 256, f"the observer of a quiet fleet grew {grown_kib:.0f} KiB"

        # One GPU turns faulty for an Xid: only it is reported for the hardware error rule.
        gpu = master.registry.gpus[uuids[123]]
        gpu.fault = GpuFault(kind="xid", reason="Xid 79", since=15.0, code=79)
        series = observer.collect(loop.rules, 30.0, loop.states.keys())
        assert [(s.metric, s.subject, s.points) for s in series if s.metric == GPU_HARDWARE_ERROR] == [
            (GPU_HARDWARE_ERROR, gpu.uuid, ((30.0, 1.0),))
        ]
    finally:
        await master.stop()


async def test_a_subject_with_a_live_alert_is_reported_even_when_it_breaches_nothing_nor_speaks(tmp_path):
    master, uuids = await fleet(tmp_path, 1, 2)
    agent_id = master.registry.gpus[uuids[0]].agent_id
    try:
        rule = msgspec.structs.replace(OVERHEATING, for_s=0.0, clear_for_s=0.0, fault=False)
        now = [100.0]
        loop = AlertLoop(FleetObserver(master), [rule], clock=lambda: now[0])
        loop.observer.attach()
        hear(master, agent_id, [GpuSample(uuid=uuids[0], ts=99.0, temperature_c=90.0, utilization_pct=50.0)])
        [fired] = await loop.step()
        assert fired.phase == FIRING
        now[0] += PERIOD_S  # silent: its last point stands, the alert stays
        assert await loop.step() == [] and [s.subject for s in loop.firing()] == [uuids[0]]
        hear(master, agent_id, [GpuSample(uuid=uuids[0], ts=now[0], temperature_c=82.0, utilization_pct=50.0)])
        now[0] += PERIOD_S  # between the thresholds: breaches nothing, still firing, still reported
        assert await loop.step() == [] and [s.subject for s in loop.firing()] == [uuids[0]]
        hear(master, agent_id, [GpuSample(uuid=uuids[0], ts=now[0], temperature_c=70.0, utilization_pct=50.0)])
        now[0] += PERIOD_S
        [resolved] = await loop.step()
        assert (resolved.phase, resolved.value) == ("resolved", 70.0)
        now[0] += PERIOD_S  # quiet again: nothing kept
        assert await loop.step() == [] and loop.observer.kept_points == 0
    finally:
        await master.stop()


async def test_a_rule_that_breaches_on_the_healthy_value_sees_every_gpu(tmp_path):
    master, uuids = await fleet(tmp_path, 2, 2)
    try:
        healthy = AlertRule(name="gpu_healthy", metric=GPU_HARDWARE_ERROR, op="==", threshold=0, severity="info")
        fired = await AlertLoop(FleetObserver(master), [healthy]).step()
        assert sorted(t.subject for t in fired) == sorted(uuids)
    finally:
        await master.stop()


series_lists = st.lists(
    st.tuples(
        st.sampled_from(["GPU-0", "GPU-1", "GPU-2", "GPU-3", "GPU-4"]),
        st.lists(st.sampled_from(TEMPERATURES), min_size=0, max_size=3),
    ),
    min_size=0,
    max_size=5,
    unique_by=lambda one: one[0],
)


@settings(max_examples=100, deadline=None)
@given(rounds=st.lists(series_lists, min_size=1, max_size=8), slice_size=st.integers(min_value=1, max_value=3))
def test_evaluating_in_slices_gives_what_one_evaluation_gives(rounds, slice_size):
    whole_states: dict[tuple[str, str], AlertState] = {}
    sliced_states: dict[tuple[str, str], AlertState] = {}
    for number, subjects in enumerate(rounds):
        now = (number + 1) * PERIOD_S
        series = [
            Series(metric=GPU_TEMPERATURE, subject=s, points=tuple((now - 10 + i, v) for i, v in enumerate(values)))
            for s, values in subjects
        ]
        rules = RULES if number % 3 != 2 else [COLD]  # a rule removed now and then: its alerts resolve
        whole = evaluate(rules, series, whole_states, now)
        sliced = asyncio.run(evaluate_in_slices(rules, series, sliced_states, now, slice_size=slice_size))
        assert fingerprint(sliced) == fingerprint(whole)
        whole_states, sliced_states = whole.states, sliced.states

"""Temperature anomalies (management/monitoring/anomaly.py): a GPU is compared with itself at the same utilization.
The baselines alone, then through the observer and the shipped rule on a real Master (SQLite in tmp_path), samples
handed to the Master's sample listeners (the GPUs, which cannot exist here, are the test's samples), and the memory
the baselines take for 80,000 GPUs."""

from __future__ import annotations

import random
import time
import tracemalloc

from bench.alerts import seed_fleet
from common.inventory import GpuSample
from management.monitoring.alert_loop import AlertLoop
from management.monitoring.anomaly import STD_FLOOR_C, WARM_UP, TemperatureBaselines, band_of
from management.monitoring.evaluator import FIRING
from management.monitoring.observe import FleetObserver
from management.monitoring.rules import load_rules
from master.changes import SamplesTaken
from master.config import MasterConfig
from master.master import Master

SAMPLE_S = 10.0


def test_a_band_judges_only_once_warm_and_scores_the_distance_in_its_own_spread():
    baselines = TemperatureBaselines()
    rng = random.Random(7)
    scores = [baselines.observe("GPU-0", 50.0, 60.0 + rng.uniform(-1, 1)) for _ in range(WARM_UP)]
    assert scores == [None] * WARM_UP  # warming up
    steady = baselines.observe("GPU-0", 55.0, 60.5)  # the same band (50-75 %)
    assert steady is not None and steady < 1
    hot = baselines.observe("GPU-0", 60.0, 75.0)
    assert hot is not None and hot > 4  # 15 °C over a band whose spread is about 1 °C (floored at STD_FLOOR_C)
    assert baselines.observe("GPU-0", 95.0, 80.0) is None  # the 75-100 % band has never been seen: no judgement
    mean, std, count = baselines.expected("GPU-0", 50.0) or (0.0, 0.0, 0)
    assert 59 < mean < 61 and std < STD_FLOOR_C and count == WARM_UP + 2
    assert [band_of(u) for u in (0.0, 24.9, 25.0, 74.9, 75.0, 100.0, 140.0, float("nan"))] == [0, 0, 1, 2, 3, 3, 3, 0]


def test_a_hot_spell_is_learned_slowly_so_it_stays_flagged():
    baselines = TemperatureBaselines()
    for _ in range(200):
        baselines.observe("GPU-0", 50.0, 60.0)
    spell = [baselines.observe("GPU-0", 50.0, 72.0) for _ in range(60)]  # ten minutes hot
    assert all(score is not None and score > 4 for score in spell)


def test_forgotten_gpus_free_their_slots_for_new_ones():
    baselines = TemperatureBaselines()
    for uuid in ("GPU-a", "GPU-b"):
        baselines.observe(uuid, 50.0, 60.0)
    assert baselines.forget_except({"GPU-b"}) == 1 and len(baselines) == 1
    baselines.observe("GPU-c", 50.0, 70.0)
    assert baselines.expected("GPU-a", 50.0) is None and baselines.expected("GPU-c", 50.0) == (70.0, 0.0, 1)
    assert len(baselines._count) == 2 * 4  # GPU-c took GPU-a's slot


async def test_a_gpu_hot_at_the_same_utilization_is_flagged_and_one_that_heats_because_it_works_harder_is_not(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        [steady_then_hot, busier] = await seed_fleet(master, 1, 2)
        agent_id = master.registry.gpus[steady_then_hot].agent_id
        [rule] = [r for r in load_rules() if r.name == "gpu_temperature_anomaly"]
        assert (rule.threshold, rule.for_s, rule.severity, rule.fault) == (4, 300, "warning", False)
        now = [time.time()]
        loop = AlertLoop(FleetObserver(master), [rule], clock=lambda: now[0])
        loop.observer.watch(loop.rules)
        loop.observer.attach()
        rng = random.Random(3)
        fired = []

        async def minutes(count: int, hot: tuple[float, float], busy: tuple[float, float]) -> None:
            """``count`` minutes of samples each SAMPLE_S: (utilization, temperature) of each GPU, give or take a
            degree; one evaluation every 30 s of it."""
            for _ in range(count * 6):
                now[0] += SAMPLE_S
                samples = [
                    GpuSample(uuid=uuid, ts=now[0], utilization_pct=util, temperature_c=temp + rng.uniform(-1, 1))
                    for uuid, (util, temp) in ((steady_then_hot, hot), (busier, busy))
                ]
                master.changes.publish(SamplesTaken(agent_id=agent_id, samples=samples))
                if round(now[0] / SAMPLE_S) % 3 == 0:  # every third sample
                    fired.extend(await loop.step())

        await minutes(24, hot=(50.0, 60.0), busy=(50.0, 62.0))  # both learn their figures at half load
        assert fired == [] and loop.observer.kept_points == 0  # normal: nothing kept, nothing flagged
        # Now the first runs 15 °C hotter at the same load; the second heats by 18 °C, working at full load (a band
        # it learns afresh: judged only once warm, against itself at that load).
        await minutes(10, hot=(50.0, 75.0), busy=(95.0, 80.0))
        assert [(t.subject, t.phase) for t in fired] == [(steady_then_hot, FIRING)]
        assert 300 <= fired[0].at - fired[0].since <= 300 + 30
        assert fired[0].value is not None and fired[0].value > 4
    finally:
        await master.stop()


def test_the_baselines_of_eighty_thousand_gpus_at_four_loads_take_under_nine_mib():
    uuids = [f"GPU-{i:05d}-3f0c-4a56-9e3b-{i:012d}" for i in range(80_000)]  # the registry holds these strings
    tracemalloc.start()
    try:
        baselines = TemperatureBaselines()
        for util in (10.0, 35.0, 60.0, 85.0):
            for uuid in uuids:
                baselines.observe(uuid, util, 60.0)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(baselines) == 80_000
    assert held < 9 * 1024 * 1024, f"{held / 1024 / 1024:.1f} MiB for 80,000 GPUs"

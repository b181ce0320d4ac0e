"""What the Master takes of a GPU sample (issue 22, D4, D5, D11): a date near now and figures a GPU can show; one
bad sample is set aside and never holds back the others, in the frame, in the fleet's figures or in a flush."""

from __future__ import annotations

import time

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from common.inventory import GpuSample
from common.wire import Error, Heartbeat, Telemetry
from master.config import MasterConfig
from master.master import Master
from master.store import SqliteStore
from master.telemetry import (
    GPU_COUNTER_MAX,
    GPU_TEMPERATURE_C,
    SampleWindow,
    SetAside,
    TelemetryAggregator,
    plausible_gpu,
)
from tests.master.linked import connect, gpus, relay, relay_link, to_agent

NOW = 1_800_000_000.0
WINDOW = SampleWindow(max_age_s=86400.0, max_ahead_s=600.0)
TOTAL_MIB = 81_559  # an H100 80GB


def judged(**figures: object) -> GpuSample | SetAside:
    return plausible_gpu(GpuSample(uuid="GPU-0", **{"ts": NOW, **figures}), TOTAL_MIB, NOW, WINDOW)  # type: ignore[arg-type]


def test_an_honest_sample_is_taken_as_it_is():
    honest = GpuSample(
        uuid="GPU-0", ts=NOW - 30, utilization_pct=97.5, memory_used_mib=TOTAL_MIB, temperature_c=71.0, power_w=690.0,
        clock_sm_mhz=1980, clock_mem_mhz=2619, ecc_corrected=3, xid_count=1,
    )  # fmt: skip
    assert plausible_gpu(honest, TOTAL_MIB, NOW, WINDOW) is honest


def test_a_sample_dated_far_from_now_is_set_aside():
    for ts in (-1e21, 0.0, NOW - 86401, NOW + 601, float("inf"), float("nan"), 1e300):
        verdict = judged(ts=ts)
        assert isinstance(verdict, SetAside) and verdict.figure == "ts", ts
    assert isinstance(judged(ts=NOW - 3600), GpuSample)  # a relay's buffer replayed an hour late is still taken


def test_utilization_outside_0_to_100_and_memory_beyond_the_gpus_are_set_aside():
    for utilization in (1e308, 100.01, -1.0, float("nan"), float("-inf")):
        verdict = judged(utilization_pct=utilization)
        assert isinstance(verdict, SetAside) and verdict.figure == "utilization_pct", utilization
    for memory in (2**62, TOTAL_MIB + 1, -1):
        verdict = judged(memory_used_mib=memory)
        assert isinstance(verdict, SetAside) and verdict.figure == "memory_used_mib", memory
    for counters in ({"ecc_uncorrected": GPU_COUNTER_MAX}, {"ecc_corrected": -1}, {"xid_count": 2**70}):
        verdict = judged(**counters)
        assert isinstance(verdict, SetAside) and verdict.figure == "counters", counters


def test_an_optional_reading_out_of_its_physical_range_is_taken_as_not_said():
    taken = judged(utilization_pct=40.0, temperature_c=1e300, power_w=-5.0, clock_sm_mhz=2**40, clock_mem_mhz=-1)
    assert isinstance(taken, GpuSample)
    assert (taken.utilization_pct, taken.temperature_c, taken.power_w, taken.clock_sm_mhz, taken.clock_mem_mhz) == (
        40.0, None, None, None, None,
    )  # fmt: skip


floats = st.floats(allow_nan=True, allow_infinity=True)


@given(
    ts=floats, utilization=floats, memory=st.integers(-(2**70), 2**70), temperature=st.none() | floats,
    power=st.none() | floats, counter=st.integers(-(2**70), 2**70),
)  # fmt: skip
def test_whatever_an_agent_sends_a_sample_taken_is_within_every_bound(ts, utilization, memory, temperature, power, counter):
    verdict = judged(
        ts=ts, utilization_pct=utilization, memory_used_mib=memory, temperature_c=temperature, power_w=power,
        ecc_uncorrected=counter,
    )  # fmt: skip
    if isinstance(verdict, SetAside):
        return
    assert NOW - WINDOW.max_age_s <= verdict.ts <= NOW + WINDOW.max_ahead_s
    assert 0 <= verdict.utilization_pct <= 100 and 0 <= verdict.memory_used_mib <= TOTAL_MIB
    assert 0 <= verdict.ecc_uncorrected < GPU_COUNTER_MAX
    low, high = GPU_TEMPERATURE_C
    assert verdict.temperature_c is None or low <= verdict.temperature_c <= high
    assert verdict.power_w is None or 0 <= verdict.power_w


async def test_one_bad_sample_of_a_frame_is_set_aside_and_the_others_are_taken_and_written_at_shutdown(tmp_path):
    master = Master(MasterConfig(state_dir=str(tmp_path), link_port=0))
    await master.start()
    try:
        link = relay_link()
        await connect(master, link, "agt-a", gpus(3))
        now = time.time()
        frame = Telemetry(
            ts=now,
            samples=[
                GpuSample(uuid="GPU-h100-0", ts=-1e21, utilization_pct=50.0),
                GpuSample(uuid="GPU-h100-1", ts=now, utilization_pct=1e308),
                GpuSample(uuid="GPU-h100-2", ts=now, utilization_pct=60.0, memory_used_mib=2048),
            ],
        )
        await relay(master, link, "agt-a", frame)
        assert sorted(master.telemetry.latest) == ["GPU-h100-2"]
        counted = {
            s.labels["figure"]: s.value
            for s in list(master.metrics.samples_set_aside.collect())[0].samples
            if s.name.endswith("_total")
        }
        assert counted == {"ts": 1.0, "utilization_pct": 1.0}
    finally:
        await master.stop()  # the shutdown flush: it raised OverflowError, and the honest minute was lost
    store = SqliteStore(str(tmp_path / "master.db"))
    await store.open()
    try:
        [rollup] = await store.rollups.list("GPU-h100-2")
        assert (rollup.samples, rollup.utilization_avg, rollup.memory_used_mib_max) == (1, 60.0, 2048)
        assert await store.rollups.list("GPU-h100-0") == []
    finally:
        await store.close()


async def test_a_rollup_the_store_refuses_is_set_aside_and_every_other_minute_is_written(tmp_path):
    """The last guard, behind the bounds: a minute the store cannot hold (a date beyond its integers) is set aside
    once, not retried at every flush ahead of the rest."""
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    try:
        telemetry = TelemetryAggregator(store)
        telemetry.ingest("agt-1", [GpuSample(uuid="GPU-bad", ts=-1e21), GpuSample(uuid="GPU-good", ts=NOW, utilization_pct=5.0)])
        assert await telemetry.flush(NOW, everything=True) == 1
        assert telemetry.set_aside == 1 and len(await store.rollups.list("GPU-good")) == 1
        telemetry.ingest("agt-1", [GpuSample(uuid="GPU-good", ts=NOW + 60, utilization_pct=6.0)])
        assert await telemetry.flush(NOW + 60, everything=True) == 1  # nothing of the bad one is left to retry
        assert telemetry.set_aside == 1 and len(await store.rollups.list("GPU-good")) == 2
    finally:
        await store.close()


async def test_a_heartbeat_dated_minus_1e21_leaves_the_fleets_transit_histogram_alone(master):
    link = relay_link()
    await connect(master, link, "agt-a", gpus(1))
    await relay(master, link, "agt-a", Heartbeat(seq=1, ts=-1e21))
    await relay(master, link, "agt-a", Heartbeat(seq=2, ts=float("-inf")))
    await relay(master, link, "agt-a", Heartbeat(seq=3, ts=time.time()))
    [family] = master.metrics.heartbeat_transit.collect()
    [count] = [s.value for s in family.samples if s.name.endswith("_count")]
    [total] = [s.value for s in family.samples if s.name.endswith("_sum")]
    assert count == 1 and 0 <= total < 60
    assert master.agent("agt-a").state == "ready"  # the heartbeats themselves are taken: the agent is heard


async def test_a_hello_stating_a_gpu_of_2_62_mib_is_refused_so_memory_use_stays_bounded_by_a_real_figure(master):
    link = relay_link()
    huge = msgspec.structs.replace(gpus(1)[0], memory_total_mib=2**62)
    await connect(master, link, "agt-a", [huge])
    [error] = to_agent(link, "agt-a")
    assert isinstance(error, Error) and error.code == "schema_violation" and "memory_total_mib" in error.message
    assert master.gpus() == []

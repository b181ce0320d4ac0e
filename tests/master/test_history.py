"""Telemetry history: rollups merged into hours (and a query's steps), and the Master's history loop that
downsamples finished hours and deletes what is past retention, against a real SQLite store."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from master.history import HistoryKeeper, downsample, downsample_host, hour_start, merge_host_rollups, merge_rollups
from master.records import HostRollup, TelemetryRollup
from master.store import SqliteStore

HOUR = 29_000_000 - 29_000_000 % 60  # a minute number that starts an hour
DAY_S = 86400.0


def rollup(minute: int, **overrides: Any) -> TelemetryRollup:
    fields: dict[str, Any] = dict(
        gpu_uuid="GPU-a",
        agent_id="agt-1",
        minute=minute,
        samples=6,
        utilization_avg=50.0,
        utilization_max=80.0,
        memory_used_mib_max=1000,
        memory_used_mib_avg=800.0,
        temperature_max=70.0,
        temperature_avg=60.0,
        power_avg_w=300.0,
        power_max_w=350.0,
        clock_sm_avg_mhz=1500.0,
    )
    return TelemetryRollup(**(fields | overrides))


def test_an_hour_weighs_each_minute_by_its_samples_and_keeps_the_highest_counters():
    busy = rollup(HOUR, samples=6, utilization_avg=90.0, xid_count=1, throttle_reasons=["sw_thermal"])
    quiet = rollup(HOUR + 1, samples=2, utilization_avg=10.0, temperature_max=None, temperature_avg=None, ecc_corrected=3)
    later = rollup(HOUR + 59, samples=4, utilization_avg=50.0, throttle_reasons=["gpu_idle"], agent_id="agt-2")

    hour = merge_rollups([quiet, later, busy], HOUR)

    assert (hour.minute, hour.minutes, hour.samples) == (HOUR, 3, 12)
    assert hour.utilization_avg == pytest.approx((90 * 6 + 10 * 2 + 50 * 4) / 12, abs=0.01)
    assert hour.temperature_avg == 60.0  # the minute without a temperature does not pull the average down
    assert (hour.xid_count, hour.ecc_corrected) == (1, 3)
    assert hour.throttle_reasons == ["gpu_idle", "sw_thermal"]
    assert hour.agent_id == "agt-2"  # where the GPU reported last


def test_merging_nothing_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        merge_rollups([], HOUR)


def test_downsampling_leaves_empty_steps_out_and_a_lone_aligned_rollup_as_it_is():
    minutes = [rollup(HOUR + m) for m in (0, 1, 2, 14, 15, 44)]
    quarters = downsample(minutes, 15)
    assert [(q.minute, q.minutes) for q in quarters] == [(HOUR, 4), (HOUR + 15, 1), (HOUR + 30, 1)]
    assert quarters[1] is minutes[4]  # nothing to merge
    assert downsample(minutes, 1) == minutes
    assert downsample([], 60) == []
    with pytest.raises(ValueError, match="step_minutes"):
        downsample(minutes, 0)


rollups = st.builds(
    rollup,
    minute=st.integers(HOUR, HOUR + 600),
    samples=st.integers(1, 12),
    utilization_avg=st.floats(0, 100),
    utilization_max=st.floats(0, 100),
    temperature_avg=st.none() | st.floats(20, 100),
    xid_count=st.integers(0, 5),
    throttle_reasons=st.lists(st.sampled_from(["gpu_idle", "sw_thermal", "hw_slowdown"]), unique=True),
)


@given(st.lists(rollups, min_size=1, max_size=40), st.integers(1, 120))
def test_downsampling_keeps_every_sample_counter_and_reason_and_averages_within_the_minutes(minutes, step):
    minutes = sorted(minutes, key=lambda r: r.minute)
    buckets = downsample(minutes, step)

    assert sum(b.samples for b in buckets) == sum(m.samples for m in minutes)
    assert sum(b.minutes for b in buckets) == len(minutes)
    assert [b.minute for b in buckets] == sorted({m.minute - m.minute % step for m in minutes})
    for bucket in buckets:
        inside = [m for m in minutes if bucket.minute <= m.minute < bucket.minute + step]
        averages = [m.utilization_avg for m in inside]
        assert min(averages) - 0.01 <= bucket.utilization_avg <= max(averages) + 0.01
        assert bucket.xid_count == max(m.xid_count for m in inside)
        assert set(bucket.throttle_reasons) == {reason for m in inside for reason in m.throttle_reasons}


@given(st.lists(rollups, min_size=1, max_size=40))
def test_an_hour_made_of_quarter_hours_is_the_hour_made_of_its_minutes(minutes):
    minutes = sorted(minutes, key=lambda r: r.minute)
    direct = downsample(minutes, 60)
    twice = downsample(downsample(minutes, 15), 60)
    assert [(h.minute, h.samples, h.minutes, h.xid_count) for h in twice] == [
        (h.minute, h.samples, h.minutes, h.xid_count) for h in direct
    ]
    for a, b in zip(direct, twice):
        assert a.utilization_avg == pytest.approx(b.utilization_avg, abs=0.05)  # each merge rounds to 0.01


# --- the history loop, on a real SQLite store ----------------------------------------------------------------


@pytest.fixture
async def store(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    yield store
    await store.close()


def keeper(store: SqliteStore, uuids: list[str], **overrides: Any) -> HistoryKeeper:
    settings: dict[str, Any] = dict(minute_retention_s=7 * DAY_S, hourly_retention_s=90 * DAY_S, duty=1.0)
    return HistoryKeeper(store, lambda: uuids, **(settings | overrides))


async def test_the_loop_downsamples_each_finished_hour_once_and_not_the_open_one(store):
    await store.rollups.put_many([rollup(HOUR + m) for m in range(0, 60, 10)])  # a finished hour: 6 minutes
    await store.rollups.put_many([rollup(HOUR + 60 + m, gpu_uuid="GPU-b") for m in range(3)])  # the next, still open
    history = keeper(store, ["GPU-a", "GPU-b"])
    now = (HOUR + 60 + 5) * 60.0

    assert await history.step(now) == {"hours": 1, "hourly_rollups": 1, "deleted": 0}
    [hour] = await store.hourly_rollups.list("GPU-a")
    assert (hour.minute, hour.minutes, hour.samples) == (HOUR, 6, 36)
    assert await store.hourly_rollups.list("GPU-b") == []
    assert (await history.step(now))["hours"] == 0  # done already

    later = (HOUR + 120 + 1) * 60.0  # the second hour is over now
    assert await history.step(later) == {"hours": 1, "hourly_rollups": 1, "deleted": 0}
    [hour_b] = await store.hourly_rollups.list("GPU-b")
    assert (hour_b.minute, hour_b.minutes) == (HOUR + 60, 3)


async def test_a_restarted_master_downsamples_the_hour_before_the_current_one_again_harmlessly(store):
    await store.rollups.put_many([rollup(HOUR + m) for m in range(5)])
    now = (HOUR + 61) * 60.0
    await keeper(store, ["GPU-a"]).step(now)
    await store.rollups.put_many([rollup(HOUR + 5)])  # a late minute, flushed by the stopping Master
    await keeper(store, ["GPU-a"]).step(now)  # a new process
    [hour] = await store.hourly_rollups.list("GPU-a")
    assert hour.minutes == 6


async def test_retention_deletes_minutes_after_a_week_and_hours_after_ninety_days(store):
    now = (HOUR + 100 * 24 * 60) * 60.0
    now_minute = int(now // 60)
    week_ago, quarter_ago = now_minute - 7 * 24 * 60, now_minute - 90 * 24 * 60
    await store.rollups.put_many([rollup(week_ago - 1), rollup(week_ago + 1)])
    await store.hourly_rollups.put_many([rollup(hour_start(quarter_ago) - 60), rollup(hour_start(quarter_ago) + 60)])

    done = await keeper(store, ["GPU-a"]).step(now)

    assert [r.minute for r in await store.rollups.list("GPU-a")] == [week_ago + 1]
    assert [r.minute for r in await store.hourly_rollups.list("GPU-a")] == [hour_start(quarter_ago) + 60]
    assert done["deleted"] == 2


async def test_retention_is_configurable(store):
    now = (HOUR + 600) * 60.0
    await store.rollups.put_many([rollup(HOUR + 600 - 90), rollup(HOUR + 600 - 30)])
    await keeper(store, ["GPU-a"], minute_retention_s=3600.0).step(now)
    assert [r.minute for r in await store.rollups.list("GPU-a")] == [HOUR + 570]


async def test_retention_runs_once_an_hour_with_the_downsampling_not_at_every_step(store):
    history = keeper(store, ["GPU-a"], minute_retention_s=3600.0)
    now = (HOUR + 600) * 60.0
    await history.step(now)
    await store.rollups.put_many([rollup(HOUR)])  # long past the hour's retention, written after the pass
    assert (await history.step(now + 300))["deleted"] == 0
    assert (await history.step(now + 3600))["deleted"] == 1  # the next hour's pass


def test_a_rollup_stored_before_the_history_fields_decodes_as_one_minute_without_them():
    old = b'{"gpu_uuid":"GPU-a","agent_id":"agt-1","minute":60,"samples":6,"utilization_avg":1.0,"utilization_max":2.0,'
    old += b'"memory_used_mib_max":3,"temperature_max":null,"power_avg_w":null,"ecc_uncorrected":0}'
    decoded = msgspec.json.decode(old, type=TelemetryRollup)
    assert (decoded.minutes, decoded.xid_count, decoded.throttle_reasons, decoded.clock_sm_avg_mhz) == (1, 0, [], None)


# --- a host's own history (HostRollup) -----------------------------------------------------------------------------


def host_rollup(minute: int, **overrides: Any) -> HostRollup:
    fields: dict[str, Any] = dict(
        agent_id="agt-1",
        minute=minute,
        samples=6,
        cpu_pct_avg=50.0,
        cpu_pct_max=80.0,
        load_1m_avg=2.0,
        ram_used_mib_avg=4000.0,
        ram_used_mib_max=5000,
        ram_total_mib=65536,
        disk_used_gib=100.0,
        disk_free_gib_min=900.0,
        net_rx_bytes=6_000,
        net_tx_bytes=600,
    )
    return HostRollup(**(fields | overrides))


def test_a_host_hour_weighs_averages_by_samples_adds_up_the_bytes_and_keeps_the_extremes_and_the_latest_total():
    busy = host_rollup(HOUR, samples=6, cpu_pct_avg=90.0, cpu_pct_max=100.0, disk_free_gib_min=850.0, ram_total_mib=32768)
    quiet = host_rollup(HOUR + 1, samples=2, cpu_pct_avg=10.0, load_1m_avg=None, net_rx_bytes=None, disk_used_gib=120.0)
    later = host_rollup(HOUR + 59, samples=4, ram_used_mib_max=7000, ram_total_mib=131072)

    hour = merge_host_rollups([later, quiet, busy], HOUR)

    assert (hour.minute, hour.minutes, hour.samples, hour.agent_id) == (HOUR, 3, 12, "agt-1")
    assert hour.cpu_pct_avg == pytest.approx((90 * 6 + 10 * 2 + 50 * 4) / 12, abs=0.01)
    assert (hour.cpu_pct_max, hour.load_1m_avg) == (100.0, 2.0)  # the minute without a load does not pull it down
    assert (hour.ram_used_mib_max, hour.ram_total_mib) == (7000, 131072)  # the total is the latest minute's
    assert (hour.disk_used_gib, hour.disk_free_gib_min) == (120.0, 850.0)
    assert (hour.net_rx_bytes, hour.net_tx_bytes) == (12_000, 1_800)  # a minute without counters adds nothing
    with pytest.raises(ValueError, match="at least one"):
        merge_host_rollups([], HOUR)


def test_a_host_hour_of_minutes_without_readings_says_none_not_zero():
    blank = HostRollup(agent_id="agt-1", minute=HOUR, samples=1)
    hour = merge_host_rollups([blank, HostRollup(agent_id="agt-1", minute=HOUR + 1, samples=1)], HOUR)
    assert (hour.cpu_pct_avg, hour.ram_used_mib_max, hour.disk_free_gib_min, hour.net_rx_bytes) == (None, None, None, None)


def test_a_hosts_rollups_downsample_into_steps_as_a_gpus_do():
    minutes = [host_rollup(HOUR + m) for m in (0, 1, 2, 14, 15, 44)]
    quarters = downsample_host(minutes, 15)
    assert [(q.minute, q.minutes, q.net_rx_bytes) for q in quarters] == [
        (HOUR, 4, 24_000),
        (HOUR + 15, 1, 6_000),
        (HOUR + 30, 1, 6_000),
    ]
    assert downsample_host(minutes, 1) == minutes


async def test_the_loop_downsamples_a_hosts_finished_hour_and_applies_the_retentions_to_its_rollups(store):
    await store.host_rollups.put_many([host_rollup(HOUR + m) for m in range(0, 60, 10)])  # a finished hour: 6 minutes
    await store.host_rollups.put_many([host_rollup(HOUR + 60 + m) for m in range(3)])  # the next, still open
    history = keeper(store, [], agent_ids=lambda: ["agt-1", "agt-quiet"])

    assert await history.step((HOUR + 65) * 60.0) == {"hours": 1, "hourly_rollups": 1, "deleted": 0}
    [hour] = await store.host_hourly_rollups.list("agt-1")
    assert (hour.minute, hour.minutes, hour.samples, hour.net_rx_bytes) == (HOUR, 6, 36, 36_000)
    assert await store.host_hourly_rollups.list("agt-quiet") == []

    # A day on, with the minutes kept an hour and the hours a day: the first hour's minutes and its hour go.
    history.minute_retention_s, history.hourly_retention_s = 3600.0, DAY_S
    done = await history.step((HOUR + 24 * 60 + 61) * 60.0)
    assert await store.host_rollups.list("agt-1") == []
    assert [h.minute for h in await store.host_hourly_rollups.list("agt-1")] == [HOUR + 60]
    assert done["deleted"] == 6 + 3 + 1

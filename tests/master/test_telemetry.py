"""Telemetry: the latest sample per GPU in memory; finished minutes persisted as rollups."""

import time

import pytest

from common.inventory import GpuSample, HostSample
from common.wire import Telemetry
from master.store import SqliteStore
from master.telemetry import TelemetryAggregator
from tests.master.linked import connect, relay, relay_link

MINUTE = 29_000_000 * 60  # a whole minute, in seconds


def sample(uuid: str, ts: float, util: float, temp: float = 50.0, power: float = 200.0) -> GpuSample:
    return GpuSample(uuid=uuid, ts=ts, utilization_pct=util, memory_used_mib=int(util * 10), temperature_c=temp, power_w=power)


async def test_latest_sample_is_kept_and_finished_minutes_are_rolled_up(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 1, 10, temp=40), sample("GPU-b", MINUTE + 2, 90)])
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 30, 30, temp=70, power=300)])
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 61, 50)])  # the next minute, still open
    assert telemetry.latest["GPU-a"].utilization_pct == 50

    assert await telemetry.flush(MINUTE + 65) == 2  # only the finished minute, for both GPUs
    [rollup] = await store.rollups.list("GPU-a")
    assert (rollup.minute, rollup.samples, rollup.utilization_avg, rollup.utilization_max) == (MINUTE // 60, 2, 20.0, 30)
    assert (rollup.temperature_max, rollup.power_avg_w, rollup.memory_used_mib_max) == (70, 250.0, 300)

    assert await telemetry.flush(MINUTE + 65, everything=True) == 1  # shutdown writes the open minute too
    assert len(await store.rollups.list("GPU-a")) == 2
    await store.close()


async def test_a_minute_rolls_up_the_history_fields_of_its_samples(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    hot = GpuSample(
        uuid="GPU-a", ts=MINUTE + 1, utilization_pct=90, memory_used_mib=300, temperature_c=88, power_w=600,
        clock_sm_mhz=1500, clock_mem_mhz=2619, ecc_corrected=2, xid_count=1, throttle_reasons=("sw_thermal",),
    )  # fmt: skip
    idle = GpuSample(
        uuid="GPU-a", ts=MINUTE + 31, utilization_pct=0, memory_used_mib=100, temperature_c=None, power_w=100,
        clock_sm_mhz=500, clock_mem_mhz=None, ecc_corrected=1, xid_count=1, throttle_reasons=("gpu_idle",),
    )  # fmt: skip
    telemetry.ingest("agt-1", [hot, idle])
    await telemetry.flush(MINUTE + 61)

    [rollup] = await store.rollups.list("GPU-a")
    assert (rollup.memory_used_mib_avg, rollup.temperature_avg, rollup.power_max_w) == (200.0, 88.0, 600.0)
    assert (rollup.clock_sm_avg_mhz, rollup.clock_mem_avg_mhz) == (1000.0, 2619.0)  # averaged over the samples that say
    assert (rollup.ecc_corrected, rollup.xid_count, rollup.minutes) == (2, 1, 1)
    assert rollup.throttle_reasons == ["gpu_idle", "sw_thermal"]
    await store.close()


async def test_rollups_a_failed_flush_did_not_write_are_written_by_the_next(tmp_path, monkeypatch):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    telemetry.ingest("agt-1", [sample(f"GPU-{i}", MINUTE + 1, 10) for i in range(1200)])
    real_put_many, calls = store.rollups.put_many, []

    async def failing_second_batch(batch):
        calls.append(len(batch))
        if len(calls) == 2:
            raise OSError("disk full")  # the store fails mid-flush, after one batch went in
        await real_put_many(batch)

    monkeypatch.setattr(store.rollups, "put_many", failing_second_batch)
    with pytest.raises(OSError, match="disk full"):
        await telemetry.flush(MINUTE + 65, duty=1.0)
    assert len([r for i in range(1200) for r in await store.rollups.list(f"GPU-{i}")]) == calls[0]
    assert await telemetry.flush(MINUTE + 65, duty=1.0) == 1200 - calls[0]  # the rest, nothing twice
    assert [len(await store.rollups.list(f"GPU-{i}")) for i in range(1200)] == [1] * 1200
    await store.close()


async def test_a_minute_ended_by_a_later_sample_and_a_late_sample_of_it_are_both_written(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 10, 10)])
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 70, 70)])  # the next minute: the first one has ended
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 20, 30)])  # late, out of order: still counted for its minute
    assert telemetry.latest["GPU-a"].utilization_pct == 30  # the latest to arrive

    assert await telemetry.flush(MINUTE + 125) == 2
    first, second = await store.rollups.list("GPU-a")
    assert (first.minute, first.samples, first.utilization_avg) == (MINUTE // 60, 2, 20.0)
    assert (second.minute, second.samples, second.utilization_avg) == (MINUTE // 60 + 1, 1, 70.0)
    await store.close()


def test_recent_samples_are_kept_only_for_watched_hosts_and_stay_bounded():
    telemetry = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # the rings never touch the store
    recent = telemetry.recent
    recent.per_gpu, recent.max_agents, recent.watch_s = 3, 2, 100.0
    telemetry.ingest("agt-1", [sample("GPU-a", 1, 10)])
    assert recent.of("agt-1") == {}  # nobody watches it: only the latest sample is kept

    recent.watch("agt-1", now=1000, latest=[telemetry.latest["GPU-a"]])
    for ts in (2, 3, 4, 5):
        telemetry.ingest("agt-1", [sample("GPU-a", ts, ts * 10), sample("GPU-b", ts, 0)])
    telemetry.ingest("agt-1", [sample("GPU-a", 4, 99)])  # a late sample is not charted again
    assert [s.ts for s in recent.of("agt-1")["GPU-a"]] == [3, 4, 5]  # the ring holds the last three
    assert [s.ts for s in recent.of("agt-1")["GPU-b"]] == [3, 4, 5]

    recent.watch("agt-2", now=1001)
    recent.watch("agt-3", now=1002)  # a third host: the least recently watched one's rings go
    assert recent.watched == ["agt-2", "agt-3"] and recent.of("agt-1") == {}

    recent.watch("agt-3", now=1102)  # agt-2 was last watched more than watch_s ago
    assert recent.watched == ["agt-3"]


def test_a_hosts_latest_sample_of_itself_is_kept_and_an_older_one_does_not_replace_it(tmp_path):
    telemetry = TelemetryAggregator(SqliteStore(str(tmp_path / "m.db")))  # the store is not touched
    telemetry.ingest_host("agt-1", HostSample(ts=200.0, cpu_pct=50.0))
    telemetry.ingest_host("agt-1", HostSample(ts=100.0, cpu_pct=10.0))  # late
    telemetry.ingest_host("agt-2", HostSample(ts=150.0, ram_used_mib=1024))
    assert telemetry.latest_hosts["agt-1"].cpu_pct == 50.0
    assert telemetry.latest_hosts["agt-2"].ram_used_mib == 1024


async def test_a_telemetry_frame_through_a_relay_link_keeps_its_hosts_sample_and_its_gpus_samples(master):
    link = relay_link()
    await connect(master, link, "agt-a")
    host = HostSample(ts=time.time(), cpu_pct=33.0, disk_free_gib=120.5)
    gpu = GpuSample(uuid="GPU-h100-0", ts=time.time(), utilization_pct=80.0, throttle_reasons=("sw_power_cap",))
    await relay(master, link, "agt-a", Telemetry(ts=time.time(), samples=[gpu], host=host))
    assert master.telemetry.latest_hosts["agt-a"] == host
    assert master.telemetry.latest["GPU-h100-0"].throttle_reasons == ("sw_power_cap",)

"""Telemetry: the latest sample per GPU in memory; finished minutes persisted as rollups."""

import asyncio
import gc
import sys
import time
import tracemalloc

import msgspec
import pytest

from common.inventory import THROTTLE_REASONS, GpuSample, HostSample
from common.wire import Telemetry
from master.batches import BATCH
from master.store import SqliteStore
from master.telemetry import NET_STEP_MAX_S, TelemetryAggregator, _Minute, counter_step, kept_sample
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


# --- a host's own readings, rolled up by the minute (HostRollup) ---------------------------------------------------


def host_sample(ts: float, cpu: float | None = 20.0, rx: int | None = None, tx: int | None = None, **fields) -> HostSample:
    defaults = dict(load_1m=1.5, ram_used_mib=4096, ram_total_mib=65536, disk_used_gib=100.0, disk_free_gib=900.0)
    return HostSample(ts=ts, cpu_pct=cpu, net_rx_bytes=rx, net_tx_bytes=tx, **(defaults | fields))


@pytest.fixture
async def store(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    yield store
    await store.close()


async def test_a_minute_of_a_hosts_samples_is_one_host_rollup_with_the_bytes_its_counters_moved(store):
    telemetry = TelemetryAggregator(store)
    telemetry.ingest_host("agt-1", host_sample(MINUTE - 10, cpu=99.0, rx=1_000, tx=500))  # the minute before
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 5, cpu=10.0, rx=4_000, tx=600, ram_used_mib=1000, disk_free_gib=800.0))
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 25, cpu=30.0, rx=10_000, tx=700, ram_used_mib=3000, load_1m=None))
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 45, cpu=None, rx=10_500, tx=900, ram_total_mib=32768))
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 65, rx=11_000, tx=1_000))  # the next minute, still open

    assert await telemetry.flush(MINUTE + 70) == 2  # the minute before and this one; no GPU had samples
    before, this = await store.host_rollups.list("agt-1")
    assert (before.minute, before.samples, before.net_rx_bytes) == (MINUTE // 60 - 1, 1, None)  # no step to count yet
    assert (this.minute, this.samples, this.minutes) == (MINUTE // 60, 3, 1)
    assert (this.cpu_pct_avg, this.cpu_pct_max) == (20.0, 30.0)  # over the samples that said
    assert this.load_1m_avg == 1.5
    assert (this.ram_used_mib_avg, this.ram_used_mib_max, this.ram_total_mib) == (2698.67, 4096, 32768)  # total: the latest
    assert (this.disk_used_gib, this.disk_free_gib_min) == (100.0, 800.0)
    assert (this.net_rx_bytes, this.net_tx_bytes) == (9_500, 400)  # 3,000 + 6,000 + 500; 100 + 100 + 200
    assert await store.rollups.list("agt-1") == []  # kept apart from the GPUs'


async def test_a_counter_that_goes_backwards_counts_nothing_for_that_step_and_a_long_gap_is_not_placed(store):
    telemetry = TelemetryAggregator(store)
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 1, rx=50_000, tx=50_000))
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 11, rx=100, tx=51_000))  # the host rebooted: rx starts again
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 21, rx=400, tx=None))  # tx not read this time
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 21 + NET_STEP_MAX_S + 1, rx=10**9, tx=10**9))  # away too long
    await telemetry.flush(MINUTE + 3600, everything=True)

    first, *_, last = await store.host_rollups.list("agt-1")
    assert (first.net_rx_bytes, first.net_tx_bytes) == (300, 1_000)  # 0 for the reboot's step, then 300
    assert (last.net_rx_bytes, last.net_tx_bytes) == (None, None)
    assert counter_step(10, 5, 1.0) == 0 and counter_step(None, 5, 1.0) is None and counter_step(5, 10, 1.0) == 5


async def test_a_late_host_sample_counts_for_its_minute_without_counters_and_a_repeated_one_not_at_all(store):
    telemetry = TelemetryAggregator(store)
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 10, cpu=10.0, rx=1_000))
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 70, cpu=70.0, rx=2_000))  # the next minute: the first has ended
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 20, cpu=30.0, rx=1_500))  # late, out of order
    telemetry.ingest_host("agt-1", host_sample(MINUTE + 70, cpu=70.0, rx=2_000))  # the same frame again
    assert telemetry.latest_hosts["agt-1"].ts == MINUTE + 70  # a late sample is not the latest

    assert await telemetry.flush(MINUTE + 125) == 2
    first, second = await store.host_rollups.list("agt-1")
    assert (first.samples, first.cpu_pct_avg, first.net_rx_bytes) == (2, 20.0, None)
    assert (second.samples, second.cpu_pct_avg, second.net_rx_bytes) == (1, 70.0, 1_000)


async def test_host_rollups_a_failed_flush_did_not_write_are_written_by_the_next(store, monkeypatch):
    telemetry = TelemetryAggregator(store)
    for i in range(3):
        telemetry.ingest_host(f"agt-{i}", host_sample(MINUTE + 1))
    real_put_many = store.host_rollups.put_many

    async def failing(batch):
        raise OSError("disk full")

    monkeypatch.setattr(store.host_rollups, "put_many", failing)
    with pytest.raises(OSError, match="disk full"):
        await telemetry.flush(MINUTE + 65, duty=1.0)
    monkeypatch.setattr(store.host_rollups, "put_many", real_put_many)
    assert await telemetry.flush(MINUTE + 65, duty=1.0) == 3
    assert [len(await store.host_rollups.list(f"agt-{i}")) for i in range(3)] == [1, 1, 1]


def test_a_hosts_open_minute_costs_a_few_hundred_bytes_so_a_10000_host_fleet_a_few_megabytes():
    telemetry = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # nothing is flushed
    ids = [f"agt-{i:05d}" for i in range(10_000)]
    for agent_id in ids:
        telemetry.latest_hosts[agent_id] = host_sample(MINUTE, rx=10**12, tx=10**12)  # kept before history was
    later = [host_sample(MINUTE + 10, cpu=i % 100 + 0.5, rx=10**12 + i, tx=10**12 + 2 * i) for i in range(10_000)]
    tracemalloc.start()
    try:
        for agent_id, sample_ in zip(ids, later, strict=True):
            telemetry.ingest_host(agent_id, sample_)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(telemetry._host_open) == 10_000
    assert held / 10_000 < 512  # measured: about 365 bytes per host (the minute, its numbers, its dict entry)


async def test_a_hosts_readings_out_of_bounds_are_taken_as_not_said_and_every_other_minute_is_still_written(store):
    """A host is untrusted: one rollup the store refused would hold every host's minutes back at each flush."""
    telemetry = TelemetryAggregator(store)
    telemetry.ingest_host("agt-bad", host_sample(MINUTE + 1, cpu=1e300, rx=2**70, tx=5, ram_used_mib=-1, load_1m=1e13))
    telemetry.ingest_host("agt-bad", host_sample(MINUTE + 11, cpu=50.0, rx=10, tx=5 + 10**14))  # 100 TB in 10 s
    telemetry.ingest_host("agt-bad", host_sample(1e300, cpu=1.0))  # dated beyond any minute the store can key
    telemetry.ingest_host("agt-good", host_sample(MINUTE + 1, cpu=10.0))

    assert await telemetry.flush(MINUTE + 65) == 2
    [bad] = await store.host_rollups.list("agt-bad")
    assert (bad.samples, bad.cpu_pct_avg, bad.load_1m_avg, bad.ram_used_mib_max) == (2, 50.0, 1.5, 4096)
    assert (bad.net_rx_bytes, bad.net_tx_bytes) == (None, None)  # the huge counter unsaid; the step too fast to be real
    assert telemetry.latest_hosts["agt-bad"].ts == MINUTE + 11
    assert [r.cpu_pct_avg for r in await store.host_rollups.list("agt-good")] == [10.0]


def test_a_gpus_latest_sample_and_open_minute_cost_a_few_hundred_bytes_so_80000_gpus_tens_of_megabytes():
    """Each GPU's latest sample and open minute are the Master's largest per-GPU state (with an ended one at a flush)."""
    telemetry = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # nothing is flushed here
    first = [frame_sample(i, MINUTE + 20 + i % 30, ("sw_power_cap",) if i % 2 else ()) for i in range(10_000)]
    tracemalloc.start()
    try:
        for one in first:
            telemetry.ingest("agt-1", [one])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(telemetry.latest) == 10_000
    # measured: 397 bytes per GPU (its struct, its array of figures, its dict entry); before they were packed together,
    # 349 for the open minute alone and a latest sample besides (about 300 as decoded); 573 for the minute with a float
    # attribute per figure
    assert held / 10_000 < 500


async def test_a_minute_without_temperature_power_clocks_or_throttling_says_none_not_zero(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    telemetry.ingest("agt-1", [GpuSample(uuid="GPU-bare", ts=MINUTE + 1, utilization_pct=30.0, memory_used_mib=5)])
    await telemetry.flush(MINUTE + 61)
    [rollup] = await store.rollups.list("GPU-bare")
    assert (rollup.temperature_max, rollup.temperature_avg, rollup.power_avg_w, rollup.power_max_w) == (None,) * 4
    assert (rollup.clock_sm_avg_mhz, rollup.clock_mem_avg_mhz, rollup.throttle_reasons) == (None, None, [])
    assert (rollup.utilization_max, rollup.memory_used_mib_max, rollup.ecc_uncorrected) == (30.0, 5, 0)
    await store.close()


async def test_the_rollups_of_a_minute_whose_telemetry_was_paced_or_shed_are_marked_thinner(tmp_path):
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    telemetry.note_thinning(MINUTE + 5, factor=1.0, shed=False)  # all well: nothing to mark
    assert telemetry.thin_minutes == {}
    telemetry.note_thinning(MINUTE + 10, factor=1.0, shed=True)  # shed before the pace changed
    telemetry.note_thinning(MINUTE + 20, factor=4.0, shed=True)  # then agents told to report 4x less often
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 1, 10), sample("GPU-a", MINUTE + 61, 20)])
    telemetry.ingest("agt-1", [sample("GPU-a", MINUTE + 121, 30)])
    assert await telemetry.flush(MINUTE + 125) == 2
    thin, usual = await store.rollups.list("GPU-a")
    assert (thin.minute, thin.thinned) == (MINUTE // 60, 4.0)
    assert (usual.minute, usual.thinned) == (MINUTE // 60 + 1, 1.0)
    await store.close()


async def test_a_minutes_rollups_are_spread_over_the_flush_window_and_written_at_once_on_shutdown(tmp_path, monkeypatch):
    """A minute of 1,200 GPUs and 150 hosts, flushed with a spread of 30 s: its batches rest in between and the
    rests come to about 30 s (the clock is a fake that moves only with rests, so this is the pacing's arithmetic, not
    a timing); the minutes already written are let go meanwhile. On shutdown nothing rests."""
    rests: list[float] = []
    live: list[int] = []  # the flushed minute's GPUs still held in memory at each rest

    held: list[_Minute] = []  # the minute's GPUs' minutes: still referenced elsewhere while the flush holds them

    real_sleep, flushing = asyncio.sleep, asyncio.current_task()

    async def rest(seconds: float) -> None:
        if asyncio.current_task() is not flushing:  # asyncio.sleep is patched for every task: the store's own loops
            await real_sleep(seconds)  # (its checkpoints every 0.5 s, master/store/sqlite/database.py) rest as usual
            return
        rests.append(seconds)
        # referenced by more than ``held``, the loop's name and the argument: still held by the flush
        live.append(sum(1 for minute in held if sys.getrefcount(minute) > 3))

    monkeypatch.setattr("master.batches.asyncio.sleep", rest)
    monkeypatch.setattr("master.batches.time.monotonic", lambda: sum(rests))
    store = SqliteStore(str(tmp_path / "m.db"))
    await store.open()
    telemetry = TelemetryAggregator(store)
    for host in range(150):
        telemetry.ingest(f"agt-{host}", [sample(f"GPU-{host}-{i}", MINUTE + 1, 10) for i in range(8)])
        telemetry.ingest_host(f"agt-{host}", host_sample(MINUTE + 1))
    for host in range(150):  # the minute ended: it waits for the flush
        telemetry.ingest(f"agt-{host}", [sample(f"GPU-{host}-{i}", MINUTE + 61, 10) for i in range(8)])
    held.extend(minute for ended_then in telemetry._ended.values() for minute in ended_then.values())
    assert await telemetry.flush(MINUTE + 65, spread_s=30.0) == 1200 + 150
    gpu_batches, host_batches = -(-1200 // BATCH), -(-150 // BATCH)
    assert len(rests) == gpu_batches - 1 + host_batches - 1  # a rest between batches, none after the last
    # writes take no time on this clock: the rests are the window, and the hosts' rollups rest their share of it
    assert sum(rests) == pytest.approx(30.0 + (30.0 * 150 / 1200 if host_batches > 1 else 0.0))
    # each batch's minutes are let go as it is written, not when the half minute is over
    assert live == [1200 - BATCH * n for n in range(1, gpu_batches)] + [0] * (host_batches - 1)
    assert len(await store.rollups.list("GPU-149-7")) == 1 and len(await store.host_rollups.list("agt-149")) == 1

    rests.clear()
    telemetry.ingest("agt-1", [sample(f"GPU-1-{i}", MINUTE + 70, 10) for i in range(8)])
    for host in range(150, 300):
        telemetry.ingest(f"agt-{host}", [sample(f"GPU-{host}-{i}", MINUTE + 70, 10) for i in range(8)])
    assert await telemetry.flush(MINUTE + 75, everything=True, spread_s=30.0) >= 1208
    assert rests == []  # shutdown: everything at once
    await store.close()


def frame_sample(i: int, ts: float, reasons: tuple[str, ...] = ()) -> GpuSample:
    """A sample as a frame decodes it: its UUID and reasons are strings of its own, equal to every earlier frame's."""
    return msgspec.json.decode(
        msgspec.json.encode(GpuSample(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", ts=ts, throttle_reasons=reasons)),
        type=GpuSample,
    )


def test_every_minute_of_a_gpu_holds_its_first_uuid_string_and_reasons_are_shared_strings():
    telemetry = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # nothing is flushed here
    first, later, late = (
        frame_sample(7, MINUTE + 5, ("sw_power_cap",)),
        frame_sample(7, MINUTE + 65),
        frame_sample(7, MINUTE + 50),
    )
    telemetry.ingest("agt-1", [first])
    telemetry.ingest("agt-1", [later, late])  # a later minute, then a late sample of the one it ended
    telemetry.ingest(
        "agt-1", [frame_sample(7, MINUTE + 70, ("hw_slowdown", "sw_power_cap")), frame_sample(7, MINUTE + 80, ("sw_power_cap",))]
    )
    open_ = telemetry._gpus[first.uuid]
    ended = telemetry._ended[MINUTE // 60][first.uuid]
    assert open_.uuid is ended.uuid is first.uuid and later.uuid is not first.uuid
    assert telemetry.latest[first.uuid].uuid is first.uuid
    assert int(ended.v[ended.at]) == 2  # the first sample and the late one
    assert ended.throttle_reasons == ("sw_power_cap",) and ended.throttle_reasons[0] is THROTTLE_REASONS[2]
    assert open_.minute_reasons == ("hw_slowdown", "sw_power_cap")  # merged, sorted, once each


def test_a_kept_sample_is_the_sample_as_sent_naming_its_gpu_by_the_registrys_string_with_shared_reasons():
    registry_uuid = "GPU-00000007-0000-0000-0000-000000000000"  # the registry's string, from the host's hello
    sent = frame_sample(7, MINUTE + 5, ("sw_power_cap", "hw_slowdown"))
    kept = kept_sample(sent, registry_uuid)
    again = kept_sample(frame_sample(7, MINUTE + 15, ("sw_power_cap", "hw_slowdown")), registry_uuid)

    assert kept == sent and kept.uuid is registry_uuid and sent.uuid is not registry_uuid
    assert kept.throttle_reasons == ("sw_power_cap", "hw_slowdown")  # in the agent's order
    assert kept.throttle_reasons is again.throttle_reasons
    assert kept.throttle_reasons[0] is THROTTLE_REASONS[THROTTLE_REASONS.index("sw_power_cap")]
    assert kept_sample(frame_sample(7, MINUTE + 25), registry_uuid).throttle_reasons == ()


def test_the_latest_sample_read_back_is_the_sample_kept_whatever_it_said_or_left_unsaid():
    telemetry = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # nothing is flushed here
    full = GpuSample(
        uuid="GPU-a", ts=MINUTE + 1.25, utilization_pct=97.5, memory_used_mib=81_000, temperature_c=-0.0, power_w=699.9,
        clock_sm_mhz=1980, ecc_corrected=3, ecc_uncorrected=2**53, clock_mem_mhz=2619, xid_count=7,
        throttle_reasons=("sw_power_cap", "hw_slowdown"),
    )  # fmt: skip
    bare = GpuSample(uuid="GPU-b", ts=MINUTE + 2)
    # figures no double holds as themselves (never from the Master, which takes plausible samples only): kept whole
    odd = GpuSample(uuid="GPU-c", ts=MINUTE + 3, temperature_c=float("nan"), ecc_corrected=2**60 + 1)
    telemetry.ingest("agt-1", [full, bare, odd])

    assert telemetry.latest["GPU-a"] == full and telemetry.latest.get("GPU-b") == bare
    assert telemetry.latest["GPU-c"] is odd
    assert telemetry.latest["GPU-a"].throttle_reasons is full.throttle_reasons
    assert (type(telemetry.latest["GPU-a"].memory_used_mib), telemetry.latest["GPU-b"].power_w) == (int, None)
    assert telemetry.latest.get("GPU-z") is None and "GPU-z" not in telemetry.latest and "GPU-a" in telemetry.latest
    assert sorted(telemetry.latest) == ["GPU-a", "GPU-b", "GPU-c"] and len(telemetry.latest) == 3

    # the fleet's figures read two figures of every GPU without making its sample: the same as the sample's
    for uuid in ("GPU-a", "GPU-b", "GPU-c"):
        sample = telemetry.latest[uuid]
        assert telemetry.usage(uuid) == telemetry.latest.usage(uuid) == (sample.utilization_pct, sample.memory_used_mib)
    assert type(telemetry.usage("GPU-a")[1]) is int and telemetry.usage("GPU-z") is None  # type: ignore[index]

    telemetry.ingest("agt-1", [msgspec.structs.replace(bare, uuid="GPU-c", ts=MINUTE + 4)])  # a usual one again
    assert telemetry.latest["GPU-c"] == msgspec.structs.replace(bare, uuid="GPU-c", ts=MINUTE + 4)


def test_a_gpus_ended_and_open_minutes_and_latest_sample_cost_about_a_kilobyte_with_frames_own_strings():
    """What a flush finds: each GPU's ended minute, its open one and its latest sample, from frames that each decoded
    their own UUID and reasons (the Master's case). Measured: 1,387 bytes a GPU with a UUID string and a set of reasons
    per minute and a tuple and a number per ended entry; 1,010 then (874 in a later run); 346 with the latest sample and
    the open minute packed in one array (the frames' own UUID strings and reasons are no longer kept in a sample)."""
    telemetry = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # nothing is flushed here
    gpus = 10_000

    def frames(minute: int) -> list[GpuSample]:
        return [frame_sample(i, MINUTE + 30 + 60 * minute, ("sw_power_cap",) if i % 2 else ()) for i in range(gpus)]

    for one in frames(0):
        telemetry.ingest("agt-1", [one])  # the minute before, and a latest sample per GPU, exist before
    tracemalloc.start()
    try:
        for minute in (1, 2):
            for one in frames(minute):
                telemetry.ingest("agt-1", [one])
            if minute == 1:
                telemetry._ended.clear()  # written by a flush: what stays is the minute ended by the next one
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(telemetry.latest) == gpus and len(telemetry._ended[MINUTE // 60 + 1]) == gpus
    assert held / gpus < 600


def test_a_minute_named_the_same_reasons_holds_the_very_tuple_each_kept_sample_names():
    """What makes adding a sample's reasons to its minute a single identity test (master/telemetry.py
    ``_merged_reasons``): a kept sample's reasons and its minute's are one shared tuple."""
    agg = TelemetryAggregator(store=None)  # type: ignore[arg-type]  # nothing flushed here
    now = 28_000_000 * 60.0
    decoded = [
        msgspec.json.decode(
            msgspec.json.encode(GpuSample(uuid="GPU-a", ts=now + i, utilization_pct=1.0, throttle_reasons=("gpu_idle",))),
            type=GpuSample,
        )
        for i in range(3)
    ]
    kept = [kept_sample(s, "GPU-a") for s in decoded]
    assert decoded[0].throttle_reasons is not decoded[1].throttle_reasons  # each frame decodes a tuple of its own
    agg.ingest("agt-a", kept)
    minute = agg._gpus["GPU-a"].minute_reasons
    assert minute == ("gpu_idle",)
    assert all(s.throttle_reasons is minute for s in kept)

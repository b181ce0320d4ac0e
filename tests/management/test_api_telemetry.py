"""GET /api/v1/{gpus,agents,workloads}/{id}/telemetry on the real API and a real Master (SQLite): samples go through
the Master's aggregator into one-minute rollups, the history loop makes hours of them, and the API answers them at
the step asked, to whoever owns them (a provider its hosts' GPUs, a renter its workloads')."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from common.inventory import GpuSample, HostSample
from management.store import rental_repo
from management.views.telemetry import TelemetryView
from master.records import RentalHost, RentalRecord
from tests.management.hosts import add_agent, api_key

HOUR_S = 3600.0
# A whole hour three hours ago: its minutes are well inside the one-minute retention, and it is over.
T0 = (time.time() // HOUR_S - 3) * HOUR_S


def sample(uuid: str, ts: float, util: float, **fields: Any) -> GpuSample:
    return GpuSample(uuid=uuid, ts=ts, utilization_pct=util, memory_used_mib=1000, temperature_c=60.0, power_w=300.0, **fields)


async def fleet(api) -> tuple[str, str]:
    """Host agt-acme (provider acme, two GPUs) and agt-other (provider other): ten minutes of telemetry on agt-acme's
    first GPU at T0, each minute two samples (util 10 and 30), an Xid counted from minute 5 on."""
    await add_agent(api.master, "agt-acme", "a10:2", provider="acme", runtime="simulated", isolation="container")
    await add_agent(api.master, "agt-other", "a10:1", provider="other", runtime="simulated", isolation="container")
    first, second = (g.uuid for g in api.master.gpus("agt-acme"))
    for minute in range(10):
        xids = 1 if minute >= 5 else 0
        api.master.telemetry.ingest(
            "agt-acme",
            [sample(first, T0 + minute * 60 + 5, 10, xid_count=xids), sample(first, T0 + minute * 60 + 35, 30, xid_count=xids)],
        )
    await api.master.telemetry.flush(T0 + HOUR_S, everything=True)
    return first, second


async def get(api, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    response = await api.get(path, headers=headers)
    return response.status, await response.json()


async def test_a_gpus_minutes_come_back_one_point_each_and_its_step_merges_them(api):
    first, _ = await fleet(api)
    status, body = await get(api, f"/api/v1/gpus/{first}/telemetry?from={T0:.0f}&to={T0 + 600:.0f}&step=60", api.auth)
    assert status == 200, body
    msgspec.convert(body, TelemetryView)  # the answer is what the OpenAPI document says
    [series] = body["series"]
    assert (body["subject"], body["id"], body["step_s"], body["resolution_s"]) == ("gpu", first, 60, 60)
    assert [(p["samples"], p["utilization_avg"], p["utilization_max"]) for p in series["points"]] == [(2, 20.0, 30.0)] * 10
    assert [p["xid_count"] for p in series["points"]] == [0] * 5 + [1] * 5

    status, body = await get(api, f"/api/v1/gpus/{first}/telemetry?from={T0:.0f}&to={T0 + 600:.0f}&step=300", api.auth)
    assert [(p["minutes"], p["samples"], p["xid_count"]) for p in body["series"][0]["points"]] == [(5, 10, 0), (5, 10, 1)]


async def test_an_hourly_step_reads_the_hours_the_history_loop_made_and_the_minutes_not_downsampled_yet(api):
    first, _ = await fleet(api)
    window = f"from={T0:.0f}&to={T0 + 2 * HOUR_S:.0f}&step=3600"
    _, before = await get(api, f"/api/v1/gpus/{first}/telemetry?{window}", api.auth)  # no hour made yet: from minutes
    api.master.history.done_until = None
    await api.master.history.step(T0 + HOUR_S + 60)  # the hour at T0 is over: downsampled
    assert len(await api.master.store.hourly_rollups.list(first)) == 1
    await api.master.store.rollups.delete_before([first], int(T0 // 60) + 60)  # the minutes gone: only the hour is left

    _, after = await get(api, f"/api/v1/gpus/{first}/telemetry?{window}", api.auth)
    assert after["resolution_s"] == 3600
    assert [(p["minutes"], p["samples"], p["utilization_avg"]) for p in after["series"][0]["points"]] == [(10, 20, 20.0)]
    assert after["series"] == before["series"]


async def test_a_host_answers_a_series_per_gpu_and_a_gpu_without_data_has_no_points(api):
    first, second = await fleet(api)
    status, body = await get(api, f"/api/v1/agents/agt-acme/telemetry?from={T0:.0f}&to={T0 + 600:.0f}", api.auth)
    assert status == 200, body
    msgspec.convert(body, TelemetryView)
    assert [(s["gpu_uuid"], len(s["points"])) for s in body["series"]] == [(first, 10), (second, 0)]
    assert body["step_s"] == 60  # ten minutes: the finest step is the default
    assert body["host"] is None  # the host has not reported itself

    api.master.telemetry.ingest_host("agt-acme", HostSample(ts=T0 + 30, cpu_pct=12.5, ram_used_mib=2048, net_rx_bytes=10))
    _, body = await get(api, f"/api/v1/agents/agt-acme/telemetry?from={T0:.0f}&to={T0 + 600:.0f}", api.auth)
    msgspec.convert(body, TelemetryView)
    assert (body["host"]["cpu_pct"], body["host"]["ram_used_mib"], body["host"]["load_1m"]) == (12.5, 2048, None)


async def test_a_provider_sees_its_own_hosts_history_only_and_a_renter_no_gpus(api):
    first, _ = await fleet(api)
    acme, other = await api_key(api.master, "provider", "acme"), await api_key(api.master, "provider", "other")
    renter = await api_key(api.master, "renter", "alice")
    assert (await get(api, f"/api/v1/gpus/{first}/telemetry", acme))[0] == 200
    assert (await get(api, "/api/v1/agents/agt-acme/telemetry", acme))[0] == 200
    status, body = await get(api, f"/api/v1/gpus/{first}/telemetry", other)
    assert status == 404 and first in body["error"]["message"]  # as if it did not exist
    assert (await get(api, "/api/v1/agents/agt-acme/telemetry", other))[0] == 404
    assert (await get(api, f"/api/v1/gpus/{first}/telemetry", renter))[0] == 403


async def test_a_workload_answers_its_gpus_over_its_runs_to_its_renter_only(api):
    first, _ = await fleet(api)
    alice, bob = await api_key(api.master, "renter", "alice"), await api_key(api.master, "renter", "bob")
    spec = {"name": "train", "image": "busybox", "replica": {"gpus": 1}}
    created = await api.post("/api/v1/workloads", json=spec, headers=alice)
    assert created.status == 201, await created.text()
    workload_id = (await created.json())["id"]
    host = RentalHost(agent_id="agt-acme", provider="acme", gpus=1, price=0, units=[first])
    run = RentalRecord(  # a run from minute 2 to minute 6 of the telemetry
        id=f"{workload_id}-a1", workload_id=workload_id, account="alice", kind="on_demand", hosts=[host],
        started_at=T0 + 120, ended_at=T0 + 360,
    )  # fmt: skip
    assert await rental_repo(api.master.store).insert(run)

    status, body = await get(api, f"/api/v1/workloads/{workload_id}/telemetry?from={T0:.0f}&to={T0 + 600:.0f}", alice)
    assert status == 200, body
    msgspec.convert(body, TelemetryView)
    [series] = body["series"]
    assert (series["gpu_uuid"], series["unit"], series["agent_id"]) == (first, first, "agt-acme")
    assert len(series["points"]) == 4
    assert series["points"][0]["ts"] == series["since"]  # cut to the run: minutes 2 to 5 of the ten
    assert series["until"] is not None
    assert (await get(api, f"/api/v1/workloads/{workload_id}/telemetry", bob))[0] == 404
    provider = await api_key(api.master, "provider", "acme")
    assert (await get(api, f"/api/v1/workloads/{workload_id}/telemetry", provider))[0] == 403


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("step=90", "step"),
        ("step=30", "step"),
        ("from=2000&to=1000", "from"),
        ("from=0&to=6048000&step=60", "step"),  # ten weeks at one minute: too many points
        ("from=abc", "from"),
        ("colour=red", "colour"),
        ("to=1e12", "to"),
    ],
)
async def test_a_bad_window_is_a_400_naming_the_parameter(api, query, says):
    first, _ = await fleet(api)
    status, body = await get(api, f"/api/v1/gpus/{first}/telemetry?{query}", api.auth)
    assert status == 400, body
    assert says in body["error"]["message"]


async def test_an_unknown_gpu_host_or_workload_is_a_404(api):
    for path in ("/api/v1/gpus/GPU-nowhere", "/api/v1/agents/agt-nowhere", "/api/v1/workloads/wl-nowhere"):
        status, body = await get(api, f"{path}/telemetry", api.auth)
        assert status == 404, (path, body)


# --- a host's own history: CPU, memory, disk, network ---------------------------------------------------------------


def reading(ts: float, cpu: float, rx: int, tx: int) -> HostSample:
    return HostSample(
        ts=ts, cpu_pct=cpu, load_1m=2.0, ram_used_mib=4096, ram_total_mib=65536, disk_used_gib=100.0, disk_free_gib=900.0,
        net_rx_bytes=rx, net_tx_bytes=tx,
    )  # fmt: skip


async def host_readings(api) -> None:
    """agt-acme reports itself for two minutes from T0, every 20 s: CPU 10 then 30 in turn; 6,000 bytes in and 1,200
    out per step (each minute's first step counts from the minute before)."""
    await fleet(api)
    for step in range(6):
        cpu = 10.0 if step % 2 == 0 else 30.0
        api.master.telemetry.ingest_host("agt-acme", reading(T0 + 20 * step, cpu, 1_000_000 + 6_000 * step, 1_200 * step))
    await api.master.telemetry.flush(T0 + HOUR_S, everything=True)


async def test_a_host_answers_its_own_readings_per_minute_beside_its_gpus_series(api):
    await host_readings(api)
    status, body = await get(api, f"/api/v1/agents/agt-acme/telemetry?from={T0:.0f}&to={T0 + 120:.0f}&step=60", api.auth)
    assert status == 200, body
    msgspec.convert(body, TelemetryView)  # the answer is what the OpenAPI document says
    first, second = body["host_points"]
    assert (first["minutes"], first["samples"], first["cpu_pct_avg"], first["cpu_pct_max"]) == (1, 3, 16.67, 30.0)
    assert (first["ram_used_mib_avg"], first["ram_total_mib"], first["disk_free_gib_min"]) == (4096.0, 65536, 900.0)
    assert (first["net_rx_bytes_per_s"], first["net_tx_bytes_per_s"]) == (200.0, 40.0)  # two steps: 12,000 B in 60 s
    assert (second["samples"], second["cpu_pct_avg"]) == (3, 23.33)
    assert (second["net_rx_bytes_per_s"], second["net_tx_bytes_per_s"]) == (300.0, 60.0)  # three steps
    assert second["ts"] > first["ts"]
    assert [len(s["points"]) for s in body["series"]] == [2, 0]  # the GPUs' series as before
    assert body["host"]["cpu_pct"] == 30.0  # and the latest reading


async def test_a_hosts_hourly_step_merges_its_minutes_and_reads_the_hour_the_history_loop_made(api):
    await host_readings(api)
    window = f"from={T0:.0f}&to={T0 + 2 * HOUR_S:.0f}&step=3600"
    _, before = await get(api, f"/api/v1/agents/agt-acme/telemetry?{window}", api.auth)  # from the minutes
    api.master.history.done_until = None
    await api.master.history.step(T0 + HOUR_S + 60)  # the hour at T0 is over: downsampled, the host's too
    assert len(await api.master.store.host_hourly_rollups.list("agt-acme")) == 1
    await api.master.store.host_rollups.delete_before(["agt-acme"], int(T0 // 60) + 60)  # only the hour left

    status, after = await get(api, f"/api/v1/agents/agt-acme/telemetry?{window}", api.auth)
    assert status == 200, after
    msgspec.convert(after, TelemetryView)
    [hour] = after["host_points"]
    assert (hour["minutes"], hour["samples"], hour["cpu_pct_avg"]) == (2, 6, 20.0)
    assert hour["net_rx_bytes_per_s"] == 250.0  # 30,000 B over the two minutes with data
    assert after["host_points"] == before["host_points"]


async def test_a_gpu_or_workload_answer_has_no_host_points(api):
    first, _ = await fleet(api)
    _, body = await get(api, f"/api/v1/gpus/{first}/telemetry?from={T0:.0f}&to={T0 + 600:.0f}", api.auth)
    assert body["host_points"] is None
    _, body = await get(api, f"/api/v1/agents/agt-other/telemetry?from={T0:.0f}&to={T0 + 600:.0f}", api.auth)
    assert body["host_points"] == []  # a host that never reported itself: no points, not zeros


@pytest.mark.parametrize(("query", "says"), [("step=90", "step"), ("from=2000&to=1000", "from"), ("to=x", "to")])
async def test_a_bad_window_for_a_host_is_a_400_naming_the_parameter(api, query, says):
    await host_readings(api)
    status, body = await get(api, f"/api/v1/agents/agt-acme/telemetry?{query}", api.auth)
    assert status == 400, body
    assert says in body["error"]["message"]


async def test_a_providers_host_history_is_its_own(api):
    await host_readings(api)
    acme, other = await api_key(api.master, "provider", "acme"), await api_key(api.master, "provider", "other")
    status, body = await get(api, f"/api/v1/agents/agt-acme/telemetry?from={T0:.0f}&to={T0 + 120:.0f}", acme)
    assert status == 200 and len(body["host_points"]) == 2
    assert (await get(api, "/api/v1/agents/agt-acme/telemetry", other))[0] == 404


async def test_a_window_from_the_epoch_says_so_rather_than_null(api):
    """Found by schemathesis: ``from=1.5`` aligns down to 0, and the answer's ``from`` was null, not a time."""
    first, _ = await fleet(api)
    status, body = await get(api, f"/api/v1/gpus/{first}/telemetry?from=1.5&to={T0 + 600:.0f}&step=1800000", api.auth)
    assert status == 200, body
    msgspec.convert(body, TelemetryView)
    assert body["from"] == "1970-01-01T00:00:00.000Z"

"""Issue 22, what the Master trusts from an agent, on real processes: a Master and a relay, an honest provider's real
agent (simulated GPUs: no GPU here), and a hostile provider's agent played by this test, which holds a real enrolled
certificate and sends the relay frames it crafts.

- D3: the hostile hello names the honest host's GPU UUIDs (any renter of a card can read them). The honest host keeps
  its GPUs, unflagged, as offered as before, across the hostile agent leaving, being revoked and a Master restart;
  only the hostile host shows the claim, flagged; an operator's repair settles it (not 409).
- D4, D5: one sample dated -1e21 is set aside: the API lists agents and GPUs (no 500), the shutdown flush writes
  the honest host's minutes, and what was set aside is counted.
- D11: utilization 1e308 and memory 2**62 from the hostile host do not reach the fleet's gauges for a group that holds
  the honest host's GPUs.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sqlite3
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import ClientConnection, connect

from agent.simulate import SimulatedCollector
from common.inventory import GpuInfo, GpuSample, HostInfo, Inventory
from common.wire import AgentEvent, AgentEventKind, Hello, Telemetry, encode
from tests.e2e.test_identity import context_for, keep_pair
from tests.support.grid import Grid, running_grid, wait_for

FAST_TELEMETRY = {"telemetry_s": 1.0}  # the honest agent's samples arrive within a second
# The honest agent runs the process runtime sandboxed, a uid per container (isolation "sandbox"), which this grid's operator
# allows to be offered, as the demo does: its GPUs are offered, and must stay so.
OFFERED = {"offer_sandboxed_hosts": True}
SANDBOXED = {"IDLEGRID_AGENT_PROCESS_USER": "dynamic"}
HOSTILE_PROVIDER = "hostile-provider"


def enroll_hostile(grid: Grid, tmp_path: Path) -> tuple[str, Path]:
    """Enroll an agent of another provider and keep its key and certificate; no daemon of it runs."""
    done = grid.enroll("hostile", grid.relays["relay-1"], token=grid.join_token(HOSTILE_PROVIDER))
    assert done.returncode == 0, done.stderr
    return grid.agent_id("hostile"), keep_pair(grid, "hostile", tmp_path / "hostile-pair")


@asynccontextmanager
async def hostile_link(
    grid: Grid, pair: Path, gpus: list[GpuInfo], host: HostInfo, region: str
) -> AsyncIterator[ClientConnection]:
    """The hostile agent connected through the relay with ``gpus`` in its hello, welcomed."""
    hello = Hello(versions=[1], agent_version="0", inventory=Inventory(host=host, gpus=gpus), region=region)
    async with connect(grid.relays["relay-1"].agent_url, ssl=context_for(pair), open_timeout=5) as ws:
        await ws.send(encode(hello).decode())
        deadline = time.monotonic() + 15
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=max(0.1, deadline - time.monotonic())))
            if frame["type"] == "welcome":
                break
            assert frame["type"] != "error", frame
        yield ws


async def taken(grid: Grid, ws: ClientConnection, agent_id: str, marker: str, telemetry: Callable[[], bool]) -> None:
    """Wait until the Master has handled what was sent on ``ws`` so far: frames of one lane are handled in order, so
    once a report sent after them is recorded, they were handled (whatever the code made of them). Telemetry is the
    exception: the relay folds it into one frame per interval, which can reach the Master after a later report, so
    what the Master made of it is waited for by ``telemetry`` (its expected outcome, bounded like the report)."""
    await ws.send(encode(AgentEvent(kind=AgentEventKind.GPU_THROTTLED, ts=time.time(), message=marker)).decode())
    path = f"/api/v1/events?subject={agent_id}&kind=agent_report.gpu_throttled&limit=1000"
    await asyncio.to_thread(
        wait_for, lambda: any(e["data"].get("message") == marker for e in grid.get(path)["items"]), 15, f"report {marker}"
    )
    await asyncio.to_thread(wait_for, telemetry, 15, f"the telemetry sent before {marker}")


def honest_gpus(grid: Grid, agent_id: str) -> list[tuple[str, str, list[str], bool]]:
    return [(g["uuid"], g["state"], g["flags"], g["offered"]) for g in grid.agent(agent_id)["gpus"]]


def master_metrics(grid: Grid) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{grid.api_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def set_aside(grid: Grid, figure: str) -> float:
    return sum(
        v for labels, v in master_metrics(grid).get("idlegrid_gpu_samples_set_aside_total", []) if labels["figure"] == figure
    )


async def test_a_hostile_hello_naming_another_providers_gpus_takes_nothing_from_them(tmp_path):
    with running_grid(tmp_path, OFFERED) as grid:
        honest_id, _ = await asyncio.to_thread(lambda: grid.run_agent("honest", simulate="h100:2", env=SANDBOXED))
        hostile_id, pair = await asyncio.to_thread(enroll_hostile, grid, tmp_path)
        before = await asyncio.to_thread(honest_gpus, grid, honest_id)
        assert [(state, flags, offered) for _, state, flags, offered in before] == [("available", [], True)] * 2
        honest = await asyncio.to_thread(grid.agent, honest_id)
        victim_uuids = [uuid for uuid, _, _, _ in before]
        named = [
            msgspec.structs.replace(g, uuid=u)
            for g, u in zip(SimulatedCollector("h100:2", host_key="hostile").inventory(), victim_uuids, strict=True)
        ]
        host = msgspec.convert(honest["host"], HostInfo)

        async with hostile_link(grid, pair, named, host, honest["region"]):
            hostile = await asyncio.to_thread(grid.wait_state, hostile_id, "ready")
            # The claim shows on the claimant only: flagged, offline.
            assert [(g["uuid"], g["state"], g["flags"]) for g in hostile["gpus"]] == [
                (u, "offline", ["duplicate_uuid"]) for u in victim_uuids
            ]
            assert await asyncio.to_thread(honest_gpus, grid, honest_id) == before
            # The operator settles it: the claims are dropped, the holder keeps the card (not 409).
            status, repaired = await asyncio.to_thread(grid.call, "POST", f"/api/v1/gpus/{victim_uuids[0]}/repair")
            assert status == 200, repaired
            assert (repaired["agent_id"], repaired["state"]) == (honest_id, "available")
            assert [g["uuid"] for g in (await asyncio.to_thread(grid.agent, hostile_id))["gpus"]] == victim_uuids[1:]
        # The hostile agent left.
        await asyncio.to_thread(grid.wait_state, hostile_id, "offline")
        assert await asyncio.to_thread(honest_gpus, grid, honest_id) == before

        # It comes back, claims again (flagged again), and is revoked.
        async with hostile_link(grid, pair, named, host, honest["region"]):
            await asyncio.to_thread(grid.wait_state, hostile_id, "ready")
            flagged = (await asyncio.to_thread(grid.agent, hostile_id))["gpus"]
            assert [g["flags"] for g in flagged] == [["duplicate_uuid"]] * 2
            status, body = await asyncio.to_thread(grid.call, "POST", f"/api/v1/agents/{hostile_id}/revoke")
            assert status == 200, body
        assert await asyncio.to_thread(honest_gpus, grid, honest_id) == before

        # A Master restart: the honest host still holds its GPUs, unflagged, and they are as offered as before.
        assert grid.master is not None
        grid.master.kill(signal.SIGTERM)
        grid.restart_master()
        wait_for(lambda: honest_gpus(grid, honest_id) == before, 45, "the honest host's GPUs back as before")
        stored = sqlite3.connect(grid.master_dir / "master.db")
        try:
            docs = [json.loads(doc) for (doc,) in stored.execute("SELECT doc FROM gpus")]
        finally:
            stored.close()
        assert sorted((d["uuid"], d["agent_id"], d["flags"]) for d in docs) == [(u, honest_id, []) for u in sorted(victim_uuids)]


async def test_a_sample_dated_minus_1e21_is_set_aside_and_the_honest_hosts_minutes_are_written(tmp_path):
    with running_grid(tmp_path, FAST_TELEMETRY) as grid:
        honest_id, _ = await asyncio.to_thread(grid.run_agent, "honest", simulate="h100:2")
        hostile_id, pair = await asyncio.to_thread(enroll_hostile, grid, tmp_path)
        own = SimulatedCollector("h100:2", host_key="hostile").inventory()
        honest = await asyncio.to_thread(grid.agent, honest_id)
        host = msgspec.convert(honest["host"], HostInfo)
        wait_for(lambda: all(g["telemetry"] for g in grid.agent(honest_id)["gpus"]), 30, "the honest host's samples")

        async with hostile_link(grid, pair, own, host, honest["region"]) as ws:
            now = time.time()
            bad = GpuSample(uuid=own[0].uuid, ts=-1e21, utilization_pct=50.0)
            good = GpuSample(uuid=own[1].uuid, ts=now, utilization_pct=42.0, memory_used_mib=1024)
            await ws.send(encode(Telemetry(ts=now, samples=[bad, good])).decode())

            def good_taken() -> bool:
                return bool({g["uuid"]: g for g in grid.agent(hostile_id)["gpus"]}[own[1].uuid]["telemetry"])

            await taken(grid, ws, hostile_id, "after-the-bad-sample", good_taken)
            # D5: the operator's lists answer (they answered 500 until the agent sent another sample).
            for path in ("/api/v1/agents", "/api/v1/gpus", f"/api/v1/agents/{hostile_id}"):
                status, body = await asyncio.to_thread(grid.call, "GET", path)
                assert status == 200, (path, status, body)
            gpus = {g["uuid"]: g for g in (await asyncio.to_thread(grid.agent, hostile_id))["gpus"]}
            assert gpus[own[0].uuid]["telemetry"] is None  # the bad one set aside, the good one of the same frame taken
            assert await asyncio.to_thread(set_aside, grid, "ts") == 1

        # D4: the shutdown flush writes every minute the honest host filled; nothing of the bad sample blocks it.
        assert grid.master is not None
        assert grid.master.terminate() == 0
        stored = sqlite3.connect(grid.master_dir / "master.db")
        try:
            minutes = {uuid: n for uuid, n in stored.execute("SELECT gpu_uuid, COUNT(*) FROM rollups GROUP BY gpu_uuid")}
        finally:
            stored.close()
        honest_uuids = [g["uuid"] for g in honest["gpus"]]
        assert all(minutes.get(uuid, 0) >= 1 for uuid in honest_uuids), minutes
        assert own[0].uuid not in minutes and minutes.get(own[1].uuid) == 1


async def test_utilization_1e308_and_memory_2_62_stay_out_of_the_fleet_gauges_of_honest_hosts(tmp_path):
    with running_grid(tmp_path, FAST_TELEMETRY) as grid:
        honest_id, _ = await asyncio.to_thread(grid.run_agent, "honest", simulate="h100:2")
        hostile_id, pair = await asyncio.to_thread(enroll_hostile, grid, tmp_path)
        own = SimulatedCollector("h100:1", host_key="hostile").inventory()
        honest = await asyncio.to_thread(grid.agent, honest_id)
        host = msgspec.convert(honest["host"], HostInfo)

        async with hostile_link(grid, pair, own, host, honest["region"]) as ws:
            [mine] = (await asyncio.to_thread(grid.agent, hostile_id))["gpus"]
            group = {(g["tier"], g["model"]) for g in honest["gpus"]}
            assert group == {(mine["tier"], mine["model"])} and mine["state"] == "available"  # one group, both hosts
            wait_for(lambda: all(g["telemetry"] for g in grid.agent(honest_id)["gpus"]), 30, "the honest host's samples")
            poison = [
                GpuSample(uuid=mine["uuid"], ts=time.time(), utilization_pct=1e308),
                GpuSample(uuid=mine["uuid"], ts=time.time() + 0.001, memory_used_mib=2**62),
                GpuSample(uuid=mine["uuid"], ts=time.time() + 0.002, utilization_pct=-1.0, temperature_c=1e300),
            ]
            for sample in poison:  # one frame each: the last sample of a frame is the GPU's latest
                await ws.send(encode(Telemetry(ts=time.time(), samples=[sample])).decode())
            await taken(
                grid,
                ws,
                hostile_id,
                "after-the-poison",
                lambda: set_aside(grid, "utilization_pct") >= 2 and set_aside(grid, "memory_used_mib") >= 1,
            )
            metrics = await asyncio.to_thread(master_metrics, grid)
            region = honest["region"] or "none"
            [tier], [model] = {t for t, _ in group}, {m for _, m in group}

            def of(name: str) -> list[float]:
                return [
                    v
                    for labels, v in metrics.get(name, [])
                    if (labels["tier"], labels["region"], labels["model"]) == (tier, region, model)
                ]

            [utilization] = of("idlegrid_gpu_utilization_mean_percent")
            [memory] = of("idlegrid_gpu_memory_used_ratio")
            assert 0.0 <= utilization <= 100.0 and 0.0 <= memory <= 1.0, (utilization, memory)
            assert of("idlegrid_gpus_sampled") == [2.0]  # the honest host's two; the hostile GPU has no sample taken
            temperatures = of("idlegrid_gpu_temperature_max_celsius")
            assert all(math.isfinite(t) and t < 150 for t in temperatures), temperatures
            listed: list[dict[str, Any]] = (await asyncio.to_thread(grid.get, "/api/v1/gpus"))["items"]
            assert [g["telemetry"] for g in listed if g["uuid"] == mine["uuid"]] == [None]
            assert (set_aside(grid, "utilization_pct"), set_aside(grid, "memory_used_mib")) == (2, 1)

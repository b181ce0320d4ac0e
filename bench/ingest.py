"""``python -m bench ingest``: telemetry rollups written per second, by the Master's own code, to each store.

No scheduler, no network between agents and Master: samples for ``gpus`` GPUs, ``samples_per_minute``
each, go into the Master's ``TelemetryAggregator``, one minute after another, and each finished
minute is flushed through the store's repository in the Master's batches (master/batches.py), with no
rest between them: ``rollups_per_s`` is the capacity of the write path. The Master's own flush loop
rests after each batch as long as it took, so that a flush never stalls traffic; that paced figure is
reported too, as ``paced_rollups_per_s`` (about half, by design). The baseline is a raw insert loop on
the same store: the same rows, already encoded, in batches of the same size, straight to ``sqlite3``
(the same file, the same pragmas) or to PyMongo's ``insert_many`` (the same server).
``rollups_per_s / baseline_per_s`` is what the Master's path costs over the store's own limit.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from common.inventory import GpuSample
from master.batches import BATCH
from master.store import open_store
from master.store.base import Store
from master.telemetry import TelemetryAggregator

FIRST_MINUTE = 28_000_000  # a minute number of 2023; any will do


def _samples(gpus: list[str], minute: int, per_minute: int, rng: random.Random) -> list[tuple[str, list[GpuSample]]]:
    """One telemetry frame per (agent of 8 GPUs, sample time): the shape the Master ingests."""
    frames = []
    for k in range(per_minute):
        ts = minute * 60 + (k + 0.5) * 60 / per_minute
        for first in range(0, len(gpus), 8):
            samples = [
                GpuSample(
                    uuid=uuid,
                    ts=ts,
                    utilization_pct=round(rng.random() * 100, 1),
                    memory_used_mib=rng.randrange(80_000),
                    temperature_c=round(30 + rng.random() * 50, 1),
                    power_w=round(70 + rng.random() * 600, 1),
                    clock_sm_mhz=1980,
                )
                for uuid in gpus[first : first + 8]
            ]
            frames.append((f"agt-{first // 8:06d}", samples))
    return frames


async def measure_store(store: Store, *, gpus: int, minutes: int, samples_per_minute: int, seed: int = 1) -> dict[str, Any]:
    """The Master's path, unpaced then paced (on other GPUs): ingest samples, flush each finished minute."""
    figures = await _measure(
        store, "bench", gpus=gpus, minutes=minutes, samples_per_minute=samples_per_minute, seed=seed, duty=1.0
    )
    paced = await _measure(
        store, "paced", gpus=gpus, minutes=minutes, samples_per_minute=samples_per_minute, seed=seed, duty=None
    )
    figures["paced_rollups_per_s"] = paced["rollups_per_s"]
    return figures


async def _measure(
    store: Store, name: str, *, gpus: int, minutes: int, samples_per_minute: int, seed: int, duty: float | None
) -> dict[str, Any]:
    rng = random.Random(seed)
    uuids = [f"GPU-{name}-{i:06d}" for i in range(gpus)]
    aggregator = TelemetryAggregator(store)
    ingest_s = flush_s = 0.0
    written = samples = 0
    for m in range(minutes):
        minute = FIRST_MINUTE + m
        frames = _samples(uuids, minute, samples_per_minute, rng)
        started = time.perf_counter()
        for agent_id, batch in frames:
            aggregator.ingest(agent_id, batch)
        ingest_s += time.perf_counter() - started
        samples += sum(len(b) for _, b in frames)
        started = time.perf_counter()
        written += await aggregator.flush((minute + 1) * 60, duty=duty)
        flush_s += time.perf_counter() - started
    stored = await store.rollups.list(uuids[0])
    if len(stored) != minutes:
        raise RuntimeError(f"expected {minutes} rollups of {uuids[0]} in the store, found {len(stored)}")
    return {
        "rollups": written,
        "rollups_per_s": round(written / flush_s, 1),
        "flush_s": round(flush_s, 3),
        "samples_per_s": round(samples / ingest_s, 1),
    }


def _raw_rows(gpus: int, minute: int) -> list[tuple[str, int, bytes]]:
    encoder = msgspec.json.Encoder()
    return [
        (
            f"GPU-raw-{i:06d}",
            minute,
            encoder.encode(
                {
                    "gpu_uuid": f"GPU-raw-{i:06d}",
                    "agent_id": f"agt-{i // 8:06d}",
                    "minute": minute,
                    "samples": 6,
                    "utilization_avg": 50.0,
                    "utilization_max": 90.0,
                    "memory_used_mib_max": 40000,
                    "temperature_max": 70.0,
                    "power_avg_w": 400.0,
                    "ecc_uncorrected": 0,
                }
            ),
        )
        for i in range(gpus)
    ]


def raw_sqlite(path: Path, *, gpus: int, minutes: int) -> float:
    """Rows per second of a raw executemany loop into a table shaped like ``rollups``, in the same file."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_rollups (gpu_uuid TEXT NOT NULL, minute INTEGER NOT NULL, "
            "doc TEXT NOT NULL, PRIMARY KEY (gpu_uuid, minute)) WITHOUT ROWID"
        )
        batches = [[(u, m, d.decode()) for u, m, d in _raw_rows(gpus, FIRST_MINUTE + k)] for k in range(minutes)]
        started = time.perf_counter()
        for rows in batches:
            for first in range(0, len(rows), BATCH):
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany("INSERT INTO raw_rollups (gpu_uuid, minute, doc) VALUES (?, ?, ?)", rows[first : first + BATCH])
                conn.execute("COMMIT")
        return gpus * minutes / (time.perf_counter() - started)
    finally:
        conn.close()


async def raw_mongo(url: str, *, gpus: int, minutes: int) -> float:
    """Documents per second of a raw ``insert_many`` loop into a collection of the same database."""
    from pymongo import AsyncMongoClient

    from master.store.mongo import database_name

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    try:
        collection = client[database_name(url)]["raw_rollups"]
        batches = [
            [{"_id": f"{u}:{m}", **msgspec.json.decode(d)} for u, m, d in _raw_rows(gpus, FIRST_MINUTE + k)]
            for k in range(minutes)
        ]
        started = time.perf_counter()
        for docs in batches:
            for first in range(0, len(docs), BATCH):
                await collection.insert_many(docs[first : first + BATCH], ordered=False)
        return gpus * minutes / (time.perf_counter() - started)
    finally:
        await client.close()


async def run_ingest_bench(
    *,
    gpus: int = 10_000,
    minutes: int = 3,
    samples_per_minute: int = 6,
    stores: tuple[str, ...] = ("sqlite", "mongodb"),
    mongo_url: str = "",
) -> list[dict[str, Any]]:
    results = []
    work = Path(tempfile.mkdtemp(prefix="idlegrid-ingest-"))
    try:
        for kind in stores:
            if kind == "sqlite":
                results.append(await _sqlite(work, gpus, minutes, samples_per_minute))
            elif kind == "mongodb":
                results.append(await _mongo(work, gpus, minutes, samples_per_minute, mongo_url))
            else:
                raise ValueError(f"unknown store {kind!r}: sqlite or mongodb")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


async def _sqlite(work: Path, gpus: int, minutes: int, per_minute: int) -> dict[str, Any]:
    path = work / "ingest.db"
    store = open_store(f"sqlite:///{path}")
    await store.open()
    try:
        figures = await measure_store(store, gpus=gpus, minutes=minutes, samples_per_minute=per_minute)
    finally:
        await store.close()
    baseline = await asyncio.to_thread(raw_sqlite, path, gpus=gpus, minutes=minutes)
    return _result("sqlite", figures, baseline, gpus, minutes)


async def _mongo(work: Path, gpus: int, minutes: int, per_minute: int, url: str) -> dict[str, Any]:
    server = None
    if not url:
        from tests.support.mongo import Nx27017  # the same nx-27017 launcher the test suite uses

        server = Nx27017(work / "nx").start()
        url = server.uri.replace("/?", "/ingest_bench?")
    try:
        store = open_store(url)
        await store.open()
        try:
            figures = await measure_store(store, gpus=gpus, minutes=minutes, samples_per_minute=per_minute)
        finally:
            await store.close()
        baseline = await raw_mongo(url, gpus=gpus, minutes=minutes)
    finally:
        if server is not None:
            server.stop()
    return _result("mongodb" if server is None else "mongodb (nx-27017)", figures, baseline, gpus, minutes)


def _result(store: str, figures: dict[str, Any], baseline: float, gpus: int, minutes: int) -> dict[str, Any]:
    return {
        "store": store,
        "gpus": gpus,
        "minutes": minutes,
        **figures,
        "baseline_per_s": round(baseline, 1),
        "vs_baseline": round(figures["rollups_per_s"] / baseline, 3) if baseline else None,
    }
